"""Every public name of the pinned reference (onnxruntime-genai 0.18) exists in genai with the
same kind, and the module-level ones behave as the reference's do on this machine.

Compared with the reference engine itself: ``dir()`` of the module and of each public class,
enumeration values, tensor containers, log line formats, provider answers and errors.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.compat import logging_options
from genai.compat.unsupported import FEATURES
from genai.errors import ProviderUnavailableError
from genai.providers import CPUProvider, ExecutionProvider, is_provider_available, plugins
from genai.providers.hookspecs import hookimpl
from tests import test_providers

og = pytest.importorskip("onnxruntime_genai", reason="reference engine not installed")

#: Only the built-in cpu plugin, plus the plugin modules a test registers (test_providers'
#: fixture); providers/<name>/ plugin packages loaded from the source tree.
isolated = test_providers.isolated
load_provider_package = test_providers.load_provider_package

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT.parent / "shared" / "models" / "smollm2-135m-instruct-int4"


# -- dir() of the reference against genai ------------------------------------------------------


def public_names(obj: object) -> list[str]:
    return sorted(name for name in dir(obj) if not name.startswith("_"))


def module_kind(value: object) -> str:
    if isinstance(value, types.ModuleType):
        return "module"
    if isinstance(value, type):
        return "class"
    if callable(value):
        return "function"
    return type(value).__name__


def member_kind(owner: type, name: str) -> str:
    """How ``name`` is defined on the class: static (static or class method), property (any
    data descriptor: property, pybind11 property, enum name/value), member (an enumeration
    member), method, or the value's type."""
    raw = inspect.getattr_static(owner, name)
    if isinstance(raw, (staticmethod, classmethod)):
        return "static"
    if isinstance(raw, property) or (
        hasattr(type(raw), "__set__") and hasattr(type(raw), "__get__")
    ):
        return "property"
    if isinstance(raw, owner):
        return "member"
    if callable(raw):
        return "method"
    return type(raw).__name__


REFERENCE_CLASSES = [name for name in public_names(og) if module_kind(getattr(og, name)) == "class"]


def test_module_names_match_the_reference() -> None:
    missing, wrong_kind = [], []
    for name in public_names(og):
        kind = module_kind(getattr(og, name))
        if kind == "module":
            continue  # the reference's compiled extension module (onnxruntime_genai), not API
        if not hasattr(genai, name):
            missing.append(f"{name} ({kind})")
        elif module_kind(getattr(genai, name)) != kind:
            wrong_kind.append(f"{name}: {module_kind(getattr(genai, name))}, reference {kind}")
    assert not missing and not wrong_kind, (
        f"genai lacks reference names: {', '.join(missing) or 'none'}; "
        f"of another kind: {'; '.join(wrong_kind) or 'none'}"
    )


@pytest.mark.parametrize("class_name", REFERENCE_CLASSES)
def test_class_names_match_the_reference(class_name: str) -> None:
    ref_cls = getattr(og, class_name)
    ours = getattr(genai, class_name, None)
    assert isinstance(ours, type), f"genai.{class_name} is missing or not a class"
    missing, wrong_kind = [], []
    for name in public_names(ref_cls):
        kind = member_kind(ref_cls, name)
        if name not in dir(ours):
            missing.append(f"{name} ({kind})")
        elif member_kind(ours, name) != kind:
            wrong_kind.append(f"{name}: {member_kind(ours, name)}, reference {kind}")
    assert not missing and not wrong_kind, (
        f"genai.{class_name} lacks: {', '.join(missing) or 'none'}; "
        f"of another kind: {'; '.join(wrong_kind) or 'none'}"
    )


def test_kind_check_can_fail() -> None:
    # The comparison above tells a property from a method from a static method.
    class Probe:
        value = property(lambda self: 1)

        def method(self) -> None: ...

        @staticmethod
        def static() -> None: ...

    kinds = [member_kind(Probe, n) for n in ("value", "method", "static")]
    assert kinds == ["property", "method", "static"]
    assert member_kind(og.Tokenizer, "bos_token_id") == "property"
    assert member_kind(og.Tokenizer, "encode") == "method"
    assert member_kind(og.Images, "open") == "static"
    assert member_kind(og.FinishReason, "EOS") == "member"


