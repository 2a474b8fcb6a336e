# cython: language_level=3
"""The decode loop of a vision-language model: each one-token step runs the embedding graph
on the new token id and the decoder on its ``inputs_embeds``, without the GIL.

`EmbedDecoderLoop` is a `genai._core.decoder_loop.DecoderLoop` (same sequences, logits rows,
choice and commit, grow-on-demand KV) whose run of the pending tokens is, for a one-token
decode step: write the ids into the embedding graph's bound input buffer, run it (its output
is the decoder's bound ``inputs_embeds`` buffer), grow the attention mask (all ones at batch 1
and for mRoPE decoders, else a trailing 1 per row), write Qwen-VL's 3-D mRoPE positions
(``computed + rope_delta[row]`` on the three axes), run the decoder, hand a growing KV cache's
presents to its pasts, copy the logits rows. The buffers are bound by the Python runner's
first one-token run (`genai.generation.vision_runner`), which says so with `step_ready`;
every other run (prompts, images, several tokens, the first step after a prompt or a rewind)
goes back to Python through `fallback`, as a `run` / `step` / `steps` call's only detour.
"""

from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

from genai._core.bookkeeping cimport grow_mask, prefill_rows, store_index
from genai._core.decoder_loop cimport DecoderLoop
from genai._core.native_session cimport NS_MAX_DIMS, NativeSession
from genai._core.ort_api cimport ELEM_INT32, ELEM_INT64, OrtValue

cimport numpy as cnp

import numpy as np

from genai.errors import InvalidArgumentError
from genai.runtime.buffers import aligned_zeros

cnp.import_array()

# Not errors: codes of run_pending that `run` / `step` / `steps` answer from Python.
cdef enum:
    # grow the KV cache (`grow`), then run again (decoder_loop's LOOP_NEED_GROW value)
    NEED_GROW = -104
    # not an error: the pending tokens run from Python (`fallback`), then the loop goes on
    NEED_PYTHON = -200

# run_prompt's vision output has other rows than the prompt's images need (check_feature_rows)
cdef enum:
    LOOP_ERR_ROWS = -110


def check_feature_rows(tuple shape, int64_t expected):
    """Raise `InvalidArgumentError` unless image features of ``shape`` (``[..., rows,
    hidden]``) have ``expected`` rows in all, one per image placeholder of the prompt (-1:
    any): others would fill the wrong positions, or leave placeholders unfilled (the
    reference's vision output, allocated from ``num_image_tokens``, fails in onnxruntime
    then)."""
    cdef int64_t rows = 1
    for dim in shape[:-1]:
        rows *= dim
    if not shape:
        rows = 0
    if expected >= 0 and rows != expected:
        _raise_feature_rows(rows, expected)


cdef _raise_feature_rows(int64_t rows, int64_t expected):
    """The `check_feature_rows` error: ``rows`` image feature rows made, ``expected`` needed."""
    raise InvalidArgumentError(
        f"the vision graph made {rows} image feature rows for the {expected} image "
        "placeholders of input_ids: the processor outputs given to set_inputs do not "
        "belong together (were pixel_values, image_sizes or image_grid_thw changed?)"
    )


cdef void* _data(cnp.ndarray array):
    return cnp.PyArray_DATA(array)


# a non-NULL address for an empty tensor bound by pointer
cdef int64_t _EMPTY[1]


cdef int _pass_output(NativeSession source, Py_ssize_t output, int source_stage,
                      NativeSession target, Py_ssize_t input, int target_stage,
                      int* failed, int64_t* rows) noexcept nogil:
    """Bind ``source``'s output ``output`` of its last run, where ORT left it (host memory),
    as ``target``'s input ``input``: no copy, valid until ``source`` runs again or re-binds
    the output. On failure ``failed`` names the session whose error it is (the stages of
    `EmbedDecoderLoop.failed`). ``rows`` (or NULL): the rows the output must have (the
    product of its dims but the last; -1: any); when it has others, ``rows`` becomes that
    count and the result `LOOP_ERR_ROWS`, nothing bound."""
    cdef OrtValue* value = NULL
    cdef int64_t shape[NS_MAX_DIMS]
    cdef size_t ndim = 0, i
    cdef int elem = 0, rc
    cdef int64_t count = 1
    cdef void* data = NULL
    failed[0] = source_stage
    rc = source._output_value(output, &value)
    if rc == 0:
        rc = source._tensor_shape(value, &elem, shape, &ndim)
    if rc == 0:
        rc = source.output_value_data(output, &data)
    if rc != 0:
        return rc
    if rows != NULL and rows[0] >= 0:
        for i in range(ndim - 1 if ndim > 0 else 0):
            count *= shape[i]
        if ndim == 0:
            count = 0
        if count != rows[0]:
            rows[0] = count
            failed[0] = 0
            return LOOP_ERR_ROWS
    failed[0] = target_stage
    if data == NULL:
        data = <void*>_EMPTY  # an empty tensor
    return target.bind_input_ptr(input, data, shape, ndim, elem)


