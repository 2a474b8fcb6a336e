"""Sliding-window (Gemma-2/3-style local) layers: window-sized KV caches with tokens and logits
of the reference and of an independent NumPy forward pass, well past the window.

The fixture alternates local layers (0, 2: ``local_window_size=8``, ``sliding_window_cache=1``)
with global ones (1, 3). The reference runs it only with the shared buffer, unpadded batches and
one beam; the growing layout and beam search are checked against the reference running the same
weights with window-masked full-length caches (``window_cache=False``) and against NumPy.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import genai
from genai.errors import ConfigError, GenerationError
from genai.kv.kv_cache import (
    check_relayout,
    relayout,
    resident_rows,
    window_capacity,
    window_capacity_for,
)
from genai.testing.models import write_gqa_decoder
from tests.numpy_decoder import decoder_logits
from tests.parity import assert_same_run, greedy

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

WINDOW = 8
LAYERS = 4
LOCAL = (0, 2)
HEADS, KV_HEADS, HIDDEN = 4, 2, 64
CAPACITY = WINDOW + 16  # the CPU's slack, as the reference
MAX_LENGTH = 100  # five compactions of the local caches (at 25, 42, 59, 76, 93 tokens)
PROMPT = np.array([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], np.int32)
BATCH = np.array([PROMPT, [30, 31, 8, 9, 40, 41, 42, 43, 44, 45, 46]], np.int32)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("sliding-window")
    common = {"num_layers": LAYERS, "sliding_window": WINDOW, "local_layers": LOCAL}
    return {
        "shared": write_gqa_decoder(root, name="shared", **common),
        "growing": write_gqa_decoder(root, name="growing", share_buffer=False, **common),
        "masked": write_gqa_decoder(root, name="masked", window_cache=False, **common),
        "slack": write_gqa_decoder(root, name="slack", cache_slack=5, **common),
        "global": write_gqa_decoder(root, name="global", num_layers=LAYERS),
    }


def run_ours(folder: pathlib.Path, prompt: np.ndarray, **options) -> object:
    return greedy(genai, genai.Model(folder), prompt, MAX_LENGTH, keep_logits=True, **options)


def assert_close_logits(ours, theirs, atol: float = 1e-4) -> None:
    assert len(ours.logits) == len(theirs.logits)
    for step, (a, b) in enumerate(zip(ours.logits, theirs.logits, strict=True)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=f"step {step}")


# --------------------------------------------------------------------------------------------
# Parity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("initial", [0, 4, 16], ids=["up-front", "grow-from-4", "grow-from-16"])
@pytest.mark.parametrize("prompt", [PROMPT, BATCH], ids=["batch1", "batch2"])
@pytest.mark.parametrize("layout", ["shared", "growing"])
def test_tokens_and_logits_match_the_reference_past_the_window(folders, layout, prompt, initial):
    ours = run_ours(folders[layout], prompt, kv_initial_capacity=initial)
    theirs = greedy(og, og.Model(str(folders["shared"])), prompt, MAX_LENGTH, keep_logits=True)
    assert ours.token_count == MAX_LENGTH > 4 * CAPACITY
    assert_same_run(ours, theirs)
    assert_close_logits(ours, theirs)


@pytest.mark.parametrize("layout", ["shared", "growing"])
@pytest.mark.parametrize("prompt", [PROMPT, BATCH], ids=["batch1", "batch2"])
def test_continuous_decoding_past_the_window_equals_a_fresh_run(folders, layout, prompt):
    """append_tokens after the local caches compacted: multi-token steps over a compacted cache
    (batch 1) and one token per run (batch 2) continue exactly like the reference's fresh run."""
    prompt = np.atleast_2d(prompt)
    model = genai.Model(folders[layout])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, batch_size=prompt.shape[0])
    generator = genai.Generator(model, params)
    generator.append_tokens(prompt)
    for _ in range(30):  # 41 tokens: compacted at 25
        generator.generate_next_token()
    extra = np.tile(np.array([11, 13, 17, 19, 23, 29, 31], np.int32), (prompt.shape[0], 1))
    generator.append_tokens(extra)
    for _ in range(20):
        generator.generate_next_token()
    continued = np.array([generator.get_sequence(b) for b in range(prompt.shape[0])])
    prefix = continued[:, : prompt.shape[1] + 30 + extra.shape[1]]
    fresh = greedy(og, og.Model(str(folders["shared"])), prefix, continued.shape[1])
    np.testing.assert_array_equal(continued, np.array(fresh.sequences))


