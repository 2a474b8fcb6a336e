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

from genai.runtime import onnx_wire as wire

__all__ = ["RunLengthSplit", "split_by_run_length"]

log = logging.getLogger(__name__)

#: The name genai's builder gives the ``If`` (a cheap test before parsing the graph), and how
#: far into the file it is looked for.
_MARKER = b"prefill_or_decode"
_MARKER_WITHIN = 1 << 20


@dataclass(frozen=True)
class RunLengthSplit:
    """The two flattened graphs (serialized ModelProtos) and the length that separates them:
    runs whose ``ids`` input is longer than ``above`` along axis 1 run ``long_graph``."""

    short_graph: bytes
    long_graph: bytes
    ids: str
    above: int


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
    fields = wire.fields(node)
    inputs = wire.strings(fields, wire.NODE_INPUT)
    names = inputs + wire.strings(fields, wire.NODE_OUTPUT)
    op = wire.strings(fields, wire.NODE_OP_TYPE)
    if op and op[0] in _SUBGRAPH_OPS:
        for attr in wire.payloads(fields, wire.NODE_ATTRIBUTE):
            attr_fields = wire.fields(attr)
            for graph in wire.payloads(attr_fields, wire.ATTR_GRAPH) + wire.payloads(
                attr_fields, wire.ATTR_GRAPHS
            ):
                used |= _inputs_used(wire.payloads(wire.fields(graph), wire.GRAPH_NODE))
    if not any(name in rename for name in names):
        used.update(inputs)
        return node, inputs
    out = bytearray()
    for number, kind, value, raw in fields:
        if number in (wire.NODE_INPUT, wire.NODE_OUTPUT) and kind == wire.LEN:
            name = value.decode()
            out += wire.len_field(number, rename.get(name, name).encode())
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
    except (wire.MalformedProto, UnicodeDecodeError, struct.error) as exc:
        log.debug("%s: not split (%s)", path, exc)
        return None


def _split(data: bytes, path: Path) -> RunLengthSplit | None:
    found = wire.model_graph(data)
    if found is None:
        return None
    model, graph = found
    nodes = [wire.fields(node) for node in wire.payloads(graph, wire.GRAPH_NODE)]
    if len(nodes) != 4:
        return None
    kinds = [(wire.strings(node, wire.NODE_OP_TYPE) or [""])[0] for node in nodes]
    if sorted(kinds) != ["Gather", "Greater", "If", "Shape"]:
        return None
    by_kind = dict(zip(kinds, nodes, strict=True))
    producer = {
        out: kind for kind, node in by_kind.items() for out in wire.strings(node, wire.NODE_OUTPUT)
    }
    inits = {}
    for tensor in wire.payloads(graph, wire.GRAPH_INITIALIZER):
        names = wire.strings(wire.fields(tensor), wire.TENSOR_NAME)
        if names:
            inits[names[0]] = tensor
    if_in, greater_in = (
        wire.strings(by_kind["If"], wire.NODE_INPUT),
        wire.strings(by_kind["Greater"], wire.NODE_INPUT),
    )
    gather_in, shape_in = (
        wire.strings(by_kind["Gather"], wire.NODE_INPUT),
        wire.strings(by_kind["Shape"], wire.NODE_INPUT),
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
        or wire.scalar(inits[gather_in[1]]) != 1
    ):
        return None
    above = wire.scalar(inits[greater_in[1]])
    if above is None or above < 0:
        return None
    outer_outputs = wire.strings(by_kind["If"], wire.NODE_OUTPUT)
    graph_outputs = [
        wire.strings(wire.fields(v), wire.VALUE_NAME)[0]
        for v in wire.payloads(graph, wire.GRAPH_OUTPUT)
    ]
    if outer_outputs != graph_outputs:
        return None
    branches = {}
    for attr in wire.payloads(by_kind["If"], wire.NODE_ATTRIBUTE):
        attr_fields = wire.fields(attr)
        name, subgraphs = (
            wire.strings(attr_fields, wire.ATTR_NAME),
            wire.payloads(attr_fields, wire.ATTR_GRAPH),
        )
        if name and len(subgraphs) == 1:
            branches[name[0]] = subgraphs[0]
    if set(branches) != {"then_branch", "else_branch"}:
        return None

    def flatten(branch: bytes) -> bytes:
        fields = wire.fields(branch)
        inner_outputs = [
            wire.strings(wire.fields(v), wire.VALUE_NAME)[0]
            for v in wire.payloads(fields, wire.GRAPH_OUTPUT)
        ]
        if len(inner_outputs) != len(outer_outputs):
            raise wire.MalformedProto("the branch's outputs are not the If's")
        rename = dict(zip(inner_outputs, outer_outputs, strict=True))
        used: set[str] = set()
        flat_nodes = [
            _renamed(node, rename, used)[0] for node in wire.payloads(fields, wire.GRAPH_NODE)
        ]
        top = bytearray()
        for number, _, _, raw in graph:
            if number not in (wire.GRAPH_NODE, wire.GRAPH_INITIALIZER):
                top += raw
        for node in flat_nodes:
            top += wire.len_field(wire.GRAPH_NODE, node)
        for name, tensor in inits.items():
            if name in used:
                top += wire.len_field(wire.GRAPH_INITIALIZER, tensor)
        out = bytearray()
        for number, _, _, raw in model:
            if number != wire.MODEL_GRAPH:
                out += raw
        out += wire.len_field(wire.MODEL_GRAPH, bytes(top))
        return bytes(out)

    split = RunLengthSplit(
        short_graph=flatten(branches["else_branch"]),
        long_graph=flatten(branches["then_branch"]),
        ids=shape_in[0],
        above=above,
    )
    log.debug("%s: runs of more than %d tokens take the If's then branch", path, above)
    return split
