"""Behaviours the reference's own test suite checks, side by side with the reference engine
(``onnxruntime_genai``) on the same folders: device-type spelling, models loaded from memory with
external data, every declared graph output, preset and user-set extra inputs, run options, the
generic adapter inputs of its ``adapters`` / ``multiple_adapters`` test models, and the methods
of its Python classes. The folders follow the reference's recipes (its
``test_onnxruntime_genai_api.py``) on a tiny GroupQueryAttention decoder."""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

import genai
from genai.providers import ExecutionProvider
from genai.testing.models import (
    add_logits_addend_input,
    expose_hidden_states,
    save_external_data,
    write_gqa_decoder,
)
from genai.testing.speculative import with_draft
from tests.test_providers import load_provider_package

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

ENGINES = pytest.mark.parametrize("engine", [og, genai], ids=["reference", "genai"])
VOCAB = 64
EOS = 2  # the fixture folders' eos_token_id
#: Batch 2, left-padded as in the reference's test_get_output / test_hidden_states.
PROMPT = np.array([[0, 0, 5, 52], [0, 7, 19, 31]], dtype=np.int32)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_gqa_decoder(tmp_path_factory.mktemp("reference-behaviour"), name="base")


def copy_of(base: pathlib.Path, tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    folder = tmp_path / name
    shutil.copytree(base, folder)
    return folder


def generator(engine: Any, model: Any, max_length: int = 10, batch_size: int = 2) -> Any:
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=max_length, batch_size=batch_size)
    return engine.Generator(model, params)


def greedy(engine: Any, model: Any, setup: Callable[[Any], None] | None = None) -> np.ndarray:
    """Rows of a greedy run on PROMPT, with ``setup(generator)`` before the prompt."""
    gen = generator(engine, model)
    if setup is not None:
        setup(gen)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    return np.stack([np.asarray(gen.get_sequence(i)) for i in range(PROMPT.shape[0])])


# --------------------------------------------------------------------------------------------
# max_length against the context length (Config.overlay) and max_length 0
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", [genai, og], ids=["genai", "reference"])
def test_a_lowered_context_length_is_checked_when_a_generator_is_made(
    engine: Any, base: pathlib.Path
) -> None:
    """The folder's search.max_length above an overlaid context length loads; a generator
    whose max_length is still above it is refused, one within it runs (the reference's
    generators.cpp checks max_length there, not at load)."""
    config = engine.Config(str(base))
    config.overlay('{"model": {"context_length": 16}, "search": {"max_length": 64}}')
    model = engine.Model(config)
    with pytest.raises((RuntimeError, ValueError), match=r"max_length \(64\) cannot be greater"):
        engine.Generator(model, engine.GeneratorParams(model))
    with pytest.raises((RuntimeError, ValueError), match=r"max_length \(20\) cannot be greater"):
        generator(engine, model, max_length=20)
    gen = generator(engine, model, max_length=12)
    gen.append_tokens(PROMPT)
    while not gen.is_done():
        gen.generate_next_token()
    assert len(gen.get_sequence(0)) == 12


