"""QNN-style windowed models (``sliding_window.slide_key_value_cache`` / ``slide_inputs``): a
static cache slid by the engine, prompts fed a window at a time (`genai.kv.windowed_cache`,
`genai.generation.windowed_runner`).

The slide and the windowed inputs are checked against plain NumPy definitions; the engine
against the reference (onnxruntime-genai runs these models only with prompts of at most one
window: its single-decoder path feeds only the first window of a longer one) and, for longer
prompts, batches and appends after generating, against the reference fed the rest of a prompt
token by token and against an independent NumPy forward pass.
"""

from __future__ import annotations

import json
import pathlib
import types

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import genai
from genai.errors import ConfigError, SearchOptionError
from genai.generation.windowed_runner import WindowedInputs
from genai.kv.windowed_cache import KEY_AXIS, VALUE_AXIS, SlidingWindowSpec, WindowedKVCache, slide
from genai.testing.models import write_gqa_decoder
from genai.testing.windowed import write_windowed_decoder
from tests.numpy_decoder import decoder_logits

WINDOW, CONTEXT = 8, 128
LAYERS, HEADS, KV_HEADS = 2, 4, 2
PAD = 0


def prompt_of(n: int, offset: int = 4) -> np.ndarray:
    """n distinct-ish non-special token ids."""
    return (np.arange(n) * 7 % 50 + offset).astype(np.int32)


# --------------------------------------------------------------------------------------------
# The slide and the windowed inputs, against NumPy definitions
# --------------------------------------------------------------------------------------------


class _Session:
    """Records what a cache binds."""

    def __init__(self) -> None:
        self.inputs: dict[str, np.ndarray] = {}
        self.outputs: dict[str, np.ndarray] = {}

    def bind_input(self, name: str, array: np.ndarray) -> None:
        self.inputs[name] = array

    def bind_output(self, name: str, array: np.ndarray) -> None:
        self.outputs[name] = array


def _spec(window: int = 3, context: int = 12, alignment: str = "right") -> SlidingWindowSpec:
    return SlidingWindowSpec(window, context, PAD, 7, alignment, None)


def _io(layers: int = 2, kv: int = 2, head: int = 2, dtype=np.float32) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        kv_heads=kv,
        head_size=head,
        kv_dtype=np.dtype(dtype),
        past_keys=tuple(f"past.{i}.key" for i in range(layers)),
        past_values=tuple(f"past.{i}.value" for i in range(layers)),
        present_keys=tuple(f"present.{i}.key" for i in range(layers)),
        present_values=tuple(f"present.{i}.value" for i in range(layers)),
    )


def test_slide_keeps_the_last_positions():
    past = np.arange(2 * 1 * 3 * 5).reshape(2, 1, 3, 5)
    present = -np.arange(2 * 1 * 3 * 2).reshape(2, 1, 3, 2) - 1
    out = slide(past, present, 5, axis=3)
    np.testing.assert_array_equal(out[..., :3], past[..., 2:])
    np.testing.assert_array_equal(out[..., 3:], present)
    grown = slide(past, present, 6, axis=3)  # prompt -> generation: N - W -> N - 1
    np.testing.assert_array_equal(grown[..., :4], past[..., 1:])
    np.testing.assert_array_equal(grown[..., 4:], present)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_cache_pasts_are_the_last_positions_of_everything_fed(batch, dtype):
    """Three prompt windows, the switch to one token per run, then tokens: before a run of S
    tokens each past holds the last N - S positions of [pad_value * (N - W), presents...]."""
    spec, io = _spec(), _io(dtype=dtype)
    session = _Session()
    cache = WindowedKVCache(io, spec, session, batch)
    rng = np.random.default_rng(0)
    n, w, kv, hd = spec.context, spec.window, io.kv_heads, io.head_size
    history = [
        [np.full((kv, batch, hd, n - w), 7, dtype), np.full((kv, batch, n - w, hd), 7, dtype)]
        for _ in range(2)
    ]
    for count in (3, 3, 3, 1, 1, 1, 1, 1):
        cache.prepare(count)
        for layer in range(2):
            key, value = history[layer]
            np.testing.assert_array_equal(cache.pasts[layer][0], key[..., -(n - count) :])
            np.testing.assert_array_equal(cache.pasts[layer][1], value[:, :, -(n - count) :])
            assert session.inputs[f"past.{layer}.key"] is cache.pasts[layer][0]
            assert session.outputs[f"present.{layer}.key"].shape == (kv, batch, hd, count)
        for layer in range(2):  # the "run": random presents
            for which, axis in ((0, KEY_AXIS), (1, VALUE_AXIS)):
                out = session.outputs[f"present.{layer}.{('key', 'value')[which]}"]
                out[...] = rng.integers(0, 255, out.shape).astype(dtype)
                history[layer][which] = np.concatenate([history[layer][which], out], axis=axis)
        cache.ran()
        np.testing.assert_array_equal(cache.read("present.1.value"), out)


