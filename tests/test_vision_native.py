"""Vision-language models' native decode steps (`genai._core.vision_loop.EmbedDecoderLoop`):
after the first one-token step (run from Python, which binds the buffers) every step runs the
embedding graph and the decoder without returning to Python. Each test compares genai with
the reference (onnxruntime_genai) on the same tiny random folder and the same processor
output, at every step: the chosen tokens and the logits the choice was made from.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

import genai
from genai._core.ort_api import OrtError
from genai._core.vision_loop import prompt_ids
from genai.errors import GenerationError, InvalidArgumentError, UnsupportedFeatureError
from genai.generation.vision_runner import MRopeSpec, mrope_positions
from genai.testing.vision import write_gemma3, write_phi3v, write_qwen2_5_vl

og = pytest.importorskip("onnxruntime_genai")
Image = pytest.importorskip("PIL.Image")

PROMPTS = {
    "phi3v": "<|user|>\n{tags}what is in the picture?<|end|>\n<|assistant|>\n",
    "qwen": "<|im_start|>user\n{tags}what is in the picture?<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\n{tags}what is in the picture?<end_of_turn>\n"
    "<start_of_turn>model\n",
}
KINDS = ["phi3v", "qwen2_5_vl", "qwen3_vl", "gemma3"]
STEPS = 12


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm-native")
    return {
        "phi3v": write_phi3v(root, seed=11),
        "qwen2_5_vl": write_qwen2_5_vl(root, seed=12),
        "qwen3_vl": write_qwen2_5_vl(root, model_type="qwen3_vl", seed=13),
        "gemma3": write_gemma3(root, seed=14),
    }


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three synthetic pictures of different sizes."""
    root = tmp_path_factory.mktemp("native-images")
    rng = np.random.default_rng(3)
    paths = []
    for i, (height, width) in enumerate([(80, 120), (100, 100), (64, 150)]):
        yy, xx = np.mgrid[0:height, 0:width]
        picture = np.stack(
            [(xx * 255) // width, (yy // 6 % 2) * 220, rng.integers(0, 256, xx.shape)]
        )
        path = root / f"picture{i}.png"
        Image.fromarray(np.moveaxis(picture, 0, -1).astype(np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _prompt(kind: str, count: int) -> str:
    if kind == "phi3v":
        tags = "".join(f"<|image_{i + 1}|>\n" for i in range(count))
    elif kind == "gemma3":
        tags = "<start_of_image>" * count
    else:
        kind, tags = "qwen", "<|vision_start|><|image_pad|><|vision_end|>" * count
    return PROMPTS[kind].format(tags=tags)


def _reference_inputs(folder: Path, prompt: str, paths: list[str]) -> object:
    processor = og.Model(str(folder)).create_multimodal_processor()
    return processor(prompt, images=og.Images.open(*paths) if paths else None)


def _arrays(named: object) -> dict[str, np.ndarray]:
    return {name: named[name].as_numpy() for name in named.keys()}  # noqa: SIM118


def _ours(arrays: dict[str, np.ndarray]) -> genai.NamedTensors:
    out = genai.NamedTensors()
    for name, array in arrays.items():
        out[name] = array
    return out


def _as_reference(arrays: dict[str, np.ndarray]) -> object:
    named = og.NamedTensors()
    for name, array in arrays.items():
        if array.dtype.kind in "iu":  # as_numpy's int64 is 'q', which the bindings refuse
            array = np.array(array.tolist(), dtype=array.dtype.str)
        named[name] = np.ascontiguousarray(array)
    return named


def _generator(module, folder: Path, **search):
    model = module.Model(str(folder)) if module is og else module.Model(folder)
    params = module.GeneratorParams(model)
    params.set_search_options(**search)
    return module.Generator(model, params)


def _one_image_pair(folder: Path, kind: str, images: list[str], extra: int):
    """(the reference's generator, ours) after both ``set_inputs`` of the same one-image
    prompt, with room for ``extra`` more tokens."""
    named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + extra)
    reference.set_inputs(named)
    ours = _generator(genai, folder, max_length=n + extra)
    ours.set_inputs(_ours(_arrays(named)))
    return reference, ours


class _Runs:
    """Counts the runs a genai generator's loop sends back to Python (the rest are native)."""

    def __init__(self, generator: genai.Generator) -> None:
        self.loop = generator._driver.loop
        self.count = 0
        self._fallback = self.loop.fallback

        def counted(prompt: bool) -> None:
            self.count += not prompt
            self._fallback(prompt)

        self.loop.fallback = counted


def _steps(generator, count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``count`` greedy steps: the logits each was chosen from and the tokens chosen."""
    logits, tokens = [], []
    for _ in range(count):
        if generator.is_done():
            break
        generator.generate_next_token()
        logits.append(generator.get_logits().copy())
        tokens.append(np.array(generator.get_next_tokens()))
    return logits, tokens


def _assert_same_steps(ours: tuple[list, list], reference: tuple[list, list]) -> None:
    assert len(ours[1]) == len(reference[1])
    for our_tokens, ref_tokens in zip(ours[1], reference[1], strict=True):
        np.testing.assert_array_equal(our_tokens, ref_tokens)
    for our_logits, ref_logits in zip(ours[0], reference[0], strict=True):
        np.testing.assert_allclose(our_logits, ref_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_every_native_step_matches_the_reference(folders, images, kind):
    """Tokens and logits of every step after an image prompt; only the first step after
    the prompt runs from Python."""
    folder = folders[kind]
    named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + STEPS + 1)
    reference.set_inputs(named)
    ours = _generator(genai, folder, max_length=n + STEPS + 1)
    runs = _Runs(ours)
    ours.set_inputs(_ours(_arrays(named)))
    _assert_same_steps(_steps(ours, STEPS), _steps(reference, STEPS))
    assert runs.count == 1  # the first one-token step binds the buffers; the others are native


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_generate_until_done_runs_native_steps(folders, images, kind):
    """generate_until_done (one call for every step) ends with the reference's sequence."""
    folder = folders[kind]
    named = _reference_inputs(folder, _prompt(kind, 2), images[:2])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + STEPS)
    reference.set_inputs(named)
    while not reference.is_done():
        reference.generate_next_token()
    ours = _generator(genai, folder, max_length=n + STEPS)
    runs = _Runs(ours)
    ours.set_inputs(_ours(_arrays(named)))
    made = ours.generate_until_done()
    np.testing.assert_array_equal(ours.get_sequence(0), reference.get_sequence(0))
    assert made == len(reference.get_sequence(0)) - n
    assert runs.count == 1


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl", "gemma3"])
def test_kv_growth_between_native_steps(folders, images, kind):
    """A KV cache that starts small and grows every few tokens (kv_initial_capacity 8) grows
    from inside the native steps (shared buffers) with the reference's tokens and logits."""
    folder = folders[kind]
    named = _reference_inputs(folder, _prompt(kind, 1), images[1:2])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + 30)
    reference.set_inputs(named)
    ours = _generator(genai, folder, max_length=n + 30, kv_initial_capacity=8)
    runs = _Runs(ours)
    ours.set_inputs(_ours(_arrays(named)))
    _assert_same_steps(_steps(ours, 28), _steps(reference, 28))
    assert runs.count == 1


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_rewind_into_native_steps_then_continue(folders, images, kind):
    """Generate 8 natively, truncate to 3 generated tokens, generate 5 again: every step's
    logits and tokens are the reference's for the sequence generated straight through (the
    reference's rewind_to fails on these kinds; `rewind_to` replays the 4th first)."""
    folder = folders[kind]
    named = _reference_inputs(folder, _prompt(kind, 1), images[2:3])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + 12)
    reference.set_inputs(named)
    straight = _steps(reference, 8)
    ours = _generator(genai, folder, max_length=n + 12)
    runs = _Runs(ours)
    ours.set_inputs(_ours(_arrays(named)))
    _assert_same_steps(_steps(ours, 8), straight)
    ours.truncate(n + 3)
    again = _steps(ours, 5)
    _assert_same_steps(again, (straight[0][3:], straight[1][3:]))
    # after the rewind one step runs from Python (it re-binds the KV), the rest natively
    assert runs.count == 2
    ours.rewind_to(n + 3)
    _assert_same_steps(_steps(ours, 4), (straight[0][4:], straight[1][4:]))


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl", "gemma3"])
def test_appended_text_after_native_steps(folders, images, kind):
    """Generate 4 natively, append 3 text tokens (one Python run), generate 6 natively: the
    reference's steps for one image prompt holding every token so far (its own continuation
    drops the pending token on vision models)."""
    folder = folders[kind]
    named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    arrays = _arrays(named)
    n = arrays["input_ids"].shape[1]
    ours = _generator(genai, folder, max_length=n + 20)
    runs = _Runs(ours)
    ours.set_inputs(_ours(arrays))
    _steps(ours, 4)
    ours.append_tokens(np.array([[7, 8, 9]], np.int32))
    ours_after = _steps(ours, 6)
    arrays["input_ids"] = ours.get_sequence(0)[None, : n + 4 + 3].astype(arrays["input_ids"].dtype)
    reference = _generator(og, folder, max_length=n + 20)
    reference.set_inputs(_as_reference(arrays))
    _assert_same_steps(ours_after, _steps(reference, 6))
    # from Python: the first step after the prompt, the appended tokens' run, the step after it
    assert runs.count == 3


