"""Two sessions for a decoder graph that branches on its run's length.

genai's builder writes ``--prefill-int8`` decoders as one ``If`` at the top of the graph
(`genai.builder.onnx_writer`): runs of more than ``VERIFY_TOKENS`` new tokens per row take
the int8 branch, shorter ones (decode steps, speculative verification) the int4 branch. Both
engines run that graph as it is, but ORT's ``If`` costs every decode step a few percent. genai
instead makes one session per branch, each the branch's nodes flattened into the top graph
(same inputs, outputs, initializers and kernels, so the same numbers), and routes each run to
the one the ``If`` would take (`genai._core.native_session.NativeSession.route_long_runs`).

`split_by_run_length` recognises the pattern, ``If(Greater(Gather(Shape(ids), 1), N))``,
whatever else a folder holds: graphs without it load as they are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["RunLengthSplit", "split_by_run_length"]

log = logging.getLogger(__name__)

#: The name genai's builder gives the ``If`` (a cheap test before parsing the graph).
_MARKER = b"prefill_or_decode"


@dataclass(frozen=True)
class RunLengthSplit:
    """The two flattened graphs (serialized ModelProtos) and the length that separates them:
    runs whose ``ids`` input is longer than ``above`` along axis 1 run ``long_graph``."""

    short_graph: bytes
    long_graph: bytes
    ids: str
    above: int


def split_by_run_length(path: str | Path) -> RunLengthSplit | None:
    """The two graphs of ``path`` when its top level is one run-length ``If`` (see the module
    docstring), else None. Initializers keep their external-data references (a session made
    from the bytes needs the model folder as its external-data folder)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if _MARKER not in data:
        return None
    import onnx  # lazy: only for graphs that carry the builder's marker
    from onnx import numpy_helper  # lazy: as onnx

    model = onnx.load_from_string(data)
    graph = model.graph
    ifs = [node for node in graph.node if node.op_type == "If"]
    if len(ifs) != 1 or len(graph.node) != 4:
        return None
    node = ifs[0]
    producers = {out: n for n in graph.node for out in n.output}
    inits = {init.name: init for init in graph.initializer}

    def scalar(name: str) -> int | None:
        init = inits.get(name)
        if init is None or init.data_location == onnx.TensorProto.EXTERNAL:
            return None
        value = np.asarray(numpy_helper.to_array(init)).reshape(-1)
        return int(value[0]) if value.size == 1 else None

    greater = producers.get(node.input[0])
    gather = producers.get(greater.input[0]) if greater is not None else None
    shape = producers.get(gather.input[0]) if gather is not None else None
    if (
        greater is None
        or greater.op_type != "Greater"
        or gather is None
        or gather.op_type != "Gather"
        or shape is None
        or shape.op_type != "Shape"
        or scalar(gather.input[1]) != 1
    ):
        return None
    above = scalar(greater.input[1])
    if above is None:
        return None
    branches = {attr.name: attr.g for attr in node.attribute}
    if set(branches) != {"then_branch", "else_branch"}:
        return None
    if list(node.output) != [value.name for value in graph.output]:
        return None

    def flatten(branch: onnx.GraphProto) -> bytes:
        flat = onnx.ModelProto()
        flat.CopyFrom(model)
        top = flat.graph
        rename = {
            inner.name: outer for inner, outer in zip(branch.output, node.output, strict=True)
        }
        del top.node[:]
        for inner in branch.node:
            copy = top.node.add()
            copy.CopyFrom(inner)
            copy.input[:] = [rename.get(name, name) for name in copy.input]
            copy.output[:] = [rename.get(name, name) for name in copy.output]
        used = {name for n in top.node for name in n.input}
        for attr_node in top.node:  # nested subgraphs read outer values too
            for attr in attr_node.attribute:
                if attr.HasField("g"):
                    used.update(name for n in attr.g.node for name in n.input)
        kept = [init for init in top.initializer if init.name in used]
        del top.initializer[:]
        top.initializer.extend(kept)
        return flat.SerializeToString()

    split = RunLengthSplit(
        short_graph=flatten(branches["else_branch"]),
        long_graph=flatten(branches["then_branch"]),
        ids=shape.input[0],
        above=above,
    )
    log.debug("%s: runs of more than %d tokens take the If's other branch", path, above)
    return split
