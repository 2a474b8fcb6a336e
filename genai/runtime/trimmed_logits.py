"""A decoder graph whose long runs compute the lm_head for the rows genai reads, not for every
position.

A decoder exported by the reference's builder returns ``logits`` for every position of a run:
a 512-token prompt of a 49k-vocabulary model computes (and writes) 512 x 49152 logits to use one
row. The lm_head is then a large share of the prompt's time (a fifth of SmolLM2-135M's
weights) and the logits its largest buffer. `trim_logits` rewrites such a graph at load time:

* a run of at most `VERIFY_TOKENS` new tokens per row (decode steps, speculative verification,
  short appended turns), or a run whose attention mask has a zero (a padded batch), computes
  every row, exactly as before;
* a longer run without padding runs the lm_head chain on its last two positions: ``logits`` is
  ``[batch, 2, vocab]``, its last row each batch row's next-token logits. Two rows, not one,
  because onnxruntime's ``MatMulNBits`` takes another kernel for a single row whose last bits
  differ; from two rows on each row's result does not depend on the row count, so the row is
  bit-identical to the reference's run of the whole graph.

So a reader takes a run's row for its last token from position ``count - 1`` when the output
has ``count`` rows (per batch row, its last real token when padded), else from the output's
last row. The rewrite adds ten small nodes, which a decode step runs too (about a
microsecond of work each, plus onnxruntime's per-node cost).

The pre-head hidden state (the lm_head's input, ``[batch, sequence, hidden]``) becomes an
extra output, and `TrimmedLogits.head` is a graph of the lm_head chain alone: a caller that
asks for a long run's every row (`Generator.get_output("logits")`, as perplexity scripts do)
gets them from the head graph over the hidden state, the reference's values.

The rewrite applies when the graph's ``logits`` output is made by a ``MatMul`` /
``MatMulNBits`` over constant weights (at least `MIN_HEAD_SIZE` of them: a smaller lm_head
saves less than the nodes cost) followed only by elementwise ops with constants (a softcap, a
cast), the graph takes the attention mask as an input and imports opset 13 or later; other
graphs load as they are. It reads and writes the protobuf itself
(`genai.runtime.onnx_wire`). ``GENAI_TRIM_LOGITS=0`` turns it off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from genai.runtime import onnx_wire as wire

__all__ = ["MIN_HEAD_SIZE", "VERIFY_TOKENS", "TrimmedLogits", "trim_logits"]

log = logging.getLogger(__name__)

#: Runs of at most this many new tokens per row keep every row's logits (16 proposals + the
#: pending token: the reference's largest max_draft_tokens + 1, what speculative decoding
#: verifies in one run).
VERIFY_TOKENS = 17

#: The smallest lm_head (hidden x vocabulary weights) worth trimming: the ten nodes cost a
#: decode step some microseconds, what a prompt row of a 4M-weight lm_head takes.
MIN_HEAD_SIZE = 1 << 22

#: The ops that may make the lm_head, and the elementwise ops that may follow it.
_HEADS = {("", "MatMul"), ("com.microsoft", "MatMulNBits"), ("com.microsoft", "FusedMatMul")}
_ELEMENTWISE = {"Identity", "Cast", "Mul", "Div", "Add", "Sub", "Tanh"}
_PREFIX = "genai_trim/"


@dataclass(frozen=True)
class TrimmedLogits:
    """A trimmed decoder (see the module docstring): ``graph`` and ``head`` are serialized
    ModelProtos (their initializers keep their external-data references); ``hidden`` names
    the pre-head hidden state, an output of ``graph`` and the input of ``head``; runs of more
    than ``above`` tokens without padding return the logits of their last two positions.
    ``data_folder``: where the loader found the external data (None: the model folder). A
    loaded model's copy keeps neither graph (empty bytes) but a head graph of a few kilobytes
    (its weights in an external-data file)."""

    graph: bytes
    head: bytes
    hidden: str
    above: int
    data_folder: str | None = None


def _with_inputs_renamed(node: wire.Node, rename: dict[str, str]) -> bytes:
    """``node``'s bytes with its inputs renamed by ``rename``."""
    out = bytearray()
    for number, kind, value, raw in wire.fields(node.raw):
        if number == wire.NODE_INPUT and kind == wire.LEN:
            name = value.decode()  # type: ignore[union-attr]
            out += wire.len_field(number, rename.get(name, name).encode())
        else:
            out += raw
    return bytes(out)