# -- features genai does not run yet ------------------------------------------------------------


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_features_not_run_raise_naming_the_feature_and_the_doc(feature: str) -> None:
    error = FEATURES[feature].error("Something.open")
    assert isinstance(error, NotImplementedError)
    message = str(error)
    assert "Something.open" in message and FEATURES[feature].name in message
    assert "docs/differences.md" in message


def test_differences_doc_lists_what_is_refused() -> None:
    text = (ROOT / "docs" / "differences.md").read_text(encoding="utf-8")
    for name in ("block_table", "rnn_states_prev", "StreamingProcessor", "dflash2", "phi4mm"):
        assert name in text, name


# -- enumerations ----------------------------------------------------------------------------


@pytest.mark.parametrize("enum_name", ["FinishReason", "EngineErrorCode", "EngineEventFlags"])
def test_enumeration_values_match_the_reference(enum_name: str) -> None:
    ref_enum, ours = getattr(og, enum_name), getattr(genai, enum_name)
    want = {name: int(member) for name, member in ref_enum.__members__.items()}
    assert {name: int(member) for name, member in ours.__members__.items()} == want
    for name, value in want.items():
        member = getattr(ours, name)
        assert (member.name, member.value) == (name, value)
        assert ours(value) is member
        assert str(member) == str(getattr(ref_enum, name)) == f"{enum_name}.{name}"


def test_engine_event_flags_combine() -> None:
    flags = genai.EngineEventFlags.TOKEN | genai.EngineEventFlags.TURN_FINISHED
    ref = og.EngineEventFlags.TOKEN | og.EngineEventFlags.TURN_FINISHED
    assert int(flags) == int(ref) == 3
    assert genai.EngineEventFlags.TOKEN in flags


# -- provider questions ----------------------------------------------------------------------

REFERENCE_PROVIDERS = ["cuda", "dml", "openvino", "qnn", "webgpu"]
# The onnxruntime EP each reference name needs; when the installed onnxruntime lacks it, no
# plugin can run that provider.
ORT_EP = {"cuda": "CUDAExecutionProvider", "dml": "DmlExecutionProvider"}
PROVIDER_PACKAGES = {
    "cuda": "cuda",
    "dml": "directml",
    "openvino": "openvino",
    "qnn": "qnn",
    "webgpu": "webgpu",
}


def _plugin(name: str, *classes: type[ExecutionProvider]) -> types.ModuleType:
    module = types.ModuleType(name)

    @hookimpl
    def register_providers(register):
        for cls in classes:
            register(cls)

    module.register_providers = register_providers  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize("name", REFERENCE_PROVIDERS)
def test_is_available_without_a_plugin_is_false(name: str, isolated) -> None:
    # No plugin answers to the name: genai cannot run it, whatever its build.
    assert getattr(genai, f"is_{name}_available")() is False


@pytest.mark.parametrize("name", REFERENCE_PROVIDERS)
def test_is_available_matches_the_reference_with_the_real_plugins(name: str, isolated) -> None:
    module = isolated(load_provider_package(PROVIDER_PACKAGES[name]))
    ours = getattr(genai, f"is_{name}_available")()
    ref = getattr(og, f"is_{name}_available")()
    # The plugin that answers is the one whose provider the reference's name normalises to.
    (cls,) = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, ExecutionProvider)
        and obj.__module__ == module.__name__
    ]
    assert ours is (cls().unavailable_reason() is None)
    if name in ORT_EP:
        import onnxruntime

        # The reference answers whether its build has the EP; the CPU wheel has neither.
        assert ref is False
        if ORT_EP[name] not in onnxruntime.get_available_providers():
            assert ours is False
    else:
        # Difference (docs/differences.md): the reference answers True for plugin-EP
        # providers whatever is installed; genai answers whether its plugin can run here.
        assert ref is True


def test_is_available_follows_the_plugins_probe(isolated) -> None:
    state = {"reason": "no adapter here"}

    class FakeWebGPU(CPUProvider):
        name = "WebGPU"
        ort_name = "WebGpuExecutionProvider"

        def unavailable_reason(self) -> str | None:
            return state["reason"]

    isolated(_plugin("fake_webgpu_plugin", FakeWebGPU))
    assert genai.is_webgpu_available() is False
    state["reason"] = None
    assert genai.is_webgpu_available() is True
    assert is_provider_available("WebGpuExecutionProvider") is True  # any reference spelling
    assert genai.is_cuda_available() is False

    class Raising(FakeWebGPU):
        def unavailable_reason(self) -> str | None:
            raise RuntimeError("probe failed")

    assert Raising().is_available() is False  # a probe that raises counts as unavailable


