"""Providers: the seam's defaults, the first-party provider packages' probes and option building
(CUDA, TensorRT-RTX and DirectML cannot run here: their policy is tested with fakes), the C API
additions for plugin EPs, and ``genai providers``."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import genai
from genai._core import ort_api
from genai._core.native_session import NativeSession
from genai.errors import ConfigError, ProviderUnavailableError
from genai.providers import plugins
from genai.providers.base import (
    Capabilities,
    ExecutionProvider,
    GraphCapture,
    PluginEPProvider,
    get_provider_class,
    list_providers,
)
from genai.providers.cpu import CPUProvider
from genai.providers.hookspecs import hookimpl

ROOT = Path(__file__).resolve().parents[1]


def load_provider_package(name: str) -> types.ModuleType:
    """Import providers/<name>/genai_provider_<name> from the source tree (not installed)."""
    module_name = f"genai_provider_{name}"
    path = ROOT / "providers" / name / module_name / "__init__.py"
    spec = importlib.util.spec_from_file_location(f"_test_{module_name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch):
    """Only the built-in plugins, plus those a test registers (removed afterwards)."""
    monkeypatch.setenv(plugins.ENV_DISABLE_AUTOLOAD, "1")
    monkeypatch.delenv(plugins.ENV_TRACE, raising=False)
    plugins.reset()
    added = []

    def register(module: types.ModuleType) -> types.ModuleType:
        added.append(module)
        plugins.register_plugin(module, module.__name__)
        return module

    yield register
    for module in added:
        plugins.unregister_plugin(module)
    monkeypatch.undo()
    plugins.reset()


@pytest.fixture
def fake_ep_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write an importable fake plugin-EP package ``name`` (get_library_path/get_ep_name)."""
    root = tmp_path / "fake-eps"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    made = []

    def make(name: str, ep_name: str, library: str = "/nonexistent/libfake.so", **extra: str):
        body = textwrap.dedent(f"""
            def get_library_path():
                return {library!r}

            def get_ep_name():
                return {ep_name!r}
            """)
        for fn, value in extra.items():
            body += f"\ndef {fn}():\n    return {value!r}\n"
        (root / f"{name}.py").write_text(body)
        made.append(name)
        importlib.invalidate_caches()
        return name

    yield make
    for name in made:
        sys.modules.pop(name, None)


def fake_device(ep_name: str, device_type: str, device_id: int = 0, vendor: str = "Fake"):
    return types.SimpleNamespace(
        ep_name=ep_name, device_type=device_type, device_id=device_id, vendor=vendor
    )


class FakeSession:
    def __init__(self, kinds: dict[str, str] | None, fail: bool = False) -> None:
        self.kinds = kinds or {}
        self.fail = fail

    def input_memory_info(self):
        if self.fail:
            raise RuntimeError("onnxruntime too old")
        return {n: {"name": k, "device_type": k.upper()} for n, k in self.kinds.items()}

    def output_memory_info(self):
        return {}


# --- the seam --------------------------------------------------------------------------------


def test_cpu_provider_defaults() -> None:
    cpu = CPUProvider()
    assert cpu.unavailable_reason() is None
    assert cpu.session_spec({}).providers == []
    assert cpu.validate_options({}) == {}
    with pytest.raises(ConfigError, match="accepts: none"):
        cpu.validate_options({"x": "1"})
    assert cpu.capabilities.exact and cpu.capabilities.kv_layouts == {"shared", "growing"}
    buffer = cpu.allocate((2, 3), np.dtype(np.float32))
    assert (
        isinstance(buffer, np.ndarray) and not buffer.any() and cpu.buffer_device(buffer) == "cpu"
    )
    described = cpu.describe()
    assert described["placement"]["kv_cache"] == "cpu" and described["graph_capture"] is None
    with pytest.raises(ProviderUnavailableError, match="no graph capture"):
        cpu.graph_capture_options(True)
    cpu.check_session(FakeSession({"x": "cpu"}))  # no expectation: no check


@pytest.mark.parametrize("spelling", ["cpu", "CPU", "CPUExecutionProvider", "cpuexecutionprovider"])
def test_cpu_found_under_every_spelling(isolated, spelling: str) -> None:
    assert get_provider_class(spelling) is CPUProvider