def test_window_cache_computes_what_window_masking_does(folders):
    """The reference on the window-masked full-cache graph: the same function, another kernel."""
    ours = run_ours(folders["growing"], PROMPT)
    masked = greedy(og, og.Model(str(folders["masked"])), PROMPT, MAX_LENGTH, keep_logits=True)
    assert_same_run(ours, masked)
    assert_close_logits(ours, masked)


# --- an independent NumPy forward pass --------------------------------------------------------


def graph_weights(folder: pathlib.Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(folder / "model.onnx"))
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


def numpy_logits(w: dict[str, np.ndarray], tokens: np.ndarray, window: int | None) -> np.ndarray:
    """Logits ``[len, vocab]``; layers in `LOCAL` see keys j with ``i - j < window``."""
    return decoder_logits(
        w, tokens, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS, local_layers=LOCAL, window=window
    )


@pytest.mark.parametrize("layout", ["shared", "growing"])
def test_logits_match_a_numpy_forward_with_the_window(folders, layout):
    ours = run_ours(folders[layout], PROMPT)
    sequence = ours.sequences[0]
    weights = graph_weights(folders[layout])
    expected = numpy_logits(weights, sequence, WINDOW)
    steps = np.array([np.asarray(x)[0, -1] for x in ours.logits])  # after len(PROMPT) - 1, ...
    positions = np.arange(len(PROMPT) - 1, len(PROMPT) - 1 + len(steps))
    np.testing.assert_allclose(steps, expected[positions], atol=1e-4, rtol=0)
    # the window matters: attending to everything gives other logits past the window
    unwindowed = numpy_logits(weights, sequence, None)[positions]
    assert np.abs(unwindowed - expected[positions])[WINDOW:].max() > 1e-2


# --------------------------------------------------------------------------------------------
# Memory: local layers keep window + slack positions
# --------------------------------------------------------------------------------------------


def per_position_bytes(model: genai.Model, batch: int = 1) -> int:
    io = model.io
    return 2 * batch * io.kv_heads * io.head_size * io.kv_dtype.itemsize  # K and V, one layer


@pytest.mark.parametrize("layout", ["shared", "growing"])
def test_local_layers_hold_window_plus_slack(folders, layout):
    model = genai.Model(folders[layout])
    assert model.io.window_size == WINDOW and model.io.window_layers == LOCAL
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, kv_initial_capacity=0)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    while not generator.is_done():
        generator.generate_next_token()
        length = generator.token_count()
        for layer in range(LAYERS):
            shape = generator.get_output(f"present.{layer}.key").shape
            if layer in LOCAL:
                assert shape[2] == CAPACITY
            else:  # shared: max_length up front; growing: what was computed
                assert shape[2] == (MAX_LENGTH if layer_shared(layout) else length - 1)
    unit = per_position_bytes(model)
    if layout == "shared":
        expected = unit * (2 * CAPACITY + 2 * MAX_LENGTH)
    else:
        expected = unit * (2 * CAPACITY + 2 * (generator.token_count() - 1))
    assert generator.kv_cache_bytes == expected


@pytest.mark.parametrize("layout", ["shared", "growing"])
def test_used_bytes_count_resident_positions(folders, layout):
    model = genai.Model(folders[layout])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    generator.generate_until_done(50)
    computed = generator.token_count() - 1
    unit = per_position_bytes(model)
    held = resident_rows(computed, CAPACITY, WINDOW)
    assert held < CAPACITY < computed
    assert generator._kv.used_bytes(computed) == unit * (2 * held + 2 * computed)
    plain = genai.Model(folders["global"])
    other = genai.Generator(plain, genai.GeneratorParams(plain))
    assert other._kv.used_bytes(computed) == unit * LAYERS * computed


def layer_shared(layout: str) -> bool:
    return layout == "shared"


def test_the_saving_against_full_caches(folders):
    """Same model without windows: every layer holds max_length positions."""
    windowed, full = genai.Model(folders["shared"]), genai.Model(folders["global"])
    sizes = {}
    for name, model in (("windowed", windowed), ("full", full)):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=MAX_LENGTH, kv_initial_capacity=0)
        sizes[name] = genai.Generator(model, params).kv_cache_bytes
    unit = per_position_bytes(windowed)
    assert sizes["full"] == unit * LAYERS * MAX_LENGTH
    assert sizes["full"] - sizes["windowed"] == unit * len(LOCAL) * (MAX_LENGTH - CAPACITY)