cdef class EmbedDecoderLoop(DecoderLoop):
    """A `DecoderLoop` for a vision-language model (see the module docstring): made with no
    session (as a loop whose model runs outside it), then `attach` gives it the graphs and
    ``fallback`` (``fallback(prompt)``: run the pending tokens from Python, make the logits
    rows current) the runs it does not make itself."""

    def __cinit__(self):
        self.step_ids = NULL
        self.step_positions = NULL
        self.step_logits_f32 = NULL
        self.rope_deltas = NULL
        self.step_ready = False
        self.ones_filled = 0
        self.dec_mask_in = -1
        self.dec_pos_in = -1
        self.emb_ids_in = -1
        self.prompt_positions = NULL
        self.kv_pending = False
        self.mrope = False
        self.prompt_vision = None
        self.features_out = self.features_in = self.embeds_out = self.embeds_in = -1
        self.prompt_logits = -1
        self.failed = 0

    def attach(
        self, NativeSession embedding, NativeSession decoder, *, str attention_mask,
        cnp.ndarray step_ids, object step_positions, cnp.ndarray step_logits, list kv_pairs,
        object grow_kv, Py_ssize_t kv_capacity, bint ones_mask,
    ):
        """Run one-token steps over ``embedding`` and ``decoder`` (bindings): ``step_ids``
        [batch, 1] is the embedding's bound ids input, ``step_positions`` [3, batch, 1] the
        decoder's bound mRoPE positions (None: the decoder takes none), ``step_logits``
        float32 [batch, 1, vocab] its bound logits output; the mask ``attention_mask`` is
        re-bound at every step from the loop's buffer. ``kv_pairs``: (present, past) names
        handed over after each run; ``grow_kv(needed, filled) -> capacity`` grows a shared
        buffer of ``kv_capacity`` positions (-1: no limit). ``ones_mask``: a step's mask is
        all ones. (`fallback`, set apart, runs every other run.)"""
        cdef Py_ssize_t i, batch = self.batch
        if self.embedding is not None:
            raise ValueError("the loop is attached already")
        if step_ids.shape[0] != batch or step_ids.size != batch:
            raise ValueError(f"step_ids must be [{batch}, 1], got {(<object>step_ids).shape}")
        if step_ids.dtype not in (np.int32, np.int64) or not step_ids.flags.c_contiguous:
            raise TypeError("step_ids must be a C-contiguous int32 or int64 array")
        if (step_logits.dtype != np.float32 or step_logits.size != batch * self.vocab
                or not step_logits.flags.c_contiguous):
            raise TypeError(f"step_logits must be C-contiguous float32 [{batch}, 1, vocab]")
        self.embedding, self.decoder = embedding, decoder
        self.dec_mask_in = decoder.input_index(attention_mask)
        self._arrays["step_ids"] = step_ids
        self.step_ids = _data(step_ids)
        self.ids_wide = step_ids.dtype == np.int64
        self._arrays["step_logits_f32"] = step_logits
        self.step_logits_f32 = <const float*>_data(step_logits)
        deltas = self._arrays.setdefault("rope_deltas", np.zeros(batch, np.int64))
        self.rope_deltas = <int64_t*>_data(deltas)
        if step_positions is not None:
            positions = <cnp.ndarray?>step_positions
            if positions.size != 3 * batch or not positions.flags.c_contiguous:
                raise ValueError(f"step_positions must be C-contiguous [3, {batch}, 1]")
            if positions.dtype not in (np.int32, np.int64):
                raise TypeError("step_positions must be int32 or int64")
            self._arrays["step_positions"] = positions
            self.step_positions = _data(positions)
            self.pos_wide = positions.dtype == np.int64
        self.ones_mask = ones_mask
        self.grow = grow_kv
        self.kv_capacity = kv_capacity
        if kv_pairs:
            # (freed by DecoderLoop's __dealloc__)
            self.kv_out = <Py_ssize_t*>calloc(len(kv_pairs), sizeof(Py_ssize_t))
            self.kv_in = <Py_ssize_t*>calloc(len(kv_pairs), sizeof(Py_ssize_t))
            if self.kv_out == NULL or self.kv_in == NULL:
                raise MemoryError()
            for i, (present, past) in enumerate(kv_pairs):
                self.kv_out[i] = decoder.output_index(present)
                self.kv_in[i] = decoder.input_index(past)
            self.n_kv_pairs = len(kv_pairs)

    # ------------------------------------------------------------------ state the runner sets
    def set_computed(self, Py_ssize_t computed):
        """Tokens whose KV the cache holds (the Python runner's runs)."""
        if computed < 0 or computed > self.max_length:
            raise ValueError(f"computed must be in [0, {self.max_length}], got {computed}")
        self.computed = computed

    def mask_view(self):
        """The attention mask of the last run, [batch, mask_length] (a view of the loop's
        buffer: writes go to the loop)."""
        width = self.mask_length
        return self._arrays["attention_mask"][: self.batch * width].reshape(self.batch, width)

    def set_mask(self, mask):
        """Copy ``mask`` [batch, n] into the loop's buffer as the mask of the tokens so far."""
        mask = np.asarray(mask)
        if mask.ndim != 2 or mask.shape[0] != self.batch or mask.shape[1] > self.max_length:
            raise ValueError(
                f"mask must be [{self.batch}, n <= {self.max_length}], got {list(mask.shape)}")
        width = mask.shape[1]
        view = self._arrays["attention_mask"][: self.batch * width].reshape(self.batch, width)
        view[...] = mask  # (NumPy copies overlapping memory safely: mask may be a view of it)
        self.mask_length = width
        self.ones_filled = 0

    # ------------------------------------------------------------------ runs and steps
    def run(self, bint prompt, Py_ssize_t chunk=0):
        """Run the pending tokens: natively for a one-token decode step when `step_ready`,
        else through ``fallback(prompt)``. ``chunk``: `DecoderLoop.run`'s, ignored (a
        vision-language prompt runs whole; the multimodal driver passes none)."""
        cdef int rc
        while True:
            with nogil:
                rc = self.run_pending(prompt)
            if rc == NEED_GROW:
                self._grow_kv()
                continue
            if rc == NEED_PYTHON:
                self.fallback(prompt)
                rc = 0
            break
        if rc != 0:
            self.raise_error(rc)

    def step(self):
        """One generation step: run the pending token if the logits are stale (natively when
        `step_ready`, else through `fallback`), choose, commit."""
        cdef int rc
        if self.logits_ready:
            rc = self.choose_and_commit()
        else:
            while True:
                with nogil:
                    rc = self.step_nogil()
                if rc == NEED_GROW:
                    self._grow_kv()
                    continue
                if rc == NEED_PYTHON:
                    self.fallback(False)
                    rc = self.choose_and_commit()
                break
        if rc != 0:
            self.raise_error(rc)

    def steps(self, Py_ssize_t count):
        """Up to ``count`` steps, without the GIL but for the runs that need Python; stops
        early when done. Returns the number of steps made."""
        cdef int rc = 0
        cdef Py_ssize_t made = 0
        while True:
            with nogil:
                while made < count and not self.all_done and self.length < self.max_length:
                    rc = self.step_nogil()
                    if rc != 0:
                        break
                    made += 1
            if rc == NEED_GROW:
                self._grow_kv()
            elif rc == NEED_PYTHON:
                self.fallback(False)  # the logits rows are current: the next step chooses
            else:
                break
            rc = 0
        if rc != 0:
            self.raise_error(rc)
        return made

    cdef int run_pending(self, bint prompt) noexcept nogil:
        if (prompt or self.length - self.computed != 1 or not self.step_ready
                or self.kv_pending):
            return NEED_PYTHON
        if not self.ones_mask and self.mask_length != self.computed:
            return NEED_PYTHON  # (never: the runner's mask covers the computed tokens)
        if self.kv_capacity >= 0 and self.length > self.kv_capacity:
            return NEED_GROW  # before touching any state
        return self.run_embedded_step()

    cdef int run_embedded_step(self) noexcept nogil:
        cdef Py_ssize_t batch = self.batch, start = self.computed, stop = self.length
        cdef Py_ssize_t a, b, i, n
        cdef int64_t shape[2]
        cdef int rc
        cdef bint wide = self.mask_elem == ELEM_INT64
        for b in range(batch):
            store_index(self.step_ids, self.ids_wide, b, self.sequences[b, start])
        rc = self.embedding.run_binding()
        if rc != 0:
            self.failed = 1
            return rc
        if self.ones_mask:
            n = batch * stop
            for i in range(self.ones_filled, n):
                store_index(self.mask_buf, wide, i, 1)
            self.ones_filled = n
        else:
            grow_mask(self.mask_buf, wide, batch, self.mask_length)
        self.mask_length = stop
        if self.step_positions != NULL:
            for a in range(3):
                for b in range(batch):
                    store_index(self.step_positions, self.pos_wide, a * batch + b,
                                start + self.rope_deltas[b])
        shape[0] = batch
        shape[1] = stop
        rc = self.decoder.bind_input_ptr(self.dec_mask_in, self.mask_buf, shape, 2,
                                         self.mask_elem)
        if rc == 0:
            rc = self.decoder.run_binding()
        if rc == 0 and self.n_kv_pairs:
            rc = self.decoder.rebind_outputs_as_inputs(self.kv_out, self.kv_in, self.n_kv_pairs)
        if rc != 0:
            self.failed = 2
            return rc
        memcpy(&self.logits_rows[0, 0], self.step_logits_f32, batch * self.vocab * sizeof(float))
        self.computed = stop
        self.last_run_count = 1
        self.logits_ready = True
        self.ran_once = True
        if self.sampler is not None:
            self.sampler.maxima_valid = 0  # the rows were rewritten
        return 0

    def run_prompt_decoder(self, Py_ssize_t logits_index, const int32_t[::1] last,
                           Py_ssize_t count):
        """Run the decoder on the inputs the runner bound (a run of ``count`` tokens whose
        logits output, float32 in host memory, ORT allocates), hand a growing cache's presents
        to its pasts, and copy each row's logits at position ``last[row]`` (the output's last
        row when it has fewer rows than the run: a last-position or trimmed graph) into the
        logits rows: in one call, as the work right after a long run is slow from Python (cold
        caches). Returns False, the rows untouched, when the output is not ``[batch, 1 to
        count, vocab]`` (the runner then reads it itself and names the problem)."""
        cdef int rc
        cdef int64_t shape[NS_MAX_DIMS]
        cdef size_t ndim = 0
        cdef void* data = NULL
        self._check_prompt_call(logits_index)
        if last.shape[0] != self.batch:
            raise ValueError(f"last must have {self.batch} entries, got {last.shape[0]}")
        with nogil:
            rc = self.decoder_prompt_run(logits_index, shape, &ndim, &data, False)
        if rc != 0:
            self.raise_error(rc)
        return self._copy_prompt_rows(shape, ndim, data, &last[0], count)

    @property
    def binds_prompt_ids(self):
        """`bind_prompt_inputs` binds the embedding's ids (see `chain_prompt`)."""
        return self.emb_ids_in >= 0

    def chain_prompt(self, NativeSession vision, Py_ssize_t features_out,
                     Py_ssize_t features_in, Py_ssize_t embeds_out, Py_ssize_t embeds_in,
                     Py_ssize_t logits_index, object position_ids=None, object mrope=None,
                     object ids=None):
        """Let `run_prompt` run a first prompt's graphs in one call: the vision graph
        (``vision``, a binding; None: the model has none) whose output ``features_out`` is
        the embedding's input ``features_in``, the embedding's output ``embeds_out`` the
        decoder's input ``embeds_in``, the decoder's logits output ``logits_index`` (ORT
        allocates it in host memory). ``position_ids``: the decoder's 3-D mRoPE positions
        input (None: it takes none); ``mrope``: Qwen-VL's ``(image_token_id,
        video_token_id, vision_start_token_id, pad_token_id, spatial_merge_size)`` (None:
        the decoder-only mask rules); ``ids``: the embedding's ids input, which
        `bind_prompt_inputs` fills from the loop's ``input_ids`` buffer (None, or of another
        element type than the loop's ids: the runner binds it)."""
        if self.decoder is None:
            raise ValueError("the loop is not attached")
        if embeds_out < 0 or embeds_out >= self.embedding.n_outputs:
            raise IndexError(f"embedding output index {embeds_out} out of range")
        if vision is not None and (features_out < 0 or features_out >= vision.n_outputs):
            raise IndexError(f"vision output index {features_out} out of range")
        if logits_index < 0 or logits_index >= self.decoder.n_outputs:
            raise IndexError(f"decoder output index {logits_index} out of range")
        if mrope is not None:
            values = [int(v) for v in mrope]
            if len(values) != 5 or values[4] <= 0:
                raise ValueError("mrope must be 5 ids with a spatial_merge_size > 0")
            for i in range(5):
                self.mrope_ids[i] = values[i]
        self.mrope = mrope is not None
        self.dec_pos_in = -1
        self.prompt_positions = NULL
        if position_ids is not None:
            if not self.mrope:
                raise ValueError("position_ids are bound for mRoPE decoders only")
            self.dec_pos_in = self.decoder.input_index(position_ids)
            self.pos_elem = self.decoder.input_types_c[self.dec_pos_in]
            if self.pos_elem != ELEM_INT64 and self.pos_elem != ELEM_INT32:
                raise TypeError(f"{position_ids!r} must be int64 or int32")
            # [3, batch, seq] of a prompt, at the start of a buffer of the longest prompt
            positions = aligned_zeros(
                3 * self.batch * self.max_length,
                np.int64 if self.pos_elem == ELEM_INT64 else np.int32,
            )
            self._arrays["prompt_positions"] = positions
            self.prompt_positions = _data(positions)
        self.emb_ids_in = -1
        if ids is not None:
            index = self.embedding.input_index(ids)
            if self.embedding.input_types_c[index] == self.ids_elem:
                self.emb_ids_in = index
        self.prompt_vision = vision
        self.features_out, self.features_in = features_out, features_in
        self.embeds_out, self.embeds_in = embeds_out, embeds_in
        self.prompt_logits = logits_index

    def bind_prompt_inputs(self, object grid, cnp.ndarray error):
        """A first prompt's inputs for `run_prompt` (the loop's pending tokens, from
        ``computed`` to ``length``), bound: the decoder's attention mask (the loop's; mRoPE
        models: 0 at every ``pad_token_id``, else trailing pads of ``prompt_pad`` masked and
        each row's count of real tokens in the loop's ``next_position``), each row's index of
        its last real token (the loop's ``last_index``), for mRoPE models the rows'
        ``rope_deltas`` and, when the decoder takes them, the 3-D positions [3, batch, seq]
        (the loop's ``prompt_positions``) from ``grid`` ([n, 3] image grids or None), and the
        embedding's ids (the loop's ``input_ids``) when `binds_prompt_ids`. Returns 0, or an
        mRoPE failure with ``error`` (int64 [6]) filled (see `mrope_rows`), nothing bound."""
        cdef Py_ssize_t batch = self.batch, seq = self.length - self.computed, b, i, n
        cdef Py_ssize_t start = self.computed
        cdef int rc = 0
        cdef bint wide = self.mask_elem == ELEM_INT64
        cdef int64_t* wide_tokens = NULL
        cdef int64_t* wide_positions = NULL
        cdef const int64_t* grid_data = NULL
        cdef Py_ssize_t n_images = 0
        cdef int64_t shape[3]
        cdef const int32_t* row
        cdef cnp.ndarray grid_array
        cdef int64_t* error_data
        if self.decoder is None:
            raise ValueError("the loop is not attached")
        if seq <= 0:
            raise ValueError("no pending tokens")
        if (cnp.PyArray_TYPE(error) != cnp.NPY_INT64 or cnp.PyArray_SIZE(error) < 6
                or not cnp.PyArray_IS_C_CONTIGUOUS(error)):
            raise ValueError("error must be C-contiguous int64 [6]")
        error_data = <int64_t*>_data(error)
        if self.mrope and grid is not None:
            grid_array = <cnp.ndarray?>grid
            if (cnp.PyArray_NDIM(grid_array) != 2 or grid_array.shape[1] != 3
                    or cnp.PyArray_TYPE(grid_array) != cnp.NPY_INT64
                    or not cnp.PyArray_IS_C_CONTIGUOUS(grid_array)):
                grid_array = np.ascontiguousarray(np.asarray(grid).reshape(-1, 3), np.int64)
            n_images = grid_array.shape[0]
            if n_images:
                grid_data = <const int64_t*>_data(grid_array)
        n = batch * seq
        with nogil:
            # the index of each row's last real token (and the decoder-only mask)
            prefill_rows(&self.sequences[0, start], self.max_length, batch, seq,
                         self.prompt_pad, self.mask_buf, NULL, seq, wide, self.last_index,
                         self.next_position, self.pad_id)
            if self.emb_ids_in >= 0:
                for b in range(batch):
                    row = &self.sequences[b, start]
                    for i in range(seq):
                        store_index(self.ids_buf, self.ids_elem == ELEM_INT64, b * seq + i,
                                    row[i])
            if self.mrope:
                wide_tokens = <int64_t*>malloc(n * sizeof(int64_t))
                wide_positions = <int64_t*>malloc(3 * n * sizeof(int64_t))
                if wide_tokens == NULL or wide_positions == NULL:
                    rc = -1
                else:
                    for b in range(batch):
                        row = &self.sequences[b, start]
                        for i in range(seq):
                            wide_tokens[b * seq + i] = row[i]
                            # mRoPE models mask every pad token
                            store_index(self.mask_buf, wide, b * seq + i,
                                        row[i] != self.mrope_ids[3])
                    rc = _mrope(wide_tokens, batch, seq, grid_data, n_images,
                                self.mrope_ids[0], self.mrope_ids[1], self.mrope_ids[2],
                                self.mrope_ids[3], self.mrope_ids[4], wide_positions,
                                self.rope_deltas, error_data)
                    if rc == 0 and self.prompt_positions != NULL:
                        for i in range(3 * n):
                            store_index(self.prompt_positions, self.pos_elem == ELEM_INT64, i,
                                        wide_positions[i])
                free(wide_tokens)
                free(wide_positions)
        if rc == -1:
            raise MemoryError()
        if rc != 0:
            return rc
        self.mask_length = seq
        self.ones_filled = 0
        shape[0] = batch
        shape[1] = seq
        if self.emb_ids_in >= 0:
            rc = self.embedding.bind_input_ptr(self.emb_ids_in, self.ids_buf, shape, 2,
                                               self.ids_elem)
            if rc != 0:
                self.embedding.raise_last_error()
        rc = self.decoder.bind_input_ptr(self.dec_mask_in, self.mask_buf, shape, 2,
                                         self.mask_elem)
        if rc == 0 and self.prompt_positions != NULL:
            shape[0] = 3
            shape[1] = batch
            shape[2] = seq
            rc = self.decoder.bind_input_ptr(self.dec_pos_in, self.prompt_positions, shape, 3,
                                             self.pos_elem)
        if rc != 0:
            self.decoder.raise_last_error()
        return 0

    def run_prompt(self, Py_ssize_t count, bint with_images, int64_t feature_rows=-1):
        """A first prompt's three runs (see `chain_prompt`) in one call, on the inputs the
        runner bound (`bind_prompt_inputs`, the pixel inputs, the ids): the vision graph when
        ``with_images`` (else the embedding's features input is bound already), its output
        bound where ORT left it as the embedding's input, the embedding graph, its output
        bound as the decoder's input, then the decoder as `run_prompt_decoder` (each row's
        logits at its ``last_index`` copied) for ``count`` tokens; a growing cache's presents
        become its pasts later, at `hand_over_kv` (as the reference swaps them before the
        next run: the caller calls it before anything else runs or reads the KV). No
        Python runs between the graphs (right after a long run it is 10-20x slower than
        warm). The bound features and embeddings are ORT's outputs, valid until their
        binding runs again or re-binds them. Returns True: the rows copied, the tokens
        computed and the logits ready (the loop's state set as after its own runs); False:
        ran, but the logits output is not ``[batch, count or 1, vocab]`` (the runner reads
        it; the loop's state untouched). ``feature_rows``: the image feature rows the vision
        graph must make (-1: any); other counts raise `InvalidArgumentError` before the
        embedding runs (`check_feature_rows`)."""
        cdef int rc = 0
        cdef int64_t rows = feature_rows
        cdef int64_t shape[NS_MAX_DIMS]
        cdef size_t ndim = 0
        cdef void* data = NULL
        cdef NativeSession embedding = self.embedding
        cdef NativeSession vision = self.prompt_vision if with_images else None
        if self.prompt_logits < 0:
            raise ValueError("chain_prompt was not called")
        if with_images and vision is None:
            raise ValueError("the model has no vision graph")
        self._check_prompt_call(self.prompt_logits)
        if ((vision is not None and vision.output_in_device_memory[self.features_out])
                or embedding.output_in_device_memory[self.embeds_out]):
            raise ValueError("the image features or embeddings live in device memory")
        with nogil:
            if vision is not None:
                self.failed = 3
                rc = vision.run_binding()
                if rc == 0:
                    rc = _pass_output(vision, self.features_out, 3, embedding, self.features_in,
                                      1, &self.failed, &rows)
            if rc == 0:
                self.failed = 1
                rc = embedding.run_binding()
            if rc == 0:
                rc = _pass_output(embedding, self.embeds_out, 1, self.decoder, self.embeds_in,
                                  2, &self.failed, NULL)
            if rc == 0:
                rc = self.decoder_prompt_run(self.prompt_logits, shape, &ndim, &data, True)
        if rc == LOOP_ERR_ROWS:
            _raise_feature_rows(rows, feature_rows)
        if rc != 0:
            if self.failed == 3:
                self.failed = 0
                if rc > 0 or -4 <= rc <= -1:
                    vision.raise_last_error()
            self.raise_error(rc)
        self.failed = 0
        if not self._copy_prompt_rows(shape, ndim, data, self.last_index, count):
            return False
        # the rows are current: the loop's state moves on here, not in Python
        self.computed += count
        self.last_run_count = count
        self.logits_ready = True
        self.ran_once = True
        if self.sampler is not None:
            self.sampler.maxima_valid = 0
        return True

    def hand_over_kv(self):
        """Bind a growing cache's presents of the last `run_prompt` as its pasts, if that is
        still to do (`kv_pending`); before the decoder runs again or the KV is read."""
        cdef int rc = 0
        if not self.kv_pending:
            return
        with nogil:
            rc = self.decoder.rebind_outputs_as_inputs(self.kv_out, self.kv_in, self.n_kv_pairs)
        self.kv_pending = False
        if rc != 0:
            self.decoder.raise_last_error()

    cdef _check_prompt_call(self, Py_ssize_t logits_index):
        if self.decoder is None:
            raise ValueError("the loop is not attached")
        if logits_index < 0 or logits_index >= self.decoder.n_outputs:
            raise IndexError(f"decoder output index {logits_index} out of range")
        if self.decoder.output_in_device_memory[logits_index]:
            raise ValueError("the logits output lives in device memory")

    cdef int decoder_prompt_run(self, Py_ssize_t logits_index, int64_t* shape, size_t* ndim,
                                void** data, bint defer_kv) noexcept nogil:
        """The decoder's prompt run, the KV hand-over (``defer_kv``: left to `hand_over_kv`,
        `kv_pending`), the logits output's shape and data."""
        cdef int rc
        self.failed = 2
        rc = self.decoder.run_binding()
        if rc == 0 and self.n_kv_pairs and defer_kv:
            self.kv_pending = True
        elif rc == 0 and self.n_kv_pairs:
            rc = self.decoder.rebind_outputs_as_inputs(self.kv_out, self.kv_in, self.n_kv_pairs)
        if rc == 0:
            rc = self.decoder.output_value_shape(logits_index, shape, ndim)
        if rc == 0:
            rc = self.decoder.output_value_data(logits_index, data)
        if rc == 0:
            self.failed = 0
        return rc

    cdef object _copy_prompt_rows(self, const int64_t* shape, size_t ndim, void* data,
                                  const int32_t* last, Py_ssize_t count):
        cdef Py_ssize_t b, pos, batch = self.batch, vocab = self.vocab
        if (ndim != 3 or shape[0] != batch or shape[2] != vocab
                or shape[1] < 1 or shape[1] > count or data == NULL):
            return False
        # fewer rows than tokens (a last-position or trimmed graph): the last row is the run's
        # last token's
        for b in range(batch):
            pos = last[b] if shape[1] == count else shape[1] - 1
            if pos < 0 or pos >= shape[1]:
                raise ValueError(f"last[{b}] = {pos} is outside the run's {shape[1]} positions")
        for b in range(batch):
            pos = last[b] if shape[1] == count else shape[1] - 1
            memcpy(&self.logits_rows[b, 0], <const float*>data + (b * shape[1] + pos) * vocab,
                   vocab * sizeof(float))
        return True

    cdef object raise_error(self, int rc):
        cdef NativeSession failed = (
            self.embedding if self.failed == 1 else self.decoder if self.failed == 2 else None
        )
        self.failed = 0
        if failed is not None and (rc > 0 or -4 <= rc <= -1):
            failed.raise_last_error()
        DecoderLoop.raise_error(self, rc)


