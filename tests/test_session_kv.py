"""A KV cache the execution provider keeps inside the session (OpenVINO ``enable_causallm``).

The engine-side rules run everywhere (a CPU provider told that its session keeps the cache);
the real stateful mode runs where the OpenVINO EP is installed (scripts/conformance_all.sh
openvino runs this file in that environment) and is compared with the CPU EP's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_providers import load_provider_package

import genai
import genai.runtime.model as genai_model
from genai.errors import ConfigError, GenerationError
from genai.providers import CPUProvider, SessionKV, available_ort_providers
from genai.testing.models import write_optimum_decoder


def write_stateful_names(folder: Path) -> Path:
    """Rename an optimum fixture's KV pairs to the names OpenVINO's stateful mode recognises
    (``past_key_%d`` / ``present_key_%d``), in the graph and in genai_config.json."""
    model = onnx.load(str(folder / "model.onnx"))
    renamed = {}
    for value in (*model.graph.input, *model.graph.output):
        parts = value.name.split(".")
        if value.name.startswith("past_key_values.") and len(parts) == 3:
            renamed[value.name] = f"past_{parts[2]}_{parts[1]}"
        elif value.name.startswith("present.") and len(parts) == 3:
            renamed[value.name] = f"present_{parts[2]}_{parts[1]}"
    for value in (*model.graph.input, *model.graph.output):
        value.name = renamed.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [renamed.get(x, x) for x in node.input]
        node.output[:] = [renamed.get(x, x) for x in node.output]
    onnx.save(model, str(folder / "model.onnx"))
    config_file = folder / "genai_config.json"
    config = json.loads(config_file.read_text())
    decoder = config["model"]["decoder"]
    decoder["inputs"].update(past_key_names="past_key_%d", past_value_names="past_value_%d")
    decoder["outputs"].update(
        present_key_names="present_key_%d", present_value_names="present_value_%d"
    )
    config_file.write_text(json.dumps(config, indent=2))
    return folder


@pytest.fixture(scope="module")
def stateful_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_optimum_decoder(tmp_path_factory.mktemp("session-kv"), name="ov-names")
    return write_stateful_names(folder)


def greedy(model: genai.Model, prompt: list[int], new: int) -> list[int]:
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new)
    generator = genai.Generator(model, params)
    generator.append_tokens(np.array(prompt, np.int64))
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


# --- engine rules, on any machine -------------------------------------------------------------


@pytest.fixture
def cpu_session_kv(monkeypatch: pytest.MonkeyPatch):
    """Models load with a CPU provider that declares a session-kept KV cache."""

    def provider(name: str) -> CPUProvider:
        instance = CPUProvider()
        instance.session_kv = SessionKV(rewind_option="kvcache_rewind")
        return instance

    monkeypatch.setattr(genai_model, "get_provider", provider)


def test_one_live_generator_per_session(stateful_folder: Path, cpu_session_kv) -> None:
    model = genai.Model(stateful_folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=16)
    first = genai.Generator(model, params)
    with pytest.raises(GenerationError, match="another live Generator"):
        genai.Generator(model, params)
    del first
    second = genai.Generator(model, params)  # the first is gone: its state may be dropped
    assert second.kv_cache_bytes == 0


def test_batch_beams_reads_and_snapshots_are_refused(stateful_folder, cpu_session_kv) -> None:
    model = genai.Model(stateful_folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=16, batch_size=2)
    with pytest.raises(NotImplementedError, match="batch_size 1"):
        genai.Generator(model, params)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=16)
    generator = genai.Generator(model, params)
    generator.append_tokens(np.array([1, 5, 7], np.int64))
    with pytest.raises(GenerationError, match="keeps the KV cache inside the session"):
        generator.get_output("present_key_0")
    assert generator.get_output("logits").shape[-1] > 0


def test_openvino_checks_kv_names_before_creating_the_session(tmp_path: Path) -> None:
    m = load_provider_package("openvino")
    folder = write_optimum_decoder(tmp_path, name="builder-names")
    config = genai.Config(folder)
    assert "present_<kind>_%d" in m.stateful_name_problem(config)
    assert m.stateful_name_problem(genai.Config(write_stateful_names(folder))) is None
    ov = m.OpenVINOProvider()
    options = ov.validate_options({"enable_causallm": "True"})
    with pytest.raises(ConfigError, match="present_key_names"):
        ov.session_spec(options, config)


# --- the real stateful mode -------------------------------------------------------------------

needs_openvino = pytest.mark.skipif(
    "OpenVINOExecutionProvider" not in available_ort_providers(),
    reason="the OpenVINO EP is not installed (scripts/conformance_all.sh openvino runs this)",
)


def openvino_model(folder: Path) -> genai.Model:
    config = genai.Config(folder)
    config.clear_providers()
    config.append_provider("OpenVINO")
    config.set_provider_option("OpenVINO", "device_type", "CPU")
    config.set_provider_option("OpenVINO", "enable_causallm", "True")
    return genai.Model(config)


@needs_openvino
def test_stateful_greedy_equals_the_cpu_ep(stateful_folder: Path) -> None:
    cpu = genai.Model(stateful_folder)
    ov = openvino_model(stateful_folder)
    for prompt in ([1, 5, 7, 9], [1, 11], [1, 3, 4, 5, 6, 7, 8, 9, 10]):
        assert greedy(ov, prompt, 40) == greedy(cpu, prompt, 40)  # also: each starts afresh


@needs_openvino
def test_stateful_rewind_and_continuous_decoding(stateful_folder: Path) -> None:
    cpu = genai.Model(stateful_folder)
    ov = openvino_model(stateful_folder)
    runs = {}
    for name, model in (("cpu", cpu), ("ov", ov)):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=64)
        generator = genai.Generator(model, params)
        generator.append_tokens(np.array([1, 5, 7, 9], np.int64))
        for _ in range(10):
            generator.generate_next_token()
        generator.rewind_to(8)
        generator.append_tokens(np.array([12, 13], np.int64))
        for _ in range(10):
            generator.generate_next_token()
        runs[name] = (generator.get_sequence(0).tolist(), generator.get_logits())
        del generator
    assert runs["ov"][0] == runs["cpu"][0]
    np.testing.assert_allclose(runs["ov"][1], runs["cpu"][1], atol=1e-3)
