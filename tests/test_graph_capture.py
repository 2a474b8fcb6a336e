"""Graph capture: device tensors, the decode loop's static-input path, the run options that
capture / skip, the provider's decision, and the fixture graph that can be captured.

Everything here runs on the CPU EP (which ignores ``gpu_graph_id``): the static path binds the
same tensors it binds on a GPU, only in host memory. The captured runs themselves are checked
on WebGPU (Mesa lavapipe) by the conformance suite (`GraphCaptureTests`, run by
``scripts/conformance_all.sh webgpu``) and by `test_webgpu_capture_replays` below when the
WebGPU EP can run.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import genai
from genai._core.native_session import DeviceTensor
from genai.errors import ConfigError
from genai.providers import CPUProvider, GraphCapture, Placement
from genai.testing.models import write_gqa_decoder
from tests.test_providers import load_provider_package

PROMPT = np.array([5, 9, 13, 7, 11], np.int32)


@pytest.fixture(scope="module")
def static_model_dir(tmp_path_factory):
    return write_gqa_decoder(
        tmp_path_factory.mktemp("capture"), name="static", seed=11, static_mask=True
    )


@pytest.fixture(scope="module")
def shape_model_dir(tmp_path_factory):
    return write_gqa_decoder(tmp_path_factory.mktemp("capture"), name="shape", seed=11)


def _model(folder, **search):
    cfg = genai.Config(str(folder))
    cfg.clear_providers()
    if search:
        cfg.overlay({"search": search})
    return genai.Model(cfg)


def _generator(model, capture: bool, **search):
    """A batch-1 generator with PROMPT appended; ``capture``: its single-token steps run the
    static path (what Generator does for a provider whose graph capture is on)."""
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40, **search)
    gen = genai.Generator(model, params)
    if capture:
        gen._loop.use_graph_capture(gen._session.next_graph_id())
    gen.append_tokens(PROMPT)
    return gen


def _tokens(gen, steps=20):
    out = []
    for _ in range(steps):
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


# --- DeviceTensor ---------------------------------------------------------------------------


def test_device_tensor_before_and_after_placement(static_model_dir) -> None:
    t = DeviceTensor((1, 2, 4, 3), np.float32, device="webgpu")
    assert t.shape == (1, 2, 4, 3) and t.nbytes == 96 and t.itemsize == 4 and len(t) == 1
    assert t.device_name() == "webgpu" and not t.placed and not t.numpy().any()
    t[:, :, :2, :] = 1.5
    assert t.copy()[0, 0, 1, 2] == 1.5 and t[0, 0, 2, 0] == 0
    with pytest.raises(NotImplementedError, match="past_present_share_buffer=false"):
        t.reshape(1, -1)
    session = _model(static_model_dir).session.new_binding()
    session.bind_input("past_key_values.0.key", DeviceTensor((1, 2, 4, 16), np.float32))
    t2 = DeviceTensor((1, 2, 4, 16), np.float32, device="webgpu")
    t2[0, 1] = 2.0
    session.bind_output("present.0.key", t2)  # placed where the CPU EP wants it: the host
    assert t2.placed and not t2.in_device_memory and t2.device_name() == "cpu"
    assert t2.memory_name == "Cpu" and t2.numpy()[0, 1].min() == 2.0
    t2.write(np.arange(t2.size, dtype=np.float32).reshape(t2.shape))
    assert t2[0, 1, 3, 15] == t2.size - 1
    assert not session.bound_input_in_device_memory("past_key_values.0.key")
    with pytest.raises(TypeError, match="expects"):
        session.bind_input("input_ids", DeviceTensor((1, 1), np.float32))
    with pytest.raises(ValueError, match="binds whole"):
        session.bind_input(
            "past_key_values.0.value", DeviceTensor((1, 2, 4, 16), np.float32), shape=(1, 2, 2, 16)
        )
    with pytest.raises(TypeError, match="ndarray or a DeviceTensor"):
        session.bind_input("input_ids", [[1]])


def test_device_tensor_staging_is_the_callers_memory() -> None:
    host = np.zeros(6, np.int64)
    t = DeviceTensor((1, 6), np.int64, staging=host, keep_staging=True)
    host[2] = 7
    assert t[0, 2] == 7
    with pytest.raises(ValueError, match="C-contiguous"):
        DeviceTensor((1, 4), np.int64, staging=host)
    with pytest.raises(TypeError, match="staging"):
        DeviceTensor((1, 6), np.int32, staging=host)


# --- run options ----------------------------------------------------------------------------


def test_graph_ids_and_run_options(static_model_dir) -> None:
    model = _model(static_model_dir)
    a, b = model.session.new_binding(), model.session.new_binding()
    first, second = a.next_graph_id(), b.next_graph_id()
    assert first != second and min(first, second) > 0
    a.set_graph_capture(first)
    assert a.graph_id == first
    a.set_graph_capture(-1)
    assert a.graph_id == -1
    a.set_graph_capture(None)
    assert a.graph_id is None
    with pytest.raises(ValueError, match="graph_id"):
        a.set_graph_capture(0)


# --- the decode loop's static path ----------------------------------------------------------


def test_static_path_gives_the_same_tokens(static_model_dir) -> None:
    model = _model(static_model_dir)
    plain = _tokens(_generator(model, False))
    gen = _generator(model, True, kv_initial_capacity=0)
    assert gen._loop.capture
    assert set(gen._loop.static_tensors()) == {"input_ids", "attention_mask", "logits"}
    graph = gen._session.graph_id
    assert _tokens(gen) == plain
    assert gen._session.graph_id == graph  # a cache allocated up front: one graph
    mask = gen._loop.static_tensors()["attention_mask"].numpy()
    assert mask.shape == (1, 40) and mask[0, :24].all() and not mask[0, 24:].any()
    # rewind, then the same continuation (the static mask is zeroed past the new length);
    # rewind_to replays the token at index 8 (plain[3]) first
    gen.rewind_to(8)
    again = _tokens(gen, 12)
    assert again == plain[4:16]
    # several tokens at once (continuous decoding) run uncaptured, then capture resumes
    gen.append_tokens(np.array([4, 6], np.int32))
    ref = _generator(model, False)
    _tokens(ref, 20)
    ref.rewind_to(8)
    _tokens(ref, 12)
    ref.append_tokens(np.array([4, 6], np.int32))
    assert _tokens(gen, 5) == _tokens(ref, 5)


def test_growth_captures_anew(static_model_dir) -> None:
    model = _model(static_model_dir)
    plain = _tokens(_generator(model, False))
    gen = _generator(model, True, kv_initial_capacity=8)
    first = gen._session.graph_id
    assert _tokens(gen) == plain
    assert gen._loop.kv_capacity > 8 and gen._session.graph_id > first
    # any re-bind from Python (e.g. an adapter's weights) moves to a new graph id
    before = gen._session.graph_id
    gen._session.bind_input("past_key_values.0.key", gen._kv._buffers[0])
    assert gen._session.graph_id > before
    gen.truncate(10)
    assert _tokens(gen, 5) == plain[5:10]


def test_static_model_computes_what_the_shape_model_does(static_model_dir, shape_model_dir):
    static = _tokens(_generator(_model(static_model_dir), False))
    shape = _tokens(_generator(_model(shape_model_dir), False))
    assert static == shape
    # the growing layout too (a [1, total] mask: the same total length)
    growing = _model(static_model_dir, past_present_share_buffer=False)
    assert _tokens(_generator(growing, False)) == shape


def test_use_graph_capture_refuses_what_it_cannot_capture(static_model_dir) -> None:
    growing = _model(static_model_dir, past_present_share_buffer=False)
    params = genai.GeneratorParams(growing)
    params.set_search_options(max_length=40)
    gen = genai.Generator(growing, params)
    with pytest.raises(ValueError, match="shared-buffer KV"):
        gen._loop.use_graph_capture(1)
    model = _model(static_model_dir)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40, batch_size=2)
    gen = genai.Generator(model, params)
    with pytest.raises(ValueError, match="batch 1"):
        gen._loop.use_graph_capture(1)
    with pytest.raises(ValueError, match="graph_id"):
        gen._loop.use_graph_capture(0)
    gen._loop.use_graph_capture(-1)  # uncaptured runs on a capture-enabled session
    assert not gen._loop.capture and gen._session.graph_id == -1


# --- the provider's decision ----------------------------------------------------------------


class _DeviceProvider(CPUProvider):
    name = "fake-device"
    device = "fakegpu"
    placement = Placement(kv_cache="fakegpu", allocator="session")
    graph_capture = GraphCapture(option="capture")


def test_graph_capture_id_and_blockers(static_model_dir) -> None:
    provider = _DeviceProvider()
    session = _model(static_model_dir).session.new_binding()
    assert provider.graph_capture_id({}, session, rows=1, shared_kv=True) == 0  # off
    on = provider.graph_capture_options(True)
    assert provider.graph_capture_id(on, session, rows=1, shared_kv=True) > 0
    assert provider.graph_capture_id(on, session, rows=2, shared_kv=True) == -1
    assert "2 rows" in provider.graph_capture_blocker(rows=2, shared_kv=True)
    assert provider.graph_capture_id(on, session, rows=1, shared_kv=False) == -1
    assert "shared-buffer" in provider.graph_capture_blocker(rows=1, shared_kv=False)

    class HostKV(_DeviceProvider):
        placement = Placement()

    assert "host memory" in HostKV().graph_capture_blocker(rows=1, shared_kv=True)
    assert HostKV().graph_capture_id(on, session, rows=1, shared_kv=True) == -1

    # an EP that refuses other layouts on a capture-enabled session: an error, not a -1
    class SharedOnly(_DeviceProvider):
        graph_capture = GraphCapture(option="capture", session_requires_shared_buffer=True)

    with pytest.raises(ConfigError, match="only the shared-buffer KV layout"):
        SharedOnly().graph_capture_id(on, session, rows=1, shared_kv=False)
    assert SharedOnly().graph_capture_id(on, session, rows=2, shared_kv=True) == -1
    config = genai.Config(str(static_model_dir))
    config.overlay({"search": {"past_present_share_buffer": False}})
    with pytest.raises(ConfigError, match="past_present_share_buffer"):
        SharedOnly().session_spec(on, config)
    SharedOnly().session_spec({}, config)  # capture off: any layout
    _DeviceProvider().session_spec(on, config)  # an EP that takes both
    assert "no graph capture" in CPUProvider().graph_capture_blocker(rows=1, shared_kv=True)
    assert CPUProvider().graph_capture_id({}, session, rows=1, shared_kv=True) == 0
    # a device-placed role is allocated as a DeviceTensor, reported on the device
    buffer = provider.allocate((1, 2, 3, 4), np.dtype(np.float32))
    assert isinstance(buffer, DeviceTensor) and provider.buffer_device(buffer) == "fakegpu"
    assert isinstance(provider.allocate((2,), np.dtype(np.int64), role="inputs"), np.ndarray)


# --- providers ------------------------------------------------------------------------------


def test_directml_graph_capture_on_by_default(monkeypatch) -> None:
    m = load_provider_package("directml")
    dml = m.DirectMLProvider()
    options = dml.validate_options({"device_id": "0"})
    assert dml.graph_capture_enabled(options)  # as the reference: on unless opted out
    spec = dml.session_spec(options)
    assert spec.config_entries == {m.GRAPH_CAPTURE_CONFIG_KEY: "1"}
    assert spec.providers == [("DML", {"device_id": "0"})]
    off = dml.validate_options({"enable_graph_capture": "0", "device_filter": "gpu"})
    assert not dml.graph_capture_enabled(off)
    spec = dml.session_spec(off)
    assert spec.config_entries == {"ep.dml.enable_graph_capture": "0"}
    assert spec.providers == [("DML", {"device_filter": "gpu"})]  # not a DML EP option
    on = dml.session_spec(dml.validate_options({"enable_graph_capture": "1"}))
    assert on.config_entries == {"ep.dml.enable_graph_capture": "1"}
    with pytest.raises(ConfigError, match="enable_graph_capture"):
        dml.validate_options({"enable_graph_capture": "yes"})
    # its KV cache stays on the host (not checked on DirectML hardware): generators run
    # uncaptured on the capture-enabled session
    assert "host memory" in dml.graph_capture_blocker(rows=1, shared_kv=True)


def test_webgpu_declares_device_kv_and_capture() -> None:
    m = load_provider_package("webgpu")
    webgpu = m.WebGPUProvider()
    assert webgpu.capabilities.kv_layouts == {"shared", "growing"}
    assert webgpu.placement.kv_cache == "webgpu" and webgpu.placement.allocator == "session"
    assert webgpu.graph_capture_options(True) == {"enableGraphCapture": "1"}
    assert not webgpu.graph_capture_enabled({})
    assert webgpu.graph_capture.session_requires_shared_buffer
    assert webgpu.graph_capture_blocker(rows=1, shared_kv=True) is None
    buffer = webgpu.allocate((1, 2, 3, 4), np.dtype(np.float32))
    assert isinstance(buffer, DeviceTensor) and webgpu.buffer_device(buffer) == "webgpu"
    assert webgpu.buffer_device(webgpu.allocate((2,), np.dtype(np.int64), role="inputs")) == "cpu"


# --- WebGPU, when it can run here -----------------------------------------------------------


def _webgpu_ready() -> str | None:
    if importlib.util.find_spec("onnxruntime_ep_webgpu") is None:
        return "onnxruntime-ep-webgpu is not installed"
    if importlib.util.find_spec("genai_provider_webgpu") is None:
        return "genai-provider-webgpu is not installed"
    return None


def _webgpu_capture_model(folder, monkeypatch):
    """``folder``'s model on WebGPU (lavapipe allowed) with graph capture on; skips when the
    EP cannot run."""
    monkeypatch.setenv("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")
    cfg = genai.Config(str(folder))
    cfg.clear_providers()
    cfg.append_provider("webgpu")
    cfg.set_provider_option("webgpu", "enableGraphCapture", "1")
    try:
        return genai.Model(cfg)
    except genai.errors.ProviderUnavailableError as exc:
        pytest.skip(str(exc))


@pytest.mark.skipif(_webgpu_ready() is not None, reason=str(_webgpu_ready()))
def test_webgpu_capture_replays(static_model_dir, monkeypatch) -> None:
    model = _webgpu_capture_model(static_model_dir, monkeypatch)
    cpu = _tokens(_generator(_model(static_model_dir), False))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40, kv_initial_capacity=8)
    gen = genai.Generator(model, params)
    graph = model.provider.graph_capture_id(
        model.provider_options, gen._session, rows=1, shared_kv=not gen._kv.handover
    )
    assert graph > 0
    gen._loop.use_graph_capture(graph)
    gen.append_tokens(PROMPT)
    assert _tokens(gen) == cpu
    assert gen._session.bound_input_in_device_memory("past_key_values.0.key")
    assert gen._loop.static_tensors()["logits"].in_device_memory


@pytest.mark.skipif(_webgpu_ready() is not None, reason=str(_webgpu_ready()))
def test_webgpu_refuses_a_host_buffer_as_past_and_present(static_model_dir, monkeypatch) -> None:
    monkeypatch.setenv("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")
    cfg = genai.Config(str(static_model_dir))
    cfg.clear_providers()
    cfg.append_provider("webgpu")
    try:
        model = genai.Model(cfg)
    except genai.errors.ProviderUnavailableError as exc:
        pytest.skip(str(exc))
    session = model.session.new_binding()
    host = np.zeros((1, 2, 8, 16), np.float32)
    session.bind_input("past_key_values.0.key", host)
    with pytest.raises(ValueError, match="separate device buffers"):
        session.bind_output("present.0.key", host)
    device = DeviceTensor((1, 2, 8, 16), np.float32)
    session.bind_input("past_key_values.0.value", device)
    session.bind_output("present.0.value", device)
    assert device.in_device_memory and device.memory_name.startswith("WebGPU")


@pytest.mark.skipif(_webgpu_ready() is not None, reason=str(_webgpu_ready()))
def test_webgpu_captured_generator_rewound_to_zero_replays_for_a_new_prompt(
    static_model_dir, monkeypatch
) -> None:
    """What the serving fallback does with a finished generator: rewind_to(0) and a new
    prompt replay the graph already captured (no new graph id) with a fresh run's tokens."""
    model = _webgpu_capture_model(static_model_dir, monkeypatch)
    cpu = _tokens(_generator(_model(static_model_dir), False))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40, kv_initial_capacity=0)
    gen = genai.Generator(model, params)
    assert gen._loop.capture
    gen.append_tokens(PROMPT)
    assert _tokens(gen) == cpu
    graphs = model.session.next_graph_id()  # the counter after this generator's graph
    gen.rewind_to(0)
    gen.append_tokens(PROMPT)
    assert _tokens(gen) == cpu
    assert model.session.next_graph_id() == graphs + 1  # no graph was added meanwhile
