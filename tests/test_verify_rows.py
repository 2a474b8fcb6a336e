"""`genai.runtime.verify_rows`: which graphs' verify runs can get one-token steps' numbers, the
answer checked against onnxruntime's own int4 kernel run alone and among other rows."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from genai.runtime.verify_rows import linear_ops, rows_like_steps


def _linear_model(accuracy: int, extra: str | None = None, zero_points: bool = False) -> bytes:
    rng = np.random.default_rng(accuracy)
    k, n, block = 256, 96, 32
    inits = [
        numpy_helper.from_array(rng.integers(0, 256, (n, k // block, 16), dtype=np.uint8), "w"),
        numpy_helper.from_array((rng.random(n * k // block) * 0.02).astype(np.float32), "s"),
    ]
    names = ["a", "w", "s"]
    if zero_points:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, n * 4, dtype=np.uint8), "z"))
        names.append("z")
    nodes = [
        helper.make_node(
            "MatMulNBits",
            names,
            ["y"],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=4,
            block_size=block,
            accuracy_level=accuracy,
        )
    ]
    if extra:
        inits.append(numpy_helper.from_array(np.eye(n, dtype=np.float32), "eye"))
        nodes.append(helper.make_node(extra, ["y", "eye"], ["y2"]))
    out = "y2" if extra else "y"
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _alone_as_in_a_run(data: bytes) -> bool:
    """onnxruntime itself: five rows in one run against each row alone, every bit."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    rows = np.random.default_rng(1).standard_normal((5, 256)).astype(np.float32)
    together = session.run(None, {"a": rows})[0]
    alone = np.concatenate([session.run(None, {"a": rows[i : i + 1]})[0] for i in range(5)])
    return bool(np.array_equal(together.view(np.uint32), alone.view(np.uint32)))


@pytest.mark.parametrize("accuracy", [0, 1, 4])
@pytest.mark.parametrize("zero_points", [False, True])
def test_probe_answers_as_onnxruntime_runs(accuracy: int, zero_points: bool) -> None:
    data = _linear_model(accuracy, zero_points=zero_points)
    ops = linear_ops(data)
    assert ops == frozenset({(256, 96, 4, 32, accuracy, zero_points)})
    assert rows_like_steps(ops) == _alone_as_in_a_run(data)


def test_other_linears_are_not_vouched_for() -> None:
    assert linear_ops(_linear_model(4, extra="MatMul")) is None
    assert not rows_like_steps(None)
    assert linear_ops(b"not a model") is None
    assert rows_like_steps(frozenset())  # no linears: nothing depends on the run's length