def _inputs_reference(fed: list[int], context: int, window: int) -> np.ndarray:
    """The mask a run sees: column j of [past, current] holds a real token."""
    cells = [None] * (context - window) + fed
    return np.array([c is not None and c != PAD for c in cells[-context:]], np.int64)


def test_windowed_inputs_mark_the_real_positions():
    """A 10-token prompt in windows of 4 (two pads in front), then 3 generated tokens: the mask
    marks exactly the columns holding real tokens, positions count real tokens."""
    spec = _spec(window=4, context=12)
    inputs = WindowedInputs(spec, 1, np.dtype(np.int64), np.dtype(np.int64), np.dtype(np.int64))
    prompt = list(range(10, 20))
    padded = [PAD, PAD, *prompt]
    fed: list[int] = []
    for start in (0, 4, 8):
        window = padded[start : start + 4]
        inputs.window(np.array([window]))
        fed += window
        np.testing.assert_array_equal(inputs.mask[0], _inputs_reference(fed, 12, 4))
        np.testing.assert_array_equal(inputs.input_ids[0], window)
    np.testing.assert_array_equal(inputs.position_ids[0], [6, 7, 8, 9])
    for step, token in enumerate((30, 31, 32)):
        inputs.token(np.array([token]))
        fed.append(token)
        np.testing.assert_array_equal(inputs.mask[0], _inputs_reference(fed, 12, 4))
        assert inputs.position_ids.tolist() == [[10 + step]]


def test_first_window_positions_and_mask():
    """As the reference: pads get position 0 and mask 0 in the first window."""
    spec = _spec(window=4, context=8)
    inputs = WindowedInputs(spec, 2, np.dtype(np.int32), np.dtype(np.int32), np.dtype(np.int32))
    inputs.window(np.array([[PAD, PAD, 5, 6], [PAD, 4, 5, 6]]))
    assert inputs.position_ids.tolist() == [[0, 0, 0, 1], [0, 0, 1, 2]]
    assert inputs.mask.tolist() == [[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1]]


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("windowed")
    common = {"window_size": WINDOW, "context_length": CONTEXT}
    out = {
        "uint8": write_windowed_decoder(root, name="uint8", **common),
        "left": write_windowed_decoder(root, name="left", alignment="left", **common),
        "int64": write_windowed_decoder(root, name="int64", id_dtype="int64", **common),
        "uint8-batch": write_windowed_decoder(
            root, name="uint8-batch", dynamic_batch=True, **common
        ),
        "float": write_windowed_decoder(
            root, name="float", kv_dtype="float32", dynamic_batch=True, **common
        ),
    }
    return out


@pytest.fixture(scope="module")
def folders(written: dict[str, pathlib.Path]) -> dict[str, pathlib.Path]:
    for folder in written.values():
        require_loading(folder)
    return written


def require_loading(folder: pathlib.Path) -> None:
    """Skip unless genai.Model loads windowed models (genai/runtime/model.py must accept slide_*
    windows and uint8 KV inputs)."""
    try:
        genai.Model(folder)
    except NotImplementedError as exc:
        pytest.skip(f"windowed models do not load: {exc}")
    except ConfigError as exc:
        if "unsupported type uint8" not in str(exc):
            raise
        pytest.skip(f"windowed models do not load: {exc}")


