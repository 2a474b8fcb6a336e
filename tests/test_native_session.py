"""NativeSession (onnxruntime through its C API, genai._core.native_session) on tiny ONNX models,
checked against NumPy and onnxruntime's own Python InferenceSession."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

try:
    from genai._core import native_session, ort_api
except ImportError as exc:  # pragma: no cover - depends on the build
    pytest.skip(
        "genai._core.native_session / ort_api are not compiled (build the Cython extensions with "
        f"`python setup.py build_ext --inplace`): {exc}",
        allow_module_level=True,
    )

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

NativeSession = native_session.NativeSession


def _save(graph, path: Path) -> str:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture(scope="module")
def affine_model(tmp_path_factory) -> str:
    """Y = X * 2 + 1 (X float32 [n, 4]); J = I + 1 (I int64 [m])."""
    nodes = [
        helper.make_node("Mul", ["X", "two"], ["X2"]),
        helper.make_node("Add", ["X2", "one"], ["Y"]),
        helper.make_node("Add", ["I", "ione"], ["J"]),
    ]
    graph = helper.make_graph(
        nodes,
        "affine",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("I", TensorProto.INT64, ["m"]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("J", TensorProto.INT64, ["m"]),
        ],
        initializer=[
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("ione", TensorProto.INT64, [], [1]),
        ],
    )
    return _save(graph, tmp_path_factory.mktemp("affine") / "affine.onnx")


@pytest.fixture(scope="module")
def kv_model(tmp_path_factory) -> str:
    """A KV-like step: present = past + delta (delta broadcast over the sequence axis) and
    total = ReduceSum(attention_mask). present is meant to be bound to past's own buffer."""
    nodes = [
        helper.make_node("Add", ["past", "delta"], ["present"]),
        helper.make_node("ReduceSum", ["attention_mask"], ["total"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "kv",
        [
            helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, "max_len", 4]),
            helper.make_tensor_value_info("delta", TensorProto.FLOAT, [1, 2, 1, 4]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "total_len"]),
        ],
        [
            helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, 2, "max_len", 4]),
            helper.make_tensor_value_info("total", TensorProto.INT64, []),
        ],
    )
    return _save(graph, tmp_path_factory.mktemp("kv") / "kv.onnx")


@pytest.fixture(scope="module")
def step_model(tmp_path_factory) -> str:
    """Outputs shaped like their inputs: Y = X + 1 (float32 [n, 4]), W = Z + 2 (int64 [m])."""
    nodes = [
        helper.make_node("Add", ["X", "one"], ["Y"]),
        helper.make_node("Add", ["Z", "two"], ["W"]),
    ]
    graph = helper.make_graph(
        nodes,
        "step",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("Z", TensorProto.INT64, ["m"]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("W", TensorProto.INT64, ["m"]),
        ],
        initializer=[
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("two", TensorProto.INT64, [], [2]),
        ],
    )
    return _save(graph, tmp_path_factory.mktemp("step") / "step.onnx")


@pytest.fixture(scope="module")
def grow_model(tmp_path_factory) -> str:
    """A growing KV cache: present = Concat(past, new) on axis 1 (float32 [1, t, 4] ->
    [1, t + 1, 4]) and total = ReduceSum(present) (read each step, like logits)."""
    nodes = [
        helper.make_node("Concat", ["past", "new"], ["present"], axis=1),
        helper.make_node("ReduceSum", ["present"], ["total"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "grow",
        [
            helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, "past_len", 4]),
            helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, 1, 4]),
        ],
        [
            helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, "total_len", 4]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
    )
    return _save(graph, tmp_path_factory.mktemp("grow") / "grow.onnx")


def test_library_and_version():
    path = ort_api.library_path()
    assert os.path.basename(path).startswith("libonnxruntime")
    assert ort_api.version() == ort.__version__
    assert ort_api.api_version() >= 12


def test_metadata(affine_model):
    s = NativeSession(affine_model)
    assert s.input_names == ("X", "I")
    assert s.output_names == ("Y", "J")
    assert s.input_dtypes == {"X": np.dtype(np.float32), "I": np.dtype(np.int64)}
    assert s.output_dtypes == {"Y": np.dtype(np.float32), "J": np.dtype(np.int64)}
    assert s.input_elem_types == {"X": 1, "I": 7}
    assert s.input_shapes == {"X": ("n", 4), "I": ("m",)}
    assert s.output_shapes == {"Y": ("n", 4), "J": ("m",)}
    assert s.input_index("I") == 1
    assert s.output_index("Y") == 0