def test_max_length_zero_is_refused_and_a_folders_zero_is_its_context(
    base: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    for engine in (genai, og):
        with pytest.raises((RuntimeError, ValueError), match="search max_length is 0"):
            generator(engine, engine.Model(str(base)), max_length=0)
    folder = copy_of(base, tmp_path, "zero")
    config = json.loads((folder / "genai_config.json").read_text())
    config["search"]["max_length"] = 0
    (folder / "genai_config.json").write_text(json.dumps(config))
    lengths = []
    for engine in (genai, og):
        model = engine.Model(str(folder))
        lengths.append(engine.GeneratorParams(model).get_search_options()["max_length"])
    assert lengths[0] == lengths[1] == config["model"]["context_length"]


# --------------------------------------------------------------------------------------------
# Model.device_type
# --------------------------------------------------------------------------------------------


def test_device_type_spelled_as_the_reference(base: pathlib.Path) -> None:
    assert genai.Model(base).device_type == og.Model(str(base)).device_type == "CPU"


@pytest.mark.parametrize(
    ("package", "options", "expected"),
    [
        # The reference's to_string(DeviceType) for the device each provider installs.
        ("cuda", {}, "CUDA"),
        ("directml", {}, "DirectML"),
        ("webgpu", {}, "WebGPU"),
        ("openvino", {}, "OpenVINO"),
        ("tensorrt_rtx", {}, "NvTensorRtRtx"),
        ("qnn", {}, "CPU"),
        ("qnn", {"enable_htp_shared_memory_allocator": "1"}, "QnnWithSharedMemory"),
        ("qnn", {"backend_type": "gpu"}, "QnnWithSharedMemory"),
    ],
)
def test_device_type_of_other_providers(package: str, options: dict, expected: str) -> None:
    """Each provider plugin declares the reference's spelling of its device."""
    module = load_provider_package(package)
    classes = [
        c
        for c in vars(module).values()
        if isinstance(c, type)
        and issubclass(c, ExecutionProvider)
        and c is not ExecutionProvider
        and c.__module__ == module.__name__
    ]
    assert len(classes) == 1
    assert classes[0]().reference_device_type(options) == expected


def test_device_type_of_a_third_party_provider() -> None:
    """A provider that declares nothing runs its buffers through the host: "CPU"."""

    class SomePluginEP(ExecutionProvider):
        name = "SomePluginEP"

    assert SomePluginEP().reference_device_type({}) == "CPU"


# --------------------------------------------------------------------------------------------
# Config.add_model_data with the builder's model.onnx.data beside it
# --------------------------------------------------------------------------------------------


def test_model_from_memory_reads_external_data_from_the_model_folder(
    base: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = copy_of(base, tmp_path, "external")
    save_external_data(folder)  # model.onnx + model.onnx.data
    assert (folder / "model.onnx.data").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the data file is not in the working directory
    rows = {}
    for engine in (og, genai):
        config = engine.Config(str(folder))
        config.add_model_data("model.onnx", (folder / "model.onnx").read_bytes())
        model = engine.Model(config)
        config.remove_model_data("model.onnx")
        rows[engine] = greedy(engine, model)
    np.testing.assert_array_equal(rows[genai], rows[og])


# --------------------------------------------------------------------------------------------
# Trailing pad tokens: padding only with a batch size above 1
# --------------------------------------------------------------------------------------------


def run_rows(
    engine: Any, model: Any, prompt: np.ndarray, num_beams: int = 1
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The first step's logits and the final rows of a greedy (or beam) run on ``prompt``."""
    params = engine.GeneratorParams(model)
    params.set_search_options(
        max_length=prompt.shape[1] + 5,
        batch_size=prompt.shape[0],
        num_beams=num_beams,
        num_return_sequences=num_beams,
    )
    gen = engine.Generator(model, params)
    gen.append_tokens(prompt)
    logits = np.asarray(gen.get_output("logits")).copy()
    while not gen.is_done():
        gen.generate_next_token()
    rows = prompt.shape[0] * num_beams
    return logits, [np.asarray(gen.get_sequence(i)) for i in range(rows)]


@pytest.mark.parametrize(
    ("prompt", "num_beams"),
    [
        ([[5, 52, 0, 0]], 1),  # batch 1: the trailing pad ids are tokens
        ([[0]], 1),  # a prompt of one pad id
        ([[5, 52, 0]], 2),  # beams of one prompt: still no padding
        ([[5, 52, 0, 0], [7, 19, 31, 40]], 1),  # batch 2: trailing pads masked
    ],
    ids=["batch1", "lone-pad", "batch1-beams", "batch2"],
)
def test_trailing_pad_ids_as_the_reference(
    base: pathlib.Path, prompt: list[list[int]], num_beams: int
) -> None:
    ids = np.array(prompt, dtype=np.int32)
    ref_logits, ref_rows = run_rows(og, og.Model(str(base)), ids, num_beams)
    our_logits, our_rows = run_rows(genai, genai.Model(base), ids, num_beams)
    assert our_logits.shape == ref_logits.shape
    np.testing.assert_allclose(our_logits, ref_logits, atol=1e-4)
    for ours, ref in zip(our_rows, ref_rows, strict=True):
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_next_tokens_after_append_as_the_reference(base: pathlib.Path, batch_size: int) -> None:
    prompt = PROMPT[:batch_size]
    seen: dict[Any, list[list[int]]] = {}
    for engine in (og, genai):
        gen = generator(engine, engine.Model(str(base)), max_length=12, batch_size=batch_size)
        gen.append_tokens(prompt)
        tokens = [np.asarray(gen.get_next_tokens()).tolist()]
        gen.generate_next_token()
        tokens.append(np.asarray(gen.get_next_tokens()).tolist())
        if batch_size == 1:  # continuous decoding: the appended tokens are the next ones
            gen.append_tokens(np.array([[9, 33]], np.int32))
            tokens.append(np.asarray(gen.get_next_tokens()).tolist())
            gen.generate_next_token()
            tokens.append(np.asarray(gen.get_next_tokens()).tolist())
        seen[engine] = tokens
    assert seen[genai] == seen[og]
    assert seen[genai][0] == prompt[:, -1].tolist()


def test_next_tokens_before_any_token_is_an_error(base: pathlib.Path) -> None:
    gen = generator(genai, genai.Model(base))
    with pytest.raises(genai.GenaiError, match="append_tokens"):
        gen.get_next_tokens()


# --------------------------------------------------------------------------------------------
# get_output for every declared output
# --------------------------------------------------------------------------------------------


def test_hidden_states_output_matches_the_reference(
    base: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    folder = copy_of(base, tmp_path, "hidden")
    expose_hidden_states(folder)
    seen: dict[Any, list[np.ndarray]] = {}
    for engine in (og, genai):
        gen = generator(engine, engine.Model(str(folder)))
        gen.append_tokens(PROMPT)
        gen.generate_next_token()
        first = np.asarray(gen.get_output("hidden_states"))
        gen.generate_next_token()
        seen[engine] = [first, np.asarray(gen.get_output("hidden_states"))]
    ours, ref = seen[genai], seen[og]
    assert ref[0].shape == (2, 4, 64) and ref[1].shape == (2, 1, 64)
    for a, b in zip(ours, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, atol=1e-5)


@ENGINES
def test_unknown_output_or_input_is_a_runtime_error(engine: Any, base: pathlib.Path) -> None:
    gen = generator(engine, engine.Model(str(base)))
    gen.append_tokens(PROMPT)
    with pytest.raises(RuntimeError, match="zzz"):
        gen.get_output("zzz")
    with pytest.raises(RuntimeError, match="zzz"):
        gen.get_input("zzz")


# --------------------------------------------------------------------------------------------
# Preset extra inputs and set_model_input (the reference's test_preset_extra_inputs)
# --------------------------------------------------------------------------------------------


def extra_input_folder(base: pathlib.Path, tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    """The reference's recipe: an int64 scalar input, cast and added to the logits."""
    folder = copy_of(base, tmp_path, name.replace(":", "_"))
    add_logits_addend_input(folder, name, elem_type=onnx.TensorProto.INT64, shape=[])
    return folder


@pytest.mark.parametrize("name", ["num_logits_to_keep", "onnx::Neg_67"])
def test_preset_extra_inputs_fed_as_the_reference(
    base: pathlib.Path, tmp_path: pathlib.Path, name: str
) -> None:
    folder = extra_input_folder(base, tmp_path, name)
    rows, fed = {}, {}
    for engine in (og, genai):
        model = engine.Model(str(folder))
        rows[engine] = greedy(engine, model)
        gen = generator(engine, model)
        gen.append_tokens(PROMPT)
        fed[engine] = np.asarray(gen.get_input(name))
    np.testing.assert_array_equal(rows[genai], rows[og])
    assert fed[genai].dtype == fed[og].dtype == np.int64
    np.testing.assert_array_equal(fed[genai], fed[og])


@ENGINES
def test_unclaimed_extra_input_is_missing(
    engine: Any, base: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    folder = extra_input_folder(base, tmp_path, "abcde")
    gen = generator(engine, engine.Model(str(folder)))
    with pytest.raises(RuntimeError, match="Missing Input: abcde"):
        gen.append_tokens(PROMPT)


@pytest.mark.parametrize("name", ["abcde", "num_logits_to_keep"])
def test_set_model_input_feeds_the_graph(
    base: pathlib.Path, tmp_path: pathlib.Path, name: str
) -> None:
    folder = extra_input_folder(base, tmp_path, name)
    value = np.array(3, dtype=np.int64)
    logits, fed = {}, {}
    for engine in (og, genai):
        gen = generator(engine, engine.Model(str(folder)))
        gen.set_model_input(name, value)
        gen.append_tokens(PROMPT)
        logits[engine] = [np.asarray(gen.get_logits())]
        fed[engine] = np.asarray(gen.get_input(name))
        gen.generate_next_token()
        logits[engine].append(np.asarray(gen.get_logits()))
    np.testing.assert_array_equal(fed[genai], fed[og])
    for ours, ref in zip(logits[genai], logits[og], strict=True):
        np.testing.assert_allclose(ours, ref, atol=1e-5)
    # 3 added to every logit (the graph's own logits are not all 3 + something else)
    plain = generator(genai, genai.Model(str(base)))
    plain.append_tokens(PROMPT)
    np.testing.assert_allclose(logits[genai][0], np.asarray(plain.get_logits()) + 3, atol=1e-5)


def test_set_model_input_checks_the_name(base: pathlib.Path) -> None:
    gen = generator(genai, genai.Model(base))
    with pytest.raises(ValueError, match="fed by the generator"):
        gen.set_model_input("input_ids", np.zeros((2, 4), np.int32))
    with pytest.warns(UserWarning, match="no input 'zzz'"):
        gen.set_model_input("zzz", np.array(1, np.int64))  # ignored, as the reference
    gen.append_tokens(PROMPT)
    with pytest.raises(KeyError):
        gen.get_input("zzz")


@pytest.mark.parametrize(
    "args",
    [
        (5, np.zeros(1, np.float32)),
        ("extra", None),
        ("extra", "text"),
        ("extra", b"x"),
        ("extra", [1, 2, 3]),
        ("extra", 3),
        ("extra", {"a": 1}),
    ],
)
def test_set_model_input_argument_types_as_the_reference(base: pathlib.Path, args) -> None:
    """A name that is no str, a value that is no array: a TypeError, as the reference's binding
    (were accepted: a warning and nothing, or an array of one string)."""
    for engine in (genai, og):
        gen = generator(engine, engine.Model(str(base)))
        with pytest.raises(TypeError):
            gen.set_model_input(*args)


# --------------------------------------------------------------------------------------------
# set_runtime_option, snapshot_state, set_hidden_states, set_inputs
# --------------------------------------------------------------------------------------------


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except RuntimeError:
        return "raises"
    return "ok"


def test_terminate_session_as_the_reference(base: pathlib.Path) -> None:
    seen: dict[Any, list[str]] = {}
    rows = {}
    for engine in (og, genai):
        gen = generator(engine, engine.Model(str(base)))
        gen.append_tokens(PROMPT)
        gen.generate_next_token()
        gen.set_runtime_option("terminate_session", "1")
        seen[engine] = [
            outcome(gen.generate_next_token),
            outcome(gen.is_done),
            outcome(gen.get_logits),
            outcome(lambda g=gen: g.get_output("logits")),
            outcome(lambda g=gen: g.append_tokens(np.array([[5], [6]], np.int32))),
            outcome(gen.snapshot_state),
            outcome(gen.get_next_tokens),
            outcome(gen.token_count),
            outcome(lambda g=gen: g.set_runtime_option("terminate_session", "2")),
        ]
        gen.set_runtime_option("terminate_session", "0")
        while not gen.is_done():
            gen.generate_next_token()
        rows[engine] = np.stack([np.asarray(gen.get_sequence(i)) for i in range(2)])
    assert seen[genai] == seen[og]
    assert "raises" in seen[og] and "ok" in seen[og]
    np.testing.assert_array_equal(rows[genai], rows[og])


def _profiles(folder: pathlib.Path, prefix: str) -> list[Any]:
    """The JSON traces onnxruntime wrote as ``<prefix>_<time>.json`` in ``folder``."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob(f"{prefix}_*.json"))]


def test_run_level_profiling_as_the_reference(base: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """``set_runtime_option("enable_profiling", prefix)``: onnxruntime (>= 1.25) profiles each
    run into ``<prefix>_<time>.json`` (the reference's run option; "0" turns it off again),
    where a run config entry of that name would profile nothing. The traces name the graph's
    nodes; with a draft model (its own graph) its runs are profiled too."""
    if tuple(int(x) for x in onnxruntime.__version__.split(".")[:2]) < (1, 25):
        pytest.skip(f"run-level profiling needs onnxruntime >= 1.25 ({onnxruntime.__version__})")
    gen = generator(genai, genai.Model(str(base)))
    gen.set_runtime_option("enable_profiling", str(tmp_path / "run"))
    gen.append_tokens(PROMPT)
    gen.generate_next_token()
    traces = _profiles(tmp_path, "run")
    assert traces, "no run profile written"
    nodes = {event["name"] for trace in traces for event in trace if event.get("cat") == "Node"}
    graph = onnx.load(str(base / "model.onnx"), load_external_data=False).graph
    assert nodes & {f"{node.name}_kernel_time" for node in graph.node}, sorted(nodes)[:5]
    gen.set_runtime_option("enable_profiling", "0")
    count = len(traces)
    gen.generate_next_token()
    assert len(_profiles(tmp_path, "run")) == count

    # a one-layer draft: its runs' traces show one attention node, the target's two
    draft = write_gqa_decoder(tmp_path, num_layers=1, seed=3, name="draft")
    folder = with_draft(base, draft, tmp_path / "pair", speculative={"max_draft_tokens": 2})
    model = genai.Model(str(folder))
    gen = generator(genai, model, batch_size=1)
    gen.set_runtime_option("enable_profiling", str(tmp_path / "spec"))
    gen.append_tokens(PROMPT[:1])
    gen.generate_next_token()
    attention = {
        len({e["name"] for e in trace if "GroupQueryAttention" in e["name"]})
        for trace in _profiles(tmp_path, "spec")
    }
    assert attention == {1, 2}, attention


def test_run_option_and_no_op_state_calls_keep_the_tokens(base: pathlib.Path) -> None:
    def setup(gen: Any) -> None:
        gen.set_runtime_option("memory.enable_memory_arena_shrinkage", "cpu:0")
        gen.snapshot_state()  # no recurrent state: nothing to capture
        gen.set_hidden_states(np.zeros((2, 4, 64), np.float32))  # no hidden_states input

    rows = {engine: greedy(engine, engine.Model(str(base)), setup) for engine in (og, genai)}
    np.testing.assert_array_equal(rows[genai], rows[og])
    np.testing.assert_array_equal(rows[genai], greedy(genai, genai.Model(base)))


def test_run_option_is_per_generator(base: pathlib.Path) -> None:
    model = genai.Model(base)
    gen = generator(genai, model)
    gen.set_runtime_option("bad.entry", "x")
    other = generator(genai, model)
    other.append_tokens(PROMPT)  # the other binding keeps the session's run options
    assert other.token_count() == 4


@ENGINES
def test_set_inputs_and_processors_refused_for_a_decoder(engine: Any, base: pathlib.Path) -> None:
    model = engine.Model(str(base))
    gen = generator(engine, model)
    with pytest.raises(RuntimeError, match="SetInputs|set_inputs"):
        gen.set_inputs(og.NamedTensors() if engine is og else {})
    with pytest.raises(RuntimeError, match="not a registered multi-modal model type"):
        model.create_multimodal_processor()
    with pytest.raises(RuntimeError, match="unsupported model type 'llama'"):
        model.create_streaming_processor()


@pytest.mark.parametrize("cls", ["Generator", "Model", "GeneratorParams", "Adapters"])
def test_every_reference_method_exists(cls: str) -> None:
    ours = dir(getattr(genai, cls))
    missing = [n for n in dir(getattr(og, cls)) if not n.startswith("_") and n not in ours]
    assert missing == []


# --------------------------------------------------------------------------------------------
# Adapters: the reference's adapters / multiple_adapters test models
# --------------------------------------------------------------------------------------------


def export_adapter(path: pathlib.Path, params: dict[str, np.ndarray]) -> str:
    adapter = onnxruntime.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters(
        {k: onnxruntime.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()}
    )
    adapter.export_adapter(str(path))
    return str(path)


@pytest.fixture(scope="module")
def adapter_model(base: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """``adapter_a`` + ``adapter_b`` ([vocab] float, initializers of zeros also listed as graph
    inputs) added to the logits, as the reference's test_adapters builds its folders."""
    folder = tmp_path_factory.mktemp("adapters") / "adapters"
    shutil.copytree(base, folder)
    for name in ("adapter_a", "adapter_b"):
        add_logits_addend_input(folder, name, shape=[VOCAB], default=np.zeros(VOCAB, np.float32))
    return folder


ADAPTER_CASES = {
    "none": [],
    "adapters": [{"adapter_a": 0, "adapter_b": 1}],  # one file with both
    "multiple_adapters": [{"adapter_a": 0}, {"adapter_b": 1}],  # one file each
    "same_input_twice": [{"adapter_a": 0}, {"adapter_a": 1}],  # the last activated wins
}


@pytest.mark.parametrize("case", list(ADAPTER_CASES))
def test_adapter_inputs_by_name_match_the_reference(
    adapter_model: pathlib.Path, tmp_path: pathlib.Path, case: str
) -> None:
    rng = np.random.default_rng(7)
    values = [rng.random(VOCAB, dtype=np.float32) for _ in range(2)]
    files = [
        export_adapter(
            tmp_path / f"{case}_{i}.onnx_adapter", {k: values[v] for k, v in spec.items()}
        )
        for i, spec in enumerate(ADAPTER_CASES[case])
    ]
    logits, rows = {}, {}
    for engine in (og, genai):
        model = engine.Model(str(adapter_model))
        adapters = engine.Adapters(model)

        def activate(gen: Any, adapters: Any = adapters) -> None:
            for i in range(len(files)):
                gen.set_active_adapter(adapters, f"adapter_{i}")

        for i, path in enumerate(files):
            adapters.load(path, f"adapter_{i}")
        gen = generator(engine, model)
        activate(gen)
        gen.append_tokens(PROMPT)
        logits[engine] = np.asarray(gen.get_logits())
        rows[engine] = greedy(engine, model, activate)
    np.testing.assert_allclose(logits[genai], logits[og], atol=1e-5)
    np.testing.assert_array_equal(rows[genai], rows[og])
    base_logits = generator(genai, genai.Model(adapter_model))
    base_logits.append_tokens(PROMPT)
    delta = logits[genai] - np.asarray(base_logits.get_logits())
    expected = {
        "none": 0,
        "adapters": values[0] + values[1],
        "multiple_adapters": values[0] + values[1],
        "same_input_twice": values[1],
    }[case]
    np.testing.assert_allclose(delta, np.broadcast_to(expected, delta.shape), atol=1e-5)


def test_adapter_parameter_checked_against_the_graph_input(
    adapter_model: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    adapters = genai.Adapters(genai.Model(adapter_model))
    with pytest.raises(genai.runtime.adapters.AdapterError, match="'nothere' is not an input"):
        adapters.load(export_adapter(tmp_path / "a.onnx_adapter", {"nothere": np.ones(3)}), "a")
    with pytest.raises(genai.runtime.adapters.AdapterError, match="shape \\[3\\]"):
        adapters.load(
            export_adapter(tmp_path / "b.onnx_adapter", {"adapter_a": np.ones(3, np.float32)}),
            "b",
        )
    with pytest.raises(genai.runtime.adapters.AdapterError, match="float64"):
        adapters.load(export_adapter(tmp_path / "c.onnx_adapter", {"adapter_a": np.ones(64)}), "c")


# --------------------------------------------------------------------------------------------
# Folders of kinds genai does not run yet: refused naming the feature
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "model_type", "feature"),
    [
        ({"rnn_states_prev": "rnn_states_prev"}, "llama", "Marian-style"),
        ({}, "marian-ssru", "Marian-style"),
        ({"block_table": "block_table"}, "decoder", "paged-KV engine models"),
        ({"cumulative_sequence_lengths": "cu_seqlens"}, "llama", "paged-KV engine models"),
    ],
)
def test_unsupported_model_kinds_refused_by_name(
    base: pathlib.Path, inputs: dict, model_type: str, feature: str
) -> None:
    config = genai.Config(base)
    # The keys as the reference's folders carry them: the config accepts them, Model refuses.
    config.overlay({"model": {"type": model_type, "decoder": {"inputs": inputs}}})
    with pytest.raises(NotImplementedError, match=feature):
        genai.Model(config)


def test_set_model_input_leaves_initializers_to_adapters(adapter_model: pathlib.Path) -> None:
    """The reference binds set_model_input values only to graph inputs: an overridable
    initializer (an adapter's target) keeps its value."""
    value = np.linspace(0, 1, VOCAB, dtype=np.float32)
    logits = {}
    for engine in (og, genai):
        gen = generator(engine, engine.Model(str(adapter_model)))
        with pytest.warns(UserWarning) if engine is genai else contextlib.nullcontext():
            gen.set_model_input("adapter_b", value)
        gen.append_tokens(PROMPT)
        logits[engine] = np.asarray(gen.get_logits())
    plain = generator(og, og.Model(str(adapter_model)))
    plain.append_tokens(PROMPT)
    np.testing.assert_allclose(logits[og], np.asarray(plain.get_logits()), atol=1e-6)
    np.testing.assert_allclose(logits[genai], logits[og], atol=1e-5)


# --------------------------------------------------------------------------------------------
# Arguments of the wrong type: a TypeError naming the argument (the reference's bindings raise
# a TypeError; given None for a string some of them crash the process)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", [genai, og], ids=["genai", "reference"])
@pytest.mark.parametrize(
    "call",
    [
        lambda e, m, g: e.Adapters(None),
        lambda e, m, g: e.Adapters(str(m)),
        lambda e, m, g: g.set_active_adapter(None, "a"),
        lambda e, m, g: e.GeneratorParams(m).set_guidance("regex", "a", "yes"),
    ],
    ids=["Adapters(None)", "Adapters(path)", "set_active_adapter(None)", "ff_tokens=str"],
)
def test_wrong_argument_types_are_type_errors(engine: Any, base: pathlib.Path, call) -> None:
    model = engine.Model(str(base))
    gen = generator(engine, model)
    with pytest.raises(TypeError) as raised:
        call(engine, model, gen)
    if engine is genai:
        assert isinstance(raised.value, genai.ArgumentTypeError)
        assert " must be " in str(raised.value)


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda c: c.append_provider(None), "provider name"),
        (lambda c: c.set_provider_option("cpu", None, "1"), "provider option name"),
        (lambda c: c.set_provider_option(None, "k", "1"), "provider name"),
        (lambda c: c.add_model_data(None, b"x"), "model data name"),
        (lambda c: c.add_model_data("model.onnx", "text"), "model data must be bytes"),
        (lambda c: c.add_model_data("model.onnx", 3), "model data must be bytes"),
    ],
)
def test_config_arguments_of_the_wrong_type_are_named(base: pathlib.Path, call, what) -> None:
    """(The reference crashes on None where a string is due: genai's own check.)"""
    config = genai.Config(str(base))
    with pytest.raises(genai.ArgumentTypeError, match=what):
        call(config)
    config.add_model_data("model.onnx", np.frombuffer(b"ab", np.uint8))  # a buffer is bytes
    assert config.model_data("model.onnx") == b"ab"


# --------------------------------------------------------------------------------------------
# After every row ended (EOS)
# --------------------------------------------------------------------------------------------


def _ended_by_eos(engine: Any, model: Any, speculative: bool) -> Any:
    """A batch-1 generator whose third token is forced to the EOS."""
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=12)
    if speculative:
        params.set_speculative_options(ngram_size=3)
    gen = engine.Generator(model, params)
    gen.append_tokens(np.array([5, 52, 5, 52, 5], np.int32))
    gen.generate_next_token()
    logits = np.array(gen.get_logits(), np.float32)  # (the reference's set_logits needs them)
    logits[:] = -10.0
    logits[..., EOS] = 10.0
    gen.set_logits(logits)
    gen.generate_next_token()
    assert gen.is_done()
    return gen


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "ngram"])
def test_generating_after_every_row_ended_adds_nothing(base: pathlib.Path, speculative) -> None:
    """As the reference: generate_next_token after the EOS does nothing (genai raised 'no
    pending tokens to run'; with n-gram decoding it went on generating)."""
    found = []
    for engine in (genai, og):
        gen = _ended_by_eos(engine, engine.Model(str(base)), speculative)
        count = gen.token_count()
        next_tokens = []
        for _ in range(3):
            gen.generate_next_token()
            next_tokens.append([int(t) for t in gen.get_next_tokens()])  # the pad id
        assert gen.token_count() == count and gen.is_done()
        found.append((count, next_tokens))
    assert found[0] == found[1]