def test_capabilities_validate() -> None:
    with pytest.raises(ValueError, match="kv_layouts"):
        Capabilities(kv_layouts=frozenset({"paged"}))
    with pytest.raises(ValueError, match="logits_atol"):
        Capabilities(logits_atol=-1)
    caps = Capabilities(kv_layouts={"shared"})  # type: ignore[arg-type]
    assert caps.shared_buffer_required and caps.as_dict()["kv_layouts"] == ["shared"]


def test_option_values_must_be_strings() -> None:
    with pytest.raises(ConfigError, match="must be a string"):
        ExecutionProvider().validate_options({"a": 1})  # type: ignore[dict-item]


def test_check_session_requires_the_claimed_memory() -> None:
    class GPUish(ExecutionProvider):
        name = "gpuish"
        ort_name = "GPUishExecutionProvider"
        session_memory_device = "GPU"

    with pytest.raises(ProviderUnavailableError, match="took no part of the graph"):
        GPUish().check_session(FakeSession({"input_ids": "cpu"}))
    GPUish().check_session(FakeSession({"input_ids": "cpu", "past": "gpu"}))
    GPUish().check_session(FakeSession(None, fail=True))  # ORT cannot tell: no verdict


def test_list_providers_reports_probe_failures(isolated) -> None:
    class Raising(ExecutionProvider):
        name = "raising-probe"
        ort_name = "X"

        def unavailable_reason(self):
            raise RuntimeError("probe bug")

    module = types.ModuleType("raising_plugin")
    module.register_providers = hookimpl(lambda register: register(Raising))
    isolated(module)
    rows = {r.name: r for r in list_providers()}
    assert rows["cpu"].available and rows["cpu"].package == "genai-runtime"
    assert list_providers()[0].name == "cpu"
    assert not rows["raising-probe"].available
    assert "probe raised RuntimeError: probe bug" in rows["raising-probe"].reason
    assert rows["raising-probe"].plugin == "raising_plugin"


# --- cuda --------------------------------------------------------------------------------------


