"""NativeSession (onnxruntime through its C API, genai._core.native_session) on tiny ONNX models,
checked against NumPy and onnxruntime's own Python InferenceSession."""

from __future__ import annotations

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


def test_many_sessions_are_released(affine_model):
    for _ in range(20):
        s = NativeSession(affine_model)
        s.bind_input("X", np.zeros((1, 4), np.float32))
        del s


_CIMPORT_PYX = """
# cython: language_level=3
from libc.stdint cimport int64_t
from genai._core.ort_api cimport ELEM_FLOAT, ELEM_INT64
from genai._core.native_session cimport NativeSession


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
