"""Whether a speculative verify run can give its rows one-token steps' numbers on this CPU.

Speculative decoding emits plain decoding's tokens when a verify run's logits equal the
one-token steps' bit for bit. On onnxruntime's CPU kernels GroupQueryAttention computes a run
of several rows in another order than one row; genai's attention op can run a verify run one
row per call (`genai.runtime.chunked_attention.single_rows`). The int4 linears are the other
kernel whose numbers can depend on the run's length: ``MatMulNBits`` takes another kernel for a
single row on some CPUs and settings (measured on onnxruntime 1.32: with ``accuracy_level`` 4
on AVX-512 CPUs a row's bits are the same in a run of 1 or of 5; on AVX2 CPUs, and with
accuracy levels 0-1, they are not). A float32 ``MatMul`` on an initializer runs onnxruntime's
packed SGEMM, whose rows agree (asked too); one on a weight bound at run time takes a one-row
kernel for a lone row (LoRA branches: `genai.runtime.lora_rows` makes those genai's op, which
runs them row by row in verify runs), and other linear ops (``Gemm``, ``MatMulInteger``, ...)
are not vouched for. So `rows_like_steps` asks onnxruntime: each distinct linear setting of the
graph (`linear_ops`) runs once on a random row alone and once among others, and if every one
gives the same bits verify runs are made one attention row per call. Where they differ and
every linear has 4-bit weights in blocks of 32 at accuracy level 4, genai's own
``StepRowsMatMulNBits`` (`genai._core.custom_ops`) computes each row of a run with the
one-row kernel's arithmetic on AVX2 CPUs; `op_gives_steps` checks it against onnxruntime's
one-row runs the same way, and if it agrees verify runs go, one attention row per call, to a
second session of the decoder's graph with that op (`step_rows_graph`, `StepRowsSession`,
built on the first verify run: it loads the weights once more). Otherwise they stay one call,
the reference engine's numbers (and text).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from genai.runtime import onnx_wire as wire
from genai.runtime.chunked_attention import single_rows

__all__ = [
    "FLOAT_BITS",
    "LinearOps",
    "StepRowsSession",
    "exact_rows",
    "linear_ops",
    "op_gives_steps",
    "rows_like_steps",
    "runs_agree",
    "step_rows_apply",
    "step_rows_graph",
    "step_rows_takes",
    "verify_rows",
]

log = logging.getLogger(__name__)

#: A graph's distinct linear settings: ``(K, N, bits, block_size, accuracy_level, zero points
#: given)`` of each ``MatMulNBits``, and ``(K, N, 32, 0, 0, False)`` of each float32 ``MatMul``
#: on a ``[K, N]`` initializer (`FLOAT_BITS`); None: the graph has a linear op whose rows
#: `rows_like_steps` cannot vouch for.
LinearOps = frozenset[tuple[int, int, int, int, int, bool]] | None

#: The ``bits`` of a float32 ``MatMul`` setting in `LinearOps`.
FLOAT_BITS = 32

_MS = "com.microsoft"
#: Linear ops whose kernels take another path for a single row (or are not probed).
_OTHER_LINEARS = {
    ("", "Gemm"),
    ("", "MatMulInteger"),
    ("", "QLinearMatMul"),
    (_MS, "MatMulIntegerToFloat"),
    (_MS, "DynamicQuantizeMatMul"),
    (_MS, "FusedMatMul"),
    (_MS, "QGemm"),
    (_MS, "MatMulFpQ4"),
    (_MS, "MatMulBnb4"),
}
_UINT8, _FLOAT = 2, 1
#: The length of the random pattern a probe's weights repeat (a prime: rows and blocks differ).
_PATTERN = 65521
_ATTRS = ("K", "N", "bits", "block_size", "accuracy_level")


def linear_ops(graph: bytes) -> LinearOps:
    """The distinct linear settings of the serialized model ``graph`` (see `LinearOps`), None
    when it has another linear op or one these settings do not describe (a bias, group
    indices, a ``MatMul`` on anything but a float32 2-D initializer), or cannot be read."""
    try:
        model = wire.model_graph(graph)
        if model is None:
            return None
        weights: dict[str, tuple[int, int]] | None = None
        found = set()
        for raw in wire.payloads(model[1], wire.GRAPH_NODE):
            node = wire.parse_node(raw)
            key = (node.domain, node.op)
            if key in _OTHER_LINEARS:
                return None
            if key == ("", "MatMul"):
                if weights is None:
                    weights = _float_matrices(model[1])
                shape = weights.get(node.inputs[1]) if len(node.inputs) == 2 else None
                if shape is None:
                    return None
                found.add((*shape, FLOAT_BITS, 0, 0, False))
                continue
            if key != (_MS, "MatMulNBits"):
                continue
            setting = _setting(node)
            if setting is None:
                return None
            found.add(setting)
        return frozenset(found)
    except (wire.MalformedProto, UnicodeDecodeError, ValueError):
        return None


def _float_matrices(graph: list) -> dict[str, tuple[int, int]]:
    """``{name: (rows, columns)}`` of a graph's float32 2-D initializers that are not graph
    inputs too (an input with an initializer is a default a run may override)."""
    inputs = {wire.read_value_info(v)[0] for v in wire.payloads(graph, wire.GRAPH_INPUT)}
    found = {}
    for tensor in wire.payloads(graph, wire.GRAPH_INITIALIZER):
        name = (wire.strings(wire.fields(tensor), wire.TENSOR_NAME) or [""])[0]
        shape = wire.dims(tensor)
        if name not in inputs and len(shape) == 2 and wire.elem_type(tensor) == _FLOAT:
            found[name] = (shape[0], shape[1])
    return found


def _setting(node: wire.Node) -> tuple[int, int, int, int, int, bool] | None:
    """A ``MatMulNBits`` node's setting (see `LinearOps`), None when its attributes or inputs
    (a bias, group indices) are not described by one."""
    inputs = wire.given(node.inputs)
    values = [node.ints.get(name, 0 if name == "accuracy_level" else None) for name in _ATTRS]
    if len(inputs) > 4 or any(not isinstance(v, int) for v in values):
        return None
    return (*values, len(inputs) == 4)  # type: ignore[return-value]


def rows_like_steps(ops: LinearOps) -> bool:
    """Whether every ``MatMulNBits`` setting in ``ops`` gives a row the same bits alone as
    in a run of several rows, on this CPU (each setting asked of onnxruntime once per
    process); False for None."""
    return ops is not None and all(_probe(*setting) for setting in sorted(ops))


def _probe_model(
    k: int,
    n: int,
    bits: int,
    block: int,
    accuracy: int,
    zero_points: bool,
    op: tuple[str, str] = (_MS, "MatMulNBits"),
) -> bytes:
    """A one-node model: ``op`` (domain, name) on random weights of the setting, input ``a``
    [m, k], output ``y`` [m, n] (the same weights for every op); for a float32 setting
    (`FLOAT_BITS`), ``MatMul`` on a [k, n] initializer. The weights (113 MB for a float
    vocabulary projection) are a random pattern repeated, written once, at the model's end."""
    rng = np.random.default_rng(0)
    domain, name = op
    ints: dict[str, int | list[int]] = {}
    inits: list[bytes] = []
    if bits == FLOAT_BITS:
        domain, name = "", "MatMul"
        weight = np.resize(rng.standard_normal(_PATTERN, dtype=np.float32), (k, n))
        elem, names = _FLOAT, ["a", "w"]
    else:
        blocks = k // block
        pattern = rng.integers(0, 256, _PATTERN, dtype=np.uint8)
        weight = np.resize(pattern, (n, blocks, block * bits // 8))
        scales = (rng.random(n * blocks, dtype=np.float32) * 0.02).astype(np.float32)
        inits.append(wire.raw_tensor("s", _FLOAT, [n * blocks], scales.tobytes()))
        elem, names = _UINT8, ["a", "w", "s"]
        if zero_points:
            per_row = (blocks * bits + 7) // 8
            points = rng.integers(0, 256, (n, per_row), dtype=np.uint8)
            inits.append(wire.raw_tensor("z", _UINT8, [n * per_row], points.tobytes()))
            names.append("z")
        ints.update(zip(_ATTRS, (k, n, bits, block, accuracy), strict=True))
    graph = wire.len_field(
        wire.GRAPH_NODE, wire.node(name, names, ["y"], "probe", domain=domain, ints=ints)
    )
    graph += wire.len_field(wire.GRAPH_NAME, b"probe")
    for tensor in inits:
        graph += wire.len_field(wire.GRAPH_INITIALIZER, tensor)
    graph += wire.len_field(wire.GRAPH_INPUT, wire.value_info("a", _FLOAT, ["m", k]))
    graph += wire.len_field(wire.GRAPH_OUTPUT, wire.value_info("y", _FLOAT, ["m", n]))
    # the weight's tensor ends the graph, and the graph the model: its bytes come last
    head = wire.raw_tensor_head("w", elem, list(weight.shape), weight.nbytes)
    graph += wire.field_head(wire.GRAPH_INITIALIZER, len(head) + weight.nbytes) + head
    model = wire.encode_varint(1 << 3) + wire.encode_varint(8)  # ir_version 8
    model += wire.opset_import("", 17) + wire.opset_import(_MS, 1)
    if domain not in ("", _MS):
        model += wire.opset_import(domain, 1)
    model += wire.field_head(wire.MODEL_GRAPH, len(graph) + weight.nbytes) + graph
    return b"".join((model, memoryview(np.ascontiguousarray(weight)).cast("B")))


def _probe_rows(k: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((5, k)).astype(np.float32)


def _alone(session: Any, rows: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([_run(session, rows[i : i + 1], n) for i in range(len(rows))])


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


@functools.cache
def _probe(
    k: int, n: int, bits: int, block: int, accuracy: int, zero_points: bool, partner: bool = False
) -> bool:
    """Whether onnxruntime's ``MatMulNBits`` of the setting gives each of 5 random rows in one
    run the bits it gives the row alone (``partner``: in a run of 2, beside another row)."""
    from genai._core.native_session import NativeSession  # lazy: the native extension

    if bits != FLOAT_BITS and (block <= 0 or bits not in (2, 4, 8) or k % block):
        return False
    if k <= 0 or n <= 0:
        return False
    setting = (k, n, bits, block, accuracy)
    try:
        model = _probe_model(*setting, zero_points)
        session = NativeSession(None, model_bytes=model, intra_op_num_threads=1)
        rows = _probe_rows(k)
        if partner:
            each = [_run(session, rows[[i, (i + 1) % len(rows)]], n)[:1] for i in range(len(rows))]
            same = _same_bits(_run(session, rows, n), np.concatenate(each))
        else:
            same = _same_bits(_run(session, rows, n), _alone(session, rows, n))
    except Exception as exc:  # a setting onnxruntime refuses: not vouched for
        log.debug("MatMulNBits probe %s failed: %s", setting, exc)
        return False
    log.debug("MatMulNBits %s: a row %s %s", setting, "in a run of 2" if partner else "alone",
              "as in a run of 5" if same else "differs")  # fmt: skip
    return same


def runs_agree(ops: LinearOps) -> bool:
    """Whether every ``MatMulNBits`` setting in ``ops`` gives a row the same bits in a run of 2
    as in a run of 5 on this CPU (onnxruntime's kernel for several rows: the numbers of a
    served decode step, which always runs two rows or more); False for None."""
    return ops is not None and all(_probe(*setting, partner=True) for setting in sorted(ops))


def step_rows_takes(
    k: int, n: int, bits: int, block: int, accuracy: int, zero_points: bool
) -> bool:
    """Whether StepRowsMatMulNBits takes the setting: 4 bits in blocks of 32 at accuracy level
    4 (int8 activations), the setting whose one-row kernel it reproduces."""
    return bits == 4 and block == 32 and accuracy == 4 and k > 0 and n > 0 and k % 32 == 0


@functools.cache
def _probe_op(k: int, n: int, bits: int, block: int, accuracy: int, zero_points: bool) -> bool:
    from genai._core.custom_ops import DOMAIN, STEP_ROWS_MATMUL  # lazy: the native extension
    from genai._core.native_session import NativeSession

    setting = (k, n, bits, block, accuracy)
    if not step_rows_takes(*setting, zero_points):
        return False
    try:
        ours = NativeSession(
            None,
            model_bytes=_probe_model(*setting, zero_points, op=(DOMAIN, STEP_ROWS_MATMUL)),
            intra_op_num_threads=1,
            genai_ops=True,
        )
        theirs = NativeSession(
            None, model_bytes=_probe_model(*setting, zero_points), intra_op_num_threads=1
        )
        rows = _probe_rows(k)
        same = _same_bits(_run(ours, rows, n), _alone(theirs, rows, n))
    except Exception as exc:
        log.debug("StepRowsMatMulNBits probe %s failed: %s", setting, exc)
        return False
    log.debug("StepRowsMatMulNBits %s: %s", setting,
              "one-row numbers" if same else "not one-row numbers")  # fmt: skip
    return same


def op_gives_steps(ops: LinearOps) -> bool:
    """Whether genai's ``StepRowsMatMulNBits`` gives the rows of a run of every ``MatMulNBits``
    setting in ``ops`` the bits onnxruntime gives each row alone, and onnxruntime's float32
    ``MatMul`` of every float setting does so itself, on this CPU (asked once per setting and
    process); False for None or no ``MatMulNBits`` setting."""
    packed = _packed(ops)
    floats = sorted(set(ops or ()) - set(packed))
    return (
        bool(packed)
        and all(_probe_op(*setting) for setting in packed)
        and all(_probe(*setting) for setting in floats)
    )


def _packed(ops: LinearOps) -> list[tuple[int, int, int, int, int, bool]]:
    """The ``MatMulNBits`` settings of ``ops`` (not the float ones), sorted."""
    return [setting for setting in sorted(ops or ()) if setting[2] != FLOAT_BITS]


def step_rows_apply(ops: LinearOps) -> bool:
    """Whether ``ops`` has ``MatMulNBits`` settings and StepRowsMatMulNBits takes each one
    (`step_rows_takes`): a graph whose verify runs a `StepRowsSession` can serve (float
    ``MatMul`` settings stay as they are there)."""
    packed = _packed(ops)
    return bool(packed) and all(step_rows_takes(*setting) for setting in packed)


def _run(session: Any, rows: np.ndarray, n: int) -> np.ndarray:
    out = np.empty((rows.shape[0], n), np.float32)
    session.bind_input("a", rows)
    session.bind_output("y", out)
    session.run()
    return out


def step_rows_graph(data: bytes) -> bytes | None:
    """The serialized model ``data`` with genai's ``StepRowsMatMulNBits`` for each of its
    ``MatMulNBits`` nodes (same inputs, outputs and attributes), or None when it has none or one
    the op does not take (`step_rows_takes`), or cannot be read."""
    from genai._core.custom_ops import DOMAIN, STEP_ROWS_MATMUL  # lazy: the native extension

    def rename(node: wire.Node) -> str | None:
        if (node.domain, node.op) != (_MS, "MatMulNBits"):
            return None
        setting = _setting(node)
        if setting is None or not step_rows_takes(*setting):
            raise ValueError("a MatMulNBits the op does not take")
        return STEP_ROWS_MATMUL

    try:
        return wire.with_ops_renamed(data, rename, DOMAIN)
    except (wire.MalformedProto, UnicodeDecodeError, ValueError, TypeError):
        return None


class StepRowsSession:
    """The session a decoder's speculative verify runs go to where onnxruntime's
    ``MatMulNBits`` gives a row of a run other numbers than a row alone: the decoder's graph
    with `step_rows_graph`'s op, built by ``build`` on first use (it loads the weights a second
    time), None when it cannot be built (logged once)."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build: Callable[[], Any] | None = build
        self._session: Any = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        """Whether a session was built (`get` was called and succeeded)."""
        return self._session is not None

    def get(self) -> Any:
        """The session (built on the first call), or None."""
        with self._lock:
            build, self._build = self._build, None
            if build is not None:
                try:
                    self._session = build()
                except Exception as exc:  # verify runs then run as one call
                    log.warning("speculative verify runs keep onnxruntime's numbers: %s", exc)
        return self._session


@contextlib.contextmanager
def _routed(session: Any, other: Any) -> Iterator[None]:
    session.route_verify_runs(other)
    try:
        with single_rows():
            yield
    finally:
        session.route_verify_runs(None)


def exact_rows(session: Any, batched: bool = False) -> bool:
    """Whether `verify_rows` gives the verify runs of ``session`` (a `NativeSession`) the
    numbers of the plain steps they stand for on this CPU (``batched``: steps of two rows or
    more, as the server runs them; else one-row steps, as a generator's): its linears give a
    row the same bits alone as in a run (`rows_like_steps`); or, batched, the same in runs of
    2 and 5 (`runs_agree`); or, not batched, ``session`` has a `StepRowsSession` and the op
    gives one-row numbers (`op_gives_steps`)."""
    ops = session.linear_ops
    if rows_like_steps(ops):
        return True
    if batched:
        return runs_agree(ops)
    return session.step_rows_session is not None and op_gives_steps(ops)


def verify_rows(session: Any, batched: bool = False) -> contextlib.AbstractContextManager[None]:
    """The context a verify run of ``session`` (a `NativeSession` binding) runs in, so that
    each of its rows gets the numbers of the plain steps it stands for, where that can be had
    on this CPU (see `exact_rows`; ``batched``: the server's steps of two rows or more): one
    attention row per call (`single_rows`), with the graph's own linears, or, for one-row steps
    whose linears a run changes, on the graph with genai's ``StepRowsMatMulNBits``
    (``session.step_rows_session``); else nothing (one call, the reference engine's numbers
    and text)."""
    ops = session.linear_ops
    if rows_like_steps(ops) or (batched and runs_agree(ops)):
        return single_rows()
    maker = session.step_rows_session
    if not batched and maker is not None and op_gives_steps(ops):
        other = maker.get()
        if other is not None:
            return _routed(session, other)
    return contextlib.nullcontext()