def test_logits_after_every_row_ended_are_refused(base: pathlib.Path) -> None:
    """With n-gram decoding both engines refuse, in the reference's words; genai's plain
    decoding refuses too (the reference's would run the model on the EOS token)."""
    message = "Speculative decoding logits are unavailable after generation is complete."
    for engine in (genai, og):
        gen = _ended_by_eos(engine, engine.Model(str(base)), True)
        with pytest.raises(RuntimeError, match=message):
            gen.get_logits()
        with pytest.raises(RuntimeError, match=message):
            gen.set_logits(np.zeros((1, 1, VOCAB), np.float32))
    plain = _ended_by_eos(genai, genai.Model(str(base)), False)
    with pytest.raises(genai.GenerationError, match="unavailable after generation is complete"):
        plain.get_logits()


def test_next_tokens_after_rewinding_to_zero_is_an_error(base: pathlib.Path) -> None:
    gen = generator(genai, genai.Model(str(base)), batch_size=1)
    gen.append_tokens(np.array([5, 52], np.int32))
    gen.generate_next_token()
    gen.rewind_to(0)
    with pytest.raises(genai.GenerationError, match="no tokens yet"):
        gen.get_next_tokens()


def test_a_prompt_that_fills_max_length_is_done(base: pathlib.Path) -> None:
    """docs/differences.md: genai's is_done() is True right after a prompt of max_length
    tokens; the reference says False, then its next step raises."""
    width = PROMPT.shape[1]
    ours = generator(genai, genai.Model(base), max_length=width)
    ours.append_tokens(PROMPT)
    assert ours.is_done()
    theirs = generator(og, og.Model(str(base)), max_length=width)
    theirs.append_tokens(PROMPT)
    assert not theirs.is_done()
    with pytest.raises(RuntimeError):
        theirs.generate_next_token()


def test_params_changed_after_the_generator_is_made(base: pathlib.Path) -> None:
    """docs/differences.md: a genai Generator keeps the search options it was made with; the
    reference's keeps reading its params."""
    counts = []
    for engine in (genai, og):
        model = engine.Model(str(base))
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=PROMPT.shape[1] + 6, batch_size=PROMPT.shape[0])
        gen = engine.Generator(model, params)
        params.set_search_options(max_length=PROMPT.shape[1] + 3)
        gen.append_tokens(PROMPT)
        while not gen.is_done():
            gen.generate_next_token()
        counts.append(gen.token_count() - PROMPT.shape[1])
    assert counts == [6, 3]
