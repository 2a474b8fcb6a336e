"""The ONNX protobuf wire format, read and written by hand for the few fields genai's load-time
graph rewrites touch (`genai.runtime.run_length_split`, `genai.runtime.trimmed_logits`,
`genai.runtime.chunked_attention`, `genai.runtime.row_quantization`, `genai.runtime.gated_silu`).

Every field a rewrite does not touch is copied byte for byte, and loading a folder does not
import the ``onnx`` package (whose import takes most of a second). Field numbers are those of
``onnx.proto3``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "GraphIndex",
    "MalformedProto",
    "Node",
    "as_op",
    "dims",
    "elem_type",
    "encode_varint",
    "external_locations",
    "fields",
    "float_attribute",
    "float_scalar",
    "given",
    "int_attribute",
    "int_tensor",
    "len_field",
    "model_graph",
    "node",
    "opset",
    "opset_import",
    "parse_node",
    "payloads",
    "raw_tensor",
    "read_value_info",
    "relocated",
    "scalar",
    "strings",
    "value_info",
    "varint",
    "with_graph",
    "with_inputs",
]

# ModelProto, GraphProto, NodeProto, AttributeProto, ValueInfoProto, TensorProto fields
MODEL_GRAPH, MODEL_OPSET_IMPORT = 7, 8
GRAPH_NODE, GRAPH_NAME, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT = 1, 2, 5, 11, 12
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN = 1, 2, 3, 4, 5, 7
ATTR_NAME, ATTR_FLOAT, ATTR_INT, ATTR_GRAPH, ATTR_INTS, ATTR_GRAPHS = 1, 2, 3, 6, 8, 11
ATTR_TYPE = 20
VALUE_NAME, VALUE_TYPE = 1, 2
TENSOR_DIMS, TENSOR_TYPE, TENSOR_FLOAT, TENSOR_INT32, TENSOR_INT64 = 1, 2, 4, 5, 7
TENSOR_NAME, TENSOR_RAW, TENSOR_EXTERNAL_DATA, TENSOR_LOCATION = 8, 9, 13, 14
# TypeProto.tensor_type; TypeProto.Tensor's elem_type and shape; TensorShapeProto.dim;
# its Dimension's dim_value and dim_param
TYPE_TENSOR, TENSOR_ELEM_TYPE, TENSOR_SHAPE, SHAPE_DIM, DIM_VALUE, DIM_PARAM = 1, 1, 2, 1, 1, 2
FLOAT, INT32, INT64, EXTERNAL = 1, 6, 7, 1
ATTR_KIND_FLOAT, ATTR_KIND_INT, ATTR_KIND_INTS = 1, 2, 7
VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


class MalformedProto(ValueError):
    """Bytes that are not the protobuf a rewrite expects (the graph then loads as it is)."""


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise MalformedProto("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def encode_varint(value: int) -> bytes:
    """``value`` (>= 0, or a negative int64 as its two's complement) as a varint."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a message)."""
    return field_head(number, len(payload)) + payload


def field_head(number: int, length: int) -> bytes:
    """A length-delimited field's key and length: the field is this, then its ``length``
    payload bytes (so a large payload can be written once, after the head)."""
    return encode_varint(number << 3 | LEN) + encode_varint(length)


def _varint_field(number: int, value: int) -> bytes:
    return encode_varint(number << 3 | VARINT) + encode_varint(value)


def fields(data: bytes) -> list[tuple[int, int, int | bytes, bytes]]:
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
            key, pos = varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == LEN:
            size = data[pos] if pos < end else 0x80
            if size < 0x80:
                pos += 1
            else:
                size, pos = varint(data, pos)
            if pos + size > end:
                raise MalformedProto("truncated field")
            value, pos = data[pos : pos + size], pos + size
        elif wire == VARINT:
            value, pos = varint(data, pos)
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise MalformedProto(f"wire type {wire}")
        out.append((number, wire, value, data[start:pos]))
    return out


def model_graph(data: bytes) -> tuple[list, list] | None:
    """The `fields` of the serialized ModelProto ``data`` and of its graph, or None when it
    does not have exactly one."""
    model = fields(data)
    graphs = payloads(model, MODEL_GRAPH)
    if len(graphs) != 1:
        return None
    return model, fields(graphs[0])


def given(names: list[str]) -> list[str]:
    """A node's input ``names`` without the trailing empty ones (optional inputs left out:
    the reference's builder writes GroupQueryAttention with twelve, the last three empty)."""
    while names and not names[-1]:
        names = names[:-1]
    return names


def strings(message: list, number: int) -> list[str]:
    """The string fields ``number`` of a message's `fields`."""
    return [v.decode() for n, w, v, _ in message if n == number and w == LEN]


def payloads(message: list, number: int) -> list[bytes]:
    """The length-delimited fields ``number`` of a message's `fields`."""
    return [v for n, w, v, _ in message if n == number and w == LEN]


def _varints(message: list, number: int) -> list[int]:
    return [v for n, w, v, _ in message if n == number and w == VARINT]


def _int64(value: int) -> int:
    """A varint read as the int64 it encodes (negative numbers are 10-byte varints)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def elem_type(tensor: bytes) -> int:
    """A TensorProto's element type (TensorProto.DataType; 0 when unset)."""
    return next(iter(_varints(fields(tensor), TENSOR_TYPE)), 0)


def dims(tensor: bytes) -> list[int]:
    """A TensorProto's dimensions."""
    out: list[int] = []
    for number, wire, value, _ in fields(tensor):
        if number != TENSOR_DIMS:
            continue
        if wire == VARINT:
            out.append(int(value))  # type: ignore[arg-type]
        elif wire == LEN:  # packed
            pos = 0
            while pos < len(value):  # type: ignore[arg-type]
                item, pos = varint(value, pos)  # type: ignore[arg-type]
                out.append(item)
    return out


def scalar(tensor: bytes) -> int | None:
    """The one integer a TensorProto holds in the file (int32 / int64), else None."""
    message = fields(tensor)
    kind = next(iter(_varints(message, TENSOR_TYPE)), 0)
    location = next(iter(_varints(message, TENSOR_LOCATION)), 0)
    if kind not in (INT32, INT64) or location == EXTERNAL:
        return None
    values: list[int] = []
    for number, wire, value, _ in message:
        if number == TENSOR_RAW and wire == LEN:
            fmt = "<q" if kind == INT64 else "<i"
            values += [v for (v,) in struct.iter_unpack(fmt, value)]  # type: ignore[arg-type]
        elif number in (TENSOR_INT32, TENSOR_INT64):
            if wire == VARINT:
                values.append(value)  # type: ignore[arg-type]
            elif wire == LEN:  # packed
                pos = 0
                while pos < len(value):  # type: ignore[arg-type]
                    item, pos = varint(value, pos)  # type: ignore[arg-type]
                    values.append(item)
    if len(values) != 1:
        return None
    return _int64(values[0])


def float_scalar(tensor: bytes) -> float | None:
    """The one float32 a TensorProto holds in the file (dims ``[]`` or ``[1]``), else None."""
    message = fields(tensor)
    kind = next(iter(_varints(message, TENSOR_TYPE)), 0)
    location = next(iter(_varints(message, TENSOR_LOCATION)), 0)
    if kind != FLOAT or location == EXTERNAL or dims(tensor) not in ([], [1]):
        return None
    values: list[float] = []
    for number, wire, value, _ in message:
        if number in (TENSOR_RAW, TENSOR_FLOAT) and wire == LEN:  # raw bytes, or packed
            values += [v for (v,) in struct.iter_unpack("<f", value)]  # type: ignore[arg-type]
        elif number == TENSOR_FLOAT and wire == FIXED32:
            values.append(struct.unpack("<f", value)[0])  # type: ignore[arg-type]
    return values[0] if len(values) == 1 else None


def int_tensor(
    name: str, values: list[int], shape: list[int] | None = None, elem: int = INT64
) -> bytes:
    """A TensorProto of integer ``values``, int64 or (``elem`` `INT32`) int32 (1-D unless
    ``shape``; ``[]`` for a scalar)."""
    fmt = "q" if elem == INT64 else "i"
    data = struct.pack(f"<{len(values)}{fmt}", *values)
    return raw_tensor(name, elem, [len(values)] if shape is None else shape, data)


def raw_tensor(name: str, elem: int, shape: list[int], data: bytes) -> bytes:
    """A TensorProto of element type ``elem`` and ``shape`` holding ``data`` (its raw bytes)."""
    return raw_tensor_head(name, elem, shape, len(data)) + data


def raw_tensor_head(name: str, elem: int, shape: list[int], size: int) -> bytes:
    """`raw_tensor` up to its raw data of ``size`` bytes: the tensor is this, then the data."""
    out = bytearray()
    for length in shape:
        out += _varint_field(TENSOR_DIMS, length)
    out += _varint_field(TENSOR_TYPE, elem)
    out += len_field(TENSOR_NAME, name.encode())
    out += field_head(TENSOR_RAW, size)
    return bytes(out)


def node(
    op_type: str,
    inputs: list[str],
    outputs: list[str],
    name: str,
    *,
    domain: str = "",
    ints: dict[str, int | list[int]] | None = None,
) -> bytes:
    """A NodeProto with integer (or integer-list) attributes."""
    out = bytearray()
    for value in inputs:
        out += len_field(NODE_INPUT, value.encode())
    for value in outputs:
        out += len_field(NODE_OUTPUT, value.encode())
    out += len_field(NODE_NAME, name.encode())
    out += len_field(NODE_OP_TYPE, op_type.encode())
    for key, value in (ints or {}).items():
        out += int_attribute(key, value)
    if domain:
        out += len_field(NODE_DOMAIN, domain.encode())
    return bytes(out)


def int_attribute(name: str, value: int | list[int]) -> bytes:
    """A NodeProto's ``attribute`` field holding an integer (or integer-list) attribute."""
    attr = bytearray(len_field(ATTR_NAME, name.encode()))
    if isinstance(value, list):
        for item in value:
            attr += _varint_field(ATTR_INTS, item)
        attr += _varint_field(ATTR_TYPE, ATTR_KIND_INTS)
    else:
        attr += _varint_field(ATTR_INT, value)
        attr += _varint_field(ATTR_TYPE, ATTR_KIND_INT)
    return len_field(NODE_ATTRIBUTE, bytes(attr))


def float_attribute(name: str, value: float) -> bytes:
    """A NodeProto's ``attribute`` field holding a float attribute."""
    attr = len_field(ATTR_NAME, name.encode())
    attr += encode_varint(ATTR_FLOAT << 3 | FIXED32) + struct.pack("<f", value)
    attr += _varint_field(ATTR_TYPE, ATTR_KIND_FLOAT)
    return len_field(NODE_ATTRIBUTE, attr)


def opset_import(domain: str, version: int) -> bytes:
    """A ModelProto's ``opset_import`` field (OperatorSetIdProto) for ``domain``."""
    entry = len_field(1, domain.encode()) + _varint_field(2, version)
    return len_field(MODEL_OPSET_IMPORT, entry)


@dataclass
class Node:
    """What a rewrite reads of a NodeProto: its bytes, op, domain, inputs, outputs, integer
    attributes (``ints``: an int, or a list for an ints attribute) and float attributes."""

    raw: bytes
    op: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    ints: dict[str, int | list[int]] = field(default_factory=dict)
    floats: dict[str, float] = field(default_factory=dict)


def parse_node(raw: bytes) -> Node:
    """The `Node` of a NodeProto's bytes."""
    message = fields(raw)
    ints: dict[str, int | list[int]] = {}
    floats: dict[str, float] = {}
    for attr in payloads(message, NODE_ATTRIBUTE):
        attr_fields = fields(attr)
        name = (strings(attr_fields, ATTR_NAME) or [""])[0]
        single = _varints(attr_fields, ATTR_INT)
        listed = _varints(attr_fields, ATTR_INTS)
        if single:
            ints[name] = _int64(single[0])
        elif listed:
            ints[name] = [_int64(v) for v in listed]
        for number, wire, value, _ in attr_fields:
            if number == ATTR_FLOAT and wire == FIXED32:
                floats[name] = struct.unpack("<f", value)[0]  # type: ignore[arg-type]
    return Node(
        raw,
        (strings(message, NODE_OP_TYPE) or [""])[0],
        (strings(message, NODE_DOMAIN) or [""])[0],
        strings(message, NODE_INPUT),
        strings(message, NODE_OUTPUT),
        ints,
        floats,
    )


def as_op(node: list, op: str, domain: str, inputs: int | None = None) -> bytes:
    """The NodeProto of `fields` ``node`` as op ``op`` of ``domain``, its attributes and outputs
    kept, and its first ``inputs`` input names (None: all). A node of the default domain
    (no domain field) gets one."""
    out = bytearray()
    seen = 0
    named = False
    for number, kind, _, raw in node:
        if number == NODE_INPUT and kind == LEN:
            seen += 1
            if inputs is not None and seen > inputs:
                continue
            out += raw
        elif number == NODE_OP_TYPE and kind == LEN:
            out += len_field(NODE_OP_TYPE, op.encode())
        elif number == NODE_DOMAIN and kind == LEN:
            out += len_field(NODE_DOMAIN, domain.encode())
            named = True
        else:
            out += raw
    if not named and domain:
        out += len_field(NODE_DOMAIN, domain.encode())
    return bytes(out)


def initializer_names(graph: list) -> set[str]:
    """The names of a GraphProto's (`fields`) initializers."""
    return {
        (strings(fields(tensor), TENSOR_NAME) or [""])[0]
        for tensor in payloads(graph, GRAPH_INITIALIZER)
    }


def with_ops_renamed(
    data: bytes, rename: Callable[[Node], str | None], domain: str
) -> bytes | None:
    """The serialized model ``data`` with each node for which ``rename`` gives an op name made
    that op of ``domain`` (inputs, outputs and attributes kept; `as_op`); None when it renames
    none or the model has not exactly one graph. ``rename`` may raise to refuse the model."""
    found = model_graph(data)
    if found is None:
        return None
    model, graph = found
    top = bytearray()
    count = 0
    for number, kind, value, raw in graph:
        if number == GRAPH_NODE and kind == LEN:
            op = rename(parse_node(value))  # type: ignore[arg-type]
            if op is not None:
                top += len_field(GRAPH_NODE, as_op(fields(value), op, domain))  # type: ignore[arg-type]
                count += 1
                continue
        top += raw
    return with_graph(model, bytes(top), domain) if count else None


def with_inputs(raw: bytes, renamed: dict[str, str]) -> bytes:
    """The NodeProto ``raw`` reading ``renamed[name]`` in place of each input ``name`` there."""
    out = bytearray()
    for number, kind, value, field_raw in fields(raw):
        if number == NODE_INPUT and kind == LEN and value.decode() in renamed:  # type: ignore[union-attr]
            out += len_field(NODE_INPUT, renamed[value.decode()].encode())  # type: ignore[union-attr]
        else:
            out += field_raw
    return bytes(out)


class GraphIndex:
    """A GraphProto's `fields` indexed for a rewrite that replaces chains of nodes: its nodes
    (`Node`), float32 scalar initializers by name, output names, and each value's producer and
    readers (node indices)."""

    def __init__(self, graph: list) -> None:
        self.graph = graph
        self.nodes = [parse_node(raw) for raw in payloads(graph, GRAPH_NODE)]
        self.floats: dict[str, float] = {}
        self.initializers: list[bytes] = payloads(graph, GRAPH_INITIALIZER)
        for tensor in self.initializers:
            value = float_scalar(tensor)
            if value is not None:
                self.floats[(strings(fields(tensor), TENSOR_NAME) or [""])[0]] = value
        self.outputs = {read_value_info(v)[0] for v in payloads(graph, GRAPH_OUTPUT)}
        self.producer = {name: i for i, node in enumerate(self.nodes) for name in node.outputs}
        self.users: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in node.inputs:
                self.users.setdefault(name, []).append(i)

    def only_user(self, name: str, op: str, domain: str = "") -> int | None:
        """The one node reading ``name`` when it is ``op`` (of ``domain``) and ``name`` is not a
        graph output."""
        users = self.users.get(name, [])
        if len(users) != 1 or name in self.outputs:
            return None
        node = self.nodes[users[0]]
        return users[0] if (node.domain, node.op) == (domain, op) else None

    def is_float(self, name: str, value: float) -> bool:
        """Whether ``name`` is a float32 scalar initializer holding exactly ``value``."""
        found = self.floats.get(name)
        return found is not None and struct.pack("<f", found) == struct.pack("<f", value)

    def rewritten(self, replaced: dict[int, bytes], dropped: set[int]) -> bytes:
        """The graph's bytes with node ``i`` replaced by the NodeProto ``replaced[i]``, the
        nodes in ``dropped`` left out, and the initializers only they read left out too
        (onnxruntime warns of each unused one); every other field as it was."""
        kept = (node for i, node in enumerate(self.nodes) if i not in dropped)
        used = {name for node in kept for name in node.inputs}
        used |= {name for raw in replaced.values() for name in parse_node(raw).inputs}
        gone = {name for i in dropped for name in self.nodes[i].inputs} - used - self.outputs
        out = bytearray()
        nodes_written = False
        for number, kind, value, raw in self.graph:
            tensor_name = (
                (strings(fields(value), TENSOR_NAME) or [""])[0]  # type: ignore[arg-type]
                if number == GRAPH_INITIALIZER and kind == LEN
                else None
            )
            if tensor_name in gone:
                continue
            if number == GRAPH_NODE and kind == LEN:
                if not nodes_written:  # (a graph's nodes are one run of fields in practice)
                    for i, node in enumerate(self.nodes):
                        if i in replaced:
                            out += len_field(GRAPH_NODE, replaced[i])
                        elif i not in dropped:
                            out += len_field(GRAPH_NODE, node.raw)
                    nodes_written = True
                continue
            out += raw
        return bytes(out)


def with_graph(model: list, graph: bytes, domain: str = "") -> bytes:
    """A ModelProto's `fields` rebuilt with ``graph`` as its graph, importing ``domain``
    (version 1) if it names one the model does not import yet."""
    out = bytearray()
    for number, kind, _, raw in model:
        out += len_field(MODEL_GRAPH, graph) if number == MODEL_GRAPH and kind == LEN else raw
    if domain and not opset(model, domain):
        out += opset_import(domain, 1)
    return bytes(out)


def value_info(name: str, elem: int, shape: list[int | str]) -> bytes:
    """A ValueInfoProto of a tensor: ``shape`` entries are sizes or symbolic names."""
    shape_bytes = bytearray()
    for dim in shape:
        if isinstance(dim, str):
            shape_bytes += len_field(SHAPE_DIM, len_field(DIM_PARAM, dim.encode()))
        else:
            shape_bytes += len_field(SHAPE_DIM, _varint_field(DIM_VALUE, dim))
    tensor = _varint_field(TENSOR_ELEM_TYPE, elem) + len_field(TENSOR_SHAPE, bytes(shape_bytes))
    return len_field(VALUE_NAME, name.encode()) + len_field(
        VALUE_TYPE, len_field(TYPE_TENSOR, tensor)
    )


def read_value_info(info: bytes) -> tuple[str, int, list[int | str]]:
    """``(name, element type, shape)`` of a tensor's ValueInfoProto (a dimension without a
    size or a name reads as ``""``)."""
    message = fields(info)
    name = (strings(message, VALUE_NAME) or [""])[0]
    elem, shape = 0, []
    for kind in payloads(message, VALUE_TYPE):
        for tensor in payloads(fields(kind), TYPE_TENSOR):
            tensor_fields = fields(tensor)
            elem = next(iter(_varints(tensor_fields, TENSOR_ELEM_TYPE)), 0)
            for shape_bytes in payloads(tensor_fields, TENSOR_SHAPE):
                for dim in payloads(fields(shape_bytes), SHAPE_DIM):
                    dim_fields = fields(dim)
                    sizes = _varints(dim_fields, DIM_VALUE)
                    named = strings(dim_fields, DIM_PARAM)
                    shape.append(sizes[0] if sizes else named[0] if named else "")
    return name, elem, shape


def opset(model: list, domain: str = "") -> int:
    """The opset version a ModelProto's `fields` import for ``domain`` (0 when none)."""
    for entry in payloads(model, MODEL_OPSET_IMPORT):
        entry_fields = fields(entry)
        if (strings(entry_fields, 1) or [""])[0] == domain:
            return next(iter(_varints(entry_fields, 2)), 0)
    return 0


def _tensor_locations(tensor: bytes) -> list[str]:
    out = []
    for entry in payloads(fields(tensor), TENSOR_EXTERNAL_DATA):
        entry_fields = fields(entry)
        if strings(entry_fields, 1) == ["location"]:
            out += strings(entry_fields, 2)
    return out


def external_locations(model: bytes) -> set[str]:
    """The external-data files the top graph's initializers name (``location``)."""
    found: set[str] = set()
    for graph in payloads(fields(model), MODEL_GRAPH):
        for tensor in payloads(fields(graph), GRAPH_INITIALIZER):
            found.update(_tensor_locations(tensor))
    return found


def relocated(model: bytes, locations: dict[str, str]) -> bytes:
    """``model`` with its top graph's initializers' external-data ``location`` renamed by
    ``locations`` (names it does not hold stay)."""

    def tensor_bytes(tensor: bytes) -> bytes:
        out = bytearray()
        for number, kind, value, raw in fields(tensor):
            if number == TENSOR_EXTERNAL_DATA and kind == LEN:
                entry_fields = fields(value)  # type: ignore[arg-type]
                named = strings(entry_fields, 2)
                if strings(entry_fields, 1) == ["location"] and named and named[0] in locations:
                    entry = len_field(1, b"location") + len_field(2, locations[named[0]].encode())
                    raw = len_field(number, entry)
            out += raw
        return bytes(out)

    model_out = bytearray()
    for number, kind, value, raw in fields(model):
        if number == MODEL_GRAPH and kind == LEN:
            graph_out = bytearray()
            for g_number, g_kind, g_value, g_raw in fields(value):  # type: ignore[arg-type]
                if g_number == GRAPH_INITIALIZER and g_kind == LEN:
                    g_raw = len_field(g_number, tensor_bytes(g_value))  # type: ignore[arg-type]
                graph_out += g_raw
            raw = len_field(number, bytes(graph_out))
        model_out += raw
    return bytes(model_out)
