"""A decoder graph whose SiLU-gated MLP products run as one op each.

A SwiGLU MLP computes ``Mul(Mul(g, Sigmoid(g)), u)`` from its gate and up projections ``g``
and ``u``; in a ``--prefill-int8`` graph each of these is itself ``Mul(MatMulIntegerToFloat(..),
row_scale)`` with the scales of a `QuantizeRows`, and the product goes to the down
projection's QuantizeRows. onnxruntime runs that as five or six passes over ``[tokens,
intermediate]`` tensors (two row-scale Muls, QuickGelu, the product, the quantisation), each
reading and writing memory: 10-12 % of a long prompt's time (docs/benchmarks.md).
`fuse_gated_silu` replaces each such chain with genai's ``ScaledSiluMul``
(`genai._core.custom_ops`), which works through blocks of rows that stay in cache, with
onnxruntime's own QuickGelu kernel and each product rounded as its Mul op rounds it: the same
bytes (``tests/test_gated_silu.py``).

It matches ``Sigmoid(g)`` whose ``g`` only it and one ``Mul(g, Sigmoid(g))`` read, that Mul
read only by one more Mul with the up projection's value. ``g`` and ``u`` lose their row-scale
Mul when it multiplies by a `QuantizeRows` scale and nothing else reads it, and a QuantizeRows
reading only the product is folded in. onnxruntime's default optimisation level fuses
``Mul(g, Sigmoid(g))`` into QuickGelu, whose sigmoid rounds differently from its Sigmoid op's,
so the rewrite only applies to sessions at that level or above (``graph_optimization_level``
all or extended); `genai.runtime.model` applies it to the graph of a run-length split's long
branch only (it runs prompts; a decode step of one row gains nothing and pays the op's calls,
a few percent). ``GENAI_GATED_SILU=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
import struct

from genai._core.custom_ops import DOMAIN, FLOOR_ATTRIBUTE, QUANTIZE_ROWS, SCALED_SILU_MUL
from genai.runtime import onnx_wire as wire

__all__ = ["enabled", "fuse_gated_silu"]

log = logging.getLogger(__name__)


def enabled() -> bool:
    """False when ``GENAI_GATED_SILU=0`` turns the rewrite off."""
    return os.environ.get("GENAI_GATED_SILU", "1") != "0"


def fuse_gated_silu(data: bytes) -> bytes | None:
    """The serialized model ``data`` with its gated SiLU products (see the module docstring)
    fused into ``ScaledSiluMul`` nodes, or None when it has none."""
    try:
        return _rewrite(data)
    except (wire.MalformedProto, UnicodeDecodeError, ValueError, struct.error) as exc:
        log.debug("gated SiLU not fused: %s", exc)
        return None


def _is_row_scale(g: wire.GraphIndex, name: str) -> bool:
    """Whether ``name`` is the scale output of a QuantizeRows (one value per row)."""
    index = g.producer.get(name)
    if index is None:
        return False
    node = g.nodes[index]
    return (node.domain, node.op) == (DOMAIN, QUANTIZE_ROWS) and node.outputs[1:2] == [name]


def _unscaled(g: wire.GraphIndex, value: str, readers: int) -> tuple[str, str, int | None]:
    """``(x, scale, mul)`` when ``value`` is ``Mul(x, scale)`` by a QuantizeRows scale read by
    ``readers`` nodes only (none of them a graph output); else ``(value, "", None)``."""
    index = g.producer.get(value)
    if index is None or value in g.outputs or len(g.users.get(value, [])) != readers:
        return value, "", None
    node = g.nodes[index]
    if (node.domain, node.op) != ("", "Mul") or len(node.inputs) != 2:
        return value, "", None
    for x, scale in (node.inputs, node.inputs[::-1]):
        if _is_row_scale(g, scale) and not _is_row_scale(g, x):
            return x, scale, index
    return value, "", None


def _other(node: wire.Node, name: str) -> str | None:
    """The input of the two-input ``node`` that is not ``name`` (None if it has no such)."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    first, second = node.inputs
    return second if first == name else first


def _match(g: wire.GraphIndex, sigmoid: int) -> tuple[bytes, int, set[int]] | None:
    """The ``ScaledSiluMul`` node replacing the chain around the Sigmoid node ``sigmoid``, the
    index it takes, and the chain's other nodes; or None."""
    gate_value = g.nodes[sigmoid].inputs[0]
    sig_out = g.nodes[sigmoid].outputs[0]
    gelu = g.only_user(sig_out, "Mul")
    if gelu is None or _other(g.nodes[gelu], sig_out) != gate_value:
        return None
    if sorted(g.users.get(gate_value, [])) != sorted([sigmoid, gelu]):
        return None
    product = g.only_user(g.nodes[gelu].outputs[0], "Mul")
    if product is None:
        return None
    up_value = _other(g.nodes[product], g.nodes[gelu].outputs[0])
    if up_value is None or up_value == gate_value:
        return None
    gate, gate_scale, gate_mul = _unscaled(g, gate_value, 2)
    up, up_scale, up_mul = _unscaled(g, up_value, 1)
    chain = {sigmoid, gelu} | {i for i in (gate_mul, up_mul) if i is not None}
    out = g.nodes[product].outputs[0]
    outputs = [out]
    floor = None
    quantize = g.only_user(out, QUANTIZE_ROWS, DOMAIN)
    if quantize is not None and len(g.nodes[quantize].outputs) == 2:
        floor = g.nodes[quantize].floats.get(FLOOR_ATTRIBUTE)
        if floor is not None and floor > 0:
            outputs = ["", *g.nodes[quantize].outputs]
            chain.add(product)
            product = quantize  # the fused node takes the QuantizeRows' place
    inputs = wire.given([gate, up, gate_scale, up_scale])
    node = wire.node(SCALED_SILU_MUL, inputs, outputs, f"genai_scaled_silu_mul/{sigmoid}")
    if len(outputs) == 3:
        node += wire.float_attribute(FLOOR_ATTRIBUTE, floor)  # type: ignore[arg-type]
    node += wire.len_field(wire.NODE_DOMAIN, DOMAIN.encode())
    return node, product, chain


def _rewrite(data: bytes) -> bytes | None:
    found = wire.model_graph(data)
    if found is None:
        return None
    model, graph = found
    g = wire.GraphIndex(graph)
    replaced: dict[int, bytes] = {}
    dropped: set[int] = set()
    for i, node in enumerate(g.nodes):
        if (node.domain, node.op) != ("", "Sigmoid") or len(node.inputs) != 1:
            continue
        found = _match(g, i)
        if found is None:
            continue
        fused, index, chain = found
        if chain & dropped or index in replaced or chain & set(replaced):
            continue
        replaced[index] = fused
        dropped |= chain
    if not replaced:
        return None
    log.debug("%d gated SiLU products fused into %s", len(replaced), SCALED_SILU_MUL)
    return wire.with_graph(model, g.rewritten(replaced, dropped), DOMAIN)