# ---------------------------------------------------------------------- prompt ids
def prompt_ids(cnp.ndarray ids):
    """``(ids as a C-contiguous int32 copy, smallest id, largest id)`` of a non-empty 2-D
    int64 or int32 id array, in one pass (the checks of a processor's ``input_ids``); None
    for another dtype or an empty array (the caller uses NumPy). The bounds are the int64
    values (an id beyond int32 is outside any vocabulary: the copy is not used then)."""
    cdef Py_ssize_t rows, cols, b, i, s0, s1
    cdef int64_t value, lo, hi
    cdef bint wide
    cdef cnp.ndarray out
    cdef int32_t* dst
    cdef const char* src
    if ids.ndim != 2 or ids.size == 0:
        return None
    if ids.dtype == np.int64:
        wide = True
    elif ids.dtype == np.int32:
        wide = False
    else:
        return None
    rows, cols = ids.shape[0], ids.shape[1]
    s0, s1 = ids.strides[0], ids.strides[1]
    out = cnp.PyArray_EMPTY(2, ids.shape, cnp.NPY_INT32, 0)
    dst = <int32_t*>_data(out)
    src = <const char*>_data(ids)
    lo = hi = (<const int64_t*>src)[0] if wide else (<const int32_t*>src)[0]
    with nogil:
        for b in range(rows):
            for i in range(cols):
                if wide:
                    value = (<const int64_t*>(src + b * s0 + i * s1))[0]
                else:
                    value = (<const int32_t*>(src + b * s0 + i * s1))[0]
                if value < lo:
                    lo = value
                if value > hi:
                    hi = value
                dst[b * cols + i] = <int32_t>value
    return out, lo, hi