@pytest.mark.parametrize(("kind", "counts"), [("phi3v", [1, 2]), ("qwen2_5_vl", [2, 0])])
def test_batch_of_two_with_different_image_counts_step_by_step(folders, images, kind, counts):
    """Two rows of different lengths (right-padded) and image counts: every native step's
    logits and tokens, both rows, are the reference's (Phi-3 Vision's rows keep their padding
    masked; Qwen-VL's masks are all ones after the prompt, as the reference's)."""
    folder = folders[kind]
    processor = og.Model(str(folder)).create_multimodal_processor()
    pad = genai.Model(folder).config.get("model.pad_token_id")
    rows, used = [], 0
    for count in counts:
        paths = images[used : used + count]
        used += count
        row = processor(_prompt(kind, count), images=og.Images.open(*paths) if paths else None)
        rows.append(row["input_ids"].as_numpy()[0])
    width = max(map(len, rows))
    ids = np.full((2, width), pad, np.int32)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = row
    arrays = _arrays(processor(_prompt(kind, used), images=og.Images.open(*images[:used])))
    arrays["input_ids"] = ids
    reference = _generator(og, folder, max_length=width + STEPS, batch_size=2)
    reference.set_inputs(_as_reference(arrays))
    ours = _generator(genai, folder, max_length=width + STEPS, batch_size=2)
    runs = _Runs(ours)
    ours.set_inputs(_ours(arrays))
    _assert_same_steps(_steps(ours, STEPS - 1), _steps(reference, STEPS - 1))
    assert runs.count == 1