@pytest.mark.parametrize(
    ("folder", "max_length", "capacity"),
    [
        ("slack", MAX_LENGTH, WINDOW + 5),  # cache_slack from the config
        ("shared", 20, 20),  # capped at max_length
        ("shared", 6, WINDOW),  # never below the window: the op needs C >= W
    ],
)
def test_window_capacity(folders, folder, max_length, capacity):
    model = genai.Model(folders[folder])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=max_length, kv_initial_capacity=0)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT[:4])
    assert generator.get_output("present.0.key").shape[2] == capacity
    assert generator.get_output("present.1.key").shape[2] == max_length


def test_window_capacity_per_provider(folders):
    """The reference's per-provider sizes, declared by each provider (`kv_window_slack`): CPU
    W + 16, CUDA and TensorRT-RTX exactly W (their kernels), others full length; cache_slack
    overrides the default; a third-party provider may say."""
    from genai.providers import ExecutionProvider, get_provider
    from tests.test_providers import load_provider_package

    io = genai.Model(folders["shared"]).io
    cpu = get_provider("cpu")
    cuda = load_provider_package("cuda").CUDAProvider()
    trt = load_provider_package("tensorrt_rtx").TensorRTRTXProvider()
    dml = load_provider_package("directml").DirectMLProvider()

    class Plugin(ExecutionProvider):
        name = "plugin"
        kv_window_slack = 3

    assert window_capacity(io, cpu, 1000) == WINDOW + 16
    assert window_capacity(io, cuda, 1000) == WINDOW
    assert window_capacity(io, trt, 1000) == WINDOW
    assert window_capacity(io, dml, 1000) == 0
    assert window_capacity_for(io, dml, 1000) == 1000
    assert window_capacity(io, Plugin(), 1000) == WINDOW + 3
    sized = dataclasses.replace(io, window_slack=5)
    assert window_capacity(sized, cpu, 1000) == WINDOW + 5
    assert window_capacity(dataclasses.replace(io, window_layers=()), cpu, 100) == 0


def test_slack_from_the_config_matches_the_reference(folders):
    ours = run_ours(folders["slack"], PROMPT)
    theirs = greedy(og, og.Model(str(folders["slack"])), PROMPT, MAX_LENGTH, keep_logits=True)
    assert_same_run(ours, theirs)
    assert_close_logits(ours, theirs)


# --------------------------------------------------------------------------------------------
# The op's layout, rewinds, snapshots
# --------------------------------------------------------------------------------------------


def test_resident_rows_is_the_ops_layout(folders):
    """After each step, local cache rows [0, L) of the reference's run hold the last L
    positions, L = resident_rows(T): compared with the full cache of the masked graph."""
    windowed = og.Generator(og.Model(str(folders["shared"])), _ref_params(folders["shared"]))
    full = og.Generator(og.Model(str(folders["masked"])), _ref_params(folders["masked"]))
    for generator in (windowed, full):
        generator.append_tokens(PROMPT)
    compacted = 0
    for _ in range(70):
        tokens = windowed.token_count() if windowed.token_count() == len(PROMPT) else None
        windowed.get_logits(), full.get_logits()  # runs the pending token
        tokens = tokens or windowed.token_count()
        rows = resident_rows(tokens, CAPACITY, WINDOW)
        compacted += rows < min(tokens, CAPACITY)
        cache = np.asarray(windowed.get_output("present.0.key"))
        reference = np.asarray(full.get_output("present.0.key"))
        np.testing.assert_allclose(
            cache[:, :, :rows], reference[:, :, tokens - rows : tokens], atol=1e-6, rtol=0
        )
        windowed.generate_next_token()
        full.generate_next_token()
    assert compacted > 0


def _ref_params(folder: pathlib.Path):
    params = og.GeneratorParams(og.Model(str(folder)))
    params.set_search_options(max_length=MAX_LENGTH)
    return params


def test_resident_rows_formula():
    assert [resident_rows(t, 24, 8) for t in (0, 1, 24, 25, 26, 41, 42, 43)] == [
        0, 1, 24, 8, 9, 24, 8, 9,
    ]  # fmt: skip
    assert [resident_rows(t, 8, 8) for t in (8, 9, 10, 100)] == [8, 8, 8, 8]  # C == W: min(T, W)
    for capacity in (8, 9, 13, 24):
        for tokens in range(200):
            rows = resident_rows(tokens, capacity, 8)
            assert min(tokens, 8) <= rows <= min(tokens, capacity)


