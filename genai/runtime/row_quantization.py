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
any positive float32); other graphs load as they are. Chains over the same ``x`` (an MLP's gate
and up projections read the same rows) become one node. ``GENAI_ROW_QUANTIZATION=0`` turns it
off.
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


class _Graph(wire.GraphIndex):
    def __init__(self, graph: list) -> None:
        super().__init__(graph)
        self.int_lists: dict[str, list[int]] = {}
        for tensor in self.initializers:
            if wire.elem_type(tensor) == wire.INT64 and wire.dims(tensor) == [1]:
                found = wire.scalar(tensor)
                if found is not None:
                    name = (wire.strings(wire.fields(tensor), wire.TENSOR_NAME) or [""])[0]
                    self.int_lists[name] = [found]

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
    out = wire.node(QUANTIZE_ROWS, [x], [q, scale], f"genai_quantize_rows/{index}")
    return (
        out
        + wire.float_attribute(FLOOR_ATTRIBUTE, floor)
        + wire.len_field(wire.NODE_DOMAIN, DOMAIN.encode())
    )


def _rewrite(data: bytes) -> bytes | None:
    found = wire.model_graph(data)
    if found is None:
        return None
    model, graph = found
    g = _Graph(graph)
    replaced: dict[int, bytes] = {}  # Abs node index -> the QuantizeRows node
    dropped: set[int] = set()
    first: dict[tuple[str, bytes], tuple[str, str]] = {}  # (x, floor) -> its (q, scale)
    renamed: dict[str, str] = {}  # a repeated chain's q and scale -> the first one's
    for i, node in enumerate(g.nodes):
        if (node.domain, node.op) != ("", "Abs") or len(node.inputs) != 1:
            continue
        found = g.chain(i)
        if found is None:
            continue
        chain, x, floor, q, scale = found
        dropped.update(chain)
        key = (x, struct.pack("<f", floor))
        # the same rows quantised again (an MLP's gate and up): once
        if key in first and not {q, scale} & g.outputs:
            renamed[q], renamed[scale] = first[key]
            continue
        first[key] = (q, scale)
        replaced[i] = _quantize_node(x, q, scale, floor, len(replaced))
    if not replaced:
        return None
    for name in renamed:
        for user in g.users.get(name, []):
            if user not in dropped:
                replaced[user] = wire.with_inputs(replaced.get(user, g.nodes[user].raw), renamed)
    log.debug(
        "%d per-row quantisations fused into %d %s nodes",
        len(first) + len(renamed) // 2,
        len(first),
        QUANTIZE_ROWS,
    )
    return wire.with_graph(model, g.rewritten(replaced, dropped), DOMAIN)
