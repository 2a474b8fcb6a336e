"""Windowed models (``sliding_window.slide_*``) on providers that want static shapes.

A windowed graph runs at two sequence lengths (S = W for prompt windows, S = 1 for tokens); a
provider with ``static_shapes`` (QNN's HTP) cannot run one graph at both, so `genai.Model`
builds one session per run length from the same file with the sequence and past dimensions
fixed (`genai.kv.windowed_cache.static_shape_overrides`), and
`genai.generation.windowed_runner` runs each
window on the session of its length.

The engine side runs everywhere: a CPU provider told that it wants static shapes gives the
same tokens and logits as the CPU with one dynamic session. The real thing runs where the QNN
EP is installed (``scripts/conformance_all.sh qnn`` runs this file in that environment, on the
HTP simulator of onnxruntime-qnn): every node on QNN (CPU fallback disabled), greedy tokens and
logits against the CPU EP.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import numpy as np
import onnx
import pytest
from test_providers import load_provider_package

import genai
import genai.runtime.model as genai_model
from genai.errors import ConfigError, ProviderUnavailableError
from genai.kv.windowed_cache import sliding_window_spec, static_shape_overrides
from genai.providers import CPUProvider, SessionSpec, get_provider
from genai.testing.models import write_gqa_decoder
from genai.testing.windowed import write_windowed_decoder

WINDOW, CONTEXT = 8, 128


def prompt_of(n: int, offset: int = 4) -> np.ndarray:
    """n distinct-ish non-special token ids."""
    return (np.arange(n) * 7 % 50 + offset).astype(np.int32)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("windowed-static")
    common = {"window_size": WINDOW, "context_length": CONTEXT}
    return {
        "uint8": write_windowed_decoder(root, name="uint8", **common),
        "float32": write_windowed_decoder(root, name="float32", kv_dtype="float32", **common),
    }


def copy_folder(folder: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    out.mkdir(parents=True)
    for item in folder.iterdir():
        (out / item.name).write_bytes(item.read_bytes())
    return out


class StaticCPU(CPUProvider):
    """ONNX Runtime's CPU EP, declared to want static shapes (as QNN does), fixing the batch
    (and, to check that the per-shape values win, a wrong sequence length) itself."""

    static_shapes = True

    def session_spec(self, options, config=None) -> SessionSpec:
        spec = super().session_spec(options, config)
        spec.free_dimension_overrides = {"batch_size": 1, "sequence_length": 3}
        return spec


@pytest.fixture
def static_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Models load with `StaticCPU`."""
    monkeypatch.setattr(genai_model, "get_provider", lambda name: StaticCPU())


def greedy(model: genai.Model, prompt: np.ndarray, max_length: int = CONTEXT) -> list[int]:
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    generator = genai.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


def forced_logits(model: genai.Model, prompt: np.ndarray, sequence: list[int]) -> np.ndarray:
    """The logits before each token of ``sequence`` after the (padded) prompt, the tokens fed
    one per run (``[steps, vocab]``)."""
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(sequence))
    generator = genai.Generator(model, params)
    generator.append_tokens(prompt)
    out = [np.array(generator.get_logits()).reshape(-1)]
    for token in sequence[len(generator.get_sequence(0)) : -1]:
        generator.append_tokens(np.array([token], np.int32))
        out.append(np.array(generator.get_logits()).reshape(-1))
    return np.array(out)


# --- which dimensions each session fixes ----------------------------------------------------


def test_qnn_declares_static_shapes_and_the_fixture_suits_it(written):
    """The QNN provider asks for per-shape sessions; the fixture graph has no ``And`` (the QNN
    EP takes none: "Unsupported nodes in QNN EP: { name: /And_12, type: And }")."""
    assert load_provider_package("qnn").QNNProvider.static_shapes is True
    assert not getattr(CPUProvider, "static_shapes", False)
    ops = {node.op_type for node in onnx.load(str(written["uint8"] / "model.onnx")).graph.node}
    assert "And" not in ops and {"QuantizeLinear", "DequantizeLinear"} <= ops


def test_overrides_fix_the_sequence_and_past_dimensions(written):
    config = genai.Config(str(written["uint8"]))
    assert static_shape_overrides(config) == {
        WINDOW: {"sequence_length": WINDOW, "past_sequence_length": CONTEXT - WINDOW},
        1: {"sequence_length": 1, "past_sequence_length": CONTEXT - 1},
    }