def test_gpu_device_id_without_a_gpu_provider(isolated) -> None:
    with pytest.raises(ProviderUnavailableError, match="no execution provider .* GPU device"):
        genai.get_current_gpu_device_id()
    with pytest.raises(RuntimeError, match="set_current_gpu_device_id"):
        genai.set_current_gpu_device_id(0)
    with pytest.raises(TypeError):
        genai.set_current_gpu_device_id("0")
    with pytest.raises(TypeError):
        og.set_current_gpu_device_id("0")
    with pytest.raises(ValueError, match=">= 0"):
        genai.set_current_gpu_device_id(-1)


def test_reference_gpu_device_id_on_a_cpu_only_machine() -> None:
    # What the reference does here, for docs/differences.md: it kills the process (SIGSEGV)
    # instead of raising. genai raises ProviderUnavailableError (a RuntimeError).
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("a CUDA-capable onnxruntime is installed")

    def no_core_dump() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    done = subprocess.run(
        [sys.executable, "-c", "import onnxruntime_genai as og; og.get_current_gpu_device_id()"],
        capture_output=True,
        timeout=120,
        preexec_fn=no_core_dump if sys.platform != "win32" else None,
    )
    assert done.returncode != 0


def test_gpu_device_id_is_routed_to_the_provider_that_has_one(isolated) -> None:
    devices = {"current": 0, "count": 2}

    class FakeGPU(CPUProvider):
        name = "fake-gpu"

        def current_gpu_device_id(self) -> int | None:
            return devices["current"]

        def set_current_gpu_device_id(self, device_id: int) -> bool:
            if device_id >= devices["count"]:
                raise ValueError(f"no GPU {device_id}")
            devices["current"] = device_id
            return True

    class Unavailable(FakeGPU):
        name = "fake-gpu-absent"

        def unavailable_reason(self) -> str | None:
            return "not here"

        def current_gpu_device_id(self) -> int | None:
            raise AssertionError("an unavailable provider was asked")

        set_current_gpu_device_id = current_gpu_device_id  # type: ignore[assignment]

    isolated(_plugin("fake_gpu_plugin", FakeGPU, Unavailable))
    assert genai.get_current_gpu_device_id() == 0
    genai.set_current_gpu_device_id(1)
    assert devices["current"] == 1
    assert genai.get_current_gpu_device_id() == 1
    with pytest.raises(ValueError, match="no GPU 5"):
        genai.set_current_gpu_device_id(5)


def test_unregister_unknown_library_raises_as_the_reference() -> None:
    with pytest.raises(RuntimeError, match="not registered") as ours:
        genai.unregister_execution_provider_library("genai-test-never-registered")
    with pytest.raises(RuntimeError, match="not registered"):
        og.unregister_execution_provider_library("genai-test-never-registered")
    assert "genai-test-never-registered" in str(ours.value)


# -- telemetry ---------------------------------------------------------------------------------


def test_telemetry_switches_are_no_ops() -> None:
    before = logging_options.log_options()
    for module in (genai, og):
        assert module.disable_telemetry_events() is None
        assert module.enable_telemetry_events() is None
    assert logging_options.log_options() == before
    assert "no telemetry" in genai.enable_telemetry_events.__doc__


# -- log options -------------------------------------------------------------------------------


@pytest.fixture
def log_defaults():
    """Restore the default log options (and no callback) after the test, in both engines."""
    yield
    genai.set_log_callback(None)
    genai.set_log_options(**logging_options.BOOL_OPTIONS, filename="")
    og.set_log_callback(None)
    og.set_log_options(enabled=False, filename="")