def test_relayout_moves_rows_and_refuses_evicted_positions():
    heads, capacity, window = 2, 12, 4
    rows = np.arange(heads * capacity, dtype=np.float32).reshape(heads, capacity, 1) + 100
    # rows hold positions 20..31; lay out 27 tokens: L(27) = 27 - 9 * ceil(15 / 9) = 9
    out = np.full((heads, capacity, 1), -1.0, np.float32)
    assert relayout(rows, 20, 27, capacity, window, out) == 9
    np.testing.assert_array_equal(out[:, 2:9], rows[:, 0:7])  # positions 20..26
    np.testing.assert_array_equal(out[:, :2], 0)  # 18, 19: out of the next token's window
    np.testing.assert_array_equal(out[:, 9:], -1)  # rows past L untouched
    with pytest.raises(GenerationError, match="no longer holds"):
        check_relayout(20, 12, 22, capacity, window)  # token 22 attends 19..22: 19 is gone
    check_relayout(20, 12, 23, capacity, window)  # token 23 attends 20..23


@pytest.mark.parametrize("layout", ["shared", "growing"])
@pytest.mark.parametrize(
    ("steps", "back"),
    [
        (60, 1),  # 70 -> 69 computed tokens: rows stay where they are
        (60, 9),
        (50, 2),  # 60 -> 58: back before the compaction at 59; the rows move, some zero-filled
        (59, 11),  # 69 -> 58: the rows 58 needs were overwritten after the compaction
    ],
)
@pytest.mark.parametrize("how", ["rewind_to", "truncate"])
def test_rewind_past_the_window_continues_exactly(folders, layout, steps, back, how):
    model = genai.Model(folders[layout])
    straight = run_ours(folders[layout], PROMPT)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    for _ in range(steps):  # the local caches compact at 25, 42 and 59 tokens
        generator.generate_next_token()
    length = generator.token_count() - back
    getattr(generator, how)(length)
    np.testing.assert_array_equal(generator.get_sequence(0), straight.sequences[0][:length])
    logits = np.asarray(generator.get_logits())
    if how == "rewind_to":
        length += 1  # the token at index `length` ran first (the reference's rewind)
        np.testing.assert_array_equal(generator.get_sequence(0), straight.sequences[0][:length])
    np.testing.assert_allclose(logits, straight.logits[length - len(PROMPT)], atol=1e-5, rtol=0)
    while not generator.is_done():
        generator.generate_next_token()
    np.testing.assert_array_equal(generator.get_sequence(0), straight.sequences[0])


@pytest.mark.parametrize("layout", ["shared", "growing"])
def test_rewind_to_evicted_positions_is_refused_and_changes_nothing(folders, layout):
    model = genai.Model(folders[layout])
    straight = run_ours(folders[layout], PROMPT)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    for _ in range(50):
        generator.generate_next_token()
    count = generator.token_count()
    with pytest.raises(GenerationError, match="sliding-window KV cache no longer holds"):
        generator.rewind_to(count - 30)
    assert generator.token_count() == count
    while not generator.is_done():
        generator.generate_next_token()
    np.testing.assert_array_equal(generator.get_sequence(0), straight.sequences[0])


def test_rewind_at_batch_2_past_the_window(folders):
    model = genai.Model(folders["shared"])
    straight = run_ours(folders["shared"], BATCH)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, batch_size=2)
    generator = genai.Generator(model, params)
    generator.append_tokens(BATCH)
    for _ in range(55):
        generator.generate_next_token()
    generator.rewind_to(generator.token_count() - 4)
    while not generator.is_done():
        generator.generate_next_token()
    for row in range(2):
        np.testing.assert_array_equal(generator.get_sequence(row), straight.sequences[row])


@pytest.mark.parametrize("layout", ["shared", "growing"])
@pytest.mark.parametrize("generated", [0, 20])
def test_snapshot_past_the_window_restores_exactly(folders, layout, generated):
    model = genai.Model(folders[layout])
    prefix = np.arange(4, 44, dtype=np.int32) % 60 + 3  # 40 tokens: past the window capacity
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    base = genai.Generator(model, params)
    base.append_tokens(prefix)
    for _ in range(generated):
        base.generate_next_token()
    snapshot = base.snapshot()
    other = genai.Generator(model, params)
    other.restore(snapshot)
    np.testing.assert_allclose(other.get_logits(), base.get_logits(), atol=1e-4, rtol=0)
    other.generate_until_done()
    base.generate_until_done()
    np.testing.assert_array_equal(other.get_sequence(0), base.get_sequence(0))