def test_inputs_of_a_native_step_are_the_reference_s(folders, images):
    """After native steps the last run's inputs (mask, 3-D positions, ids) read back as the
    reference's do (get_input)."""
    folder = folders["qwen2_5_vl"]
    named = _reference_inputs(folder, _prompt("qwen2_5_vl", 1), images[:1])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + STEPS)
    reference.set_inputs(named)
    ours = _generator(genai, folder, max_length=n + STEPS)
    ours.set_inputs(_ours(_arrays(named)))
    for _ in range(6):
        reference.generate_next_token()
        ours.generate_next_token()
    for name in ("attention_mask", "position_ids"):
        expected = np.asarray(reference.get_input(name))
        np.testing.assert_array_equal(ours.get_input(name), expected)


def test_mrope_positions_refuse_what_they_cannot_place(folders):
    """The C loop's failures are the errors of the Python one: a video token, more images
    than image_grid_thw rows, an image whose tokens run past the row's end."""
    spec = MRopeSpec(genai.Model(folders["qwen2_5_vl"]).config)
    start, image, video = spec.vision_start_token_id, spec.image_token_id, spec.video_token_id
    grid = np.array([[1, 2, 2]])  # one merged token
    ok = np.array([[5, start, image, 6]])
    positions, deltas = mrope_positions(ok, grid, spec)
    np.testing.assert_array_equal(positions[:, 0, :], [[0, 1, 2, 3]] * 3)
    assert deltas.tolist() == [0]
    with pytest.raises(UnsupportedFeatureError, match="video"):
        mrope_positions(np.array([[5, start, video, 6]]), grid, spec)
    with pytest.raises(InvalidArgumentError, match="Not enough image_grid_thw"):
        mrope_positions(np.array([[start, image, start, image]]), grid, spec)
    with pytest.raises(InvalidArgumentError, match=r"image 1 of grid \(1, 4, 4\) needs 4 tokens"):
        mrope_positions(np.array([[5, start, image, 6]]), np.array([[1, 4, 4]]), spec)


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "gemma3"])
def test_a_dropped_generator_frees_its_runs_without_garbage_collection(folders, images, kind):
    """No reference cycle between the native loop and its runner or driver: the bindings
    (and the KV memory they hold) go with the generator, not at a later gc pass, which made
    the next generators' prompt runs fault in fresh pages."""
    folder = folders[kind]
    named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    n = named["input_ids"].as_numpy().shape[1]
    ours = _generator(genai, folder, max_length=n + 4)
    ours.set_inputs(_ours(_arrays(named)))
    ours.generate_next_token()
    driver = weakref.ref(ours._driver)
    runner = weakref.ref(ours._driver.runner)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del ours
        assert driver() is None and runner() is None  # (the runner holds the bindings)
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("kind", ["phi3v", "gemma3"])
def test_a_small_shared_cache_is_allocated_whole_and_an_explicit_capacity_grows(
    folders, images, kind
):
    """At the default kv_initial_capacity a shared-buffer cache that fits in UPFRONT_KV_BYTES
    holds max_length positions from the start (the prompt run does not grow it); an explicit
    capacity starts there and grows. Both give the reference's tokens and logits."""
    folder = folders[kind]
    named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + 6)
    reference.set_inputs(named)
    expected = _steps(reference, 5)
    whole = _generator(genai, folder, max_length=n + 6)
    assert whole._driver.kv_layout == "SharedKVCache"
    assert whole._driver.kv.capacity == n + 6
    explicit = _generator(genai, folder, max_length=n + 6, kv_initial_capacity=16)
    assert explicit._driver.kv.capacity == 16
    for generator in (whole, explicit):
        generator.set_inputs(_ours(_arrays(named)))
        _assert_same_steps(_steps(generator, 5), expected)
    assert explicit._driver.kv.capacity >= n


