"""Two sessions for a decoder graph that branches on its run's length.

genai's builder writes ``--prefill-int8`` decoders as one ``If`` at the top of the graph
(`genai.builder.onnx_writer`): runs of more than ``VERIFY_TOKENS`` new tokens per row take
the int8 branch, shorter ones (decode steps, speculative verification) the int4 branch. Both
engines run that graph as it is, but ORT's ``If`` costs every decode step a few percent. genai
instead makes one session per branch, each the branch's nodes flattened into the top graph
(same inputs, outputs, initializers and kernels, so the same numbers), and routes each run to
the one the ``If`` would take (`genai._core.native_session.NativeSession.route_long_runs`).

`split_by_run_length` recognises the pattern, ``If(Greater(Gather(Shape(ids), 1), N))`` as
the whole top graph, whatever else a folder holds: other graphs load as they are. It reads and
rewrites the protobuf wire format itself (the few ONNX fields it touches; every other field is
copied byte for byte), so loading such a folder does not import the ``onnx`` package (whose
import takes most of a second).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunLengthSplit", "split_by_run_length"]

log = logging.getLogger(__name__)

#: The name genai's builder gives the ``If`` (a cheap test before parsing the graph), and how
#: far into the file it is looked for.
_MARKER = b"prefill_or_decode"
_MARKER_WITHIN = 1 << 20

# ONNX field numbers (onnx.proto3) of what the split reads or rewrites
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER, _GRAPH_OUTPUT = 1, 5, 12
_NODE_INPUT, _NODE_OUTPUT, _NODE_OP_TYPE, _NODE_ATTRIBUTE = 1, 2, 4, 5
_ATTR_NAME, _ATTR_GRAPH, _ATTR_GRAPHS = 1, 6, 11
_VALUE_NAME = 1
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_INT32, _TENSOR_INT64 = 1, 2, 5, 7
_TENSOR_NAME, _TENSOR_RAW, _TENSOR_LOCATION = 8, 9, 14
_INT32, _INT64, _EXTERNAL = 6, 7, 1
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True)
class RunLengthSplit:
    """The two flattened graphs (serialized ModelProtos) and the length that separates them:
    runs whose ``ids`` input is longer than ``above`` along axis 1 run ``long_graph``."""

    short_graph: bytes
    long_graph: bytes
    ids: str
    above: int


class _Malformed(ValueError):
    """Bytes that are not the protobuf this module expects (the graph then loads as is)."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Malformed("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(payload)) + payload


def _fields(data: bytes) -> list[tuple[int, int, int | bytes, bytes]]:
    """``(number, wire type, value, the field's own bytes)`` of every field of a message:
    the value is an int (varint) or the payload bytes."""
    out: list[tuple[int, int, int | bytes, bytes]] = []
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        key = data[pos]
        if key < 0x80:  # (one-byte keys: every field number below 16)
            pos += 1
        else:
            key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _LEN:
            size = data[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = _varint(data, pos)
            if pos + size > end:
                raise _Malformed("truncated field")
            value, pos = data[pos : pos + size], pos + size
        elif wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise _Malformed(f"wire type {wire}")
        out.append((number, wire, value, data[start:pos]))
    return out


def _strings(fields: list, number: int) -> list[str]:
    return [v.decode() for n, w, v, _ in fields if n == number and w == _LEN]


def _payloads(fields: list, number: int) -> list[bytes]:
    return [v for n, w, v, _ in fields if n == number and w == _LEN]


def _scalar(tensor: bytes) -> int | None:
    """The one integer a TensorProto holds in the file (int32 / int64), else None."""
    fields = _fields(tensor)
    kind = next((v for n, w, v, _ in fields if n == _TENSOR_TYPE and w == _VARINT), 0)
    location = next((v for n, w, v, _ in fields if n == _TENSOR_LOCATION and w == _VARINT), 0)
    if kind not in (_INT32, _INT64) or location == _EXTERNAL:
        return None
    values: list[int] = []
    for number, wire, value, _ in fields:
        if number == _TENSOR_RAW and wire == _LEN:
            fmt = "<q" if kind == _INT64 else "<i"
            values += [v for (v,) in struct.iter_unpack(fmt, value)]
        elif number in (_TENSOR_INT32, _TENSOR_INT64):
            if wire == _VARINT:
                values.append(value)
            elif wire == _LEN:  # packed
                pos = 0
                while pos < len(value):
                    item, pos = _varint(value, pos)
                    values.append(item)
    if len(values) != 1:
        return None
    value = values[0]
    return value - (1 << 64) if value >= 1 << 63 else value


#: Ops whose attributes hold subgraphs (read for the outer names they use).
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})


def _inputs_used(nodes: list[bytes]) -> set[str]:
    """Every input name of ``nodes`` and of the nodes of their subgraphs."""
    used: set[str] = set()
    for node in nodes:
        _renamed(node, {}, used)
    return used