def test_cuda_probe_names_each_missing_piece(monkeypatch, tmp_path) -> None:
    m = load_provider_package("cuda")
    cuda = m.CUDAProvider()
    monkeypatch.setattr(m, "available_ort_providers", lambda: ["CPUExecutionProvider"])
    assert "install onnxruntime-gpu" in cuda.unavailable_reason()
    monkeypatch.setattr(
        m, "available_ort_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    monkeypatch.setattr(m, "ort_library_dir", lambda: str(tmp_path))
    assert "libonnxruntime_providers_cuda.so is missing" in cuda.unavailable_reason()
    (tmp_path / "libonnxruntime_providers_cuda.so").write_bytes(b"")
    monkeypatch.setattr(m, "probe_shared_library", lambda name: f"{name}: cannot open")
    assert cuda.unavailable_reason() == "no NVIDIA driver: libcuda.so.1: cannot open"
    monkeypatch.setattr(m, "probe_shared_library", lambda name: None)
    assert cuda.unavailable_reason() is None


def test_cuda_is_unavailable_here_with_a_reason() -> None:
    m = load_provider_package("cuda")
    reason = m.CUDAProvider().unavailable_reason()
    if "CUDAExecutionProvider" not in ort_api.available_providers():
        assert "CUDAExecutionProvider" in reason and "onnxruntime-gpu" in reason


def test_cuda_options_and_graph_capture() -> None:
    m = load_provider_package("cuda")
    cuda = m.CUDAProvider()
    with pytest.raises(ConfigError, match="device_id"):
        cuda.validate_options({"device_id": "first"})
    with pytest.raises(ConfigError, match="enable_cuda_graph"):
        cuda.validate_options({"enable_cuda_graph": "yes"})
    options = cuda.validate_options({"device_id": "1", **cuda.graph_capture_options(True)})
    assert options == {"device_id": "1", "enable_cuda_graph": "1"}
    assert cuda.graph_capture_enabled(options) and not cuda.graph_capture_enabled({})
    assert cuda.session_spec(options).providers == [("CUDAExecutionProvider", options)]
    assert cuda.capabilities.continuous_decoding and not cuda.capabilities.exact
    with pytest.raises(ProviderUnavailableError, match="CUDAExecutionProvider took no part"):
        cuda.check_session(FakeSession({"input_ids": "cpu"}))


def test_cuda_cannot_silently_fall_back(fixture_folders) -> None:
    if "CUDAExecutionProvider" in ort_api.available_providers():
        pytest.skip("this onnxruntime has the CUDA EP")
    with pytest.raises(ort_api.OrtError):
        NativeSession(str(fixture_folders["gqa"] / "model.onnx"), providers=[("CUDA", {})])


# --- tensorrt-rtx -----------------------------------------------------------------------------


def test_tensorrt_rtx_shape_profiles(fixture_folders) -> None:
    m = load_provider_package("tensorrt_rtx")
    profiles = m.shape_profiles(genai.Config(str(fixture_folders["gqa"])))
    assert set(profiles) == {
        "nv_profile_min_shapes",
        "nv_profile_opt_shapes",
        "nv_profile_max_shapes",
    }
    assert profiles["nv_profile_min_shapes"].startswith("input_ids:1x1,attention_mask:1x1,")
    assert "past_key_values.1.value:1x2x0x16" in profiles["nv_profile_min_shapes"]
    assert "past_key_values.0.key:1x2x128x16" in profiles["nv_profile_max_shapes"]
    assert "attention_mask:1x64" in profiles["nv_profile_opt_shapes"]
    batched = m.shape_profiles(genai.Config(str(fixture_folders["gqa"])), max_batch_size=4)
    assert "input_ids:4x128" in batched["nv_profile_max_shapes"]
    gpt2 = m.shape_profiles(genai.Config(str(fixture_folders["gpt2"])))
    assert "past_0:2x1x" in gpt2["nv_profile_min_shapes"]
    optimum = m.shape_profiles(genai.Config(str(fixture_folders["optimum"])))
    assert "position_ids:1x1" in optimum["nv_profile_min_shapes"]
    with pytest.raises(ConfigError, match="context_length"):
        m.shape_profiles({"model": {"decoder": {}}})


def test_tensorrt_rtx_probe_and_options(fake_ep_module, monkeypatch, isolated) -> None:
    m = load_provider_package("tensorrt_rtx")
    trt = m.TensorRTRTXProvider()
    if importlib.util.find_spec(trt.ep_module) is None:
        assert "onnxruntime-ep-nv-tensorrt-rtx" in trt.unavailable_reason()
    fake_ep_module("fake_trt_rtx", "NvTensorRTRTXExecutionProvider")
    monkeypatch.setattr(m.TensorRTRTXProvider, "ep_module", "fake_trt_rtx")
    monkeypatch.setattr(m, "probe_shared_library", lambda name: f"{name}: cannot open")
    assert trt.unavailable_reason() == "no NVIDIA driver: libcuda.so.1: cannot open"
    with pytest.raises(ConfigError, match="all of"):
        trt.validate_options({"nv_profile_min_shapes": "input_ids:1x1"})
    with pytest.raises(ConfigError, match="enable_cuda_graph"):
        trt.validate_options({"enable_cuda_graph": "on"})
    assert trt.graph_capture_options(True) == {"enable_cuda_graph": "1"}
    # aliases resolve once the plugin is registered
    module = types.ModuleType("trt_plugin")
    module.register_providers = m.register_providers
    isolated(module)
    assert get_provider_class("tensorrt_rtx") is m.TensorRTRTXProvider
    assert get_provider_class("NvTensorRtRtx") is m.TensorRTRTXProvider


def test_tensorrt_rtx_session_spec_picks_a_gpu(fixture_folders, monkeypatch) -> None:
    import genai.providers.base as gp

    m = load_provider_package("tensorrt_rtx")
    trt = m.TensorRTRTXProvider()
    ep = "NvTensorRTRTXExecutionProvider"
    monkeypatch.setattr(m.TensorRTRTXProvider, "ensure_registered", lambda self: ep)
    devices = [
        fake_device("CPUExecutionProvider", "CPU"),
        fake_device(ep, "GPU", 0x2330),
        fake_device(ep, "GPU", 0x2331),
    ]
    monkeypatch.setattr(gp, "get_ep_devices", lambda: devices)
    config = genai.Config(str(fixture_folders["gqa"]))
    spec = trt.session_spec(trt.validate_options({"device_id": "1"}), config)
    [(chosen, options)] = spec.providers
    assert chosen == [devices[2]] and "device_id" not in options
    assert options["nv_profile_max_shapes"].startswith("input_ids:1x128,")
    given = {k: "input_ids:1x1" for k in m._PROFILE_KEYS}
    [(_, options)] = trt.session_spec(given, config).providers
    assert options == given
    monkeypatch.setattr(gp, "get_ep_devices", lambda: devices[:1])
    with pytest.raises(ProviderUnavailableError) as info:
        trt.session_spec({}, config)
    assert "offers no GPU device" in str(info.value) and "CPUExecutionProvider/CPU" in str(
        info.value
    )


def test_plugin_library_registration_failure_names_the_library(fake_ep_module, tmp_path) -> None:
    not_a_library = tmp_path / "libnot_a_library.so"
    not_a_library.write_text("just text\n")
    fake_ep_module("fake_broken_ep", "BrokenExecutionProvider", library=str(not_a_library))

    class Broken(PluginEPProvider):
        name = "broken-plugin-ep"
        ort_name = "BrokenExecutionProvider"
        ep_module = "fake_broken_ep"

    assert Broken().unavailable_reason() is None  # cheap probe: the package is importable
    with pytest.raises(ProviderUnavailableError) as info:
        Broken().session_spec({})
    assert str(not_a_library) in str(info.value) and "broken-plugin-ep" in str(info.value)


# --- directml ---------------------------------------------------------------------------------


def test_directml_probe_options_and_capture(monkeypatch) -> None:
    m = load_provider_package("directml")
    dml = m.DirectMLProvider()
    if sys.platform != "win32":
        assert "Windows only" in dml.unavailable_reason()
    monkeypatch.setattr(m.DirectMLProvider, "platform", "win32")
    monkeypatch.setattr(m, "available_ort_providers", lambda: ["CPUExecutionProvider"])
    assert "onnxruntime-directml" in dml.unavailable_reason()
    monkeypatch.setattr(m, "available_ort_providers", lambda: ["DmlExecutionProvider"])
    assert dml.unavailable_reason() is None
    assert dml.graph_capture_enabled({}) is True  # on by default, as the reference
    assert dml.graph_capture_options(True) == {"enable_graph_capture": "1"}
    with pytest.raises(ConfigError, match="performance_preference"):
        dml.validate_options({"performance_preference": "fast"})
    with pytest.raises(ConfigError, match="unknown option"):
        dml.validate_options({"enableGraphCapture": "1"})
    options = dml.validate_options({"device_id": "0", "device_filter": "npu"})
    assert dml.session_spec(options).providers == [("DML", options)]
    assert not dml.capabilities.continuous_decoding


# --- openvino ---------------------------------------------------------------------------------


def test_openvino_device_types_and_modes(monkeypatch, fake_ep_module) -> None:
    import genai.providers.base as gp

    m = load_provider_package("openvino")
    assert [m.device_kind(v) for v in ("cpu", "GPU.1", "AUTO:NPU,CPU")] == ["CPU", "GPU", "NPU"]
    for bad in ("TPU", "FANCY:GPU"):
        with pytest.raises(ConfigError):
            m.device_kind(bad)
    ov = m.OpenVINOProvider()
    assert ov.validate_options({}) == {"device_type": "CPU"}
    assert ov.session_kv is None
    stateful = m.OpenVINOProvider()
    stateful.validate_options({"enable_causallm": "True"})
    assert stateful.session_kv == gp.SessionKV(rewind_option="kvcache_rewind")
    monkeypatch.setattr(m, "available_ort_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(m.OpenVINOProvider, "ep_module", "no_such_openvino_module")
    assert ov.mode() is None and "neither onnxruntime-openvino" in ov.unavailable_reason()
    with pytest.raises(ProviderUnavailableError):
        ov.session_spec({"device_type": "CPU"})
    monkeypatch.setattr(m, "available_ort_providers", lambda: ["OpenVINOExecutionProvider"])
    assert ov.mode() == "monolithic" and ov.unavailable_reason() is None
    spec = ov.session_spec({"device_type": "GPU", "precision": "FP16"})
    assert spec.providers == [("OpenVINO", {"device_type": "GPU", "precision": "FP16"})]
    # the plugin package: devices of the requested kind
    monkeypatch.setattr(m, "available_ort_providers", lambda: ["CPUExecutionProvider"])
    fake_ep_module("fake_openvino_ep", "OpenVINOExecutionProvider")
    monkeypatch.setattr(m.OpenVINOProvider, "ep_module", "fake_openvino_ep")
    monkeypatch.setattr(m.OpenVINOProvider, "ensure_registered", lambda self: self.ort_name)
    devices = [fake_device(ov.ort_name, "CPU"), fake_device(ov.ort_name, "GPU")]
    monkeypatch.setattr(gp, "get_ep_devices", lambda: devices)
    assert ov.mode() == "plugin"
    [(chosen, options)] = ov.session_spec({"device_type": "GPU", "precision": "FP16"}).providers
    assert chosen == [devices[1]] and options == {"precision": "FP16"}
    monkeypatch.setattr(gp, "get_ep_devices", lambda: [])  # the plugin on non-Intel CPUs
    with pytest.raises(ProviderUnavailableError, match="offers no"):
        ov.session_spec({"device_type": "CPU"})


# --- qnn ---------------------------------------------------------------------------------------


def test_qnn_static_shapes_and_backend(monkeypatch, fake_ep_module) -> None:
    import genai.providers.base as gp

    m = load_provider_package("qnn")
    assert m.parse_free_dimensions("") == {}
    assert m.parse_free_dimensions("sequence_length=1; total_sequence_length=64") == {
        "sequence_length": 1,
        "total_sequence_length": 64,
    }
    for bad in ("x", "x=0", "=3", "x=y"):
        with pytest.raises(ConfigError, match="NAME=POSITIVE_INT"):
            m.parse_free_dimensions(bad)
    qnn = m.QNNProvider()
    assert not qnn.capabilities.batch
    fake_ep_module("fake_qnn_ep", "QNNExecutionProvider", get_qnn_htp_path="/opt/qnn/libQnnHtp.so")
    monkeypatch.setattr(m.QNNProvider, "ep_module", "fake_qnn_ep")
    assert qnn.registration_name() == "QNNExecutionProvider"
    monkeypatch.setattr(m.QNNProvider, "ensure_registered", lambda self: "QNNExecutionProvider")
    device = fake_device("QNNExecutionProvider", "NPU")
    monkeypatch.setattr(gp, "get_ep_devices", lambda: [device])
    options = qnn.validate_options({"free_dimensions": "sequence_length=1", "soc_model": "57"})
    spec = qnn.session_spec(options)
    assert spec.providers == [
        ([device], {"soc_model": "57", "backend_path": "/opt/qnn/libQnnHtp.so"})
    ]
    assert spec.free_dimension_overrides == {"batch_size": 1, "sequence_length": 1}
    [(_, explicit)] = qnn.session_spec({"backend_type": "cpu"}).providers
    assert explicit == {"backend_type": "cpu"}


# --- webgpu, cpu package ----------------------------------------------------------------------


def test_webgpu_declarations() -> None:
    m = load_provider_package("webgpu")
    webgpu = m.WebGPUProvider()
    if importlib.util.find_spec(webgpu.ep_module) is None:
        assert "onnxruntime-ep-webgpu" in webgpu.unavailable_reason()
    assert webgpu.graph_capture_options(True) == {"enableGraphCapture": "1"}
    assert webgpu.device_types == ("GPU",) and webgpu.session_memory_device == "GPU"


def test_cpu_package_registers_the_builtin_class(isolated) -> None:
    m = load_provider_package("cpu")
    assert m.CPUProvider is CPUProvider
    module = types.ModuleType("cpu_package")
    module.register_providers = m.register_providers
    isolated(module)
    assert get_provider_class("cpu") is CPUProvider  # registering the same class is a no-op


def test_first_party_packages_declare_entry_points() -> None:
    import tomllib

    for folder in sorted((ROOT / "providers").iterdir()):
        meta = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        assert meta["entry-points"][plugins.ENTRY_POINT_GROUP] == {
            folder.name: f"genai_provider_{folder.name}"
        }
        assert "genai-runtime" in meta["dependencies"]


# --- the C API additions ----------------------------------------------------------------------


def test_ep_devices_and_available_providers() -> None:
    assert "CPUExecutionProvider" in ort_api.available_providers()
    devices = ort_api.get_ep_devices()
    cpu = [d for d in devices if d.ep_name == "CPUExecutionProvider"]
    assert cpu and cpu[0].device_type == "CPU" and cpu[0].ep_vendor == "Microsoft"
    described = cpu[0].as_dict()
    assert described["ep_metadata"].get("version") == ort_api.version()
    assert set(described) >= {"vendor", "vendor_id", "device_id", "ep_options", "device_metadata"}


def test_session_for_ep_devices_matches_the_default(fixture_folders) -> None:
    path = str(fixture_folders["gqa-noshare"] / "model.onnx")
    cpu = [d for d in ort_api.get_ep_devices() if d.ep_name == "CPUExecutionProvider"]
    plain = NativeSession(path)
    by_device = NativeSession(
        path, providers=[(cpu, {})], free_dimension_overrides={"batch_size": 1}
    )
    assert by_device.input_shapes["input_ids"][0] == 1
    assert plain.input_shapes["input_ids"][0] == "batch_size"
    outputs = []
    for session in (plain, by_device):
        session.bind_input("input_ids", np.array([[5, 9, 12]], dtype=np.int64))
        session.bind_input("attention_mask", np.ones((1, 3), dtype=np.int64))
        for i in range(2):
            for kind in ("key", "value"):
                session.bind_input(
                    f"past_key_values.{i}.{kind}", np.zeros((1, 2, 0, 16), dtype=np.float32)
                )
        for name in session.output_names:
            session.bind_output_to_device(name)
        session.run()
        outputs.append(session.get_output("logits"))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    memory = by_device.input_memory_info()
    assert memory["input_ids"] == {"name": "Cpu", "id": 0, "mem_type": 0, "device_type": "CPU"}
    assert by_device.output_memory_info()["logits"]["device_type"] == "CPU"
    with pytest.raises(ValueError, match="at least one EpDevice"):
        NativeSession(path, providers=[([], {})])
    with pytest.raises(TypeError, match="EpDevice"):
        NativeSession(path, providers=[([object()], {})])


def test_plugin_library_registration_errors(tmp_path) -> None:
    with pytest.raises(ort_api.OrtNoSuchFileError):
        ort_api.register_execution_provider_library("genai-test-missing", tmp_path / "nope.so")
    text = tmp_path / "libtext.so"
    text.write_text("not a library")
    with pytest.raises(ort_api.OrtError, match="genai-test-text"):
        ort_api.register_execution_provider_library("genai-test-text", text)
    assert "genai-test-text" not in ort_api.registered_execution_provider_libraries()
    with pytest.raises(ort_api.OrtError, match="was not registered"):
        ort_api.unregister_execution_provider_library("genai-test-never-registered")


# --- genai providers ---------------------------------------------------------------------------


def test_cli_providers_lists_every_provider(isolated, capsys) -> None:
    from genai.cli import main

    assert main(["providers", "--plugins"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["cpu", "genai-runtime", "available"]
    assert "genai-provider-cuda" in out and "not installed" in out
    assert "plugin cpu: genai.providers.cpu (built-in); hooks: register_providers" in out
    assert main(["providers", "--json", "--plugins", "--devices"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["providers"][0]["name"] == "cpu" and document["providers"][0]["available"]
    assert {p["name"] for p in document["not_installed"]} >= {"cuda", "WebGPU", "QNN", "DML"}
    assert document["plugins"][0]["name"] == "cpu"


def test_cli_providers_shows_why_not(isolated, capsys) -> None:
    from genai.cli import main

    m = load_provider_package("directml")
    module = types.ModuleType("dml_plugin")
    module.register_providers = m.register_providers
    isolated(module)
    assert main(["providers"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("DML"))
    if sys.platform != "win32":
        assert "unavailable: DirectML runs on Windows only" in line


def test_graph_capture_declaration() -> None:
    capture = GraphCapture(option="enable_x", default=True)
    assert capture.requires_shared_buffer and capture.max_batch_size == 1


# --- several providers in the config ------------------------------------------------------------


def test_every_listed_provider_must_exist_and_only_the_first_runs(
    isolated, fixture_folders, caplog
) -> None:
    """The reference appends every listed provider to its sessions (an unknown or unavailable
    one is an error); genai checks each and runs on the first, naming any other it leaves
    unused (the CPU is every session's fallback anyway)."""

    class SecondProvider(CPUProvider):
        name = "second"

    module = types.ModuleType("second_provider")
    module.register_providers = hookimpl(lambda register: register(SecondProvider))
    isolated(module)
    folder = str(fixture_folders["gqa"])

    def load(*names: str) -> genai.Model:
        config = genai.Config(folder)
        config.clear_providers()
        for name in names:
            config.append_provider(name)
        return genai.Model(config)

    with pytest.raises(ProviderUnavailableError, match="bogus_ep"):
        load("cpu", "bogus_ep")
    with caplog.at_level("WARNING", logger="genai.runtime.model"):
        assert load("cpu", "cpu").provider.name == "cpu"
        assert not [r for r in caplog.records if "is not used" in r.getMessage()]
        assert load("cpu", "second").provider.name == "cpu"
    assert any("second is not used" in r.getMessage() for r in caplog.records)