def trim_logits(
    data: bytes,
    *,
    logits: str = "logits",
    mask: str = "attention_mask",
    min_head_size: int = MIN_HEAD_SIZE,
) -> TrimmedLogits | None:
    """The trimmed graph of the serialized model ``data`` (see the module docstring), or None
    when its graph is not one the rewrite applies to or its lm_head has fewer than
    ``min_head_size`` weights."""
    try:
        return _trim(data, logits, mask, min_head_size)
    except (wire.MalformedProto, UnicodeDecodeError, ValueError) as exc:
        log.debug("logits not trimmed: %s", exc)
        return None


def _trim(data: bytes, logits: str, mask: str, min_head_size: int) -> TrimmedLogits | None:
    found = wire.model_graph(data)
    if found is None or wire.opset(found[0]) < 13:
        return None
    model, graph = found
    nodes = [wire.parse_node(raw) for raw in wire.payloads(graph, wire.GRAPH_NODE)]
    inits = {}
    for tensor in wire.payloads(graph, wire.GRAPH_INITIALIZER):
        names = wire.strings(wire.fields(tensor), wire.TENSOR_NAME)
        if names:
            inits[names[0]] = tensor
    inputs = {wire.read_value_info(v)[0]: v for v in wire.payloads(graph, wire.GRAPH_INPUT)}
    outputs = {wire.read_value_info(v)[0]: v for v in wire.payloads(graph, wire.GRAPH_OUTPUT)}
    if logits not in outputs or mask not in inputs:
        return None
    producer = {name: i for i, node in enumerate(nodes) for name in node.outputs}
    uses: dict[str, int] = {}
    for node in nodes:
        for name in node.inputs:
            uses[name] = uses.get(name, 0) + 1
    constants = set(inits) | {
        name for node in nodes if node.op == "Constant" and not node.domain for name in node.outputs
    }

    # walk back from the logits through elementwise ops to the lm_head
    chain: list[int] = []
    name = logits
    while True:
        if name not in producer or (chain and (uses.get(name) != 1 or name in outputs)):
            return None
        index = producer[name]
        node = nodes[index]
        chain.append(index)
        if (node.domain, node.op) in _HEADS:
            break
        variable = [x for x in node.inputs if x and x not in constants]
        if node.domain or node.op not in _ELEMENTWISE or len(variable) != 1 or len(chain) > 8:
            return None
        name = variable[0]
    head = nodes[chain[-1]]
    hidden = head.inputs[0]
    weights = [x for x in head.inputs[1:] if x]
    if uses.get(logits) or hidden in inputs or not all(x in inits for x in weights):
        return None
    # the hidden state's type: the weights' (MatMul's B; MatMulNBits' scales)
    typed = weights[1] if head.op == "MatMulNBits" and len(weights) > 1 else weights[0]
    hidden_type = wire.elem_type(inits[typed])
    _, logits_type, logits_shape = wire.read_value_info(outputs[logits])
    if not hidden_type or len(logits_shape) != 3:
        return None
    if _head_size(head, inits[weights[0]]) < min_head_size:
        return None  # too small to pay for the nodes every decode step runs too

    mask_type = wire.read_value_info(inputs[mask])[1]
    if mask_type not in (wire.INT32, wire.INT64):
        return None
    new_nodes, new_inits = _trim_nodes(hidden, mask, mask_type)
    rows = _PREFIX + "rows"
    top = bytearray()
    for number, _, _, raw in graph:
        if number in (wire.GRAPH_NODE, wire.GRAPH_OUTPUT):
            continue
        top += raw
    for i, node in enumerate(nodes):
        if i == chain[-1]:
            for raw in new_nodes:
                top += wire.len_field(wire.GRAPH_NODE, raw)
            top += wire.len_field(wire.GRAPH_NODE, _with_inputs_renamed(node, {hidden: rows}))
        else:
            top += wire.len_field(wire.GRAPH_NODE, node.raw)
    for raw in new_inits:
        top += wire.len_field(wire.GRAPH_INITIALIZER, raw)
    for name, info in outputs.items():
        if name == logits:
            dims = [logits_shape[0], "logits_rows", logits_shape[2]]
            info = wire.value_info(logits, logits_type, dims)
        top += wire.len_field(wire.GRAPH_OUTPUT, info)
    hidden_shape: list[int | str] = [logits_shape[0], "sequence_length", "hidden_size"]
    top += wire.len_field(wire.GRAPH_OUTPUT, wire.value_info(hidden, hidden_type, hidden_shape))

    # the head alone: the chain's nodes, the constants they use, and nothing else
    used = {x for i in chain for x in nodes[i].inputs}
    head_graph = bytearray()
    for i, node in enumerate(nodes):
        if i in chain or (node.op == "Constant" and set(node.outputs) & used):
            head_graph += wire.len_field(wire.GRAPH_NODE, node.raw)
    head_graph += wire.len_field(wire.GRAPH_NAME, b"genai_lm_head")
    for name, tensor in inits.items():
        if name in used:
            head_graph += wire.len_field(wire.GRAPH_INITIALIZER, tensor)
    head_graph += wire.len_field(
        wire.GRAPH_INPUT, wire.value_info(hidden, hidden_type, hidden_shape)
    )
    head_graph += wire.len_field(wire.GRAPH_OUTPUT, outputs[logits])
    return TrimmedLogits(
        graph=_with_graph(model, bytes(top)),
        head=_with_graph(model, bytes(head_graph)),
        hidden=hidden,
        above=VERIFY_TOKENS,
    )