def test_outputs_match_numpy_and_onnxruntime(affine_model):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    i = np.array([5, -1, 7, 0], np.int64)
    y = np.full((3, 4), np.nan, np.float32)
    j = np.zeros(4, np.int64)

    s = NativeSession(affine_model, intra_op_num_threads=1, graph_optimization_level=0)
    s.bind_input("X", x)
    s.bind_input("I", i)
    s.bind_output("Y", y)
    s.bind_output("J", j)
    s.run()
    np.testing.assert_array_equal(y, x * 2 + 1)
    np.testing.assert_array_equal(j, i + 1)

    ref = ort.InferenceSession(affine_model, providers=["CPUExecutionProvider"])
    ry, rj = ref.run(None, {"X": x, "I": i})
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(j, rj)

    # get_output copies what the binding holds
    np.testing.assert_array_equal(s.get_output("Y"), ry)

    # re-binding new data to the same names, run again
    x2 = x[::-1].copy()
    s.bind_input("X", x2)
    s.run()
    np.testing.assert_array_equal(y, x2 * 2 + 1)


def test_bind_output_to_device(affine_model):
    s = NativeSession(affine_model)
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    i = np.arange(3, dtype=np.int64)
    s.bind_input("X", x)
    s.bind_input("I", i)
    s.bind_output_to_device("Y")
    s.bind_output_to_device("J")
    s.run()
    y = s.get_output("Y")
    assert y.shape == (5, 4) and y.dtype == np.float32
    np.testing.assert_array_equal(y, x * 2 + 1)
    np.testing.assert_array_equal(s.get_output("J"), i + 1)
    # the output changes shape with the input: ORT allocates again
    s.bind_input("X", x[:2].copy())
    s.run()
    np.testing.assert_array_equal(s.get_output("Y"), x[:2] * 2 + 1)


def test_prefix_view_of_larger_buffers(affine_model):
    """shape= binds the first prod(shape) elements of a larger preallocated buffer."""
    xbuf = np.arange(40, dtype=np.float32).reshape(10, 4)
    ybuf = np.full((10, 4), -7, np.float32)
    ibuf = np.arange(8, dtype=np.int64)
    jbuf = np.full(8, -7, np.int64)
    s = NativeSession(affine_model)
    for n in (1, 3, 10):
        ybuf[:] = -7
        jbuf[:] = -7
        s.bind_input("X", xbuf, shape=(n, 4))
        s.bind_input("I", ibuf, shape=(n % 8,))
        s.bind_output("Y", ybuf, shape=(n, 4))
        s.bind_output("J", jbuf, shape=(n % 8,))
        s.run()
        np.testing.assert_array_equal(ybuf[:n], xbuf[:n] * 2 + 1)
        assert (ybuf[n:] == -7).all(), "rows past the bound prefix must be untouched"
        np.testing.assert_array_equal(jbuf[: n % 8], ibuf[: n % 8] + 1)
        assert (jbuf[n % 8 :] == -7).all()
        assert s.get_output("Y").shape == (n, 4)


def test_shared_kv_buffer_and_growing_mask(kv_model):
    """present bound to past's buffer (in place, like a shared KV cache); the attention mask is
    a growing prefix of one preallocated buffer, re-bound each step."""
    max_len = 6
    rng = np.random.default_rng(1)
    kv = rng.standard_normal((1, 2, max_len, 4)).astype(np.float32)
    start = kv.copy()
    delta = rng.standard_normal((1, 2, 1, 4)).astype(np.float32)
    mask = np.ones((1, max_len), np.int64)
    total = np.zeros((), np.int64)

    ref = ort.InferenceSession(kv_model, providers=["CPUExecutionProvider"])
    want_present, want_total = ref.run(
        None, {"past": start, "delta": delta, "attention_mask": mask[:, :1]}
    )

    s = NativeSession(kv_model, intra_op_num_threads=1)
    s.bind_input("past", kv)
    s.bind_output("present", kv)
    s.bind_input("delta", delta)
    s.bind_output("total", total)
    expected = start.copy()
    for step in range(1, max_len + 1):
        s.bind_input("attention_mask", mask, shape=(1, step))
        s.run()
        expected = expected + delta
        np.testing.assert_allclose(kv, expected, rtol=1e-6, atol=1e-6)
        assert int(total) == step
        if step == 1:
            np.testing.assert_allclose(kv, want_present, rtol=1e-6, atol=1e-6)
            assert int(total) == int(want_total)


