"""A ``--prefill-int8`` graph whose per-token activation quantisations run as one op each.

genai's builder quantises each int8 linear's input per row (token) with eight onnxruntime ops
(`genai.builder.onnx_writer`, ``per_token_matmul``)::

    top = Max(ReduceMax(Abs(x), axes=[-1], keepdims=1), floor)
    q = Cast(Add(Mul(x, Div(127, top)), 128.5), to=uint8)
    scale = Div(top, 127)

Each op reads and writes the whole ``[tokens, hidden]`` tensor: 10-20 % of a long prompt's time
(docs/benchmarks.md). `fuse_row_quantization` replaces every such chain with genai's
``QuantizeRows`` (`genai._core.custom_ops`), one pass per row that rounds each step as the ops
do, so ``q`` and ``scale`` are the same bytes (``tests/test_row_quantization.py``). It applies to
the chains whose intermediate values nothing else reads, with the constants above (``floor``
any positive float32); other graphs load as they are. ``GENAI_ROW_QUANTIZATION=0`` turns it off.
"""

from __future__ import annotations

import logging
import os
import struct

from genai._core.custom_ops import DOMAIN, FLOOR_ATTRIBUTE, QUANTIZE_ROWS
from genai.runtime import onnx_wire as wire

__all__ = ["enabled", "fuse_row_quantization"]

log = logging.getLogger(__name__)

_UINT8 = 2  # TensorProto.UINT8
_ATTR_FLOAT, _ATTR_KIND_FLOAT = 2, 1  # AttributeProto.f, AttributeType.FLOAT


def enabled() -> bool:
    """False when ``GENAI_ROW_QUANTIZATION=0`` turns the rewrite off."""
    return os.environ.get("GENAI_ROW_QUANTIZATION", "1") != "0"


def fuse_row_quantization(data: bytes) -> bytes | None:
    """The serialized model ``data`` with its per-row quantisation chains (see the module
    docstring) fused into ``QuantizeRows`` nodes, or None when it has none."""
    try:
        return _rewrite(data)
    except (wire.MalformedProto, UnicodeDecodeError, ValueError, struct.error) as exc:
        log.debug("row quantisation not fused: %s", exc)
        return None


class _Graph:
    def __init__(self, graph: list) -> None:
        self.nodes = [wire.parse_node(raw) for raw in wire.payloads(graph, wire.GRAPH_NODE)]
        self.floats: dict[str, float] = {}
        self.int_lists: dict[str, list[int]] = {}
        for tensor in wire.payloads(graph, wire.GRAPH_INITIALIZER):
            name = (wire.strings(wire.fields(tensor), wire.TENSOR_NAME) or [""])[0]
            value = wire.float_scalar(tensor)
            if value is not None:
                self.floats[name] = value
            elif wire.elem_type(tensor) == wire.INT64 and wire.dims(tensor) == [1]:
                found = wire.scalar(tensor)
                if found is not None:
                    self.int_lists[name] = [found]
        self.outputs = {wire.read_value_info(v)[0] for v in wire.payloads(graph, wire.GRAPH_OUTPUT)}
        self.producer = {name: i for i, node in enumerate(self.nodes) for name in node.outputs}
        self.users: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.inputs:
                self.users.setdefault(name, []).append(i)

    def only_user(self, name: str, op: str) -> int | None:
        """The one node reading ``name`` when it is an ``op`` and ``name`` is not a graph
        output."""
        users = self.users.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        node = self.nodes[users[0]]
        return users[0] if (node.domain, node.op) == ("", op) else None

    def is_float(self, name: str, value: float) -> bool:
        found = self.floats.get(name)
        return found is not None and struct.pack("<f", found) == struct.pack("<f", value)

    def chain(self, abs_index: int) -> tuple[list[int], str, float, str, str] | None:
        """``(nodes, x, floor, q, scale)`` of the quantisation chain starting at the Abs node
        ``abs_index``, or None."""
        g = self
        x = g.nodes[abs_index].inputs[0]
        reduce = g.only_user(g.nodes[abs_index].outputs[0], "ReduceMax")
        if reduce is None:
            return None
        node = g.nodes[reduce]
        axes = node.ints.get("axes") or (
            g.int_lists.get(node.inputs[1]) if len(node.inputs) > 1 else None
        )
        if axes not in ([-1], -1) or node.ints.get("keepdims", 1) != 1:
            return None
        top_index = g.only_user(node.outputs[0], "Max")
        if top_index is None:
            return None
        floor_inputs = [n for n in g.nodes[top_index].inputs if n != node.outputs[0]]
        if len(floor_inputs) != 1 or floor_inputs[0] not in g.floats:
            return None
        floor = g.floats[floor_inputs[0]]
        top = g.nodes[top_index].outputs[0]
        if not floor > 0 or top in g.outputs:
            return None
        inverse = scale = None
        for user in g.users.get(top, []):
            div = g.nodes[user]
            if (div.domain, div.op) != ("", "Div") or len(div.inputs) != 2:
                return None
            if div.inputs[1] == top and g.is_float(div.inputs[0], 127.0) and inverse is None:
                inverse = user
            elif div.inputs[0] == top and g.is_float(div.inputs[1], 127.0) and scale is None:
                scale = user
            else:
                return None
        if inverse is None or scale is None:
            return None
        mul = g.only_user(g.nodes[inverse].outputs[0], "Mul")
        if mul is None or set(g.nodes[mul].inputs) != {x, g.nodes[inverse].outputs[0]}:
            return None
        add = g.only_user(g.nodes[mul].outputs[0], "Add")
        if add is None:
            return None
        offsets = [n for n in g.nodes[add].inputs if n != g.nodes[mul].outputs[0]]
        if len(offsets) != 1 or not g.is_float(offsets[0], 128.5):
            return None
        cast = g.only_user(g.nodes[add].outputs[0], "Cast")
        if cast is None or g.nodes[cast].ints.get("to") != _UINT8:
            return None
        chain = [abs_index, reduce, top_index, inverse, mul, add, cast, scale]
        return chain, x, floor, g.nodes[cast].outputs[0], g.nodes[scale].outputs[0]