def _reference_lines(**options: bool) -> list[str]:
    """What the reference's log callback receives for a 2-token greedy run on SmolLM2."""
    if not (SMOLLM2 / "genai_config.json").is_file():
        pytest.skip(f"real model folder not found at {SMOLLM2}")
    lines: list[str] = []
    og.set_log_callback(lines.append)
    try:
        og.set_log_options(enabled=True, **options)
        model = og.Model(str(SMOLLM2))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=5)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([1, 2, 3], dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
    finally:
        og.set_log_options(enabled=False)
        og.set_log_callback(None)  # a callback left set crashes the reference at exit
    return lines


@pytest.mark.parametrize("ansi_tags", [False, True])
def test_log_lines_are_formatted_as_the_reference(ansi_tags: bool, log_defaults) -> None:
    want = _reference_lines(append_next_tokens=True, ansi_tags=ansi_tags)
    assert want, "the reference logged nothing"
    tokens = [line.rsplit(" ", 2)[-2] for line in want]  # "... <token> \n"
    assert all(t.isdigit() for t in tokens), want
    got: list[str] = []
    genai.set_log_callback(got.append)
    genai.set_log_options(enabled=True, append_next_tokens=True, ansi_tags=ansi_tags)
    for token in tokens:
        logging_options.log_event("append_next_tokens", f"{token} ")
    assert got == want


def _step_lines(og_module, folder: Path, ansi_tags: bool) -> list[str]:
    """The per-step log lines of a greedy batch-2 run (a made-up EOS id that one row
    generates, so it ends early, and the other reaches max_length) through ``og_module``."""
    config = og_module.Config(str(folder))
    config.overlay(json.dumps({"model": {"eos_token_id": [306]}}))
    model = og_module.Model(config)
    lines: list[str] = []
    og_module.set_log_callback(lines.append)
    items = dict.fromkeys(logging_options.STEP_ITEMS, True)
    try:
        og_module.set_log_options(enabled=True, ansi_tags=ansi_tags, **items)
        params = og_module.GeneratorParams(model)
        params.set_search_options(max_length=12, batch_size=2)
        generator = og_module.Generator(model, params)
        prompt = np.array([[1, 504, 3575, 28, 1205], [1, 504, 3575, 28, 300]], np.int32)
        generator.append_tokens(prompt)
        while not generator.is_done():
            generator.generate_next_token()
    finally:
        og_module.set_log_options(enabled=False)
        og_module.set_log_callback(None)  # a callback left set crashes the reference at exit
    # genai's own records (info and debug from its modules) are not the reference's items
    return [line for line in lines if _label(line) not in ("info", "debug")]


def _label(line: str) -> str:
    """A log line's label, its ANSI tags taken off ("" for a bare line)."""
    words = re.sub(r"\x1b\[[0-9]+m", "", line).split()
    return words[0] if words else ""


@pytest.mark.parametrize("ansi_tags", [False, True])
def test_step_log_items_write_the_references_lines(ansi_tags, log_defaults, smollm2_path):
    """generate_next_token, append_next_tokens (prompt and steps), hit_eos, hit_max_length and
    model_logits with value_stats: the reference's lines, numbers (float32 statistics) and
    order, greedy, batch 2 (genai wrote none of them)."""
    want = _step_lines(og, smollm2_path, ansi_tags)
    got = _step_lines(genai, smollm2_path, ansi_tags)
    assert sum("hit_eos" in line for line in want) == 1
    assert sum("model_logits" in line for line in want) == 7
    assert any("hit_max_length" in line for line in want)
    assert got == want


def test_log_options_reach_the_genai_logger(log_defaults, tmp_path) -> None:
    logger = logging.getLogger("genai")
    got: list[str] = []
    genai.set_log_callback(got.append)
    genai.set_log_options(enabled=True, generate_next_token=True, ansi_tags=False)
    assert logger.isEnabledFor(logging.DEBUG)
    assert logging_options.is_logging("generate_next_token")
    assert not logging_options.is_logging("append_next_tokens")
    logging_options.log_event("generate_next_token", "step")
    logging_options.log_event("append_next_tokens", "off, dropped")
    logger.warning("careful")
    logging.getLogger("genai.child").info("from a child logger")
    assert got == [
        "  generate_next_token   step\n",
        "  warning   careful\n",
        "  info   from a child logger\n",
    ]
    genai.set_log_options(warning=False)
    logger.warning("dropped")
    assert len(got) == 3
    # A file replaces the callback (and the callback replaces the file), as in the reference.
    path = tmp_path / "genai.log"
    genai.set_log_options(filename=str(path))
    logging_options.log_event("generate_next_token", "to the file")
    genai.set_log_options(model_logits=True)  # the file stays open, not emptied again
    logging_options.log_event("generate_next_token", "again")
    assert (
        path.read_text() == "  generate_next_token   to the file\n  generate_next_token   again\n"
    )
    assert len(got) == 3
    # ort_lib turns onnxruntime's own session logging to verbose.
    assert logging_options.ort_log_severity() is None
    genai.set_log_options(ort_lib=True)
    assert logging_options.ort_log_severity() == 0


def test_disabled_logging_follows_the_applications_config(log_defaults, caplog) -> None:
    genai.set_log_options(enabled=True)
    genai.set_log_options(enabled=False)
    logger = logging.getLogger("genai")
    assert logger.level == logging.NOTSET and logger.propagate
    with caplog.at_level(logging.WARNING, logger="genai"):
        logger.warning("seen by the application")
    assert "seen by the application" in caplog.text


def test_log_option_errors_as_the_reference(log_defaults) -> None:
    for bad in ({"bogus": True}, {"enabled": 1}, {"filename": 3}):
        with pytest.raises((ValueError, TypeError)) as ours:
            genai.set_log_options(**bad)
        assert next(iter(bad)) in str(ours.value)
        with pytest.raises(RuntimeError):
            og.set_log_options(**bad)
    assert logging_options.log_options()["enabled"] is False  # nothing changed
    for module in (genai, og):
        with pytest.raises(TypeError):
            module.set_log_callback(3)
    with pytest.raises(FileNotFoundError):
        genai.set_log_options(enabled=True, filename=str(Path("/nonexistent/dir/log.txt")))
    assert logging_options.log_options()["enabled"] is False


# -- Tensor and NamedTensors -------------------------------------------------------------------

DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.uint16,
    np.int16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]
