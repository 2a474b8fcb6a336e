# cython: language_level=3
"""The decode loop in C: feed pending tokens, run the session, choose and commit tokens.

`DecoderLoop` owns no policy: `genai.Generator` validates input, allocates the buffers (numpy
arrays, bound once to the session through `NativeSession`) and hands them over. A step
(`step`) or many steps (`steps`) then run without the GIL: input ids, attention mask and
position ids are written into the bound buffers, the mask is re-bound with its new length, the
session runs, the logits of each row's last real token are gathered, and the greedy choice is
committed with pad-after-EOS. Growing (past/present) KV caches are handed from the present
outputs to the past inputs without copies.

Return codes of the nogil methods: 0 = success, anything else = an error raised by
`raise_error` once the GIL is held again.
"""

cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memmove, memset

from genai._core.bookkeeping cimport (
    argmax_row,
    commit_row_tokens,
    grow_mask,
    load_index,
    prefill_rows,
    store_index,
    write_positions,
)
from genai._core.native_session cimport NS_MAX_DIMS, DeviceTensor, NativeSession
from genai._core.ort_api cimport ELEM_FLOAT, ELEM_FLOAT16, ELEM_INT32, ELEM_INT64
from genai._core.sampling cimport Sampler

import numpy as np

from genai.errors import GenerationError, NonFiniteLogitsError
from genai.runtime.buffers import aligned_zeros

cnp.import_array()

# Our own error codes (NativeSession's are > 0 for ORT errors, -1..-4 for its checks).
cdef enum:
    LOOP_ERR_NAN = -100
    LOOP_ERR_FULL = -101
    LOOP_ERR_NOTHING = -102
    LOOP_ERR_LOGITS = -103
    LOOP_NEED_GROW = -104  # not an error: the KV cache must grow before this run


cdef inline float half_to_float(uint16_t h) noexcept nogil:
    """IEEE 754 binary16 -> binary32."""
    cdef uint32_t sign = (<uint32_t>(h & 0x8000)) << 16
    cdef uint32_t exponent = (h >> 10) & 0x1F
    cdef uint32_t mantissa = h & 0x3FF
    cdef uint32_t bits
    cdef float result
    if exponent == 0:
        if mantissa == 0:
            bits = sign
        else:  # subnormal: normalise
            exponent = 127 - 15 + 1
            while (mantissa & 0x400) == 0:
                mantissa <<= 1
                exponent -= 1
            mantissa &= 0x3FF
            bits = sign | (exponent << 23) | (mantissa << 13)
    elif exponent == 0x1F:
        bits = sign | 0x7F800000 | (mantissa << 13)
    else:
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13)
    memcpy(&result, &bits, 4)
    return result