# --- a first prompt's runs: one native call -------------------------------------------------
READ_BACK_INPUTS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds")
READ_BACK_INPUTS += ("image_features",)


def _reference_reads(generator, names, read) -> dict[str, np.ndarray]:
    """What the reference returns for each of ``names`` (the names it has)."""
    values = {}
    for name in names:
        try:
            values[name] = np.asarray(getattr(generator, read)(name))
        except Exception:  # the reference has no such input / output on this model
            continue
    return values


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl", "gemma3"])
def test_a_prompt_s_inputs_and_outputs_read_back_as_the_reference_s(folders, images, kind):
    """After set_inputs (the prompt's graphs in one native call, the ids, mask, mRoPE
    positions written by the loop, features and embeddings used where ORT left them) every
    input and output the reference reads back is the reference's."""
    reference, ours = _one_image_pair(folders[kind], kind, images, 4)
    expected_inputs = _reference_reads(reference, READ_BACK_INPUTS, "get_input")
    assert {"input_ids", "attention_mask", "inputs_embeds"} <= set(expected_inputs)
    assert ("position_ids" in expected_inputs) == (kind == "qwen2_5_vl")
    for name, expected in expected_inputs.items():
        got = ours.get_input(name)
        assert got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0, err_msg=name)
    expected_outputs = _reference_reads(
        reference, ("logits", "inputs_embeds", "image_features"), "get_output"
    )
    assert "logits" in expected_outputs
    for name, expected in expected_outputs.items():
        np.testing.assert_allclose(ours.get_output(name), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl", "gemma3"])
def test_a_first_prompt_runs_its_graphs_without_the_python_runs(folders, images, kind):
    """A first prompt (one image, or none) never goes through the runner's Python runs of
    the vision, embedding and decoder graphs (they raise here); its first token and logits
    are the reference's. The step after it runs from Python as before."""
    folder = folders[kind]
    for paths in (images[:1], []):
        named = _reference_inputs(folder, _prompt(kind, len(paths)), paths)
        n = named["input_ids"].as_numpy().shape[1]
        reference = _generator(og, folder, max_length=n + 3)
        reference.set_inputs(named)
        ours = _generator(genai, folder, max_length=n + 3)
        runner = ours._driver.runner
        calls: list[str] = []

        def refuse(*args, name, calls=calls, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} ran from Python")

        for name in ("_features", "_embed", "_decode"):
            setattr(runner, name, lambda *a, name=name, **k: refuse(*a, name=name, **k))
        ours.set_inputs(_ours(_arrays(named)))
        assert calls == []
        for name in ("_features", "_embed", "_decode"):
            delattr(runner, name)
        _assert_same_steps(_steps(ours, 2), _steps(reference, 2))


def test_images_of_different_grids_still_run_one_by_one(folders, images):
    """Qwen-VL images of different grids are not one vision run: the prompt takes the
    runner's Python path (the vision graph once per image, as the reference) with the
    reference's logits."""
    folder = folders["qwen2_5_vl"]
    named = _reference_inputs(folder, _prompt("qwen2_5_vl", 2), images[1:3])
    grids = named["image_grid_thw"].as_numpy()
    assert len(np.unique(grids, axis=0)) == 2
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + 3)
    reference.set_inputs(named)
    ours = _generator(genai, folder, max_length=n + 3)
    runner = ours._driver.runner
    python_runs = []
    features = runner._features
    runner._features = lambda first_run: python_runs.append(first_run) or features(first_run)
    ours.set_inputs(_ours(_arrays(named)))
    assert python_runs == [True]
    _assert_same_steps(_steps(ours, 2), _steps(reference, 2))