def test_a_model_that_is_not_windowed_needs_no_overrides(tmp_path, static_cpu):
    folder = write_gqa_decoder(tmp_path, name="gqa")
    assert static_shape_overrides(genai.Config(str(folder))) == {}
    model = genai.Model(folder)
    assert model.shape_sessions == {} and model.io.shape_sessions == {}


def edit_graph(folder: pathlib.Path, out: pathlib.Path, edit) -> pathlib.Path:
    out = copy_folder(folder, out)
    model = onnx.load(str(out / "model.onnx"))
    edit({value.name: value for value in model.graph.input})
    onnx.save(model, str(out / "model.onnx"))
    return out


def test_an_unnamed_sequence_dimension_cannot_be_fixed(written, tmp_path, static_cpu):
    def unname(inputs):
        inputs["input_ids"].type.tensor_type.shape.dim[1].ClearField("dim_param")

    folder = edit_graph(written["uint8"], tmp_path / "unnamed", unname)
    with pytest.raises(ConfigError, match="axis 1 of 'input_ids' .* unnamed dynamic dimension"):
        genai.Model(folder)


def test_one_name_for_sequence_and_past_is_refused(written, tmp_path, static_cpu):
    def same(inputs):
        inputs["past_key_values.0.key"].type.tensor_type.shape.dim[3].dim_param = "sequence_length"

    folder = edit_graph(written["uint8"], tmp_path / "same", same)
    with pytest.raises(ConfigError, match="names the sequence and the past dimension alike"):
        genai.Model(folder)


# --- one session per run length, on the CPU -------------------------------------------------


def test_the_model_has_a_static_session_per_run_length(written, static_cpu):
    model = genai.Model(written["uint8"])
    assert sorted(model.shape_sessions) == [1, WINDOW]
    assert model.session is model.shape_sessions[1]
    assert model.io.shape_sessions == model.shape_sessions
    for count, session in model.shape_sessions.items():
        # the per-shape values win over the provider's own (sequence_length=3)
        assert session.input_shapes["input_ids"] == (1, count)
        assert session.input_shapes["past_key_values.0.key"] == (2, 1, 16, CONTEXT - count)
        assert session.output_shapes["logits"] == (1, count, 64)


@pytest.mark.parametrize("kv", ["uint8", "float32"])
@pytest.mark.parametrize("n", [5, 13, 20])
def test_static_sessions_equal_one_dynamic_session(written, monkeypatch, kv, n):
    """Prompts of one to three windows, then tokens until the context is full: the same tokens,
    and the same logits (1e-5) with the tokens fed one per run."""
    dynamic = genai.Model(written[kv])
    expected = greedy(dynamic, prompt_of(n))
    expected_logits = forced_logits(dynamic, prompt_of(n), expected)
    monkeypatch.setattr(genai_model, "get_provider", lambda name: StaticCPU())
    static = genai.Model(written[kv])
    assert static.shape_sessions
    assert greedy(static, prompt_of(n)) == expected
    np.testing.assert_allclose(
        forced_logits(static, prompt_of(n), expected), expected_logits, atol=1e-5, rtol=0
    )


def steps(model: genai.Model, generators: int = 2) -> list[list[int]]:
    """Two generators stepped in turn; the first rewinds to 0 and starts over, then gets
    tokens appended after generating and generates one more."""
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=64)
    first, second = genai.Generator(model, params), genai.Generator(model, params)
    first.append_tokens(prompt_of(13))
    second.append_tokens(prompt_of(5))
    for _ in range(10):
        first.generate_next_token()
        second.generate_next_token()
    before = first.get_sequence(0).tolist()
    first.rewind_to(0)
    first.append_tokens(prompt_of(13))
    for _ in range(10):
        first.generate_next_token()
    assert first.get_sequence(0).tolist() == before
    first.append_tokens(np.array([9, 10, 11], np.int32))
    first.generate_next_token()
    return [first.get_sequence(0).tolist(), second.get_sequence(0).tolist()]


def test_rewind_append_and_two_generators(written, monkeypatch):
    """Each generator binds both sessions; a rewind to 0 starts over on both; tokens appended
    after generating run on the one-token session: as with one dynamic session."""
    expected = steps(genai.Model(written["uint8"]))
    monkeypatch.setattr(genai_model, "get_provider", lambda name: StaticCPU())
    assert steps(genai.Model(written["uint8"])) == expected


