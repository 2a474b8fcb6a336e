"""The static KV cache of QNN-style windowed models, slid by the engine.

``model.decoder.sliding_window`` with ``slide_key_value_cache`` and ``slide_inputs`` (the
reference's ``WindowedKeyValueCache``, ``WindowedInputIDs`` and ``WindowedPositionInputs``)
describes graphs exported for NPUs that want fixed shapes: every run sees the same context of
N = ``model.context_length`` positions, split between a past of N - S positions and the S
tokens the run feeds (S = ``window_size`` = W while a prompt is fed window by window, 1 while
generating). Per layer:

* ``past key``   ``[kv_heads, batch, head_size, N - S]`` (keys transposed: sequence last),
* ``past value`` ``[kv_heads, batch, N - S, head_size]``,
* ``present``    the same with S positions: the K/V of the tokens just fed.

Before the first run the pasts hold ``pad_value`` everywhere (masked out by the attention
mask). After each run the cache *slides*: the next past is the last N - S' positions of
[past, present], S' the next run's token count (`slide`) — W positions dropped per prompt
window, then W - 1 once when generation starts (N - W -> N - 1), then one per token. The
attention mask (`genai.windowed_inputs`) marks which of the N positions hold real tokens.

`SlidingWindowSpec` is what the config and the graph say (validated once per model);
`WindowedKVCache` holds the arrays, binds them to a session and slides them.

Static shapes (a provider with ``static_shapes``, e.g. QNN's HTP): one graph cannot serve both
run lengths with fixed dimensions, so `genai.Model` builds one session per run length from the
same file, `static_shape_overrides` saying which symbolic dimensions each fixes (S = W and
N - W for prompt windows, S = 1 and N - 1 for tokens); `genai.generation.windowed_runner` runs each
window on the session of its length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from genai.errors import ConfigError, InvalidArgumentError, SearchOptionError
from genai.runtime.config import window_slides

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.runtime.config import Config
    from genai.runtime.model import DecoderIO

__all__ = [
    "SlidingWindowSpec",
    "WindowedKVCache",
    "engine_slides",
    "slide",
    "sliding_window_spec",
    "static_shape_overrides",
]

#: The sequence axis of a key and of a value tensor.
KEY_AXIS, VALUE_AXIS = 3, 2


@dataclass(frozen=True)
class SlidingWindowSpec:
    """A windowed model's contract (``model.decoder.sliding_window`` + the graph)."""

    #: W: tokens per prompt run.
    window: int
    #: N: positions every run sees (past + current), ``model.context_length``.
    context: int
    #: The token id that marks padding in the prompt windows (``model.pad_token_id``).
    pad_token: int
    #: What the pasts hold before any run (``sliding_window.pad_value``).
    pad_value: int
    #: ``"right"``: a prompt is left-padded to whole windows (it ends where a window ends);
    #: ``"left"``: right-padded.
    alignment: str
    #: The batch the graph fixes (axis 1 of the KV tensors), or None when it is symbolic.
    graph_batch: int | None

    def check_search(self, *, batch_size: int, num_beams: int) -> None:
        """Raise `SearchOptionError` for search options this model cannot run."""
        if num_beams > 1:
            raise SearchOptionError(
                "beam search (num_beams > 1) does not work with a windowed model "
                "(sliding_window.slide_key_value_cache); the reference refuses it too"
            )
        if self.graph_batch is not None and batch_size != self.graph_batch:
            raise SearchOptionError(
                f"batch_size {batch_size}: this windowed model's graph fixes the batch at "
                f"{self.graph_batch} (axis 1 of its KV tensors)"
            )
        if batch_size > 1 and self.alignment != "right":
            raise SearchOptionError(
                f"batch_size {batch_size} needs sliding_window.alignment 'right' (each row's "
                f"prompt ends at the last column); this model has {self.alignment!r}"
            )

    def padded_length(self, tokens: int) -> int:
        """A prompt of ``tokens`` tokens padded to whole windows."""
        return -(-tokens // self.window) * self.window


def engine_slides(config: Config) -> bool:
    """Whether ``model.decoder.sliding_window`` asks the engine to slide the cache and the
    inputs (a windowed model, this module)."""
    return window_slides(config.decoder.get("sliding_window"))


def static_shape_overrides(config: Config) -> dict[int, dict[str, int]]:
    """For a windowed model on a provider that wants static shapes: per run length S (the
    window W, then 1), the symbolic dimensions of the decoder graph to fix
    (``free_dimension_overrides``): the sequence dimension of ``input_ids`` /
    ``position_ids`` to S and the past dimension of each past key / value to N - S. Empty for
    a model that is not windowed. Raises `ConfigError` when the graph leaves one of those
    dimensions unnamed (it cannot be fixed by name) or uses one name for both."""
    if not engine_slides(config):
        return {}
    import onnx  # lazy: `import genai` does not load onnx; only windowed models read the graph

    block = config.decoder["sliding_window"]
    window, context = int(block["window_size"]), int(config.get("model.context_length"))
    filename = config.decoder.get("filename", "model.onnx")
    where = f"{filename} ({config.file})"
    data = config.model_data(filename)
    if data is not None:
        graph = onnx.load_model_from_string(data).graph
    else:
        path = config.resolve_file(filename, "model.decoder.filename")
        graph = onnx.load_model(str(path), load_external_data=False).graph
    inputs = {i.name: i.type.tensor_type.shape.dim for i in graph.input}
    names_in = config.decoder.get("inputs", {})
    layers = int(config.decoder.get("num_hidden_layers", 0))
    key_t = names_in.get("past_key_names", "past_key_values.%d.key")
    value_t = names_in.get("past_value_names", "past_key_values.%d.value")
    seq_axes = [(names_in.get("input_ids", "input_ids"), 1)]
    seq_axes.append((names_in.get("position_ids", "position_ids"), 1))
    past_axes = [(key_t.replace("%d", str(i)), KEY_AXIS) for i in range(layers)]
    past_axes += [(value_t.replace("%d", str(i)), VALUE_AXIS) for i in range(layers)]

    def symbols(axes: list[tuple[str, int]]) -> set[str]:
        found: set[str] = set()
        for name, axis in axes:
            dims = inputs.get(name)
            if dims is None or len(dims) <= axis or dims[axis].HasField("dim_value"):
                continue  # absent or fixed: sliding_window_spec says what is wrong
            if not dims[axis].dim_param:
                raise ConfigError(
                    f"axis {axis} of {name!r} in {where} is an unnamed dynamic dimension; a "
                    "provider with static shapes fixes a windowed model's sequence and past "
                    "dimensions by name (free_dimension_overrides)"
                )
            found.add(dims[axis].dim_param)
        return found

    seq, past = symbols(seq_axes), symbols(past_axes)
    if seq & past:
        raise ConfigError(
            f"{where} names the sequence and the past dimension alike ({sorted(seq & past)}): "
            "they cannot be fixed to S and N - S"
        )
    return {
        count: {**dict.fromkeys(sorted(seq), count), **dict.fromkeys(sorted(past), context - count)}
        for count in (window, 1)
    }


def sliding_window_spec(
    config: Config, io: DecoderIO, session: NativeSession
) -> SlidingWindowSpec | None:
    """The windowed contract of a model whose ``sliding_window`` block slides the cache and
    the inputs; None for any other model. Raises `ConfigError` when the graph does not have
    the windowed shapes (see the module docstring): S and the past length symbolic in
    ``session``'s graph, or, with one static session per run length (``io.shape_sessions``),
    fixed to S and N - S in the session of each S."""
    if not engine_slides(config):
        return None
    block = config.decoder["sliding_window"]
    where = f"{config.decoder.get('filename', 'model.onnx')} ({config.file})"
    window, context = int(block["window_size"]), int(config.get("model.context_length"))
    if io.combined_kv or not io.past_keys:
        raise ConfigError(
            f"sliding_window.slide_key_value_cache needs separate past key/value inputs "
            f"(past_key_names / past_value_names) in {where}"
        )
    batches: set[int] = set()
    shape_sessions = getattr(io, "shape_sessions", None) or {}
    if shape_sessions and set(shape_sessions) != {window, 1}:
        raise ConfigError(
            f"the static sessions of {where} are for runs of {sorted(shape_sessions)} tokens; "
            f"a window of {window} needs {window} and 1"
        )
    for count, checked in shape_sessions.items() or [(None, session)]:
        _check_shapes(io, checked, count, context, where, batches)
    if len(batches) > 1:
        raise ConfigError(f"the windowed inputs of {where} fix different batch sizes {batches}")
    if io.kv_dtype.kind not in "fu":
        raise ConfigError(f"the KV cache of {where} has type {io.kv_dtype}: float or uint8")
    pad_value = int(block.get("pad_value", 0))
    if io.kv_dtype.kind == "u" and not 0 <= pad_value <= np.iinfo(io.kv_dtype).max:
        raise ConfigError(
            f"sliding_window.pad_value {pad_value} does not fit the {io.kv_dtype} KV cache of "
            f"{where}"
        )
    return SlidingWindowSpec(
        window=window,
        context=context,
        pad_token=int(config.get("model.pad_token_id", 0) or 0),
        pad_value=pad_value,
        alignment=str(block.get("alignment", "right")),
        graph_batch=batches.pop() if batches else None,
    )


def _check_shapes(
    io: DecoderIO,
    session: NativeSession,
    count: int | None,
    context: int,
    where: str,
    batches: set[int],
) -> None:
    """Check ``session``'s windowed shapes for runs of ``count`` tokens (None: any count, the
    sequence and past dimensions symbolic); adds the batch sizes the graph fixes to
    ``batches``."""
    shapes_in, shapes_out = session.input_shapes, session.output_shapes
    kv, hd = io.kv_heads, io.head_size
    seq: int | str = "seq" if count is None else count
    past: int | str = "seq" if count is None else context - count
    suffix = "" if count is None else f" in its session for runs of {count} token(s)"

    def check(name: str, shape: tuple, expected: list, what: str) -> None:
        """``expected`` per axis: an int (that size when the graph fixes it), "seq" (must be
        symbolic: it changes between runs) or "batch"."""
        if len(shape) != len(expected) or any(
            (isinstance(want, int) and isinstance(dim, int) and dim >= 0 and dim != want)
            or (want == "seq" and isinstance(dim, int) and dim >= 0)
            for dim, want in zip(shape, expected, strict=False)
        ):
            layout = ", ".join(str(w) for w in expected).replace("seq", "dynamic")
            raise ConfigError(
                f"{what} {name!r} of {where} has shape {list(shape)}{suffix}; a windowed model "
                f"(sliding_window.slide_key_value_cache) needs [{layout}]"
            )
        for dim, want in zip(shape, expected, strict=True):
            if want == "batch" and isinstance(dim, int) and dim > 0:
                batches.add(dim)

    check(io.input_ids, shapes_in[io.input_ids], ["batch", seq], "input")
    if io.position_ids:
        check(io.position_ids, shapes_in[io.position_ids], ["batch", seq], "input")
    if io.attention_mask:
        check(io.attention_mask, shapes_in[io.attention_mask], ["batch", context], "input")
    names = zip(io.past_keys, io.past_values, io.present_keys, io.present_values, strict=True)
    for past_k, past_v, present_k, present_v in names:
        check(past_k, shapes_in[past_k], [kv, "batch", hd, past], "past key")
        check(past_v, shapes_in[past_v], [kv, "batch", past, hd], "past value")
        check(present_k, shapes_out[present_k], [kv, "batch", hd, seq], "present key")
        check(present_v, shapes_out[present_v], [kv, "batch", seq, hd], "present value")


def slide(past: np.ndarray, present: np.ndarray, length: int, axis: int) -> np.ndarray:
    """The NumPy definition of one slide: the last ``length`` positions of [past, present]
    along ``axis`` (a new array)."""
    both = np.concatenate([past, present], axis=axis)
    return np.take(both, np.arange(both.shape[axis] - length, both.shape[axis]), axis=axis)


class WindowedKVCache:
    """Past and present arrays of every layer, bound to ``session`` for each run.

    `prepare(count)` before a run of ``count`` tokens: slides the previous run's presents in
    (pasts of ``context - count`` positions) and binds pasts and presents (to ``session``, or
    to the session given for that run: one per run length with static shapes). The pasts are
    host arrays bound without copies; a slide that keeps their length moves the positions in
    place.
    """

    def __init__(
        self, io: DecoderIO, spec: SlidingWindowSpec, session: NativeSession, batch: int
    ) -> None:
        self.io, self.spec, self.session, self.batch = io, spec, session, batch
        kv, hd, dtype = io.kv_heads, io.head_size, io.kv_dtype
        self._names = list(zip(io.past_keys, io.past_values, strict=True))
        self._present_names = list(zip(io.present_keys, io.present_values, strict=True))
        past = spec.context - spec.window
        fill = np.array(spec.pad_value).astype(dtype)
        #: Per layer: [key, value] pasts, and the presents of the last run (None before).
        self.pasts = [
            [np.full((kv, batch, hd, past), fill), np.full((kv, batch, past, hd), fill)]
            for _ in self._names
        ]
        self.presents: list[list[np.ndarray]] | None = None
        self._present_buffers: dict[int, list[list[np.ndarray]]] = {}
        #: The token count and the session the arrays are bound for.
        self._bound: tuple[int, int] | None = None
        self._pending: list[list[np.ndarray]] = []

    def _presents_for(self, count: int) -> list[list[np.ndarray]]:
        found = self._present_buffers.get(count)
        if found is None:
            kv, hd, b, dtype = self.io.kv_heads, self.io.head_size, self.batch, self.io.kv_dtype
            found = [
                [np.empty((kv, b, hd, count), dtype), np.empty((kv, b, count, hd), dtype)]
                for _ in self._names
            ]
            self._present_buffers[count] = found
        return found

    def prepare(self, count: int, session: NativeSession | None = None) -> None:
        """Slide the last run's presents into the pasts for a run of ``count`` tokens, and
        bind pasts and presents to ``session`` (default: the cache's)."""
        session = self.session if session is None else session
        length = self.spec.context - count
        if self.presents is not None:
            for layer, (pasts, presents) in enumerate(zip(self.pasts, self.presents, strict=True)):
                self.pasts[layer] = [
                    self._slide(pasts[0], presents[0], length, KEY_AXIS),
                    self._slide(pasts[1], presents[1], length, VALUE_AXIS),
                ]
            self.presents = None
            self._bound = None
        if self.pasts[0][0].shape[KEY_AXIS] != length:
            raise InvalidArgumentError(
                f"a run of {count} tokens needs pasts of {length} positions; the cache holds "
                f"{self.pasts[0][0].shape[KEY_AXIS]}"
            )
        if self._bound == (count, id(session)):
            return
        presents = self._presents_for(count)
        for (past_k, past_v), (present_k, present_v), arrays, outs in zip(
            self._names, self._present_names, self.pasts, presents, strict=True
        ):
            session.bind_input(past_k, arrays[0])
            session.bind_input(past_v, arrays[1])
            session.bind_output(present_k, outs[0])
            session.bind_output(present_v, outs[1])
        self._bound = (count, id(session))
        self._pending = presents

    def ran(self) -> None:
        """The session ran: its presents slide in before the next run."""
        self.presents = self._pending

    @staticmethod
    def _slide(past: np.ndarray, present: np.ndarray, length: int, axis: int) -> np.ndarray:
        """`slide`, in place when the past keeps its length."""
        count = present.shape[axis]
        if past.shape[axis] != length:
            return np.ascontiguousarray(slide(past, present, length, axis))
        keep = length - count
        if keep <= 0:
            src = [slice(None)] * 4
            src[axis] = slice(count - length, count)
            past[...] = present[tuple(src)]
            return past
        dst, src, new = [slice(None)] * 4, [slice(None)] * 4, [slice(None)] * 4
        dst[axis], src[axis], new[axis] = slice(0, keep), slice(count, length), slice(keep, None)
        past[tuple(dst)] = past[tuple(src)]  # overlapping: NumPy copies through a buffer
        past[tuple(new)] = present
        return past

    # --- reading ------------------------------------------------------------------------------
    def read(self, name: str) -> np.ndarray | None:
        """A copy of past input or present output ``name`` as the last run saw or made it;
        None if ``name`` is not a KV name."""
        for layer, names in enumerate(self._names):
            if name in names:
                return self.pasts[layer][names.index(name)].copy()
        for layer, names in enumerate(self._present_names):
            if name in names:
                if self.presents is None:
                    raise KeyError(f"{name!r}: the model has not run yet")
                return self.presents[layer][names.index(name)].copy()
        return None

    @property
    def nbytes(self) -> int:
        """Bytes of the pasts and of the present buffers."""
        total = sum(a.nbytes for pair in self.pasts for a in pair)
        for presents in self._present_buffers.values():
            total += sum(a.nbytes for pair in presents for a in pair)
        return total

    def used_bytes(self, positions: int) -> int:
        """Bytes the pasts occupy (a static cache: all of them, whatever the length)."""
        return sum(a.nbytes for pair in self.pasts for a in pair)