def test_a_prompt_s_mrope_failures_are_mrope_positions_errors(folders, images):
    """A video token, or an image grid needing more tokens than the prompt has, raise the
    errors of mrope_positions from set_inputs (the loop's failure codes named), and the
    decoder has not run."""
    folder = folders["qwen2_5_vl"]
    model = genai.Model(folder)
    spec = MRopeSpec(model.config)
    arrays = _arrays(_reference_inputs(folder, _prompt("qwen2_5_vl", 1), images[:1]))
    too_big = dict(arrays, image_grid_thw=np.array([[1, 40, 40]], np.int64))
    video = {
        "input_ids": np.array([[5, spec.vision_start_token_id, spec.video_token_id, 6]], np.int64),
        "num_image_tokens": np.array([0], np.int64),
    }
    for inputs, error, match in (
        (too_big, InvalidArgumentError, r"needs 400 tokens"),
        (video, UnsupportedFeatureError, "video"),
    ):
        generator = genai.Generator(model, genai.GeneratorParams(model))
        with pytest.raises(error, match=match):
            generator.set_inputs(_ours(inputs))
        with pytest.raises(GenerationError, match="has not run"):
            generator.get_output("logits")


def test_a_vision_graph_failure_in_the_native_prompt_names_its_input(folders, images):
    """The vision graph's own error (pixel_values of the wrong width) comes out of the
    native prompt call, not an error of the embedding or decoder run after it."""
    folder = folders["qwen2_5_vl"]
    arrays = _arrays(_reference_inputs(folder, _prompt("qwen2_5_vl", 1), images[:1]))
    arrays["pixel_values"] = np.ascontiguousarray(arrays["pixel_values"][:, :100])
    ours = _generator(genai, folder, max_length=arrays["input_ids"].shape[1] + 2)
    with pytest.raises(OrtError, match="pixel_values"):
        ours.set_inputs(_ours(arrays))


