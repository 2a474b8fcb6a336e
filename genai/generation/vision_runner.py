"""Runs a vision-language model's three graphs for a generator (`genai.runtime.vision`).

As the reference's multimodal pipeline state does, per run:

* the first run after `VisionRunner.set_inputs` (a *prompt run*) runs the vision graph once on
  the pixel inputs (when the inputs announce image tokens, ``num_image_tokens``), and feeds its
  image features to the embedding graph; every later run feeds an empty ``[0, hidden]``
  features tensor (the ids are text from then on);
* the embedding graph turns the pending ids (image placeholders included) into
  ``inputs_embeds``; the decoder runs on them with the attention mask, positions and the KV
  cache (`genai.kv`: the shared buffer or the growing layout, bound to the decoder's binding).

One-token decode steps run natively once a Python one-token run has bound their buffers
(`genai._core.vision_loop.EmbedDecoderLoop`: the embedding graph on the new id, the decoder on its
``inputs_embeds``, without the GIL); the runner keeps its state in that loop (tokens computed, the
attention mask, mRoPE deltas), so both paths continue each other.

Positions: the decoder-only rules (`genai._core.decoder_loop`: trailing pads of a first prompt
get mask 0) for decoders without ``position_ids``; for the Qwen-VL family the 3-D mRoPE
position ids of `mrope_positions` (``[3, batch, seq]``) on the first run, then ``computed +
rope_delta[row] + i`` on all three axes with an all-ones mask, as the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from genai._core.bookkeeping import NO_PAD, prefill_inputs
from genai._core.vision_loop import (
    EmbedDecoderLoop,
    check_feature_rows,
    mrope_rows,
    prompt_ids,
)
from genai.errors import (
    GenerationError,
    InvalidArgumentError,
    ModelError,
    UnsupportedFeatureError,
)
from genai.generation.run_logits import copy_last_rows
from genai.kv.kv_cache import UPFRONT_KV_BYTES, GrowingKVCache, make_kv_cache, whole_cache_fits
from genai.runtime.vision import MROPE_TYPES, NEGATIVE_ID_TYPES

if TYPE_CHECKING:
    from genai.generation.search import SearchOptions
    from genai.runtime.model import Model

__all__ = [
    "UPFRONT_KV_BYTES",
    "MRopeSpec",
    "VisionRunner",
    "kv_initial_capacity",
    "mrope_positions",
    "tensor_array",
]

#: `VisionRunner.last_outputs` value of an output read on demand from the binding that made it
#: (`VisionRunner._made_by`): the decoder's prompt logits, a prompt's image features and
#: embeddings, which are used where ORT left them instead of being copied.
_IN_BINDING = np.zeros(0)
#: `VisionRunner.last_inputs` value of a prompt's input the loop wrote into its own buffer
#: (`EmbedDecoderLoop.bind_prompt_inputs`: the embedding's ids, mRoPE positions)
_IN_LOOP = np.zeros(0)


def kv_initial_capacity(io: Any, batch: int, max_length: int, search: SearchOptions) -> int:
    """The shared KV cache's initial capacity for ``search``: 0 (``max_length`` at once)
    when ``kv_initial_capacity`` is at its default and the whole cache takes at most
    `UPFRONT_KV_BYTES` (`genai.kv.kv_cache.whole_cache_fits`), else ``kv_initial_capacity``
    (a value set by the caller or the config is honoured as given)."""
    initial = search.kv_initial_capacity
    if initial != type(search).kv_initial_capacity:  # set by the caller (or the config)
        return initial
    return 0 if whole_cache_fits(io, batch, max_length) else initial


def tensor_array(value: Any) -> np.ndarray:
    """A NumPy array from a `genai.Tensor` (its read-only view: pixel values are not copied),
    a reference ``Tensor`` (``as_numpy``) or an array-like."""
    if isinstance(value, np.ndarray):
        return value
    to_array = getattr(type(value), "__array__", None)
    if to_array is not None:  # (called directly: np.asarray tries other protocols first)
        return np.asarray(to_array(value))
    as_numpy = getattr(value, "as_numpy", None)
    return np.asarray(as_numpy() if callable(as_numpy) else value)


class _AddressArray:
    """NumPy's view of ``shape`` elements of ``dtype`` at a raw address (the array interface,
    read-only); valid while the memory is."""

    def __init__(self, address: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.__array_interface__ = {
            "data": (address, True),
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "version": 3,
        }


def _output_view(binding: Any, name: str, dtype: np.dtype) -> np.ndarray:
    """``binding``'s output ``name`` of its last run where it lies (host memory), valid until
    the binding runs again or the output is re-bound: a prompt's logits ([batch, seq, vocab]),
    embeddings and image features are not copied."""
    shape, address = binding.output_value_info(name)
    if not address or not all(shape):
        return np.zeros(shape, dtype)
    # NumPy's array interface over the address (a ctypes array type per size cost ~0.1 ms)
    return np.asarray(_AddressArray(address, tuple(shape), dtype))


class MRopeSpec:
    """The config values Qwen-VL's 3-D positions depend on."""

    def __init__(self, config: Any) -> None:
        self.image_token_id = int(config.get("model.image_token_id", -1))
        self.video_token_id = int(config.get("model.video_token_id", -1))
        self.vision_start_token_id = int(config.get("model.vision_start_token_id", -1))
        self.pad_token_id = int(config.get("model.pad_token_id", 0))
        self.spatial_merge_size = int(config.get("model.vision.spatial_merge_size", 2))


