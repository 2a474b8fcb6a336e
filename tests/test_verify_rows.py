"""`genai.runtime.verify_rows`: which graphs' verify runs can get one-token steps' numbers, the
answer checked against onnxruntime's own int4 kernel run alone and among other rows."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from genai.runtime.verify_rows import FLOAT_BITS, linear_ops, rows_like_steps


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


@pytest.mark.parametrize(
    "setting", [(256, 96, FLOAT_BITS, 0, 0, False), (256, 96, 4, 32, 4, True)], ids=str
)
def test_a_probe_model_is_what_onnx_reads(setting) -> None:
    """The probe's one-node model, written by hand with its weight last (one copy), is a
    model onnx parses and onnxruntime runs: ``y = a @ w`` for a float setting."""
    import onnx

    from genai.runtime.verify_rows import _probe_model

    k, n, bits = setting[:3]
    data = _probe_model(*setting)
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = model.graph.node[0]
    assert [i.name for i in model.graph.input] == ["a"] and list(node.output) == ["y"]
    if bits == FLOAT_BITS:
        assert node.op_type == "MatMul" and weights["w"].shape == (k, n)
        rows = np.random.default_rng(2).standard_normal((3, k)).astype(np.float32)
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, {"a": rows})[0], rows @ weights["w"], 1e-4)
    else:
        attrs = {a.name: a.i for a in node.attribute}
        assert (node.domain, node.op_type) == ("com.microsoft", "MatMulNBits")
        assert (attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]) == setting[:4]
        assert weights["w"].shape == (n, k // 32, 16) and set(weights) == {"w", "s", "z"}


def test_float_matmuls_on_initializers_are_asked_too() -> None:
    """A float32 MatMul on a [K, N] initializer is a setting of its own; its answer is
    onnxruntime's (its packed SGEMM gives a row alone the bits it gives it in a run)."""
    data = _linear_model(4, extra="MatMul")
    ops = linear_ops(data)
    assert ops == frozenset({(256, 96, 4, 32, 4, False), (96, 96, FLOAT_BITS, 0, 0, False)})
    alone = _alone_as_in_a_run(_float_model())
    assert rows_like_steps(frozenset({(256, 96, FLOAT_BITS, 0, 0, False)})) == alone


def _float_model() -> bytes:
    weight = np.random.default_rng(5).standard_normal((256, 96)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])],
        "float",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_other_linears_are_not_vouched_for() -> None:
    assert linear_ops(_linear_model(4, extra="Gemm")) is None
    # a MatMul on a computed or run-time weight (not a LoRA input genai's rewrite took)
    computed = helper.make_graph(
        [helper.make_node("MatMul", ["a", "a2"], ["y"]), helper.make_node("Neg", ["a"], ["a2"])],
        "computed",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(computed, opset_imports=[helper.make_opsetid("", 17)])
    assert linear_ops(model.SerializeToString()) is None
    assert not rows_like_steps(None)
    assert linear_ops(b"not a model") is None
    assert rows_like_steps(frozenset())  # no linears: nothing depends on the run's length