def _renamed(node: bytes, rename: dict[str, str], used: set[str]) -> tuple[bytes, list[str]]:
    """``node`` with its input and output names renamed (the same bytes when none is), and
    its inputs; adds the inputs (and its subgraphs' inputs) to ``used``."""
    fields = _fields(node)
    inputs = _strings(fields, _NODE_INPUT)
    names = inputs + _strings(fields, _NODE_OUTPUT)
    op = _strings(fields, _NODE_OP_TYPE)
    if op and op[0] in _SUBGRAPH_OPS:
        for attr in _payloads(fields, _NODE_ATTRIBUTE):
            attr_fields = _fields(attr)
            for graph in _payloads(attr_fields, _ATTR_GRAPH) + _payloads(attr_fields, _ATTR_GRAPHS):
                used |= _inputs_used(_payloads(_fields(graph), _GRAPH_NODE))
    if not any(name in rename for name in names):
        used.update(inputs)
        return node, inputs
    out = bytearray()
    for number, wire, value, raw in fields:
        if number in (_NODE_INPUT, _NODE_OUTPUT) and wire == _LEN:
            name = value.decode()
            out += _len_field(number, rename.get(name, name).encode())
        else:
            out += raw
    inputs = [rename.get(name, name) for name in inputs]
    used.update(inputs)
    return bytes(out), inputs


def split_by_run_length(path: str | Path) -> RunLengthSplit | None:
    """The two graphs of ``path`` when its top level is one run-length ``If`` (see the module
    docstring), else None. Initializers keep their external-data references (a session made
    from the bytes needs the model folder as its external-data folder)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            # protobuf writes a model's fields in number order and a graph's nodes before its
            # initializers: the outer If's name lies in the first kilobytes, so a graph
            # without it (with its weights inline, maybe gigabytes) is not read whole
            if _MARKER not in f.read(_MARKER_WITHIN):
                return None
            f.seek(0)
            data = f.read()
    except OSError:
        return None
    try:
        return _split(data, path)
    except (_Malformed, UnicodeDecodeError, struct.error) as exc:
        log.debug("%s: not split (%s)", path, exc)
        return None


def _split(data: bytes, path: Path) -> RunLengthSplit | None:
    model = _fields(data)
    graphs = _payloads(model, _MODEL_GRAPH)
    if len(graphs) != 1:
        return None
    graph = _fields(graphs[0])
    nodes = [_fields(node) for node in _payloads(graph, _GRAPH_NODE)]
    if len(nodes) != 4:
        return None
    kinds = [(_strings(node, _NODE_OP_TYPE) or [""])[0] for node in nodes]
    if sorted(kinds) != ["Gather", "Greater", "If", "Shape"]:
        return None
    by_kind = dict(zip(kinds, nodes, strict=True))
    producer = {out: kind for kind, node in by_kind.items() for out in _strings(node, _NODE_OUTPUT)}
    inits = {}
    for tensor in _payloads(graph, _GRAPH_INITIALIZER):
        names = _strings(_fields(tensor), _TENSOR_NAME)
        if names:
            inits[names[0]] = tensor
    if_in, greater_in = (
        _strings(by_kind["If"], _NODE_INPUT),
        _strings(by_kind["Greater"], _NODE_INPUT),
    )
    gather_in, shape_in = (
        _strings(by_kind["Gather"], _NODE_INPUT),
        _strings(by_kind["Shape"], _NODE_INPUT),
    )
    if (
        len(if_in) != 1
        or producer.get(if_in[0]) != "Greater"
        or len(greater_in) != 2
        or producer.get(greater_in[0]) != "Gather"
        or len(gather_in) != 2
        or producer.get(gather_in[0]) != "Shape"
        or len(shape_in) != 1
        or greater_in[1] not in inits
        or gather_in[1] not in inits
        or _scalar(inits[gather_in[1]]) != 1
    ):
        return None
    above = _scalar(inits[greater_in[1]])
    if above is None or above < 0:
        return None
    outer_outputs = _strings(by_kind["If"], _NODE_OUTPUT)
    graph_outputs = [_strings(_fields(v), _VALUE_NAME)[0] for v in _payloads(graph, _GRAPH_OUTPUT)]
    if outer_outputs != graph_outputs:
        return None
    branches = {}
    for attr in _payloads(by_kind["If"], _NODE_ATTRIBUTE):
        attr_fields = _fields(attr)
        name, subgraphs = _strings(attr_fields, _ATTR_NAME), _payloads(attr_fields, _ATTR_GRAPH)
        if name and len(subgraphs) == 1:
            branches[name[0]] = subgraphs[0]
    if set(branches) != {"then_branch", "else_branch"}:
        return None

    def flatten(branch: bytes) -> bytes:
        fields = _fields(branch)
        inner_outputs = [
            _strings(_fields(v), _VALUE_NAME)[0] for v in _payloads(fields, _GRAPH_OUTPUT)
        ]
        if len(inner_outputs) != len(outer_outputs):
            raise _Malformed("the branch's outputs are not the If's")
        rename = dict(zip(inner_outputs, outer_outputs, strict=True))
        used: set[str] = set()
        flat_nodes = [_renamed(node, rename, used)[0] for node in _payloads(fields, _GRAPH_NODE)]
        top = bytearray()
        for number, _, _, raw in graph:
            if number not in (_GRAPH_NODE, _GRAPH_INITIALIZER):
                top += raw
        for node in flat_nodes:
            top += _len_field(_GRAPH_NODE, node)
        for name, tensor in inits.items():
            if name in used:
                top += _len_field(_GRAPH_INITIALIZER, tensor)
        out = bytearray()
        for number, _, _, raw in model:
            if number != _MODEL_GRAPH:
                out += raw
        out += _len_field(_MODEL_GRAPH, bytes(top))
        return bytes(out)

    split = RunLengthSplit(
        short_graph=flatten(branches["else_branch"]),
        long_graph=flatten(branches["then_branch"]),
        ids=shape_in[0],
        above=above,
    )
    log.debug("%s: runs of more than %d tokens take the If's then branch", path, above)
    return split