@pytest.fixture(scope="module")
def og():
    return pytest.importorskip("onnxruntime_genai", reason="the reference is a test dependency")


def weights(folder: pathlib.Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(folder / "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def numpy_logits(w: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    return decoder_logits(w, tokens, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS)[-1]


def run(engine, folder: pathlib.Path, prompt: np.ndarray, steps: int, **options):
    """Greedy steps; (next tokens per step, logits before each step, generator)."""
    batch = prompt.shape[0] if prompt.ndim == 2 else 1
    model = engine.Model(str(folder))
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=CONTEXT, batch_size=batch, **options)
    generator = engine.Generator(model, params)
    generator.append_tokens(prompt)
    tokens, logits = [], []
    for _ in range(steps):
        logits.append(np.array(generator.get_logits()))
        generator.generate_next_token()
        tokens.append(np.array(generator.get_next_tokens()))
    return np.array(tokens), np.array(logits), generator


@pytest.mark.parametrize(
    ("folder", "n"), [("uint8", 5), ("uint8", 8), ("uint8", 1), ("left", 5), ("int64", 6)]
)
def test_one_window_prompts_match_the_reference(folders, og, folder, n):
    """Tokens, logits (1e-4), sequences with their padding, token counts and the last run's
    inputs and outputs equal the reference's for 64 greedy tokens."""
    ours = run(genai, folders[folder], prompt_of(n), 64)
    theirs = run(og, folders[folder], prompt_of(n), 64)
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_allclose(ours[1], theirs[1], atol=1e-4, rtol=0)
    g, r = ours[2], theirs[2]
    np.testing.assert_array_equal(g.get_sequence(0), r.get_sequence(0))
    assert g.token_count() == r.token_count() == 64 + 8
    for name in ("input_ids", "position_ids", "attention_mask", "past_key_values.1.value"):
        np.testing.assert_array_equal(g.get_input(name), r.get_input(name), err_msg=name)
    for name in ("present.0.key", "present.1.value"):
        np.testing.assert_array_equal(g.get_output(name), r.get_output(name), err_msg=name)


def reference_token_by_token(og, folder: pathlib.Path, prompt: np.ndarray, steps: int):
    """The reference on a prompt longer than a window: its first window appended, the rest
    forced one token per step (set_logits), then greedy: (tokens after the prompt, logits)."""
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=CONTEXT)
    generator = og.Generator(model, params)
    first = len(prompt) % WINDOW or WINDOW
    generator.append_tokens(prompt[:first])
    for token in prompt[first:]:
        generator.get_logits()  # runs the pending token
        forced = np.full((1, 64), -1e4, np.float32)
        forced[0, token] = 0
        generator.set_logits(forced)
        generator.generate_next_token()
    tokens, logits = [], []
    for _ in range(steps):
        logits.append(np.array(generator.get_logits()))
        generator.generate_next_token()
        tokens.append(np.array(generator.get_next_tokens()))
    return np.array(tokens), np.array(logits)