def mrope_positions(
    tokens: np.ndarray, image_grid_thw: np.ndarray | None, spec: MRopeSpec
) -> tuple[np.ndarray, np.ndarray]:
    """Qwen-VL's 3-D rotary positions of a first prompt, as the reference computes them
    (Hugging Face's ``get_rope_index`` for images): ``(positions [3, batch, seq] int64,
    rope_deltas [batch])``.

    Per row: text runs get the same position on the temporal, height and width axes,
    counting on from the previous run (pads: 0, not counted); an image (a
    ``vision_start_token_id`` followed by ``image_token_id``) of grid (t, h, w) takes t * h/m *
    w/m positions whose axes are (start, start + row, start + column) over its merged grid
    (m = ``spatial_merge_size``). ``image_grid_thw`` rows are taken in order over the whole
    batch. ``rope_deltas[b]`` = max position + 1 - seq: later positions are ``index +
    delta``. As the reference, the first text run of every row after the first starts at 1.
    A pair inside the previous image's tokens is skipped (never in a real prompt). The loop
    runs in C (`genai._core.vision_loop.mrope_rows`).
    """
    tokens = np.ascontiguousarray(tokens, np.int64)
    if tokens.ndim != 2:
        raise InvalidArgumentError(f"input_ids must be [batch, seq], got {list(tokens.shape)}")
    batch, seq = tokens.shape
    grid = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw)
    grid = np.ascontiguousarray(grid.reshape(-1, 3), np.int64)
    merge = spec.spatial_merge_size
    positions = np.empty((3, batch, seq), np.int64)
    deltas = np.zeros(batch, np.int64)
    error = np.zeros(6, np.int64)
    failed = mrope_rows(
        tokens,
        grid,
        spec.image_token_id,
        spec.video_token_id,
        spec.vision_start_token_id,
        spec.pad_token_id,
        merge,
        positions,
        deltas,
        error,
    )
    if failed:
        _mrope_failure(failed, error, seq, merge)
    return positions, deltas