cdef inline void copy_logits_row(const void* src, int elem, Py_ssize_t offset, float* dst,
                                 Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef const uint16_t* half
    if elem == ELEM_FLOAT:
        memcpy(dst, (<const float*>src) + offset, n * sizeof(float))
    else:
        half = (<const uint16_t*>src) + offset
        for i in range(n):
            dst[i] = half_to_float(half[i])


def _elem_of(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype == np.int64:
        return ELEM_INT64
    if dtype == np.int32:
        return ELEM_INT32
    if dtype == np.float32:
        return ELEM_FLOAT
    if dtype == np.float16:
        return ELEM_FLOAT16
    raise TypeError(f"unsupported dtype {dtype}")


cdef void* _data(cnp.ndarray array):
    return cnp.PyArray_DATA(array)


cdef class DecoderLoop:
    """Per-step state and the nogil step of `genai.Generator` (see the module docstring)."""

    def __cinit__(self):
        self.kv_out = NULL
        self.kv_in = NULL
        self.n_kv_pairs = 0
        self.logprobs = NULL
        self.top_ids = NULL
        self.top_logprobs = NULL
        self.n_top = 0
        self.capture = False
        self.static_bound = False

    def __init__(
        self, NativeSession session, *, str input_ids, object attention_mask,
        object position_ids, str logits, int batch, int vocab, int max_length,
        int pad_id, object eos_ids, object id_dtype, object mask_dtype,
        object logits_dtype, list kv_pairs, Sampler sampler=None, int logprobs=-1,
        object grow_kv=None, Py_ssize_t kv_capacity=-1,
    ):
        """Allocate the loop's buffers. ``kv_pairs`` lists (present output, past input) names
        to hand over after each run (empty for a shared-buffer cache, bound by the caller).
        ``sampler``: None chooses by argmax; a `Sampler` runs the logits-processing chain.
        ``logprobs`` >= 0 (needs a sampler) records the chosen token's log-probability and
        that many top alternatives per step. ``grow_kv(needed, filled) -> capacity`` grows a
        shared-buffer KV cache holding ``kv_capacity`` positions (-1: no limit) before a run
        that would not fit; a KV cache with an ``attach_loop(loop)`` method, whose ``ensure``
        is passed as ``grow_kv``, is handed the loop (see `rewind`).

        ``session`` None: the model runs outside the loop (a runner of the caller's writes
        ``logits_rows`` and calls `set_logits_ready`); the loop only chooses and commits, and
        a run it is asked for fails with `GenerationError`."""
        cdef Py_ssize_t i
        self.sess = session
        self._arrays = {}
        self.batch, self.vocab, self.max_length = batch, vocab, max_length
        self.pad_id = self.prompt_pad = pad_id
        if session is None:
            if kv_pairs:
                raise ValueError("kv_pairs need a session")
            self.ids_in = self.mask_in = self.pos_in = self.logits_out = -1
        else:
            self.ids_in = session.input_index(input_ids)
            self.mask_in = session.input_index(attention_mask) if attention_mask else -1
            self.pos_in = session.input_index(position_ids) if position_ids else -1
            self.logits_out = session.output_index(logits)
        self.ids_elem = _elem_of(id_dtype)
        self.mask_elem = _elem_of(mask_dtype)
        self.logits_elem = _elem_of(logits_dtype)
        if self.logits_elem not in (ELEM_FLOAT, ELEM_FLOAT16):
            raise TypeError(f"logits must be float32 or float16, got {np.dtype(logits_dtype)}")

        def keep(name, array):
            self._arrays[name] = array
            return array

        zeros = aligned_zeros
        self.sequences = keep("sequences", zeros((batch, max_length), np.int32))
        self.ids_buf = _data(keep("input_ids", zeros(batch * max_length, id_dtype)))
        self.mask_buf = _data(keep("attention_mask", zeros(batch * max_length, mask_dtype)))
        self.pos_buf = _data(keep("position_ids", zeros(batch * max_length, mask_dtype)))
        self.next_position = <int64_t*>_data(keep("next_position", zeros(batch, np.int64)))
        self.last_index = <int32_t*>_data(keep("last_index", zeros(batch, np.int32)))
        self.logits_rows = keep("logits_rows", zeros((batch, vocab), np.float32))
        self.step_logits = _data(keep("step_logits", zeros((batch, 1, vocab), logits_dtype)))
        self.next_tokens = keep("next_tokens", zeros(batch, np.int32))
        self.done = keep("done", zeros(batch, np.uint8))
        self.eos_ids = keep("eos_ids", np.ascontiguousarray(eos_ids, dtype=np.int32))
        self.sampler = sampler
        self.grow = grow_kv
        self.kv_capacity = kv_capacity
        self.kv_rewind = None
        if logprobs >= 0:
            if sampler is None:
                raise ValueError("logprobs need a sampler")
            self.n_top = logprobs
            self.logprobs = <float*>_data(keep("logprobs", aligned_zeros(batch, np.float32)))
            self.top_ids = <int32_t*>_data(
                keep("top_ids", np.zeros((batch, max(logprobs, 1)), np.int32)))
            self.top_logprobs = <float*>_data(
                keep("top_logprobs", np.zeros((batch, max(logprobs, 1)), np.float32)))

        self.n_kv_pairs = len(kv_pairs)
        if self.n_kv_pairs:
            self.kv_out = <Py_ssize_t*>malloc(self.n_kv_pairs * sizeof(Py_ssize_t))
            self.kv_in = <Py_ssize_t*>malloc(self.n_kv_pairs * sizeof(Py_ssize_t))
            if self.kv_out == NULL or self.kv_in == NULL:
                raise MemoryError()
            for i, (present, past) in enumerate(kv_pairs):
                self.kv_out[i] = session.output_index(present)
                self.kv_in[i] = session.input_index(past)
        self.reset()
        # The KV cache whose `ensure` grows (a bound method) may follow the loop: its
        # `attach_loop(loop)` reads token counts (row_tokens) and sets `kv_rewind`.
        attach = getattr(getattr(grow_kv, "__self__", None), "attach_loop", None)
        if attach is not None:
            attach(self)

    def __dealloc__(self):
        free(self.kv_out)
        free(self.kv_in)

    def use_graph_capture(self, graph_id):
        """Run single-token steps as a captured graph: ``graph_id`` > 0 (unique among the
        generators of the session, e.g. `NativeSession.next_graph_id`) makes those runs bind
        input ids, attention mask ([batch, max_length]: ones, then zeros; the graph must take
        the total length from the mask's contents, not its shape) and position ids at fixed
        addresses, in the memory the session wants them (a device's, through
        `DeviceTensor`), and the logits output likewise; onnxruntime captures the graph at the
        first such run and replays it afterwards. Every other run (prompts, several tokens at
        once) runs uncaptured. Needs batch 1 and a shared-buffer KV cache (fixed addresses):
        whenever something is re-bound from Python (the cache grows into new buffers, an
        adapter's weights), the session captures anew under another graph id
        (`NativeSession.next_graph_id`; a cache allocated for ``max_length`` up front,
        ``kv_initial_capacity=0``, is captured once). ``graph_id`` -1: no run is captured (a
        session made with graph capture on, used by a generator that cannot)."""
        graph_id = int(graph_id)
        if self.sess is None:
            raise ValueError("graph capture needs a session")
        if graph_id == -1:
            self.sess.set_graph_capture(-1)
            self.capture = False
            return
        if graph_id <= 0:
            raise ValueError(f"graph_id must be > 0 or -1, got {graph_id}")
        if self.batch != 1:
            raise ValueError(f"graph capture runs batch 1 only, this loop has {self.batch} rows")
        if self.n_kv_pairs:
            raise ValueError("graph capture needs the shared-buffer KV cache "
                             "(past_present_share_buffer): this loop hands presents over")
        ids = self._arrays["input_ids"]
        mask = self._arrays["attention_mask"]
        self.ids_t = DeviceTensor((1, 1), ids.dtype, staging=ids[:1], keep_staging=True)
        self.sess.place_tensor(self.ids_t, False, self.ids_in)
        if self.mask_in >= 0:
            self.mask_t = DeviceTensor((1, self.max_length), mask.dtype,
                                       staging=mask[: self.max_length], keep_staging=True)
            self.sess.place_tensor(self.mask_t, False, self.mask_in)
        if self.pos_in >= 0:
            self.pos_t = DeviceTensor((1, 1), mask.dtype,
                                      staging=self._arrays["position_ids"][:1],
                                      keep_staging=True)
            self.sess.place_tensor(self.pos_t, False, self.pos_in)
        logits = self._arrays["step_logits"]
        self.logits_t = DeviceTensor(logits.shape, logits.dtype, staging=logits,
                                     keep_staging=True)
        self.sess.place_tensor(self.logits_t, True, self.logits_out)
        self.sess.set_graph_capture(graph_id)
        self.capture = True
        self.static_bound = False

    def static_tensors(self):
        """{name: DeviceTensor} bound by graph-captured steps (empty when capture is off)."""
        if not self.capture:
            return {}
        out = {"input_ids": self.ids_t, "logits": self.logits_t}
        if self.mask_t is not None:
            out["attention_mask"] = self.mask_t
        if self.pos_t is not None:
            out["position_ids"] = self.pos_t
        return out

    def reset(self):
        """Forget every token (a fresh generator)."""
        self.length = 0
        self.computed = 0
        self.mask_length = 0
        self.logits_ready = False
        self.all_done = False
        self.ran_once = False
        self.generated = False
        self.prompt_length = 0
        self.done[:] = 0

    # ------------------------------------------------------------------ Python-visible views
    def array(self, str name):
        """A view of one of the loop's buffers: sequences [batch, max_length], logits_rows
        [batch, vocab], next_tokens [batch], step_logits [batch, 1, vocab]."""
        return self._arrays[name]

    def row_tokens(self):
        """Each row's token count in the KV cache (its unmasked positions), int64 [batch]."""
        return np.asarray(self._arrays["next_position"]).copy()

    def input_view(self, str which):
        """The last run's input_ids / attention_mask / position_ids as a [batch, n] view."""
        if which not in ("input_ids", "attention_mask", "position_ids"):
            raise KeyError(which)
        width = self.mask_length if which == "attention_mask" else self.last_run_count
        return self._arrays[which][: self.batch * width].reshape(self.batch, width)

    # ------------------------------------------------------------------ state changes
    def append(self, tokens):
        """Copy [batch, n] tokens after the current ones (validated by the caller): a
        C-contiguous int32 array by rows in C (a prompt's ids; NumPy's slice assignment costs
        ~10 us there, right after earlier runs emptied the caches), anything else through
        NumPy."""
        cdef Py_ssize_t n = tokens.shape[1], b
        cdef cnp.ndarray array = tokens if isinstance(tokens, np.ndarray) else None
        cdef const int32_t* src
        if (array is not None and cnp.PyArray_TYPE(array) == cnp.NPY_INT32
                and cnp.PyArray_NDIM(array) == 2 and cnp.PyArray_IS_C_CONTIGUOUS(array)
                and array.shape[0] == self.batch and self.length + n <= self.max_length):
            src = <const int32_t*>_data(array)
            for b in range(self.batch if n else 0):
                memcpy(&self.sequences[b, self.length], src + b * n, n * sizeof(int32_t))
        else:
            np.asarray(self.sequences)[:, self.length:self.length + n] = tokens
        self.length += n
        self.prompt_length = self.length
        self.done[:] = 0
        self.all_done = False
        self.generated = False  # no step since these tokens

    def push_tokens(self, tokens, bint all_done):
        """Append tokens chosen outside the loop (beam search) at ``length`` for every row."""
        if self.length >= self.max_length:
            raise GenerationError("the sequence reached max_length")
        np.asarray(self.next_tokens)[:] = tokens
        np.asarray(self.sequences)[:, self.length] = tokens
        self.all_done = all_done
        self.length += 1
        self.generated = True
        self.logits_ready = False

    def set_logits_ready(self):
        """The caller wrote logits_array itself (set_logits)."""
        self.logits_ready = True

    def rewind(self, Py_ssize_t length, bint keep_last=False):
        """Keep the first ``length`` tokens; the KV of all but the last of them is kept so
        the next run recomputes that token's logits (``keep_last``: the KV of all of them
        that have it, for a caller that appends tokens before the next run: it then feeds
        only those). ``kv_rewind(before, after)``, when set, is called first with each row's
        token count (unmasked positions) before and after the rewind; if it raises, nothing
        changed."""
        cdef Py_ssize_t b, i, old = self.mask_length, kept, computed
        cdef int size = 8 if self.mask_elem == ELEM_INT64 else 4
        cdef bint wide = size == 8
        computed = min(self.computed, length if keep_last else max(length - 1, 0))
        kept = min(old, computed)
        # a row's token count is its unmasked columns (right padding is masked)
        after = np.zeros(self.batch, np.int64)
        cdef int64_t[::1] counts = after
        for b in range(self.batch):
            for i in range(kept):
                counts[b] += load_index(self.mask_buf, wide, b * old + i) != 0
        if self.kv_rewind is not None:
            self.kv_rewind(self.row_tokens(), after)
        self.length = length
        self.computed = computed
        if self.batch > 1 and kept < old:
            # keep each row's first `kept` mask columns: [batch, old] -> [batch, kept] in place
            for b in range(1, self.batch):
                memmove((<char*>self.mask_buf) + b * kept * size,
                        (<char*>self.mask_buf) + b * old * size, kept * size)
        self.mask_length = kept
        for b in range(self.batch):
            self.next_position[b] = counts[b]
        self.logits_ready = False
        self.all_done = False
        self.done[:] = 0

    def restore(self, tokens):
        """Start from a snapshot: ``tokens`` [batch, n] are the sequence so far and the KV
        cache (restored by the caller) holds the first n - 1 positions; the next run feeds
        the last token (its logits continue the sequence)."""
        cdef Py_ssize_t n = tokens.shape[1], b, i
        self.reset()
        np.asarray(self.sequences)[:, :n] = tokens
        self.length = n
        self.prompt_length = n
        self.computed = n - 1
        self.mask_length = n - 1
        for b in range(self.batch):
            self.next_position[b] = n - 1
            for i in range(n - 1):
                store_index(self.mask_buf, self.mask_elem == ELEM_INT64, b * (n - 1) + i, 1)

    def run(self, bint prompt, Py_ssize_t chunk=0):
        """Run the model on the pending tokens (GIL released). ``chunk`` > 0 (the reference's
        ``search.chunk_size``): the loop's first run, a batch-1 prompt of more tokens, runs
        ``chunk`` tokens per run, the first as the prompt and the others on top of it; the
        logits are the last run's."""
        cdef Py_ssize_t stop = self.length
        if not (prompt and chunk > 0 and self.batch == 1 and not self.ran_once
                and stop - self.computed > chunk):
            self._run_pending(prompt)
            return
        try:
            self.length = self.computed + chunk
            self._run_pending(True)
            while self.length < stop:
                self.length = min(self.length + chunk, stop)
                self._run_pending(False)
        finally:
            self.length = stop

    def _run_pending(self, bint prompt):
        cdef int rc
        while True:
            with nogil:
                rc = self.run_pending(prompt)
            if rc != LOOP_NEED_GROW:
                break
            self._grow_kv()
        if rc != 0:
            self.raise_error(rc)

    def _grow_kv(self):
        # (new KV buffers bound from Python: the session captures anew under another graph id)
        self.kv_capacity = self.grow(self.length, self.computed)

    def step(self):
        """One generation step: run if the logits are stale, choose, commit."""
        cdef int rc
        if self.logits_ready:
            rc = self.choose_and_commit()  # no model run: keep the GIL
        else:
            while True:
                with nogil:
                    rc = self.step_nogil()
                if rc != LOOP_NEED_GROW:
                    break
                self._grow_kv()
        if rc != 0:
            self.raise_error(rc)

    def steps(self, Py_ssize_t count):
        """Up to ``count`` steps in one GIL-free block; stops early when done. Returns the
        number of steps made."""
        cdef int rc = 0
        cdef Py_ssize_t made = 0
        while True:
            with nogil:
                while made < count and not self.all_done and self.length < self.max_length:
                    rc = self.step_nogil()
                    if rc != 0:
                        break
                    made += 1
            if rc != LOOP_NEED_GROW:
                break
            self._grow_kv()  # rare: back to Python to reallocate, then on without the GIL
            rc = 0
        if rc != 0:
            self.raise_error(rc)
        return made

    # ------------------------------------------------------------------ nogil core
    cdef int step_nogil(self) noexcept nogil:
        cdef int rc
        if not self.logits_ready:
            if self.computed >= self.length:
                self.error_message = b"no pending tokens to run"
                return LOOP_ERR_NOTHING
            rc = self.run_pending(False)
            if rc != 0:
                return rc
        return self.choose_and_commit()

    cdef int choose_and_commit(self) noexcept nogil:
        cdef Py_ssize_t b, best
        if self.length >= self.max_length:
            self.error_message = b"the sequence reached max_length"
            return LOOP_ERR_FULL
        if self.sampler is not None:
            if self.sampler.sample_rows_nogil(
                &self.logits_rows[0, 0], self.batch, &self.sequences[0, 0], self.max_length,
                self.length, self.prompt_length, &self.eos_ids[0], self.eos_ids.shape[0],
                &self.done[0], &self.next_tokens[0], self.logprobs,
                self.top_ids if self.n_top > 0 else NULL,
                self.top_logprobs if self.n_top > 0 else NULL, self.n_top,
            ) >= 0:
                self.error_message = b"logits contain NaN"
                return LOOP_ERR_NAN
        else:
            for b in range(self.batch):
                best = argmax_row(&self.logits_rows[b, 0], self.vocab)
                if best < 0:
                    self.error_message = b"logits contain NaN"
                    return LOOP_ERR_NAN
                self.next_tokens[b] = <int32_t>best
        self.all_done = commit_row_tokens(
            self.sequences, self.length, self.next_tokens, self.eos_ids, self.done, self.pad_id)
        # As the reference: the step that finishes the last row reports its tokens through
        # the next tokens but does not add them to the sequences.
        if not self.all_done:
            self.length += 1
        self.generated = True
        self.logits_ready = False
        return 0

    cdef int run_pending(self, bint prompt) noexcept nogil:
        cdef Py_ssize_t batch = self.batch, start = self.computed, stop = self.length
        cdef Py_ssize_t count = stop - start, b, i, total, _
        cdef int64_t shape[3]
        cdef int64_t out_shape[NS_MAX_DIMS]
        cdef size_t out_ndim = 0
        cdef void* out_data = NULL
        cdef int rc
        cdef bint wide = self.mask_elem == ELEM_INT64
        if count <= 0:
            self.error_message = b"no pending tokens to run"
            return LOOP_ERR_NOTHING
        if self.sess is None:
            self.error_message = b"this loop has no session: its model runs outside the loop"
            return LOOP_ERR_NOTHING
        if self.kv_capacity >= 0 and stop > self.kv_capacity:
            return LOOP_NEED_GROW  # before touching any state
        if not prompt and batch > 1 and count > 1:
            # Continuing a batch: one token per run (GroupQueryAttention takes several new
            # tokens on top of a past only at batch 1); the last run's logits are the ones kept.
            for i in range(count):
                self.length = start + i + 1
                rc = self.run_pending(False)
                if rc != 0:
                    self.length = stop
                    return rc
            return 0
        for b in range(batch):
            for i in range(count):
                store_index(self.ids_buf, self.ids_elem == ELEM_INT64, b * count + i,
                            self.sequences[b, start + i])
        if prompt:
            # Right-padded prompt: trailing pad tokens get mask 0 and position 0; the logits
            # kept are those of each row's last token that is not a pad id (the reference's
            # choice at batch 1 too, where no token is padding).
            prefill_rows(&self.sequences[0, 0], self.max_length, batch, count, self.prompt_pad,
                         self.mask_buf, self.pos_buf, count, wide, self.last_index,
                         self.next_position, self.pad_id)
            self.mask_length = count
        else:
            if batch == 1:  # the mask is all ones of the total length
                for i in range(self.mask_length, stop):
                    store_index(self.mask_buf, wide, i, 1)
                self.mask_length = stop
            else:  # each row's mask grows by a trailing 1 per token
                for _ in range(count):
                    grow_mask(self.mask_buf, wide, batch, self.mask_length)
                    self.mask_length += 1
            write_positions(self.pos_buf, wide, self.next_position, batch, count, count)
            for b in range(batch):
                self.last_index[b] = <int32_t>(count - 1)

        if self.capture and count == 1 and not prompt:
            rc = self.run_static()
            if rc != 0:
                return rc
            self.computed = stop
            self.last_run_count = count
            self.logits_ready = True
            self.ran_once = True
            if self.sampler is not None:
                self.sampler.maxima_valid = 0
            return 0
        self.static_bound = False  # the bindings below replace the static tensors

        shape[0] = batch
        shape[1] = count
        rc = self.sess.bind_input_ptr(self.ids_in, self.ids_buf, shape, 2, self.ids_elem)
        if rc == 0 and self.pos_in >= 0:
            rc = self.sess.bind_input_ptr(self.pos_in, self.pos_buf, shape, 2, self.mask_elem)
        if rc == 0 and self.mask_in >= 0:
            shape[1] = self.mask_length
            rc = self.sess.bind_input_ptr(self.mask_in, self.mask_buf, shape, 2, self.mask_elem)
        if rc == 0:
            if count == 1:
                shape[1] = 1
                shape[2] = self.vocab
                rc = self.sess.bind_output_ptr(self.logits_out, self.step_logits, shape, 3,
                                               self.logits_elem)
            else:
                rc = self.sess.bind_output_device_index(self.logits_out)
        if rc == 0:
            rc = self.sess.run_binding()
        if rc == 0 and self.n_kv_pairs:
            rc = self.sess.rebind_outputs_as_inputs(self.kv_out, self.kv_in, self.n_kv_pairs)
        if rc != 0:
            return rc

        if count == 1:
            for b in range(batch):
                copy_logits_row(self.step_logits, self.logits_elem, b * self.vocab,
                                &self.logits_rows[b, 0], self.vocab)
        else:
            rc = self.sess.output_value_shape(self.logits_out, out_shape, &out_ndim)
            if rc == 0:
                rc = self.sess.output_value_data(self.logits_out, &out_data)
            if rc != 0:
                return rc
            if (out_ndim != 3 or out_shape[0] != batch or out_shape[2] != self.vocab
                    or out_shape[1] < 1 or out_shape[1] > count):
                self.error_message = b"logits output has an unexpected shape"
                return LOOP_ERR_LOGITS
            total = out_shape[1]
            for b in range(batch):
                # fewer rows than tokens (a last-position or trimmed graph): the last row is
                # the run's last token's
                i = self.last_index[b] if total == count else total - 1
                copy_logits_row(out_data, self.logits_elem, (b * total + i) * self.vocab,
                                &self.logits_rows[b, 0], self.vocab)
        self.computed = stop
        self.last_run_count = count
        self.logits_ready = True
        self.ran_once = True
        if self.sampler is not None:
            self.sampler.maxima_valid = 0  # the rows were rewritten: drop load_logits' maxima
        return 0

    cdef int run_static(self) noexcept nogil:
        """One graph-captured single-token run at batch 1 (see use_graph_capture): the ids,
        mask and positions written by run_pending are in the tensors' staging arrays."""
        cdef int rc = 0
        cdef int size = 8 if self.mask_elem == ELEM_INT64 else 4
        if self.mask_t is not None and self.mask_length < self.max_length:
            # ones for the tokens so far, zeros after them (stale after a rewind otherwise)
            memset((<char*>self.mask_buf) + self.mask_length * size, 0,
                   (self.max_length - self.mask_length) * size)
        rc = self.sess.upload_tensor(self.ids_t)
        if rc == 0 and self.mask_t is not None:
            rc = self.sess.upload_tensor(self.mask_t)
        if rc == 0 and self.pos_t is not None:
            rc = self.sess.upload_tensor(self.pos_t)
        if rc == 0 and not self.static_bound:
            rc = self.sess.bind_input_tensor(self.ids_in, self.ids_t)
            if rc == 0 and self.mask_t is not None:
                rc = self.sess.bind_input_tensor(self.mask_in, self.mask_t)
            if rc == 0 and self.pos_t is not None:
                rc = self.sess.bind_input_tensor(self.pos_in, self.pos_t)
            if rc == 0:
                rc = self.sess.bind_output_tensor(self.logits_out, self.logits_t)
            if rc == 0:
                self.static_bound = True
        if rc == 0:
            rc = self.sess.run_binding_captured()
        if rc == 0:
            rc = self.sess.download_tensor(self.logits_t)
        if rc == 0:
            copy_logits_row(self.step_logits, self.logits_elem, 0, &self.logits_rows[0, 0],
                            self.vocab)
        return rc

    cdef object raise_error(self, int rc):
        message = (self.error_message.decode() if self.error_message != NULL else "")
        self.error_message = NULL
        if rc == LOOP_ERR_NAN:
            raise NonFiniteLogitsError(f"cannot choose a token: {message}")
        if rc in (LOOP_ERR_FULL, LOOP_ERR_NOTHING):
            raise GenerationError(message)
        if rc == LOOP_ERR_LOGITS:
            raise RuntimeError(message)
        if self.sess is None:
            raise RuntimeError(message or f"decode loop error {rc}")
        self.sess.raise_last_error()