def test_prompt_ids_bounds_and_copy_are_numpy_s():
    """vision_loop.prompt_ids: the int32 copy, smallest and largest id of int64 / int32
    arrays (strided too) as NumPy computes them; None for other dtypes and empty arrays."""
    rng = np.random.default_rng(7)
    wide = rng.integers(-5, 70000, size=(3, 41), dtype=np.int64)
    narrow = rng.integers(-3, 900, size=(2, 30), dtype=np.int32)[:, ::3]  # strided rows
    for ids in (wide, narrow, wide[:1, :1]):
        copy, low, high = prompt_ids(ids)
        assert copy.dtype == np.int32 and copy.flags.c_contiguous
        np.testing.assert_array_equal(copy, ids.astype(np.int32))
        assert (low, high) == (int(ids.min()), int(ids.max()))
    assert prompt_ids(wide.astype(np.uint8)) is None
    assert prompt_ids(np.zeros((1, 0), np.int64)) is None


def test_a_growing_cache_takes_the_prompt_s_kv_when_first_needed(folders, images):
    """Qwen-VL's past/present cache: the prompt's presents become the pasts after the
    prompt's native call, when first read, rewound or run (as the reference swaps them at
    its next run): the presents read back as the reference's, and a rewind right after the
    prompt, or plain steps, continue with the reference's logits."""
    folder = folders["qwen2_5_vl"]
    named = _reference_inputs(folder, _prompt("qwen2_5_vl", 1), images[:1])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, folder, max_length=n + 4)
    reference.set_inputs(named)
    expected_present = np.asarray(reference.get_output("present.0.key"))
    expected = _steps(reference, 3)
    for action in ("read", "rewind", "step"):
        ours = _generator(genai, folder, max_length=n + 4)
        ours.set_inputs(_ours(_arrays(named)))
        assert ours._driver.loop.kv_pending  # (left for later)
        if action == "read":
            got = ours.get_output("present.0.key")
            np.testing.assert_allclose(got, expected_present, atol=1e-5, rtol=0)
            np.testing.assert_allclose(
                ours.get_input("past_key_values.0.key"), expected_present, atol=1e-5, rtol=0
            )
        elif action == "rewind":
            ours.rewind_to(n)
        _assert_same_steps(_steps(ours, 3), expected)
        assert not ours._driver.loop.kv_pending


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl", "gemma3"])
def test_a_second_first_prompt_after_rewind_to_zero(folders, images, kind):
    """Native steps re-bind the embeddings, logits and positions to their step buffers;
    after rewind_to(0) the same generator's next prompt (one native call again) re-binds
    them for the prompt and gives a fresh reference generator's steps."""
    reference, ours = _one_image_pair(folders[kind], kind, images, 5)
    _steps(ours, 3)
    ours.rewind_to(0)
    named = _reference_inputs(folders[kind], _prompt(kind, 1), images[:1])
    ours.set_inputs(_ours(_arrays(named)))
    _assert_same_steps(_steps(ours, 4), _steps(reference, 4))