def _mrope_failure(failed: int, error: np.ndarray, seq: int, merge: int) -> None:
    """Raise the error of `mrope_rows`' failure code ``failed`` (``error``: its details)."""
    if failed == 1:
        raise UnsupportedFeatureError("video inputs (video_grid_thw) of Qwen-VL models")
    if failed == 2:
        raise InvalidArgumentError("Not enough image_grid_thw data for image tokens.")
    row, end, image, t, h, w = (int(x) for x in error)
    count = t * (h // merge) * (w // merge)
    raise InvalidArgumentError(
        f"image {image} of grid ({t}, {h}, {w}) needs {count} tokens from position "
        f"{end}, beyond the {seq} tokens of row {row}"
    )


class VisionRunner:
    """A generator's runs of a vision-language model (see the module docstring): writes each
    row's logits of its last real token into ``loop``'s logits rows, and hands ``loop`` the
    buffers of its native one-token steps."""

    def __init__(
        self,
        model: Model,
        batch: int,
        max_length: int,
        search: SearchOptions,
        pad_id: int,
        loop: EmbedDecoderLoop,
        *,
        padded: bool = True,
    ) -> None:
        graphs = model.vision
        assert graphs is not None
        self.model, self.graphs, self.io = model, graphs, model.io
        self.batch, self.max_length, self.pad_id = batch, max_length, pad_id
        #: the id a prompt's trailing padding has (`NO_PAD`: none; batch 1)
        self.prompt_pad = pad_id if padded else NO_PAD
        self.loop = loop
        self.logits_rows = loop.array("logits_rows")
        self.decoder = model.session.new_binding()
        model.bind_extra_inputs(self.decoder)
        self.embedding = graphs.embedding.new_binding()
        self.vision = graphs.vision.new_binding() if graphs.vision is not None else None
        #: the binding each output name comes from (`read_output` of an `_IN_BINDING` one)
        self._made_by = {
            model.io.logits: self.decoder,
            graphs.embedding_output: self.embedding,
            graphs.vision_features: self.vision,
        }
        self._features_out_dtype = (
            graphs.vision.output_dtypes[graphs.vision_features] if graphs.vision else None
        )
        #: (set_inputs key, vision graph input, its dtype) of each vision input
        vision_dtypes = graphs.vision.input_dtypes if graphs.vision else {}
        self._vision_feeds = [
            (key, name, vision_dtypes[name]) for key, name in graphs.vision_inputs.items()
        ]
        self.kv = make_kv_cache(
            model.io,
            model.provider,
            self.decoder,
            batch,
            max_length,
            search.past_present_share_buffer,
            initial_capacity=kv_initial_capacity(model.io, batch, max_length, search),
            growth_factor=search.kv_growth_factor,
        )
        self.hidden = int(model.config.decoder.get("hidden_size") or 0)
        emb_dtypes = graphs.embedding.input_dtypes
        self._ids_dtype = np.dtype(emb_dtypes[graphs.embedding_ids])
        self._features_dtype = np.dtype(emb_dtypes[graphs.embedding_features] or np.float32)
        dec_dtypes = model.session.input_dtypes
        self._embeds_dtype = np.dtype(dec_dtypes[graphs.decoder_embeds] or np.float32)
        #: the decoder takes the ids too (some exports do)
        self._decoder_ids = self.io.input_ids if self.io.input_ids in dec_dtypes else None
        io = self.io
        self._position_dtype = (
            np.dtype(dec_dtypes[io.position_ids]) if io.position_ids else io.mask_dtype
        )
        self.mrope = MRopeSpec(model.config) if model.type in MROPE_TYPES else None
        self._no_features = np.zeros((0, self.hidden), self._features_dtype)
        # one-token runs: the embedding graph writes into this buffer, the decoder reads it
        self._step_embeds = np.zeros((batch, 1, self.hidden), self._embeds_dtype)
        self._step_embeds_bound = False
        out_dtype = graphs.embedding.output_dtypes[graphs.embedding_output]
        self._embeds_out_dtype = out_dtype
        self._embeds_in_place = out_dtype is not None and np.dtype(out_dtype) == self._embeds_dtype
        # batch 1: the all-ones mask of every length is a prefix of one buffer
        self._ones = np.ones((1, max_length), self.io.mask_dtype)
        self._step_positions = np.zeros((3, batch, 1), self._position_dtype)
        #: decoder inputs of one-token runs bound once (their buffers are rewritten)
        self._step_buffers = {graphs.decoder_embeds} if self._embeds_in_place else set()
        if self.mrope is not None and io.position_ids:
            self._step_buffers.add(io.position_ids)
        self._step_bound = False
        self._fresh_presents = False
        self._growing = isinstance(self.kv, GrowingKVCache)
        if self._growing:
            pairs = self.kv.handover
            self._handover = ([p for p, _ in pairs], [q for _, q in pairs])
        self.decoder.bind_output_to_device(io.logits)
        self._logits_index = self.decoder.output_index(io.logits)
        # a trimmed decoder's long runs give their last rows; its hidden state gives every row
        # on demand (`read_output`, genai.runtime.trimmed_logits)
        trimmed = self.decoder.trimmed
        if trimmed is not None:
            self.decoder.bind_output_to_device(trimmed.hidden)
        self._step_ids = np.zeros((batch, 1), self._ids_dtype)
        # one-token runs write their logits here (float32 models), not in a new array
        self._step_logits = (
            np.zeros((batch, 1, io.vocab_size), np.float32)
            if io.logits_dtype == np.float32
            else None
        )
        self._logits_in_buffer = False
        #: one-token steps may run natively (every buffer they use is bound by one of ours)
        self._fast_ok = (
            io.attention_mask is not None
            and self._decoder_ids is None
            and self._embeds_in_place
            and self._step_logits is not None
            and (io.position_ids is None or self.mrope is not None)
        )
        if self.mrope is not None and io.position_ids is not None:
            shape = model.session.input_shapes.get(io.position_ids) or ()
            if len(shape) != 3 or shape[0] not in (3, -1) or isinstance(shape[0], str):
                raise ModelError(
                    f"{model.type} decoder input {io.position_ids!r} must be [3, batch, seq] "
                    f"(3-D mRoPE positions); the graph declares {list(shape)}"
                )
        if self._fast_ok:
            assert io.attention_mask is not None and self._step_logits is not None
            mrope_positions_in = self.mrope is not None and io.position_ids is not None
            growing = self._growing
            loop.attach(
                self.embedding,
                self.decoder,
                attention_mask=io.attention_mask,
                step_ids=self._step_ids,
                step_positions=self._step_positions if mrope_positions_in else None,
                step_logits=self._step_logits,
                kv_pairs=list(self.kv.handover) if growing else [],
                grow_kv=self.kv.ensure,  # (not a closure over self: no reference cycle)
                kv_capacity=self.kv.capacity,
                ones_mask=self.mrope is not None or batch == 1,
            )
        self._rope_deltas: np.ndarray | None = None
        #: a first prompt's three runs are one native call (`prepare_prompt`): the outputs are
        #: bound where ORT leaves them as the next graph's inputs, so their dtypes must match
        self._chain = self._fast_ok and (
            graphs.vision is None
            or (
                self._features_out_dtype is not None
                and np.dtype(self._features_out_dtype) == self._features_dtype
            )
        )
        if self._chain:
            # ORT allocates these outputs at every run (bound once; a one-token run re-binds
            # the embeddings to its buffer, `_step_embeds_bound`)
            self.embedding.bind_output_to_device(graphs.embedding_output)
            features_out = -1
            if self.vision is not None:
                self.vision.bind_output_to_device(graphs.vision_features)
                features_out = self.vision.output_index(graphs.vision_features)
            spec = self.mrope
            loop.chain_prompt(
                self.vision,
                features_out,
                self.embedding.input_index(graphs.embedding_features),
                self.embedding.output_index(graphs.embedding_output),
                self.decoder.input_index(graphs.decoder_embeds),
                self._logits_index,
                position_ids=io.position_ids if spec is not None else None,
                mrope=None
                if spec is None
                else (
                    spec.image_token_id,
                    spec.video_token_id,
                    spec.vision_start_token_id,
                    spec.pad_token_id,
                    spec.spatial_merge_size,
                ),
                ids=graphs.embedding_ids,
            )
            self._mrope_error = np.zeros(6, np.int64)
            self._loop_deltas = loop.array("rope_deltas")
            #: the loop's buffers of a prompt's inputs it binds itself: (name, shape per
            #: prompt length)
            self._loop_inputs = {}
            if loop.binds_prompt_ids:
                self._loop_inputs[graphs.embedding_ids] = ("input_ids", (batch,))
            if spec is not None and io.position_ids:
                self._loop_inputs[io.position_ids] = ("prompt_positions", (3, batch))
        #: the loop's buffers of each row's next position (decoders without position inputs)
        #: and of Qwen-VL's position offsets
        self._next_position = loop.array("next_position")
        #: inputs fed where another graph's run left them (`read_input` of an `_IN_BINDING`
        #: input): the embedding's image features, the decoder's embeddings
        self._fed_from = {
            graphs.embedding_features: (self.vision, graphs.vision_features),
            graphs.decoder_embeds: (self.embedding, graphs.embedding_output),
        }
        self.reset()

    # --- state kept in the loop ---------------------------------------------------------------
    @property
    def computed(self) -> int:
        """Tokens whose KV the cache holds."""
        return self.loop.computed

    @computed.setter
    def computed(self, value: int) -> None:
        self.loop.set_computed(value)

    @property
    def mask(self) -> np.ndarray:
        """The attention mask of the tokens so far, [batch, n] (a view of the loop's buffer)."""
        return self.loop.mask_view()

    @mask.setter
    def mask(self, value: np.ndarray) -> None:
        self.loop.set_mask(value)

    @property
    def next_position(self) -> np.ndarray:
        """Each row's next position after a decoder-only prompt (its real tokens): a view of
        the loop's buffer."""
        return self._next_position

    @next_position.setter
    def next_position(self, value: np.ndarray) -> None:
        self._next_position[:] = value

    @property
    def rope_deltas(self) -> np.ndarray | None:
        """Qwen-VL's per-row position offsets after the first prompt (None before it)."""
        return self._rope_deltas

    @rope_deltas.setter
    def rope_deltas(self, value: np.ndarray | None) -> None:
        self._rope_deltas = value
        if value is not None and self._fast_ok:
            self.loop.array("rope_deltas")[:] = value

    @property
    def fast(self) -> bool:
        """One-token steps run natively: a one-token run of ours bound their buffers."""
        return bool(self.loop.step_ready)

    @fast.setter
    def fast(self, value: bool) -> None:
        self.loop.step_ready = value

    # --- state --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every token and input (a fresh generator)."""
        self.mask = np.zeros((self.batch, 0), self.io.mask_dtype)
        self.next_position = np.zeros(self.batch, np.int64)
        self.rope_deltas = None
        self.computed = 0
        self.fast = False
        self.last_run_count = 0
        #: multimodal inputs of `set_inputs`, consumed by the next prompt run
        self.pending: dict[str, np.ndarray] = {}
        #: the image feature rows the pending prompt's vision run must make (-1: any), and
        #: the image placeholders of the pending prompt's ids (`_count_placeholders`)
        self.feature_rows = -1
        self._placeholders = -1
        self.last_inputs: dict[str, np.ndarray] = {}
        self.last_outputs: dict[str, np.ndarray] = {}

    def set_inputs(self, inputs: Mapping[str, Any]) -> np.ndarray:
        """Keep the multimodal inputs of a processor's output (pixel values, image sizes or
        grids, ``num_image_tokens``) for the next prompt run; returns its ``input_ids`` as
        int32 ``[batch, n]`` (image placeholders included) for the generator to append."""
        # keys(): the reference's NamedTensors does not iterate (its __getitem__ takes names)
        arrays = {str(name): tensor_array(inputs[name]) for name in inputs.keys()}  # noqa: SIM118
        if "input_ids" not in arrays:
            raise InvalidArgumentError("set_inputs needs 'input_ids' (a processor's output)")
        if "video_grid_thw" in arrays or "pixel_values_videos" in arrays:
            raise UnsupportedFeatureError("video inputs of vision-language models")
        ids = arrays.pop("input_ids")
        if ids.dtype.kind not in "iu":
            raise InvalidArgumentError(f"input_ids must be integers, got dtype {ids.dtype}")
        ids = ids.reshape(1, -1) if ids.ndim == 1 else ids
        if ids.ndim != 2 or ids.shape[0] != self.batch:
            raise InvalidArgumentError(
                f"input_ids has shape {list(ids.shape)}; the generator runs {self.batch} rows"
            )
        if ids.shape[1] == 0:  # as the reference: no tokens, nothing added (nor kept)
            return np.zeros((self.batch, 0), np.int32)
        # the int32 copy and the bounds in one pass (NumPy for other dtypes)
        checked = prompt_ids(ids)
        if checked is None:
            low, high = (int(ids.min()), int(ids.max())) if ids.size else (0, 0)
            ids = np.ascontiguousarray(ids, np.int32)
        else:
            ids, low, high = checked
        if high >= self.io.vocab_size:
            raise InvalidArgumentError(
                f"token id {high} is outside the vocabulary [0, {self.io.vocab_size})"
            )
        if low < 0 and self.model.type not in NEGATIVE_ID_TYPES:
            raise InvalidArgumentError(
                f"token id {low} is negative; {self.model.type} marks images with "
                "their own token id (negative placeholders are Phi-3 Vision's)"
            )
        images = arrays.get("num_image_tokens")
        if self.computed and images is not None and int(np.sum(images)) > 0:
            # the reference runs the vision graph on the first prompt only (later images would
            # silently get no features)
            raise UnsupportedFeatureError(
                "images in set_inputs after the first prompt: start a new generator (or "
                "rewind_to(0)) with every image in one prompt"
            )
        self.pending = arrays
        self._placeholders = self._count_placeholders(ids)
        self.fast = False  # the next run is ours (it consumes the pending inputs)
        return ids

    def _count_placeholders(self, ids: np.ndarray) -> int:
        """The image placeholders in ``ids``, each the place of one image feature row:
        Phi-3 Vision's negative ids, else ``model.image_token_id``'s (-1: the config names
        none, any count is taken)."""
        if self.model.type in NEGATIVE_ID_TYPES:
            return int(np.count_nonzero(ids < 0))
        token = int(self.model.config.get("model.image_token_id", -1))
        return int(np.count_nonzero(ids == token)) if token >= 0 else -1

    def _settle_kv(self) -> None:
        """A first prompt's native run leaves a growing cache's presents -> pasts hand-over
        for later (`EmbedDecoderLoop.hand_over_kv`); make it before the KV is run, read or
        changed."""
        if self.loop.kv_pending:
            self.loop.hand_over_kv()

    @property
    def nbytes(self) -> int:
        """Bytes of the KV cache."""
        self._settle_kv()
        return self.kv.nbytes

    def used_bytes(self) -> int:
        """Bytes the computed tokens occupy."""
        self._settle_kv()
        return self.kv.used_bytes(self.computed)

    def rewind(self, length: int) -> None:
        """Keep the KV of the first ``length - 1`` tokens (the next run recomputes the last
        one's logits); mRoPE deltas stay (as the reference, which only shortens its shapes)."""
        computed = min(self.computed, max(length - 1, 0))
        self._settle_kv()
        self.kv.truncate(computed)
        self._fresh_presents = True
        self.fast = False
        kept = min(self.mask.shape[1], computed)
        self.mask = np.ascontiguousarray(self.mask[:, :kept])
        self.next_position = self.mask.sum(axis=1, dtype=np.int64)
        self.computed = computed

    def snapshot(self, positions: int) -> list[np.ndarray]:
        """Copies of the KV of the first ``positions`` tokens (and the mRoPE deltas)."""
        self._settle_kv()
        arrays = self.kv.export(positions)
        if self.mrope is not None:
            deltas = self.rope_deltas if self.rope_deltas is not None else np.zeros(self.batch)
            arrays.append(np.asarray(deltas, np.int64).copy())
        return arrays

    def restore(self, arrays: list[np.ndarray], length: int) -> None:
        """Continue from a `snapshot` of ``length - 1`` tokens; the last token runs next."""
        arrays = list(arrays)
        deltas = arrays.pop() if self.mrope is not None else None
        self._settle_kv()  # (before the load replaces it)
        self.kv.load(arrays, length)
        self._fresh_presents = True
        self.fast = False
        self.rope_deltas = deltas
        self.computed = length - 1
        self.mask = np.ones((self.batch, length - 1), self.io.mask_dtype)
        self.next_position = np.full(self.batch, length - 1, np.int64)

    # --- runs ---------------------------------------------------------------------------------
    def feed(self, tokens: np.ndarray, prompt: bool) -> None:
        """Run the graphs on ``tokens`` ``[batch, count]``, every row's pending tokens
        (``prompt``: the first tokens of the sequences, rows right-padded), from Python,
        writing the logits rows (the caller marks them ready). A first prompt the loop can
        run in one native call goes there instead (`prepare_prompt`, by the driver)."""
        count = tokens.shape[1]
        if not prompt and self.batch > 1 and count > 1:
            for column in range(count):
                self.feed(tokens[:, column : column + 1], False)
            return
        first_run = prompt  # a new sequence (also after rewind_to(0)): images, positions
        features = self._features(first_run)
        embeds = self._embed(tokens, features)
        fed, last = self._positions(tokens, prompt, first_run)
        self._decode(tokens, embeds, fed, last, count)

    def prepare_prompt(self, tokens: np.ndarray) -> bool | None:
        """Bind every input of a first prompt's runs (``tokens``: the loop's pending ones)
        and write the runner's records of them, for the loop's one native call of its
        graphs (`EmbedDecoderLoop.run_prompt`: vision, embedding and decoder, each output
        bound where ORT left it as the next graph's input; then `finish_prompt` if it
        returns False). Returns whether the prompt has images (run_prompt's
        ``with_images``), or None, nothing done, when the prompt runs from Python (`feed`):
        a one-token prompt, a loop that runs no steps natively, images of different grids
        (run one by one). The caller makes the native call at once, with as little Python
        as possible after it (right after the runs Python costs 10-20x: cold caches)."""
        count = tokens.shape[1]
        if count < 2 or not self._chain:
            return None
        graphs, embedding, io = self.graphs, self.embedding, self.io
        pending, self.pending = self.pending, {}
        fed = self._vision_inputs(pending)
        inputs = self.last_inputs
        grid_name = graphs.vision_inputs.get("image_grid_thw", "")
        if fed is not None:
            if self._grids_differ(fed):
                self.pending = pending
                return None
            vision = self.vision
            assert vision is not None
            for name, value in fed.items():
                vision.bind_input(name, value)
            inputs.update(fed)
            inputs[graphs.embedding_features] = _IN_BINDING
        else:
            embedding.bind_input(graphs.embedding_features, self._no_features)
            inputs[graphs.embedding_features] = self._no_features
        if self.loop.binds_prompt_ids:
            inputs[graphs.embedding_ids] = _IN_LOOP
        else:
            ids = np.ascontiguousarray(tokens, self._ids_dtype)
            embedding.bind_input(graphs.embedding_ids, ids)
            inputs[graphs.embedding_ids] = ids
        if self._step_embeds_bound:
            embedding.bind_output_to_device(graphs.embedding_output)
            self._step_embeds_bound = False
        self._bind_decoder(tokens, {}, count)
        # the mask, positions and each row's last token, bound by the loop
        failed = self.loop.bind_prompt_inputs(inputs.get(grid_name), self._mrope_error)
        if failed:
            assert self.mrope is not None
            _mrope_failure(failed, self._mrope_error, count, self.mrope.spatial_merge_size)
        if self.mrope is not None:
            self._rope_deltas = self._loop_deltas
            if io.position_ids:
                inputs[io.position_ids] = _IN_LOOP
        self._prompt_length = count
        # what the runs feed and make, where they leave it (read_input / read_output)
        inputs[graphs.decoder_embeds] = _IN_BINDING
        outputs = self.last_outputs
        if fed is not None:
            outputs[graphs.vision_features] = _IN_BINDING
        outputs[graphs.embedding_output] = _IN_BINDING
        outputs[io.logits] = _IN_BINDING
        self.last_run_count = count
        self.fast = False
        return fed is not None

    def finish_prompt(self, count: int) -> None:
        """After `EmbedDecoderLoop.run_prompt` returned False (a logits output of an
        unexpected shape): read the rows from the output (`copy_last_rows` names the
        problem) and count the ``count`` tokens."""
        io = self.io
        logits = _output_view(self.decoder, io.logits, io.logits_dtype)
        last = self.loop.array("last_index")
        copy_last_rows(logits, self.logits_rows, last, count, io.logits)
        self.computed += count

    def _vision_inputs(self, pending: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The vision graph's inputs from ``pending`` (a first prompt's), None when it has no
        images: ``num_image_tokens`` adds up to 0, or, without it, no pixel values (as the
        reference, which then runs the vision graph on the pixels it has). Sets
        `feature_rows`, the image feature rows the vision graph must make: one per image
        placeholder of the prompt (-1: not known)."""
        tokens = pending.get("num_image_tokens")
        self.feature_rows = -1
        if tokens is None:
            pixels = pending.get("pixel_values")
            if pixels is None or pixels.size == 0:
                return None
        elif int(tokens.sum()) <= 0:
            return None
        self.feature_rows = self._placeholders
        if self.vision is None:
            raise ModelError(f"{self.model.config.file} has no model.vision graph for images")
        fed = {}
        for key, name, dtype in self._vision_feeds:
            value = pending.get(key, pending.get(name))
            if value is None:
                raise InvalidArgumentError(f"the vision graph needs {key!r}; set_inputs has none")
            fed[name] = np.ascontiguousarray(value, dtype)
        return fed

    def _grids_differ(self, fed: dict[str, np.ndarray]) -> bool:
        """Several images of different grids (each runs alone, as the reference)."""
        graphs = self.graphs
        grid_name = graphs.vision_inputs.get("image_grid_thw")
        grid = fed.get(grid_name) if grid_name else None
        return (
            grid is not None
            and "pixel_values" in graphs.vision_inputs
            and len(grid) > 1
            and len(np.unique(grid, axis=0)) > 1
        )

    def _features(self, first_run: bool) -> np.ndarray:
        """The image features for this run: the vision graph's output on the pending inputs
        for a first run with images, else ``[0, hidden]``."""
        pending, self.pending = self.pending, {}
        fed = self._vision_inputs(pending) if first_run else None
        if fed is None:
            return self._no_features
        return np.ascontiguousarray(self._run_vision(fed), self._features_dtype)

    def _run_vision(self, fed: dict[str, np.ndarray]) -> np.ndarray:
        graphs, vision = self.graphs, self.vision
        assert vision is not None and graphs.vision is not None
        self.last_inputs.update(fed)
        grid_name = graphs.vision_inputs.get("image_grid_thw")
        pixels_name = graphs.vision_inputs.get("pixel_values")
        if self._grids_differ(fed):
            assert grid_name is not None and pixels_name is not None
            grid = fed[grid_name]
            # as the reference: images of different grids run one by one; the processor pads
            # every image's patches to the largest image's count (rows [i * stride, ...))
            pixels = fed[pixels_name]
            sizes = [int(np.prod(row)) for row in grid]
            stride = 0
            if len(pixels) != sum(sizes) and len(pixels) % len(grid) == 0:
                stride = len(pixels) // len(grid)
            parts, offset = [], 0
            for index, (row, patches) in enumerate(zip(grid, sizes, strict=True)):
                start = index * stride if stride else offset
                if start + patches > len(pixels):
                    raise InvalidArgumentError(
                        f"pixel_values has {len(pixels)} patches; image {index} of grid "
                        f"{row.tolist()} needs rows up to {start + patches}"
                    )
                one = dict(fed)
                one[pixels_name] = np.ascontiguousarray(pixels[start : start + patches])
                one[grid_name] = np.ascontiguousarray(row.reshape(1, 3))
                parts.append(self._run_graph(vision, one, graphs.vision_features))
                offset += patches
            features = np.concatenate(parts, axis=0)
            self.last_outputs[graphs.vision_features] = features
        else:
            # the features are used where ORT left them (read before the vision graph runs
            # again: only a later first prompt does)
            features = self._run_in_place(
                vision, fed, graphs.vision_features, self._features_out_dtype
            )
            self.last_outputs[graphs.vision_features] = _IN_BINDING
        check_feature_rows(features.shape, self.feature_rows)
        return features

    @staticmethod
    def _run_graph(binding: Any, fed: dict[str, np.ndarray], output: str) -> np.ndarray:
        for name, value in fed.items():
            binding.bind_input(name, value)
        binding.bind_output_to_device(output)
        binding.run()
        return binding.get_output(output)

    @classmethod
    def _run_in_place(
        cls, binding: Any, fed: dict[str, np.ndarray], output: str, dtype: Any
    ) -> np.ndarray:
        """`_run_graph`, but the output is a view of the value ORT allocated (valid until the
        binding's output is re-bound or it runs again), not a copy; a copy when its dtype is
        unknown."""
        if dtype is None:
            return cls._run_graph(binding, fed, output)
        for name, value in fed.items():
            binding.bind_input(name, value)
        binding.bind_output_to_device(output)
        binding.run()
        return _output_view(binding, output, np.dtype(dtype))

    def _embed(self, tokens: np.ndarray, features: np.ndarray) -> np.ndarray:
        graphs, binding = self.graphs, self.embedding
        step = tokens.shape[1] == 1 and self._embeds_in_place and features is self._no_features
        if step:  # fixed buffers bound once; the embeddings written in place for the decoder
            self._step_ids[:] = tokens
            fed = {graphs.embedding_ids: self._step_ids, graphs.embedding_features: features}
            if not self._step_embeds_bound:
                for name, value in fed.items():
                    binding.bind_input(name, value)
                # (this releases a prompt's embeddings, which the decoder no longer reads)
                self.last_inputs.pop(graphs.decoder_embeds, None)
                binding.bind_output(graphs.embedding_output, self._step_embeds)
                self._step_embeds_bound = True
            binding.run()
            embeds = self._step_embeds
            self.last_outputs[graphs.embedding_output] = embeds
        else:
            self._step_embeds_bound = False
            fed = {
                graphs.embedding_ids: np.ascontiguousarray(tokens, self._ids_dtype),
                graphs.embedding_features: features,
            }
            # the decoder reads the embeddings where ORT left them (no copy)
            embeds = self._run_in_place(
                binding, fed, graphs.embedding_output, self._embeds_out_dtype
            )
            self.last_outputs[graphs.embedding_output] = _IN_BINDING
        self.last_inputs.update(fed)
        return np.ascontiguousarray(embeds, self._embeds_dtype)

    def _positions(
        self, tokens: np.ndarray, prompt: bool, first_run: bool
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The mask and positions of this run, and each row's index of its last real token."""
        io, b, count = self.io, self.batch, tokens.shape[1]
        last = np.full(b, count - 1, np.int32)
        positions: np.ndarray
        if self.mrope is not None:
            if first_run:
                grid = self.last_inputs.get(self.graphs.vision_inputs.get("image_grid_thw", ""))
                positions, self.rope_deltas = mrope_positions(tokens, grid, self.mrope)
                self.mask = (tokens != self.mrope.pad_token_id).astype(io.mask_dtype)
                if prompt:
                    prefill_inputs(
                        np.ascontiguousarray(tokens, np.int32),
                        self.pad_id,
                        np.zeros((b, count), io.mask_dtype),
                        np.zeros((b, count), io.mask_dtype),
                        last,
                    )
            else:
                assert self.rope_deltas is not None
                if count == 1:
                    positions = self._step_positions
                    positions[:] = (self.computed + self.rope_deltas)[None, :, None]
                else:
                    base = self.computed + self.rope_deltas[:, None] + np.arange(count)[None, :]
                    positions = np.broadcast_to(base, (3, b, count))
                total = self.computed + count
                self.mask = self._ones[:, :total] if b == 1 else np.ones((b, total), io.mask_dtype)
        elif prompt:  # the loop's own kernel: trailing pads get mask 0 and position 0
            self.mask = np.zeros((b, count), io.mask_dtype)
            positions = np.zeros((b, count), io.mask_dtype)
            prefill_inputs(
                np.ascontiguousarray(tokens, np.int32),
                self.prompt_pad,
                self.mask,
                positions,
                last,
                self.pad_id,
            )
            self.next_position = self.mask.sum(axis=1, dtype=np.int64)
        else:
            if b == 1:
                self.mask = self._ones[:, : self.mask.shape[1] + count]
            else:
                self.mask = np.concatenate([self.mask, np.ones((b, count), io.mask_dtype)], axis=1)
            positions = self.next_position[:, None] + np.arange(count)[None, :]
            self.next_position = self.next_position + count
        fed = {}
        if io.attention_mask:
            fed[io.attention_mask] = np.ascontiguousarray(self.mask)
        if io.position_ids:
            fed[io.position_ids] = np.ascontiguousarray(positions, self._position_dtype)
        return fed, last

    def _decode(
        self,
        tokens: np.ndarray,
        embeds: np.ndarray,
        fed: dict[str, np.ndarray],
        last: np.ndarray,
        count: int,
    ) -> None:
        io, decoder = self.io, self.decoder
        fed[self.graphs.decoder_embeds] = embeds
        to_buffer = self._bind_decoder(tokens, fed, count)
        step = count == 1
        if not to_buffer and self._fast_ok:
            # run, hand over and copy the last rows in one native call: Python right after a
            # long run is slow (cold caches); see EmbedDecoderLoop.run_prompt_decoder
            copied = self.loop.run_prompt_decoder(self._logits_index, last, count)
        else:
            decoder.run()
            if self._growing:
                decoder.rebind_outputs_as_inputs_py(*self._handover)
            copied = False
        if not copied:
            logits = (
                self._step_logits
                if to_buffer
                else _output_view(decoder, io.logits, io.logits_dtype)
            )
            copy_last_rows(logits, self.logits_rows, last, count, io.logits)
        # a prompt's logits stay in the binding's output (read on demand, never copied whole)
        self.last_outputs[io.logits] = self._step_logits if to_buffer else _IN_BINDING
        self.last_inputs.update(fed)
        self.computed += count
        self.last_run_count = count
        self.fast = (
            self._fast_ok
            and step
            and self._step_embeds_bound
            and (self.mrope is None or self.rope_deltas is not None)
        )

    def _bind_decoder(self, tokens: np.ndarray, fed: dict[str, np.ndarray], count: int) -> bool:
        """Make room in the KV cache and bind the decoder's inputs ``fed`` (and the ids, for
        exports that take them) and its outputs for a run of ``count`` tokens; returns
        whether the logits go to the one-token buffer."""
        io, decoder = self.io, self.decoder
        if self.computed + count > self.max_length:
            raise GenerationError(f"the sequence would exceed max_length {self.max_length}")
        self._settle_kv()
        self.loop.kv_capacity = self.kv.ensure(self.computed + count, self.computed)
        if self._decoder_ids:
            fed[self._decoder_ids] = np.ascontiguousarray(tokens, io.id_dtype)
        step = count == 1
        for name, value in fed.items():
            # one-token runs read fixed buffers (embeddings, positions): bound once
            if not (step and self._step_bound and name in self._step_buffers):
                decoder.bind_input(name, value)
        self._step_bound = step
        to_buffer = step and self._step_logits is not None
        if to_buffer and not self._logits_in_buffer:
            decoder.bind_output(io.logits, self._step_logits)
        elif not to_buffer and self._logits_in_buffer:
            decoder.bind_output_to_device(io.logits)
        self._logits_in_buffer = to_buffer
        if self._growing and self._fresh_presents:  # after a rewind re-bound the pasts
            for present, _ in self.kv.handover:
                decoder.bind_output_to_device(present)
            self._fresh_presents = False
        return to_buffer

    # --- reading ------------------------------------------------------------------------------
    def read_output(self, name: str) -> np.ndarray | None:
        """A copy of the last run's output ``name`` (logits, inputs_embeds, image_features, a
        present); None when there is none."""
        value = self.last_outputs.get(name)
        if value is _IN_BINDING:
            output = self._made_by[name].get_output(name)
            if name == self.io.logits:  # a trimmed run's every row, from its hidden state
                return self.model.every_logits_row(self.decoder, output, self.last_run_count)
            return output
        if value is not None:
            return value.copy()
        self._settle_kv()
        return self.kv.read(name)

    def read_input(self, name: str) -> np.ndarray | None:
        """A copy of what the last runs fed as ``name`` (ids, mask, positions, pixel inputs,
        inputs_embeds, a past)."""
        if name == self.io.attention_mask:
            return np.array(self.mask)  # (native steps grow it in the loop's buffer)
        value = self.last_inputs.get(name)
        if value is _IN_BINDING:  # where the graph that made it left it
            binding, output = self._fed_from[name]
            return binding.get_output(output)
        if value is _IN_LOOP:  # the loop's buffer of a prompt's input
            buffer, rows = self._loop_inputs[name]
            shape = (*rows, self._prompt_length)
            size = int(np.prod(shape))
            return np.array(self.loop.array(buffer)[:size].reshape(shape))
        if value is not None:
            return np.array(value)
        self._settle_kv()
        return self.kv.read(name)
