"""`genai.runtime.outlined_weights`: a graph file with its weights inside, as a small graph whose
initializers point into that file. Checked against onnx's own external-data reader and against
onnxruntime running the file itself."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from genai.runtime.outlined_weights import MIN_OUTLINED_BYTES, outlined

FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def _model(weights: dict[str, np.ndarray], typed: np.ndarray | None = None) -> onnx.ModelProto:
    """``y = ((x @ w1) @ w2) + b``, ``z = x @ w_typed`` (a weight in typed fields, not raw
    bytes) where given, the shape constant of a Reshape, and a string initializer."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "b"], ["h3"]),
        helper.make_node("Reshape", ["h3", "shape"], ["y"]),
    ]
    inits = [numpy_helper.from_array(value, name) for name, value in weights.items()]
    inits.append(numpy_helper.from_array(np.array([2, -1], np.int64), "shape"))
    inits.append(helper.make_tensor("words", TensorProto.STRING, [2], [b"a" * 900, b"b" * 900]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if typed is not None:
        nodes.append(helper.make_node("MatMul", ["x", "w_typed"], ["z"]))
        inits.append(
            helper.make_tensor("w_typed", TensorProto.FLOAT, typed.shape, typed.ravel().tolist())
        )
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        outputs,
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "w1": rng.standard_normal((64, 48)).astype(np.float32),
        "w2": rng.standard_normal((48, 32)).astype(np.float32),
        "b": rng.standard_normal(32).astype(np.float32),  # 128 bytes: stays inside
    }


def test_large_raw_initializers_point_into_the_file(tmp_path, weights):
    typed = np.random.default_rng(8).standard_normal((64, 16)).astype(np.float32)
    path = tmp_path / "model.onnx"
    onnx.save(_model(weights, typed), str(path))
    small = outlined(path, limit=1 << 20)
    assert small is not None
    assert len(small) < path.stat().st_size - weights["w1"].nbytes - weights["w2"].nbytes + 1024

    model = onnx.load_from_string(small)  # (from bytes: external data not read)
    by_name = {tensor.name: tensor for tensor in model.graph.initializer}
    outside = {
        name for name, tensor in by_name.items() if external_data_helper.uses_external_data(tensor)
    }
    assert outside == {"w1", "w2"}  # not the small bias or shape, the typed weight, the strings
    for name in outside:
        info = {entry.key: entry.value for entry in by_name[name].external_data}
        assert info["location"] == "model.onnx"
        assert int(info["length"]) == weights[name].nbytes >= MIN_OUTLINED_BYTES
        assert not by_name[name].HasField("raw_data")
    # onnx's own reader finds every tensor's values where the references say
    external_data_helper.load_external_data_for_model(model, str(tmp_path))
    for name, value in weights.items():
        np.testing.assert_array_equal(numpy_helper.to_array(by_name[name]), value)
    np.testing.assert_array_equal(numpy_helper.to_array(by_name["w_typed"]), typed)

    # onnxruntime runs the small graph as it runs the file
    options = ort.SessionOptions()
    options.add_session_config_entry(FOLDER_KEY, str(tmp_path))
    from_bytes = ort.InferenceSession(small, options, providers=["CPUExecutionProvider"])
    from_file = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(9).standard_normal((2, 64)).astype(np.float32)
    ours, theirs = from_bytes.run(None, {"x": x}), from_file.run(None, {"x": x})
    for mine, expected in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine, expected)


def test_graphs_it_cannot_shrink_give_none(tmp_path, weights):
    path = tmp_path / "model.onnx"
    onnx.save(_model(weights), str(path))
    assert outlined(path, limit=1 << 20) is not None
    assert outlined(path, limit=256) is None  # what remains is still larger than the limit

    small_only = tmp_path / "small.onnx"
    onnx.save(_model({name: value[:4, :4] for name, value in weights.items() if name != "b"}
                     | {"b": weights["b"][:4]}), str(small_only))  # fmt: skip
    assert outlined(small_only, limit=1 << 20) is None  # nothing to outline

    external = tmp_path / "external" / "model.onnx"
    external.parent.mkdir()
    onnx.save(_model(weights), str(external), save_as_external_data=True, location="data")
    assert outlined(external, limit=1 << 20) is None  # already outside

    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 64)
    assert outlined(garbage, limit=1 << 20) is None
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    assert outlined(empty, limit=1 << 20) is None
    assert outlined(tmp_path / "missing.onnx", limit=1 << 20) is None