def _quantize_node(x: str, q: str, scale: str, floor: float, index: int) -> bytes:
    out = bytearray(wire.node(QUANTIZE_ROWS, [x], [q, scale], f"genai_quantize_rows/{index}"))
    attr = wire.len_field(wire.ATTR_NAME, FLOOR_ATTRIBUTE.encode())
    attr += wire.encode_varint(_ATTR_FLOAT << 3 | wire.FIXED32) + struct.pack("<f", floor)
    attr += wire.encode_varint(wire.ATTR_TYPE << 3 | wire.VARINT)
    attr += wire.encode_varint(_ATTR_KIND_FLOAT)
    out += wire.len_field(wire.NODE_ATTRIBUTE, attr)
    out += wire.len_field(wire.NODE_DOMAIN, DOMAIN.encode())
    return bytes(out)


def _rewrite(data: bytes) -> bytes | None:
    model = wire.fields(data)
    graphs = wire.payloads(model, wire.MODEL_GRAPH)
    if len(graphs) != 1:
        return None
    graph_fields = wire.fields(graphs[0])
    g = _Graph(graph_fields)
    fused: dict[int, bytes] = {}  # Abs node index -> the QuantizeRows node
    dropped: set[int] = set()
    for i, node in enumerate(g.nodes):
        if (node.domain, node.op) != ("", "Abs") or len(node.inputs) != 1:
            continue
        found = g.chain(i)
        if found is None:
            continue
        chain, x, floor, q, scale = found
        fused[i] = _quantize_node(x, q, scale, floor, len(fused))
        dropped.update(chain)
    if not fused:
        return None
    # the chains' constants nothing else reads go too (onnxruntime warns of each one left)
    used = {name for i, node in enumerate(g.nodes) if i not in dropped for name in node.inputs}
    gone = {name for i in dropped for name in g.nodes[i].inputs} - used - g.outputs
    top = bytearray()
    nodes_written = False
    for number, kind, value, raw in graph_fields:
        if number == wire.GRAPH_INITIALIZER and kind == wire.LEN:
            name = (wire.strings(wire.fields(value), wire.TENSOR_NAME) or [""])[0]  # type: ignore[arg-type]
            if name in gone:
                continue
        if number == wire.GRAPH_NODE and kind == wire.LEN:
            if not nodes_written:  # (a graph's nodes are one run of fields in practice)
                for i, node in enumerate(g.nodes):
                    if i in fused:
                        top += wire.len_field(wire.GRAPH_NODE, fused[i])
                    elif i not in dropped:
                        top += wire.len_field(wire.GRAPH_NODE, node.raw)
                nodes_written = True
            continue
        top += raw
    log.debug("%d per-row quantisations fused into %s", len(fused), QUANTIZE_ROWS)
    return wire.with_graph(model, bytes(top), DOMAIN)