SHAPES = [(2, 3), (4,), (), (0, 3), (1, 2, 2)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_tensor_matches_the_reference(dtype) -> None:
    from onnx.helper import np_dtype_to_tensor_dtype

    rng = np.random.default_rng(0)
    for shape in SHAPES:
        array = np.asarray(np.abs(rng.standard_normal(shape)) * 10).astype(dtype)
        ours, ref = genai.Tensor(array), og.Tensor(array)
        assert ours.shape() == ref.shape() == list(shape)
        got, want = ours.as_numpy(), ref.as_numpy()
        assert got.dtype == want.dtype == array.dtype
        np.testing.assert_array_equal(got, want)
        # The reference's type() cannot return its enum (pybind11 TypeError); genai returns
        # the ONNX element type.
        assert ours.type() == np_dtype_to_tensor_dtype(array.dtype)
        # The data pointer: a PyCapsule, None for an empty tensor.
        kind = type(ours.data()).__name__
        assert kind == type(ref.data()).__name__ == ("PyCapsule" if array.size else "NoneType")


def test_tensor_copies_like_the_reference() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    ours, ref = genai.Tensor(array), og.Tensor(array)
    array[0, 0] = 100  # the source changes after the tensor was made
    ours.as_numpy()[0, 1] = 50  # a result of as_numpy changes
    ref.as_numpy()[0, 1] = 50
    np.testing.assert_array_equal(ours.as_numpy(), ref.as_numpy())
    assert ours.as_numpy()[0].tolist() == [0, 1, 2]


def test_tensor_errors_as_the_reference() -> None:
    for bad in ([1, 2, 3], 5, np.float32(3)):
        for module in (genai, og):
            with pytest.raises(TypeError):
                module.Tensor(bad)
    for bad in (np.zeros(2, np.complex64), np.array(["a"])):
        with pytest.raises(TypeError, match="unsupported numpy dtype"):
            genai.Tensor(bad)
        with pytest.raises(RuntimeError, match="Unsupported numpy type"):
            og.Tensor(bad)


def test_tensor_of_a_non_contiguous_array() -> None:
    # Differences (docs/differences.md): the reference refuses a strided view and reads a
    # Fortran-ordered array's memory in C order; genai copies either with its values.
    strided = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    with pytest.raises(RuntimeError, match="contiguous"):
        og.Tensor(strided)
    np.testing.assert_array_equal(genai.Tensor(strided).as_numpy(), strided)
    transposed = np.arange(6, dtype=np.int32).reshape(2, 3).T
    np.testing.assert_array_equal(genai.Tensor(transposed).as_numpy(), transposed)
    assert og.Tensor(transposed).as_numpy().ravel().tolist() == [0, 1, 2, 3, 4, 5]


def test_named_tensors_match_the_reference() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.ones(3, dtype=np.int64)
    for module in (genai, og):
        named = module.NamedTensors()
        assert len(named) == 0 and named.keys() == []
        named["x"] = x
        tensor = module.Tensor(y)
        named["y"] = tensor
        assert named["y"] is tensor  # a Tensor is stored as it is
        assert len(named) == 2 and sorted(named.keys()) == ["x", "y"]
        assert "x" in named and "z" not in named
        x_copy = named["x"].as_numpy()
        np.testing.assert_array_equal(x_copy, x)
        with pytest.raises((KeyError, RuntimeError), match="Tensor with name: z not found"):
            named["z"]
        del named["x"]
        del named["never-set"]  # deleting a missing name is a no-op in the reference
        assert named.keys() == ["y"]
        named["y"] = np.zeros(2, dtype=np.int32)  # replaced
        assert named["y"].as_numpy().tolist() == [0, 0]
        for bad_key, bad_value in ((3, x), ("w", [1, 2]), ("w", 3)):
            with pytest.raises(TypeError):
                named[bad_key] = bad_value


def test_named_tensors_is_a_mapping() -> None:
    named = genai.NamedTensors()
    named["a"] = np.zeros(1, np.int32)
    named["b"] = np.ones(1, np.int32)
    assert list(named) == ["a", "b"]
    assert {k: v.as_numpy().tolist() for k, v in named.items()} == {"a": [0], "b": [1]}
    assert named.get("c") is None
    with pytest.raises(KeyError):
        named["c"]


# -- the reference's own scripts run -------------------------------------------------------------


def test_reference_style_guard_script_runs() -> None:
    # The preamble of the reference's API tests: choose devices from the availability
    # functions, then log with options and telemetry calls.
    script = """
import genai as og
has_accelerator_ep = og.is_cuda_available() or og.is_dml_available() or og.is_webgpu_available()
devices = [] if has_accelerator_ep else ["cpu"]
for name in ("cuda", "dml", "openvino", "webgpu"):
    if getattr(og, f"is_{name}_available")():
        devices.append(name)
og.disable_telemetry_events()
og.set_log_options(enabled=False)
print(json.dumps(devices))
"""
    done = subprocess.run(
        [sys.executable, "-c", "import json\n" + script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, plugins.ENV_DISABLE_AUTOLOAD: "1"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["cpu"]


def test_ort_lib_turns_onnxruntime_session_logging_verbose(log_defaults, tmp_path, capfd):
    """``set_log_options(ort_lib=True)`` reaches onnxruntime: a session made afterwards logs
    at the verbose/info level (on stderr, onnxruntime's default sink); without it, it doesn't."""
    from genai.testing.models import write_gqa_decoder

    folder = write_gqa_decoder(tmp_path / "m")
    genai.Model(folder)
    assert "Session successfully initialized" not in capfd.readouterr().err
    genai.set_log_options(enabled=True, ort_lib=True)
    genai.Model(folder)
    assert "Session successfully initialized" in capfd.readouterr().err


def test_append_tokens_takes_a_tensor(tmp_path) -> None:
    """The reference's append_tokens(Tensor) overload: the same sequence as the array."""
    from genai.testing.models import write_gqa_decoder

    folder = write_gqa_decoder(tmp_path / "m")
    prompt = np.array([[3, 9, 4, 17]], dtype=np.int32)
    sequences = []
    for module in (genai, og):
        model = module.Model(str(folder))
        params = module.GeneratorParams(model)
        params.set_search_options(max_length=8)
        for tokens in (prompt, module.Tensor(prompt)):
            generator = module.Generator(model, params)
            generator.append_tokens(tokens)
            generator.generate_next_token()
            sequences.append(np.array(generator.get_sequence(0)).tolist())
    assert len(sequences) == 4 and all(s == sequences[0] for s in sequences)


def test_missing_named_tensor_is_a_tensor_not_found_error() -> None:
    with pytest.raises(genai.errors.TensorNotFoundError, match="Tensor with name: z"):
        genai.NamedTensors()["z"]