@pytest.mark.parametrize("n", [13, 29])
def test_long_prompts_match_the_reference_fed_token_by_token(folders, og, n):
    """A prompt of several windows gives the tokens (64) and logits (1e-4) of the reference
    fed its first window and then one prompt token per run: the cache holds the same
    positions whichever way they came in."""
    ours = run(genai, folders["uint8"], prompt_of(n), 64)
    theirs = reference_token_by_token(og, folders["uint8"], prompt_of(n), 64)
    np.testing.assert_array_equal(ours[0], theirs[0])
    np.testing.assert_allclose(ours[1], theirs[1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("n", [5, 13, 29])
def test_logits_match_a_numpy_forward(folders, n):
    """Float cache: every step's logits within 1e-4 of a NumPy forward over the real tokens
    (multi-window prompts included)."""
    w = weights(folders["float"])
    tokens, logits, _ = run(genai, folders["float"], prompt_of(n), 64)
    sequence = list(prompt_of(n))
    for step in range(64):
        np.testing.assert_allclose(
            logits[step, 0, 0], numpy_logits(w, np.array(sequence)), atol=1e-4, rtol=0
        )
        sequence.append(int(tokens[step, 0]))


def test_batch_2_rows_of_different_lengths(folders):
    """Beyond the reference (it feeds batch 1 only): rows right-padded by the caller are
    re-aligned to end at the last column; each row's logits follow its own tokens."""
    w = weights(folders["float"])
    rows = [prompt_of(19), prompt_of(11, offset=9)]
    batch = np.full((2, 19), PAD, np.int32)
    for r, row in enumerate(rows):
        batch[r, : len(row)] = row
    tokens, logits, generator = run(genai, folders["float"], batch, 64)
    for r, row in enumerate(rows):
        sequence = list(row)
        for step in range(64):
            np.testing.assert_allclose(
                logits[step, r, 0], numpy_logits(w, np.array(sequence)), atol=1e-4, rtol=0
            )
            sequence.append(int(tokens[step, r]))
        assert generator.get_sequence(r)[-64:].tolist() == sequence[len(row) :]


def test_batch_2_rows_equal_the_reference_row_by_row(folders, og):
    """uint8 cache, rows of 13 and 5 tokens in one batch (the graph's batch axis dynamic): each
    row's 64 tokens and logits (1e-4) equal the reference's batch-1 run of that row (the
    13-token row fed as the reference can: one window, then token by token)."""
    long, short = prompt_of(13), prompt_of(5, offset=9)
    batch = np.full((2, 13), PAD, np.int32)
    batch[0], batch[1, :5] = long, short
    tokens, logits, _ = run(genai, folders["uint8-batch"], batch, 64)
    for row, reference in (
        (0, reference_token_by_token(og, folders["uint8-batch"], long, 64)),
        (1, run(og, folders["uint8-batch"], short, 64)[:2]),
    ):
        np.testing.assert_array_equal(tokens[:, row], reference[0][:, 0])
        np.testing.assert_allclose(logits[:, row], reference[1][:, 0], atol=1e-4, rtol=0)


def test_append_after_generating_continues_exactly(folders):
    """Beyond the reference: tokens appended after generating are fed one per run."""
    w = weights(folders["float"])
    model = genai.Model(folders["float"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=CONTEXT)
    generator = genai.Generator(model, params)
    generator.append_tokens(prompt_of(10))
    sequence = list(prompt_of(10))
    for _ in range(5):
        generator.generate_next_token()
        sequence.append(int(generator.get_next_tokens()[0]))
    generator.append_tokens(np.array([7, 8, 9], np.int32))
    sequence += [7, 8, 9]
    np.testing.assert_allclose(
        generator.get_logits()[0, 0], numpy_logits(w, np.array(sequence)), atol=1e-4, rtol=0
    )


def test_generate_until_done_equals_stepping(folders):
    steps = run(genai, folders["uint8"], prompt_of(13), 40)[2]
    model = genai.Model(folders["uint8"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=CONTEXT)
    generator = genai.Generator(model, params)
    generator.append_tokens(prompt_of(13))
    assert generator.generate_until_done(40) == 40
    np.testing.assert_array_equal(generator.get_sequence(0), steps.get_sequence(0))


def test_the_python_stage_runs_the_window_too(folders):
    """Stop strings take the generator's Python step: the same tokens as without them."""
    plain = run(genai, folders["uint8"], prompt_of(13), 30)[0]
    staged = run(genai, folders["uint8"], prompt_of(13), 30, stop=["never said"])[0]
    np.testing.assert_array_equal(staged, plain)


def test_sampling_runs_through_the_window(folders):
    _, _, generator = run(genai, folders["uint8"], prompt_of(13), 20, do_sample=True, top_k=5)
    assert generator.token_count() == 16 + 20


def test_the_cache_is_static(folders):
    model = genai.Model(folders["uint8"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=CONTEXT)
    generator = genai.Generator(model, params)
    generator.append_tokens(prompt_of(13))
    # pasts of N - W positions per layer, K and V, plus the presents of one window
    per_position = KV_HEADS * 16 * LAYERS * 2
    assert generator.kv_cache_bytes == per_position * (CONTEXT - WINDOW + WINDOW)
    generator.generate_next_token()
    generator.generate_next_token()  # generation: pasts of N - 1, presents of 1 more
    assert generator.kv_cache_used_bytes == per_position * (CONTEXT - 1)


# --------------------------------------------------------------------------------------------
# What is refused
# --------------------------------------------------------------------------------------------


def edit_config(folder: pathlib.Path, tmp_path: pathlib.Path, **window) -> pathlib.Path:
    out = tmp_path / folder.name
    out.mkdir()
    for item in folder.iterdir():
        (out / item.name).write_bytes(item.read_bytes())
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["sliding_window"].update(window)
    (out / "genai_config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ({"window_size": 1}, "window_size must be > 1"),
        ({"window_size": 65}, r"context_length \(128\) must be >= 2 \* window_size"),
        ({"alignment": "center"}, "alignment must be 'right' or 'left'"),
        ({"slide_inputs": False}, "must both be true"),
        ({"layers": [0]}, "covers every layer"),
    ],
)
def test_invalid_configs(written, tmp_path, window, message):
    with pytest.raises(ConfigError, match=message):
        genai.Config(str(edit_config(written["uint8"], tmp_path, **window)))


def test_a_graph_without_the_windowed_shapes_is_refused(tmp_path):
    folder = write_gqa_decoder(tmp_path, name="gqa")
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["sliding_window"] = {
        "window_size": 8,
        "slide_key_value_cache": True,
        "slide_inputs": True,
    }
    (folder / "genai_config.json").write_text(json.dumps(config))
    require_loading(folder)
    model = genai.Model(folder)
    params = genai.GeneratorParams(model)
    with pytest.raises(ConfigError, match="'past_key_values.0.key' .* a windowed model .* needs"):
        genai.Generator(model, params)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_beams": 2}, "beam search"),
        ({"batch_size": 2}, "fixes the batch at 1"),
    ],
)
def test_unsupported_search_options(folders, options, message):
    model = genai.Model(folders["uint8"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=CONTEXT, **options)
    with pytest.raises(SearchOptionError, match=message):
        genai.Generator(model, params)


def test_rewind_snapshot(folders):
    _, _, generator = run(genai, folders["uint8"], prompt_of(5), 4)
    with pytest.raises(NotImplementedError, match="rewinds only to 0"):
        generator.rewind_to(9)
    with pytest.raises(NotImplementedError, match="snapshots"):
        generator.snapshot()
    generator.rewind_to(0)  # a fresh start
    generator.append_tokens(prompt_of(5))
    again = run(genai, folders["uint8"], prompt_of(5), 4)[2]
    generator.generate_next_token()
    assert generator.get_next_tokens()[0] == again.get_sequence(0)[8]


def test_a_padded_prompt_must_fit_max_length(folders):
    model = genai.Model(folders["uint8"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=12)
    generator = genai.Generator(model, params)
    with pytest.raises(ValueError, match=r"padded to whole windows of 8 \(16\)"):
        generator.append_tokens(prompt_of(10))


def test_pad_value_must_fit_the_cache(folders, tmp_path):
    model = genai.Model(edit_config(folders["uint8"], tmp_path, pad_value=300))
    with pytest.raises(ConfigError, match="pad_value 300 does not fit the uint8 KV cache"):
        genai.Generator(model, genai.GeneratorParams(model))


def test_a_graph_fixing_the_window_length_is_refused(written, tmp_path):
    """One graph serves S = W and S = 1: a static sequence dimension cannot run generation."""
    folder = edit_config(written["uint8"], tmp_path)
    model = onnx.load(str(folder / "model.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = WINDOW
    onnx.save(model, str(folder / "model.onnx"))
    require_loading(folder)
    loaded = genai.Model(folder)
    with pytest.raises(ConfigError, match=r"'input_ids' .* \[1, 8\]; .* needs \[batch, dynamic\]"):
        genai.Generator(loaded, genai.GeneratorParams(loaded))