def _head_size(head: wire.Node, weight: bytes) -> int:
    """The lm_head's weight count: ``K x N`` of a ``MatMulNBits``, else its weight's size."""
    if head.op == "MatMulNBits":
        sizes = {}
        for attr in wire.payloads(wire.fields(head.raw), wire.NODE_ATTRIBUTE):
            attr_fields = wire.fields(attr)
            name = (wire.strings(attr_fields, wire.ATTR_NAME) or [""])[0]
            value = [v for n, w, v, _ in attr_fields if n == wire.ATTR_INT and w == wire.VARINT]
            if name in ("K", "N") and value:
                sizes[name] = int(value[0])  # type: ignore[arg-type]
        return sizes.get("K", 0) * sizes.get("N", 0)
    size = 1
    for dim in wire.dims(weight):
        size *= dim
    return size


def _with_graph(model: list, graph: bytes) -> bytes:
    out = bytearray()
    for number, _, _, raw in model:
        if number != wire.MODEL_GRAPH:
            out += raw
    out += wire.len_field(wire.MODEL_GRAPH, graph)
    return bytes(out)


def _trim_nodes(hidden: str, mask: str, mask_type: int) -> tuple[list[bytes], list[bytes]]:
    """The nodes (and their constants) that slice the lm_head's rows into ``genai_trim/rows``:
    every position, or the last two of a run of more than `VERIFY_TOKENS` tokens whose
    attention mask is all ones."""
    p = _PREFIX
    inits = [
        wire.int_tensor(p + "zero_mask", [0], [], elem=mask_type),
        wire.int_tensor(p + "one", [1], []),
        wire.int_tensor(p + "two", [2], []),
        wire.int_tensor(p + "zero", [0], []),
        wire.int_tensor(p + "above", [VERIFY_TOKENS], []),
        wire.int_tensor(p + "one_d", [1]),
        wire.int_tensor(p + "big", [1 << 62]),
    ]
    n: list[bytes] = []

    def op(kind: str, inputs: list[str], out: str, **ints: int | list[int]) -> None:
        n.append(wire.node(kind, inputs, [p + out], p + out, ints=ints or None))

    op("Shape", [hidden], "hidden_shape")
    op("Gather", [p + "hidden_shape", p + "one"], "count", axis=0)  # new tokens per row
    op("Greater", [p + "count", p + "above"], "long")
    op("ReduceMin", [mask], "mask_min", keepdims=0)  # 0: a padded row
    op("Greater", [p + "mask_min", p + "zero_mask"], "unpadded")
    op("And", [p + "long", p + "unpadded"], "trim")
    op("Sub", [p + "count", p + "two"], "count_less_two")
    op("Where", [p + "trim", p + "count_less_two", p + "zero"], "start")
    op("Reshape", [p + "start", p + "one_d"], "starts")
    op("Slice", [hidden, p + "starts", p + "big", p + "one_d"], "rows")
    return n, inits