# ---------------------------------------------------------------------- Qwen-VL positions
cdef inline int64_t _text_run(const int64_t* row, Py_ssize_t start, Py_ssize_t stop,
                              int64_t pad, int64_t first, int64_t* p0, int64_t* p1,
                              int64_t* p2, Py_ssize_t seq, int64_t max_pos) noexcept nogil:
    """Positions first, first + 1, ... for the non-pad tokens of row[start:stop] on the
    three axes; pads get 0 and do not count. Returns the new max position."""
    cdef Py_ssize_t i
    cdef int64_t count = 0, value
    for i in range(start, stop):
        if row[i] != pad:
            count += 1
            value = first + count - 1
        else:
            value = 0
        p0[i] = value
        p1[i] = value
        p2[i] = value
    return first + count - 1 if count else max_pos


cdef int _mrope(const int64_t* tokens, Py_ssize_t batch, Py_ssize_t seq, const int64_t* grid,
                Py_ssize_t n_images, int64_t image_token_id, int64_t video_token_id,
                int64_t vision_start_token_id, int64_t pad, int64_t merge, int64_t* positions,
                int64_t* deltas, int64_t* error) noexcept nogil:
    cdef Py_ssize_t b, i, end, start, c, k, image = 0
    cdef int64_t max_pos, first, t, h, w, gh, gw, count
    cdef const int64_t* row
    cdef int64_t* p0
    cdef int64_t* p1
    cdef int64_t* p2
    for b in range(batch):
        row = tokens + b * seq
        p0 = positions + b * seq
        p1 = positions + (batch + b) * seq
        p2 = positions + (2 * batch + b) * seq
        start = 0
        max_pos = 0
        k = 0  # pairs seen in this row (those inside an image's tokens too)
        for i in range(seq - 1):
            if row[i] != vision_start_token_id or (
                    row[i + 1] != image_token_id and row[i + 1] != video_token_id):
                continue
            end = i + 1
            k += 1
            if end < start:
                continue  # a pair inside the previous image's tokens
            if row[end] == video_token_id:
                error[0] = b
                error[1] = end
                return 1
            if image >= n_images:
                error[0] = b
                error[1] = end
                return 2
            t = grid[3 * image]
            h = grid[3 * image + 1]
            w = grid[3 * image + 2]
            image += 1
            first = max_pos + 1 if (k > 1 or b > 0) else 0
            max_pos = _text_run(row, start, end, pad, first, p0, p1, p2, seq, max_pos)
            first = max_pos + 1
            gh = h // merge
            gw = w // merge
            count = t * gh * gw
            if end + count > seq:
                error[0] = b
                error[1] = end
                error[2] = image
                error[3] = t
                error[4] = h
                error[5] = w
                return 3
            for c in range(count):
                p0[end + c] = first
                p1[end + c] = (c // gw) % gh + first
                p2[end + c] = c % gw + first
            if count > 0:
                max_pos = max(max_pos, first + gh - 1, first + gw - 1)
            start = end + count
        if start < seq:
            first = 0 if (max_pos == 0 and start == 0) else max_pos + 1
            max_pos = _text_run(row, start, seq, pad, first, p0, p1, p2, seq, max_pos)
        deltas[b] = max_pos + 1 - seq
    return 0


def mrope_rows(
    const int64_t[:, ::1] tokens, const int64_t[:, ::1] grid, int64_t image_token_id,
    int64_t video_token_id, int64_t vision_start_token_id, int64_t pad_token_id,
    int64_t merge, int64_t[:, :, ::1] positions, int64_t[::1] deltas, int64_t[::1] error,
):
    """Qwen-VL's 3-D rotary positions of a first prompt into ``positions`` [3, batch, seq]
    and ``deltas`` [batch] (see `genai.generation.vision_runner.mrope_positions`, which
    raises the errors). Returns 0, or a failure with ``error`` filled: 1 a video token (row,
    index); 2 more images than ``grid`` rows (row, index); 3 an image's tokens past the row's
    end (row, index, image number, t, h, w)."""
    cdef Py_ssize_t batch = tokens.shape[0], seq = tokens.shape[1]
    cdef Py_ssize_t n_images = grid.shape[0]
    cdef int rc
    if positions.shape[0] != 3 or positions.shape[1] != batch or positions.shape[2] != seq:
        raise ValueError("positions must be [3, batch, seq]")
    if deltas.shape[0] != batch or error.shape[0] < 6 or grid.shape[1] != 3:
        raise ValueError("deltas must be [batch], error [6], grid [n, 3]")
    if merge <= 0:
        raise ValueError(f"spatial_merge_size must be > 0, got {merge}")
    if batch == 0 or seq == 0:
        return 0
    with nogil:
        rc = _mrope(&tokens[0, 0], batch, seq, &grid[0, 0] if n_images else NULL, n_images,
                    image_token_id, video_token_id, vision_start_token_id, pad_token_id, merge,
                    &positions[0, 0, 0], &deltas[0], &error[0])
    return rc