def test_a_session_of_the_wrong_length_is_refused(written, static_cpu):
    model = genai.Model(written["uint8"])
    io = dataclasses.replace(model.io, shape_sessions={WINDOW: model.session, 1: model.session})
    with pytest.raises(
        ConfigError, match=r"'input_ids' .* \[1, 1\] in its session for runs of 8 token"
    ):
        sliding_window_spec(model.config, io, model.session)
    io = dataclasses.replace(model.io, shape_sessions={1: model.session})
    with pytest.raises(ConfigError, match=r"runs of \[1\] tokens; a window of 8 needs 8 and 1"):
        sliding_window_spec(model.config, io, model.session)


# --- the QNN EP (HTP simulator), where installed --------------------------------------------

#: The HTP simulator settings of scripts/conformance_all.sh (``GENAI_QNN_OPTIONS``,
#: ``"key=value;..."``, replaces them).
QNN_OPTIONS = os.environ.get(
    "GENAI_QNN_OPTIONS", "enable_htp_fp16_precision=1;soc_model=57;htp_arch=73"
)


def qnn_unavailable() -> str | None:
    try:
        provider = get_provider("QNN")
        if not provider.probe_devices():
            return "the QNN EP lists no device here"
    except ProviderUnavailableError as exc:
        return f"the QNN EP is not available ({exc}); scripts/conformance_all.sh qnn runs this"
    return None


_QNN_UNAVAILABLE = qnn_unavailable()
needs_qnn = pytest.mark.skipif(_QNN_UNAVAILABLE is not None, reason=str(_QNN_UNAVAILABLE))


@pytest.fixture(scope="module")
def qnn_models(written, tmp_path_factory):
    """Per KV dtype: (the CPU EP's model, the QNN model with CPU fallback disabled)."""
    out = {}
    for kv, folder in written.items():
        qnn_folder = copy_folder(folder, tmp_path_factory.mktemp("qnn") / kv)
        path = qnn_folder / "genai_config.json"
        config = json.loads(path.read_text())
        # every node on QNN, else the session is not created
        options = config["model"]["decoder"].setdefault("session_options", {})
        options["session.disable_cpu_ep_fallback"] = "1"
        path.write_text(json.dumps(config))
        qnn_config = genai.Config(str(qnn_folder))
        qnn_config.clear_providers()
        qnn_config.append_provider("QNN")
        for item in filter(None, QNN_OPTIONS.split(";")):
            key, _, value = item.partition("=")
            qnn_config.set_provider_option("QNN", key.strip(), value.strip())
        out[kv] = (genai.Model(folder), genai.Model(qnn_config))
    return out


@needs_qnn
@pytest.mark.parametrize("kv", ["uint8", "float32"])
@pytest.mark.parametrize("n", [5, 13, 20])
def test_qnn_greedy_tokens_follow_the_cpu_ep(qnn_models, kv, n):
    """Greedy until the context is full (one to three prompt windows, then 104-120 tokens). The
    HTP computes in fp16: the tokens equal the CPU EP's until a step where the CPU's best two
    logits are within twice the provider's ``logits_atol`` of each other (a near tie), and for
    at least 48 generated tokens."""
    cpu, qnn = qnn_models[kv]
    assert sorted(qnn.shape_sessions) == [1, WINDOW]
    atol = qnn.provider.capabilities.logits_atol
    expected, got = greedy(cpu, prompt_of(n)), greedy(qnn, prompt_of(n))
    first = next((i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b), None)
    if first is None:
        return
    padded = -(-n // WINDOW) * WINDOW
    assert first - padded >= 48, f"tokens differ after {first - padded} generated tokens"
    logits = forced_logits(cpu, prompt_of(n), expected)[first - padded]
    margin = logits[expected[first]] - logits[got[first]]
    assert margin < 2 * atol, f"QNN chose {got[first]} at {first}, {margin} below the CPU's"


@needs_qnn
@pytest.mark.parametrize("n", [5, 13, 20])
def test_qnn_logits_within_the_declared_tolerance(qnn_models, n):
    """The CPU EP's greedy tokens fed to both, one per run after the prompt: every logit within
    the provider's ``logits_atol`` with a float cache. (With the uint8 cache a K/V value that
    fp16 and fp32 round to neighbouring bytes moves logits further: up to 0.56 measured, so it
    is checked by its tokens above.)"""
    cpu, qnn = qnn_models["float32"]
    atol = qnn.provider.capabilities.logits_atol
    expected = greedy(cpu, prompt_of(n))
    diff = np.abs(
        forced_logits(cpu, prompt_of(n), expected) - forced_logits(qnn, prompt_of(n), expected)
    )
    assert diff.max() <= atol, f"max logit difference {diff.max()} > {atol}"