def test_session_options(affine_model):
    s = NativeSession(
        affine_model,
        intra_op_num_threads=2,
        inter_op_num_threads=1,
        graph_optimization_level=1,
        config_entries={"session.intra_op.allow_spinning": "0"},
        providers=[("CPUExecutionProvider", {})],
        log_id="test-native",
    )
    x = np.ones((2, 4), np.float32)
    s.bind_input("X", x)
    s.bind_input("I", np.zeros(1, np.int64))
    s.bind_output_to_device("Y")
    s.bind_output_to_device("J")
    s.run()
    np.testing.assert_array_equal(s.get_output("Y"), np.full((2, 4), 3, np.float32))


def test_unknown_provider_raises_ort_error(affine_model):
    with pytest.raises(ort_api.OrtError) as info:
        NativeSession(affine_model, providers=[("NoSuchExecutionProvider", {})])
    assert "NoSuch" in str(info.value)


def test_missing_model_file(tmp_path):
    missing = tmp_path / "nope" / "model.onnx"
    with pytest.raises(ort_api.OrtError) as info:
        NativeSession(str(missing))
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.code == 3  # ORT_NO_SUCHFILE
    assert str(missing) in str(info.value)
    assert "CreateSession" in str(info.value)


def test_invalid_model_file(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(ort_api.OrtError) as info:
        NativeSession(str(bad))
    assert str(info.value)  # carries ORT's message


def test_binding_errors(affine_model):
    s = NativeSession(affine_model)
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(KeyError, match="nope"):
        s.bind_input("nope", x)
    with pytest.raises(KeyError):
        s.bind_output("X", x)  # an input name is not an output
    with pytest.raises(KeyError):
        s.get_output("nope")
    with pytest.raises(TypeError, match="float32"):
        s.bind_input("X", x.astype(np.float64))
    with pytest.raises(TypeError, match="int64"):
        s.bind_input("I", np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="C-contiguous"):
        s.bind_input("X", np.zeros((4, 4), np.float32)[:, :2])
    with pytest.raises(ValueError, match="elements"):
        s.bind_input("X", x, shape=(3, 4))
    with pytest.raises(ValueError, match="negative"):
        s.bind_input("X", x, shape=(-1, 4))
    ro = np.zeros((2, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        s.bind_output("Y", ro)
    s.bind_input("X", ro)  # read-only is fine for an input


def test_run_with_missing_binding_raises_ort_message(affine_model):
    s = NativeSession(affine_model)
    s.bind_input("X", np.zeros((2, 4), np.float32))
    s.bind_output_to_device("Y")
    s.bind_output_to_device("J")
    with pytest.raises(ort_api.OrtError) as info:
        s.run()
    assert "I" in str(info.value)
    # the session stays usable after an error
    s.bind_input("I", np.zeros(1, np.int64))
    s.run()
    np.testing.assert_array_equal(s.get_output("J"), np.ones(1, np.int64))


def test_shape_mismatch_reported_by_ort(affine_model):
    s = NativeSession(affine_model)
    s.bind_input("X", np.zeros(8, np.float32), shape=(8,))  # rank 1, model says [n, 4]
    s.bind_input("I", np.zeros(1, np.int64))
    s.bind_output_to_device("Y")
    s.bind_output_to_device("J")
    with pytest.raises(ort_api.OrtError):
        s.run()


def test_clear_bindings(affine_model):
    s = NativeSession(affine_model)
    s.bind_input("X", np.zeros((1, 4), np.float32))
    s.bind_input("I", np.zeros(1, np.int64))
    s.bind_output_to_device("Y")
    s.bind_output_to_device("J")
    s.run()
    s.clear_bindings()
    with pytest.raises(KeyError, match="not bound"):
        s.get_output("Y")


def _threads_and_files() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_many_sessions_are_released(affine_model):
    """Each session holds an intra-op thread pool: held sessions add threads, released ones
    give them (and their file handles) back."""
    NativeSession(affine_model, intra_op_num_threads=2)  # process-wide ORT state, made once
    gc.collect()
    threads, files = _threads_and_files()
    held = [NativeSession(affine_model, intra_op_num_threads=2) for _ in range(5)]
    assert _threads_and_files()[0] >= threads + 5  # the measure sees sessions
    del held
    for _ in range(20):
        s = NativeSession(affine_model, intra_op_num_threads=2)
        s.bind_input("X", np.zeros((1, 4), np.float32))
        s.bind_output_to_device("Y")
        del s
    gc.collect()
    assert _threads_and_files() == (threads, files)


# ----------------------------------------------------------------- session options


def test_model_bytes_equals_model_path(affine_model):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    i = np.array([3, 4], np.int64)
    results = []
    for s in (
        NativeSession(affine_model),
        NativeSession("affine.onnx", model_bytes=Path(affine_model).read_bytes()),
        NativeSession(model_bytes=bytearray(Path(affine_model).read_bytes())),
    ):
        assert s.input_names == ("X", "I") and s.output_names == ("Y", "J")
        s.bind_input("X", x)
        s.bind_input("I", i)
        s.bind_output_to_device("Y")
        s.bind_output_to_device("J")
        s.run()
        results.append((s.get_output("Y"), s.get_output("J")))
    for y, j in results[1:]:
        np.testing.assert_array_equal(y, results[0][0])
        np.testing.assert_array_equal(j, results[0][1])


def test_model_bytes_errors():
    with pytest.raises(ValueError, match="model_path or model_bytes"):
        NativeSession()
    with pytest.raises(ValueError, match="empty"):
        NativeSession("m.onnx", model_bytes=b"")
    with pytest.raises(ort_api.OrtError) as info:
        NativeSession("sub/bad.onnx", model_bytes=b"not a protobuf")
    assert "CreateSessionFromArray('sub/bad.onnx', 14 bytes)" in str(info.value)


@pytest.mark.parametrize("flag", [True, False])
def test_arena_pattern_log_and_run_config(affine_model, flag):
    s = NativeSession(
        affine_model,
        enable_cpu_mem_arena=flag,
        enable_mem_pattern=flag,
        log_severity_level=3,
        run_config_entries={"memory.enable_memory_arena_shrinkage": "cpu:0"},
    )
    x = np.ones((2, 4), np.float32)
    s.bind_input("X", x)
    s.bind_input("I", np.zeros(1, np.int64))
    s.bind_output_to_device("Y")
    s.bind_output_to_device("J")
    if not flag:
        # The run options reach RunWithBinding: without a CPU arena there is none to shrink.
        with pytest.raises(ort_api.OrtInvalidArgumentError, match="arena"):
            s.run()
        return
    for _ in range(3):
        s.run()
        assert s.run_checked() == 0
    np.testing.assert_array_equal(s.get_output("Y"), np.full((2, 4), 3, np.float32))


def test_invalid_log_severity_level(affine_model):
    with pytest.raises(ValueError, match="log_severity_level"):
        NativeSession(affine_model, log_severity_level=7)


def test_bad_custom_ops_library(affine_model, tmp_path):
    lib = tmp_path / "no_such_custom_ops.so"
    with pytest.raises(ort_api.OrtError) as info:
        NativeSession(affine_model, custom_ops_library=str(lib))
    assert f"registering custom ops library {lib}: [" in str(info.value)


def test_run_checked_raises(affine_model):
    s = NativeSession(affine_model)
    s.bind_input("X", np.zeros((2, 4), np.float32))
    s.bind_output_to_device("Y")
    with pytest.raises(ort_api.OrtError):
        s.run_checked()


# ----------------------------------------------------------------- values after a run


def test_output_value_info_and_input_value(step_model):
    s = NativeSession(step_model)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    z = np.arange(5, dtype=np.int64)
    y = np.zeros((2, 4), np.float32)
    s.bind_input("X", x)
    s.bind_input("Z", z, shape=(3,))
    s.bind_output("Y", y)
    s.bind_output_to_device("W")
    with pytest.raises(RuntimeError, match="no value"):
        s.output_value_info("W")  # ORT allocates it at the run
    s.run()
    assert s.output_value_info("Y") == ((2, 4), y.ctypes.data)
    shape, address = s.output_value_info("W")
    assert shape == (3,) and address != 0
    np.testing.assert_array_equal(s.get_output("W"), z[:3] + 2)
    np.testing.assert_array_equal(s.input_value("X"), x)
    np.testing.assert_array_equal(s.input_value("Z"), z[:3])  # the bound prefix
    s.clear_bindings()
    with pytest.raises(KeyError, match="not bound"):
        s.input_value("X")
    with pytest.raises(RuntimeError, match="not bound"):
        s.output_value_info("Y")


def test_rebinding_an_output_keeps_its_position(step_model):
    """ORT keeps a re-bound output's place in the binding's order (what output positions and the
    one-GetBoundOutputValues-per-run cache rely on): outputs of different shapes and types,
    re-bound in other orders and ways between runs, still read back right."""
    s = NativeSession(step_model)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    z = np.array([7, 8], np.int64)
    s.bind_input("X", x)
    s.bind_input("Z", z)
    s.bind_output_to_device("W")  # position 0
    s.bind_output_to_device("Y")  # position 1
    y = np.zeros((3, 4), np.float32)
    for how in ("device", "ptr-W", "ptr-Y", "device-Y-then-W", "both-ptr"):
        if how == "ptr-W":
            s.bind_output("W", np.zeros(2, np.int64))
        elif how == "ptr-Y":
            s.bind_output("Y", y)
            s.bind_output_to_device("W")
        elif how == "device-Y-then-W":
            s.bind_output_to_device("Y")
            s.bind_output_to_device("W")
        elif how == "both-ptr":
            s.bind_output("Y", y)
            s.bind_output("W", np.zeros(2, np.int64))
        s.run()
        np.testing.assert_array_equal(s.get_output("Y"), x + 1, err_msg=how)
        np.testing.assert_array_equal(s.get_output("W"), z + 2, err_msg=how)
        assert s.output_value_info("Y")[0] == (3, 4)
        assert s.output_value_info("W")[0] == (2,)
        # after a rebind, the outputs still read back (the binding keeps them until the run)
        s.rebind_outputs_as_inputs_py(["W"], ["Z"])
        np.testing.assert_array_equal(s.get_output("W"), z + 2, err_msg=how)
        np.testing.assert_array_equal(s.input_value("Z"), z + 2, err_msg=how)
        z = z + 2
        if how in ("ptr-W", "both-ptr"):
            s.bind_input("Z", z)  # the pointer-bound W array is re-bound as output next


# ----------------------------------------------------------------- rebind_outputs_as_inputs


def test_rebind_same_shape_steps(step_model):
    s = NativeSession(step_model, intra_op_num_threads=1)
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    z = np.array([1, -5, 9], np.int64)
    s.bind_input("X", x)
    s.bind_input("Z", z)
    s.bind_output_to_device("Y")
    s.bind_output_to_device("W")
    want_x, want_z = x.copy(), z.copy()
    for _ in range(6):
        s.run()
        want_x, want_z = want_x + 1, want_z + 2
        np.testing.assert_array_equal(s.get_output("Y"), want_x)
        np.testing.assert_array_equal(s.get_output("W"), want_z)
        s.rebind_outputs_as_inputs_py(["Y", "W"], ["X", "Z"])
        np.testing.assert_array_equal(s.input_value("X"), want_x)
        np.testing.assert_array_equal(s.input_value("Z"), want_z)
    # the first inputs' arrays are not written to
    first_x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(x, first_x)


def test_rebind_growing_kv_cache(grow_model):
    rng = np.random.default_rng(3)
    past = rng.standard_normal((1, 2, 4)).astype(np.float32)
    ref = ort.InferenceSession(grow_model, providers=["CPUExecutionProvider"])
    s = NativeSession(grow_model, intra_op_num_threads=1)
    s.bind_input("past", past)
    s.bind_output_to_device("present")
    s.bind_output_to_device("total")
    want = past.copy()
    for step in range(8):
        new = rng.standard_normal((1, 1, 4)).astype(np.float32)
        s.bind_input("new", new)
        s.run()
        ref_present, ref_total = ref.run(None, {"past": want, "new": new})
        want = np.concatenate([want, new], axis=1)
        np.testing.assert_array_equal(ref_present, want)
        assert s.output_value_info("present")[0] == (1, 3 + step, 4)
        np.testing.assert_array_equal(s.get_output("present"), want)
        np.testing.assert_allclose(s.get_output("total"), ref_total, rtol=1e-5)
        s.rebind_outputs_as_inputs_py(["present"], ["past"])
        np.testing.assert_array_equal(s.input_value("past"), want)
        np.testing.assert_allclose(s.get_output("total"), want.sum(), rtol=1e-5)


def test_rebind_pointer_bound_output_aliases_and_stays_alive(step_model):
    """A pointer-bound output rebound as input is not copied, and its array lives as long as
    the input uses it, even once the output is bound elsewhere."""
    s = NativeSession(step_model)
    x = np.zeros((2, 4), np.float32)
    s.bind_input("X", x)
    s.bind_input("Z", np.zeros(1, np.int64))
    buf = np.zeros((2, 4), np.float32)
    s.bind_output("Y", buf)
    s.bind_output_to_device("W")
    s.run()
    s.rebind_outputs_as_inputs_py(["Y"], ["X"])
    buf[0, 0] = 41.0  # the input reads the output's array itself
    assert s.input_value("X")[0, 0] == 41.0
    buf_id = id(buf)
    del buf
    s.bind_output("Y", np.zeros((2, 4), np.float32))  # the old array is still X's
    import gc

    gc.collect()
    s.run()
    got = s.get_output("Y")
    assert got[0, 0] == 42.0 and (got.ravel()[1:] == 2.0).all()
    assert buf_id != id(got)


def test_rebind_errors(step_model):
    s = NativeSession(step_model)
    s.bind_input("X", np.zeros((2, 4), np.float32))
    s.bind_input("Z", np.zeros(2, np.int64))
    s.bind_output_to_device("Y")
    with pytest.raises(RuntimeError, match="not bound"):
        s.rebind_outputs_as_inputs_py(["W"], ["Z"])
    s.bind_output_to_device("W")
    with pytest.raises(RuntimeError, match="no value"):
        s.rebind_outputs_as_inputs_py(["Y"], ["X"])  # before any run
    s.run()
    with pytest.raises(TypeError, match="element types"):
        s.rebind_outputs_as_inputs_py(["Y"], ["Z"])
    with pytest.raises(IndexError, match="twice"):
        s.rebind_outputs_as_inputs_py(["Y", "Y"], ["X", "X"])
    with pytest.raises(ValueError, match="1 output names for 2"):
        s.rebind_outputs_as_inputs_py(["Y"], ["X", "Z"])
    with pytest.raises(KeyError):
        s.rebind_outputs_as_inputs_py(["X"], ["X"])
    s.rebind_outputs_as_inputs_py([], [])
    # nothing was half done: the inputs are still the arrays bound above
    np.testing.assert_array_equal(s.input_value("X"), np.zeros((2, 4), np.float32))
    s.rebind_outputs_as_inputs_py(["Y", "W"], ["X", "Z"])
    np.testing.assert_array_equal(s.input_value("X"), np.ones((2, 4), np.float32))
    s.rebind_outputs_as_inputs_py(["Y"], ["X"])  # twice after one run: same value again
    np.testing.assert_array_equal(s.input_value("X"), np.ones((2, 4), np.float32))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_rebind_loop_does_not_leak(step_model):
    s = NativeSession(step_model, intra_op_num_threads=1)
    s.bind_input("X", np.zeros((64, 4), np.float32))  # 1 KiB per value: leaks would show
    s.bind_input("Z", np.zeros(128, np.int64))
    s.bind_output_to_device("Y")
    s.bind_output_to_device("W")
    start = 0
    for step in range(5000):
        if step == 500:
            start = _rss_bytes()
        s.run()
        s.output_value_info("Y")
        s.rebind_outputs_as_inputs_py(["Y", "W"], ["X", "Z"])
    grown = _rss_bytes() - start
    assert grown < 2 * 1024 * 1024, f"RSS grew by {grown} bytes over 4500 rebinding steps"
    np.testing.assert_array_equal(s.input_value("X"), np.full((64, 4), 5000, np.float32))
    np.testing.assert_array_equal(s.input_value("Z"), np.full(128, 10000, np.int64))


_CIMPORT_PYX = """
# cython: language_level=3
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from genai._core.ort_api cimport ELEM_FLOAT, ELEM_INT64
from genai._core.native_session cimport NS_MAX_DIMS, NativeSession


def run_steps(NativeSession s, float[:, ::1] x, float[:, ::1] y, int64_t[::1] i, int steps):
    cdef int64_t xs[2]
    cdef int64_t js[1]
    cdef int rc = 0, k
    cdef Py_ssize_t xi = s.input_index("X"), ii = s.input_index("I")
    cdef Py_ssize_t yi = s.output_index("Y")
    with nogil:
        for k in range(steps):
            xs[0] = k + 1
            xs[1] = 4
            js[0] = 1
            rc = s.bind_input_ptr(xi, &x[0, 0], xs, 2, ELEM_FLOAT)
            if rc == 0:
                rc = s.bind_output_ptr(yi, &y[0, 0], xs, 2, ELEM_FLOAT)
            if rc == 0:
                rc = s.bind_input_ptr(ii, &i[0], js, 1, ELEM_INT64)
            if rc == 0:
                rc = s.run_binding()
            if rc != 0:
                break
    if rc != 0:
        s.raise_last_error()
    return rc


def rebind_steps(NativeSession s, list outs, list ins, Py_ssize_t read_out, int steps):
    # steps x (run, rebind outs -> ins, read output read_out's shape and first float), all
    # without the GIL; returns (shape, first value) of the last step.
    cdef Py_ssize_t n = len(outs), k
    cdef Py_ssize_t out_idx[8]
    cdef Py_ssize_t in_idx[8]
    cdef int64_t shape[NS_MAX_DIMS]
    cdef size_t ndim = 0
    cdef void* data = NULL
    cdef int rc = 0, step
    for k in range(n):
        out_idx[k] = outs[k]
        in_idx[k] = ins[k]
    with nogil:
        for step in range(steps):
            rc = s.run_binding()
            if rc == 0:
                rc = s.rebind_outputs_as_inputs(out_idx, in_idx, n)
            if rc == 0:
                rc = s.output_value_shape(read_out, shape, &ndim)
            if rc == 0:
                rc = s.output_value_data(read_out, &data)
            if rc != 0:
                break
    if rc != 0:
        s.raise_last_error()
    return tuple([shape[k] for k in range(ndim)]), (<float*>data)[0]


def bad_rebind(NativeSession s, Py_ssize_t out_index, Py_ssize_t in_index):
    cdef int rc
    with nogil:
        rc = s.rebind_outputs_as_inputs(&out_index, &in_index, 1)
    if rc != 0:
        s.raise_last_error()


def time_calls(NativeSession s, list outs, list ins, int reps):
    # (ns per rebind_outputs_as_inputs, ns per run_binding, ns per output_value_shape +
    # output_value_data) over `reps` calls each, after one run.
    cdef Py_ssize_t n = len(outs), k
    cdef Py_ssize_t* out_idx = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
    cdef Py_ssize_t* in_idx = <Py_ssize_t*>malloc(n * sizeof(Py_ssize_t))
    cdef int64_t shape[NS_MAX_DIMS]
    cdef size_t ndim = 0
    cdef void* data = NULL
    cdef int rc = 0, r
    cdef double t0, t1, t2, t3
    for k in range(n):
        out_idx[k] = outs[k]
        in_idx[k] = ins[k]
    with nogil:
        rc = s.run_binding()
        t0 = _now()
        for r in range(reps):
            if rc == 0:
                rc = s.rebind_outputs_as_inputs(out_idx, in_idx, n)
        t1 = _now()
        for r in range(reps):
            if rc == 0:
                rc = s.run_binding()
        t2 = _now()
        for r in range(reps):
            if rc == 0:
                rc = s.output_value_shape(0, shape, &ndim)
            if rc == 0:
                rc = s.output_value_data(0, &data)
        t3 = _now()
    free(out_idx)
    free(in_idx)
    if rc != 0:
        s.raise_last_error()
    return (t1 - t0) / reps * 1e9, (t2 - t1) / reps * 1e9, (t3 - t2) / reps * 1e9


cdef double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


def bad_index(NativeSession s, float[:, ::1] x):
    cdef int64_t xs[2]
    xs[0] = 1
    xs[1] = 4
    cdef int rc
    with nogil:
        rc = s.bind_input_ptr(99, &x[0, 0], xs, 2, ELEM_FLOAT)
    if rc != 0:
        s.raise_last_error()


def bad_type(NativeSession s, float[:, ::1] x):
    cdef int64_t xs[2]
    xs[0] = 1
    xs[1] = 4
    cdef int rc
    with nogil:
        rc = s.bind_input_ptr(0, &x[0, 0], xs, 2, ELEM_INT64)
    if rc != 0:
        s.raise_last_error()
"""


@pytest.fixture(scope="module")
def cimport_module(tmp_path_factory):
    """A Cython module compiled here that cimports NativeSession (the API the decode loop uses)."""
    pytest.importorskip("Cython")
    if shutil.which(os.environ.get("CC", "cc")) is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the cimport test module")
    root = Path(native_session.__file__).resolve().parents[2]
    work = tmp_path_factory.mktemp("cimport")
    (work / "ns_cimport_probe.pyx").write_text(textwrap.dedent(_CIMPORT_PYX))
    (work / "setup_probe.py").write_text(
        textwrap.dedent(
            f"""
            from Cython.Build import cythonize
            from setuptools import Extension, setup
            ext = Extension("ns_cimport_probe", ["ns_cimport_probe.pyx"])
            setup(ext_modules=cythonize([ext], include_path=[{str(root)!r}], quiet=True))
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.run(
        [sys.executable, "setup_probe.py", "build_ext", "--inplace"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sys.path.insert(0, str(work))
    try:
        import ns_cimport_probe  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(work))
    return ns_cimport_probe


@pytest.mark.slow
def test_cimport_nogil_entry_points(affine_model, cimport_module):
    s = NativeSession(affine_model, intra_op_num_threads=1)
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    y = np.full((6, 4), -1, np.float32)
    i = np.array([41], np.int64)
    assert cimport_module.run_steps(s, x, y, i, 5) == 0
    np.testing.assert_array_equal(y[:5], x[:5] * 2 + 1)
    assert (y[5] == -1).all()
    with pytest.raises(IndexError):
        cimport_module.bad_index(s, x)
    with pytest.raises(TypeError):
        cimport_module.bad_type(s, x)
    # after the errors the session still runs
    assert cimport_module.run_steps(s, x, y, i, 1) == 0


@pytest.mark.slow
def test_cimport_rebind_nogil(step_model, grow_model, cimport_module):
    s = NativeSession(step_model, intra_op_num_threads=1)
    x = np.full((2, 4), 0.5, np.float32)
    s.bind_input("X", x)
    s.bind_input("Z", np.zeros(3, np.int64))
    s.bind_output_to_device("Y")
    s.bind_output_to_device("W")
    yi, wi = s.output_index("Y"), s.output_index("W")
    xi, zi = s.input_index("X"), s.input_index("Z")
    shape, first = cimport_module.rebind_steps(s, [yi, wi], [xi, zi], yi, 10)
    # the output read after the rebind is the last run's: x + 10
    assert shape == (2, 4) and first == 10.5
    np.testing.assert_array_equal(s.input_value("X"), np.full((2, 4), 10.5, np.float32))
    np.testing.assert_array_equal(s.input_value("Z"), np.full(3, 20, np.int64))
    np.testing.assert_array_equal(x, 0.5)  # the first input array is untouched
    with pytest.raises(IndexError):
        cimport_module.bad_rebind(s, 5, xi)
    with pytest.raises(TypeError):
        cimport_module.bad_rebind(s, yi, zi)
    ns_rebind, ns_run, ns_read = cimport_module.time_calls(s, [yi, wi], [xi, zi], 200)
    assert ns_rebind > 0 and ns_run > 0 and ns_read > 0

    g = NativeSession(grow_model, intra_op_num_threads=1)
    g.bind_input("past", np.zeros((1, 1, 4), np.float32))
    g.bind_input("new", np.ones((1, 1, 4), np.float32))
    g.bind_output_to_device("present")
    g.bind_output_to_device("total")
    pi = g.output_index("present")
    shape, first = cimport_module.rebind_steps(g, [pi], [g.input_index("past")], pi, 7)
    assert shape == (1, 8, 4) and first == 0.0
    np.testing.assert_array_equal(g.get_output("total"), np.float32(28.0))
    want = np.concatenate([np.zeros((1, 1, 4)), np.ones((1, 7, 4))], axis=1)
    np.testing.assert_array_equal(g.input_value("past"), want)


def test_enable_profiling_writes_a_trace(fixture_folders, tmp_path):
    """session_options.enable_profiling (the reference's key) turns ORT's profiler on: the JSON
    trace holds the model's nodes once the session is released."""
    import gc
    import json as _json

    import genai

    prefix = tmp_path / "trace"
    config = genai.Config(fixture_folders["gqa"])
    config.overlay({"model": {"decoder": {"session_options": {"enable_profiling": str(prefix)}}}})
    model = genai.Model(config)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=12)
    generator = genai.Generator(model, params)
    generator.append_tokens(np.array([3, 4, 5], np.int32))
    generator.generate_next_token()
    del generator, params, model
    gc.collect()
    (trace,) = tmp_path.glob("trace*.json")
    events = _json.loads(trace.read_text())
    ops = {e.get("args", {}).get("op_name") for e in events}
    # (genai runs the CPU's GroupQueryAttention through its chunking op: the trace names that)
    assert {"GroupQueryAttention", "ChunkedGroupQueryAttention"} & ops
