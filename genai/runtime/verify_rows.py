"""Whether a speculative verify run can give its rows one-token steps' numbers on this CPU.

Speculative decoding emits plain decoding's tokens when a verify run's logits equal the
one-token steps' bit for bit. On onnxruntime's CPU kernels GroupQueryAttention computes a run
of several rows in another order than one row; genai's attention op can run a verify run one
row per call (`genai.runtime.chunked_attention.single_rows`). The int4 linears are the other
kernel whose numbers can depend on the run's length: ``MatMulNBits`` takes another kernel for a
single row on some CPUs and settings (measured on onnxruntime 1.32: with ``accuracy_level`` 4
on AVX-512 CPUs a row's bits are the same in a run of 1 or of 5; on AVX2 CPUs, and with
accuracy levels 0-1, they are not), and other linear ops (fp32 ``MatMul``, ``Gemm``, ...) do
on every CPU. So `rows_like_steps` asks onnxruntime: each distinct ``MatMulNBits`` of the
graph (`linear_ops`) runs once on a random row alone and once among others, and only if every
one gives the same bits are verify runs made one attention row per call; otherwise they stay
one call, the reference engine's numbers (and text).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

import numpy as np

from genai.runtime import onnx_wire as wire
from genai.runtime.chunked_attention import single_rows

__all__ = ["LinearOps", "linear_ops", "rows_like_steps", "verify_rows"]

log = logging.getLogger(__name__)

#: A graph's distinct ``MatMulNBits`` settings: ``(K, N, bits, block_size, accuracy_level,
#: zero points given)``; None: the graph has a linear op whose rows `rows_like_steps` cannot
#: vouch for.
LinearOps = frozenset[tuple[int, int, int, int, int, bool]] | None

_MS = "com.microsoft"
#: Linear ops whose kernels take another path for a single row (or are not probed).
_OTHER_LINEARS = {
    ("", "MatMul"),
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
_ATTRS = ("K", "N", "bits", "block_size", "accuracy_level")


def linear_ops(graph: bytes) -> LinearOps:
    """The distinct ``MatMulNBits`` settings of the serialized model ``graph`` (see
    `LinearOps`), None when it has another linear op or one these settings do not describe
    (a bias, group indices), or cannot be read."""
    try:
        model = wire.model_graph(graph)
        if model is None:
            return None
        found = set()
        for raw in wire.payloads(model[1], wire.GRAPH_NODE):
            node = wire.parse_node(raw)
            key = (node.domain, node.op)
            if key in _OTHER_LINEARS:
                return None
            if key != (_MS, "MatMulNBits"):
                continue
            inputs = wire.given(node.inputs)
            values = [
                node.ints.get(name, 0 if name == "accuracy_level" else None) for name in _ATTRS
            ]
            if len(inputs) > 4 or any(not isinstance(v, int) for v in values):
                return None
            found.add((*values, len(inputs) == 4))  # type: ignore[arg-type]
        return frozenset(found)
    except (wire.MalformedProto, UnicodeDecodeError, ValueError):
        return None


def rows_like_steps(ops: LinearOps) -> bool:
    """Whether every ``MatMulNBits`` setting in ``ops`` gives a row the same bits alone as
    in a run of several rows, on this CPU (each setting asked of onnxruntime once per
    process); False for None."""
    return ops is not None and all(_probe(*setting) for setting in sorted(ops))


@functools.cache
def _probe(k: int, n: int, bits: int, block: int, accuracy: int, zero_points: bool) -> bool:
    from genai._core.native_session import NativeSession  # lazy: the native extension

    if k <= 0 or n <= 0 or block <= 0 or bits not in (2, 4, 8) or k % block:
        return False
    rng = np.random.default_rng(0)
    blocks = k // block
    weight = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
    scales = (rng.random(n * blocks, dtype=np.float32) * 0.02).astype(np.float32)
    inits = [
        wire.raw_tensor("w", _UINT8, list(weight.shape), weight.tobytes()),
        wire.raw_tensor("s", _FLOAT, [n * blocks], scales.tobytes()),
    ]
    names = ["a", "w", "s"]
    if zero_points:
        per_row = (blocks * bits + 7) // 8
        points = rng.integers(0, 256, (n, per_row), dtype=np.uint8)
        inits.append(wire.raw_tensor("z", _UINT8, [n * per_row], points.tobytes()))
        names.append("z")
    ints = dict(zip(_ATTRS, (k, n, bits, block, accuracy), strict=True))
    graph = wire.len_field(
        wire.GRAPH_NODE, wire.node("MatMulNBits", names, ["y"], "probe", domain=_MS, ints=ints)
    )  # type: ignore[arg-type]
    graph += wire.len_field(wire.GRAPH_NAME, b"probe")
    for tensor in inits:
        graph += wire.len_field(wire.GRAPH_INITIALIZER, tensor)
    graph += wire.len_field(wire.GRAPH_INPUT, wire.value_info("a", _FLOAT, ["m", k]))
    graph += wire.len_field(wire.GRAPH_OUTPUT, wire.value_info("y", _FLOAT, ["m", n]))
    model = wire.encode_varint(1 << 3) + wire.encode_varint(8)  # ir_version 8
    model += wire.opset_import("", 17) + wire.opset_import(_MS, 1)
    model += wire.len_field(wire.MODEL_GRAPH, graph)
    try:
        session = NativeSession(None, model_bytes=model, intra_op_num_threads=1)
        rows = rng.standard_normal((5, k)).astype(np.float32)
        together = _run(session, rows, n)
        alone = np.concatenate([_run(session, rows[i : i + 1], n) for i in range(len(rows))])
    except Exception as exc:  # a setting onnxruntime refuses: not vouched for
        log.debug("MatMulNBits probe %s failed: %s", (k, n, bits, block, accuracy), exc)
        return False
    same = bool(np.array_equal(together.view(np.uint32), alone.view(np.uint32)))
    log.debug("MatMulNBits %s: a row alone %s", (k, n, bits, block, accuracy),
              "as in a run" if same else "differs")  # fmt: skip
    return same


def _run(session: Any, rows: np.ndarray, n: int) -> np.ndarray:
    out = np.empty((rows.shape[0], n), np.float32)
    session.bind_input("a", rows)
    session.bind_output("y", out)
    session.run()
    return out


def verify_rows(ops: LinearOps) -> contextlib.AbstractContextManager[None]:
    """The context a verify run of a graph with linear ops ``ops`` runs in: one attention row
    per call (`single_rows`) when that gives one-token steps' numbers on this CPU
    (`rows_like_steps`), else nothing (one call, as the reference engine)."""
    return single_rows() if rows_like_steps(ops) else contextlib.nullcontext()