# --------------------------------------------------------------------------------------------
# Beam search, padding, configs
# --------------------------------------------------------------------------------------------


def beams(engine, folder: pathlib.Path, **options) -> list[np.ndarray]:
    model = engine.Model(str(folder))
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=80, num_beams=4, num_return_sequences=2, **options)
    generator = engine.Generator(model, params)
    generator.append_tokens(PROMPT)
    while not generator.is_done():
        generator.generate_next_token()
    return [np.asarray(generator.get_sequence(i)) for i in range(2)]


@pytest.mark.parametrize("layout", ["shared", "growing"])
def test_beam_search_with_window_caches(folders, layout):
    """The reference refuses beams on windowed graphs; it runs them on window-masked caches."""
    ours = beams(genai, folders[layout], kv_initial_capacity=16)
    theirs = beams(og, folders["masked"])
    assert len(ours[0]) == 80
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_padded_batches_are_refused_by_the_op_as_in_the_reference(folders):
    padded = np.array([PROMPT, [30, 31, 8, 9, 0, 0, 0, 0, 0, 0, 0]], np.int32)
    for engine in (genai, og):
        model = engine.Model(str(folders["shared"]))
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=40, batch_size=2)
        generator = engine.Generator(model, params)
        with pytest.raises(RuntimeError, match="too small for sequence_length"):
            generator.append_tokens(padded)


def edit_config(folder: pathlib.Path, tmp_path: pathlib.Path, **window) -> pathlib.Path:
    target = tmp_path / "edited"
    target.mkdir()
    for item in folder.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    config = json.loads((target / "genai_config.json").read_text())
    config["model"]["decoder"]["sliding_window"].update(window)
    (target / "genai_config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ({"window_size": 0}, "window_size must be > 0"),
        ({"window_size": -4}, "window_size must be > 0"),
        ({"layers": [0, 4]}, r"layer 4 is outside the decoder's layers \[0, 4\)"),
        ({"layers": [-1]}, "layer -1 is outside"),
        ({"layers": [0, 0]}, "lists a layer twice"),
        ({"layers": ["0"]}, "layers must be layer indices"),
        ({"cache_slack": -1}, "cache_slack must be >= 0"),
    ],
)
def test_invalid_window_configs(folders, tmp_path, window, message):
    with pytest.raises(ConfigError, match=message):
        genai.Model(edit_config(folders["shared"], tmp_path, **window))


def test_qnn_style_windows_need_both_slides(folders, tmp_path):
    """QNN-style windows (tests/test_windowed_cache.py) slide the cache and the inputs."""
    folder = edit_config(folders["shared"], tmp_path, slide_key_value_cache=True)
    with pytest.raises(ConfigError, match="slide_key_value_cache and slide_inputs"):
        genai.Model(folder)


def test_layers_default_to_every_layer(tmp_path):
    folder = write_gqa_decoder(tmp_path, num_layers=3, sliding_window=WINDOW, local_layers=range(3))
    config = json.loads((folder / "genai_config.json").read_text())
    del config["model"]["decoder"]["sliding_window"]["layers"]
    (folder / "genai_config.json").write_text(json.dumps(config))
    assert genai.Model(folder).io.window_layers == (0, 1, 2)


def test_the_config_window_must_be_the_ops(folders, tmp_path):
    with pytest.raises(ConfigError, match="local_window_size 8"):
        genai.Model(edit_config(folders["shared"], tmp_path, window_size=16))


def test_layers_without_a_window_cache_in_the_graph_keep_full_caches(folders, tmp_path):
    """A config block over a graph without sliding_window_cache (as exported for TensorRT-RTX):
    window-sized caches would break it, so those layers keep full length."""
    config = json.loads((folders["shared"] / "genai_config.json").read_text())
    target = tmp_path / "masked-with-block"
    target.mkdir()
    for item in folders["masked"].iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    masked = json.loads((target / "genai_config.json").read_text())
    masked["model"]["decoder"]["sliding_window"] = config["model"]["decoder"]["sliding_window"]
    (target / "genai_config.json").write_text(json.dumps(masked))
    with pytest.warns(UserWarning, match=r"layers \[0, 2\] .* keep full-length KV caches"):
        model = genai.Model(target)
    assert model.io.window_layers == ()
    ours = greedy(genai, model, PROMPT, MAX_LENGTH)
    theirs = greedy(og, og.Model(str(folders["masked"])), PROMPT, MAX_LENGTH)
    assert_same_run(ours, theirs)
