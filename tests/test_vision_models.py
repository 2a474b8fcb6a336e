"""Vision-language models end to end: the reference (onnxruntime_genai) and genai on the same
tiny random folders (`genai.testing.vision`) and the same processor output.

The reference's own processor makes the inputs (``input_ids`` with the image placeholders,
pixel values, image sizes or grids), so these tests pin the model side: the vision ->
embedding -> decoder runs, Qwen-VL's 3-D mRoPE positions, continuation, rewind, snapshots and
batches. Each check compares genai with the reference run on the same arrays; the mRoPE
positions are also checked against a loop transcription of the reference's algorithm.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.errors import InvalidArgumentError
from genai.generation.vision_runner import MRopeSpec, mrope_positions
from genai.testing.vision import GEMMA3_IMAGE_TOKENS, write_gemma3, write_phi3v, write_qwen2_5_vl

og = pytest.importorskip("onnxruntime_genai")
Image = pytest.importorskip("PIL.Image")

PHI3V_PROMPT = "<|user|>\n{tags}what is in the picture?<|end|>\n<|assistant|>\n"
QWEN_PROMPT = "<|im_start|>user\n{tags}what is in the picture?<|im_end|>\n<|im_start|>assistant\n"
QWEN_TAG = "<|vision_start|><|image_pad|><|vision_end|>"
GEMMA3_PROMPT = (
    "<start_of_turn>user\n{tags}what is in the picture?<end_of_turn>\n<start_of_turn>model\n"
)
#: (kind, images in the prompt): the reference's gemma3 takes one image at most (its image
#: features buffer holds 256 rows whatever the count; see test_gemma3_several_images)
CASES = [
    *((kind, count) for kind in ("phi3v", "qwen2_5_vl", "qwen3_vl", "fara") for count in (0, 1, 3)),
    ("gemma3", 0),
    ("gemma3", 1),
]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vlm")
    return {
        "phi3v": write_phi3v(root),
        "qwen2_5_vl": write_qwen2_5_vl(root),
        "qwen3_vl": write_qwen2_5_vl(root, model_type="qwen3_vl", seed=3),
        "fara": write_qwen2_5_vl(root, model_type="fara", seed=4),
        "gemma3": write_gemma3(root, seed=5),
    }


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three small synthetic pictures of different sizes (stripes, a disc, noise)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:96, 0:128]
    stripes = np.stack([(xx // 8 % 2) * 255, yy * 2, np.full_like(xx, 90)], -1)
    disc = np.zeros((112, 112, 3), np.uint8)
    inside = (np.mgrid[0:112, 0:112] - 56) ** 2
    disc[inside.sum(0) < 40**2] = (250, 40, 40)
    noise = rng.integers(0, 256, (64, 160, 3))
    paths = []
    for i, array in enumerate((stripes, disc, noise)):
        path = root / f"image{i}.png"
        Image.fromarray(np.asarray(array, np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _prompt(kind: str, count: int) -> str:
    if kind == "phi3v":
        return PHI3V_PROMPT.format(tags="".join(f"<|image_{i + 1}|>\n" for i in range(count)))
    if kind == "gemma3":
        return GEMMA3_PROMPT.format(tags="<start_of_image>" * count)
    return QWEN_PROMPT.format(tags=QWEN_TAG * count)


def _reference_inputs(folder: Path, prompt: str, paths: list[str]) -> tuple[object, object]:
    model = og.Model(str(folder))
    processor = model.create_multimodal_processor()
    return model, processor(prompt, images=og.Images.open(*paths) if paths else None)


def _ours(named: object) -> genai.NamedTensors:
    """The same arrays as genai's NamedTensors."""
    out = genai.NamedTensors()
    for name in named.keys():  # noqa: SIM118 (the reference's is not iterable)
        out[name] = named[name].as_numpy()
    return out


def _as_reference(arrays: dict[str, np.ndarray]) -> object:
    named = og.NamedTensors()
    for name, array in arrays.items():
        if array.dtype.kind in "iu":  # as_numpy's int64 is 'q', which the bindings refuse
            array = np.array(array.tolist(), dtype=array.dtype.str)
        named[name] = np.ascontiguousarray(array)
    return named


def _generator(module, model, **search):
    """``module``'s generator on ``model`` with the search options ``search``."""
    params = module.GeneratorParams(model)
    params.set_search_options(**search)
    return module.Generator(model, params)


def _generate(module, model, named, max_length: int, batch: int = 1, steps=None):
    """First-step logits and the sequences after greedy steps to ``max_length``."""
    generator = _generator(module, model, max_length=max_length, batch_size=batch)
    generator.set_inputs(named)
    logits = generator.get_logits()
    while not generator.is_done():
        generator.generate_next_token()
    return logits, [generator.get_sequence(i) for i in range(batch)], generator


@pytest.mark.parametrize(("kind", "count"), CASES)
def test_greedy_tokens_and_logits_match_the_reference(folders, images, kind, count):
    folder = folders[kind]
    ref_model, named = _reference_inputs(folder, _prompt(kind, count), images[:count])
    prompt_length = named["input_ids"].as_numpy().shape[1]
    max_length = prompt_length + NEW_TOKENS
    ref_logits, ref_seqs, _ = _generate(og, ref_model, named, max_length)
    our_logits, our_seqs, _ = _generate(genai, genai.Model(folder), _ours(named), max_length)
    np.testing.assert_array_equal(our_seqs[0], ref_seqs[0])
    np.testing.assert_allclose(our_logits, ref_logits, atol=1e-4, rtol=0)
    assert len(our_seqs[0]) == max_length


def test_phi3v_sequences_with_placeholders_decode(folders, images, tmp_path):
    """get_sequence of an image prompt holds Phi-3 Vision's negative placeholder ids; decoding
    it gives the reference's text without its <unk> per placeholder (a text tokenizer still
    refuses negative ids)."""
    folder = folders["phi3v"]
    ref_model, named = _reference_inputs(folder, _prompt("phi3v", 1), images[:1])
    _, ref_seqs, _ = _generate(og, ref_model, named, named["input_ids"].as_numpy().shape[1] + 3)
    model = genai.Model(folder)
    _, our_seqs, _ = _generate(genai, model, _ours(named), len(ref_seqs[0]))
    assert (our_seqs[0] < 0).any()
    reference_text = og.Tokenizer(ref_model).decode(ref_seqs[0])
    assert "<unk>" in reference_text
    assert genai.Tokenizer(model).decode(our_seqs[0]) == reference_text.replace("<unk>", "")
    from genai.testing.models import write_gqa_decoder

    text_model = write_gqa_decoder(tmp_path, name="text")
    with pytest.raises(genai.InvalidArgumentError, match="token id -1 is out of range"):
        genai.Tokenizer(text_model).decode([5, -1])


def test_phi3v_prompt_ending_in_image_placeholders_as_the_reference(folders, images):
    """A batch-1 prompt that ends inside an image's placeholder ids (Phi-3 Vision's are
    negative) has no padding: the same logits and tokens as the reference."""
    folder = folders["phi3v"]
    ref_model, named = _reference_inputs(folder, _prompt("phi3v", 1), images[:1])
    arrays = {name: named[name].as_numpy() for name in named.keys()}  # noqa: SIM118
    ids = arrays["input_ids"]
    cut = int(np.flatnonzero(ids[0] < 0)[-1]) + 1  # up to the last placeholder
    assert cut < ids.shape[1]
    arrays["input_ids"] = np.ascontiguousarray(ids[:, :cut])
    ref_logits, ref_seqs, _ = _generate(og, ref_model, _as_reference(arrays), cut + 4)
    ours = genai.NamedTensors()
    for name, array in arrays.items():
        ours[name] = array
    our_logits, our_seqs, _ = _generate(genai, genai.Model(folder), ours, cut + 4)
    np.testing.assert_array_equal(our_seqs[0], ref_seqs[0])
    np.testing.assert_allclose(our_logits, ref_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("kind", "count"), [("phi3v", 2), ("qwen2_5_vl", 2), ("gemma3", 1)])
def test_embeddings_and_image_features_stage_by_stage(folders, images, kind, count):
    """The embedding graph's output equals the reference's; its rows at the image
    placeholders are the vision graph's features, in order."""
    folder = folders[kind]
    ref_model, named = _reference_inputs(folder, _prompt(kind, count), images[:count])
    max_length = named["input_ids"].as_numpy().shape[1] + 4
    reference = _generator(og, ref_model, max_length=max_length)
    reference.set_inputs(named)
    model = genai.Model(folder)
    ours = _generator(genai, model, max_length=max_length)
    ours.set_inputs(_ours(named))
    ref_embeds = reference.get_output("inputs_embeds")
    np.testing.assert_allclose(ours.get_output("inputs_embeds"), ref_embeds, atol=1e-5, rtol=0)
    ref_logits = reference.get_output("logits")  # every position of the prompt
    np.testing.assert_allclose(ours.get_output("logits"), ref_logits, atol=1e-4, rtol=0)
    ids = named["input_ids"].as_numpy()[0]
    placeholders = ids < 0 if kind == "phi3v" else ids == model.config.get("model.image_token_id")
    features = ours.get_output("image_features")
    assert features.shape[0] == int(named["num_image_tokens"].as_numpy().sum())
    np.testing.assert_allclose(features, ref_embeds[0][placeholders], atol=1e-5, rtol=0)


def test_mrope_positions_follow_the_reference_step_by_step(folders, images):
    """Prompt positions [3, 1, n] (two images of different grids), then each step's."""
    folder = folders["qwen2_5_vl"]
    ref_model, named = _reference_inputs(folder, _prompt("qwen2_5_vl", 2), images[1:3])
    n = named["input_ids"].as_numpy().shape[1]
    reference = _generator(og, ref_model, max_length=n + 5)
    model = genai.Model(folder)
    ours = _generator(genai, model, max_length=n + 5)
    reference.set_inputs(named)
    ours.set_inputs(_ours(named))
    for _ in range(4):
        expected = reference.get_input("position_ids")
        assert expected.shape[0] == 3
        np.testing.assert_array_equal(ours.get_input("position_ids"), expected)
        np.testing.assert_array_equal(
            ours.get_input("attention_mask"), reference.get_input("attention_mask")
        )
        reference.generate_next_token()
        ours.generate_next_token()
    np.testing.assert_array_equal(ours.get_sequence(0), reference.get_sequence(0))


def _loop_rope_index(tokens, grid, spec):
    """The reference's Qwen2VLPositionInputs::CreateAndInitialize3DPositionIDs, transcribed
    loop for loop (images only): the NumPy twin's independent check."""
    batch, seq = tokens.shape
    pos = np.zeros((3, batch, seq), np.int64)
    deltas = []
    image_index = 0
    for b in range(batch):
        ids = tokens[b]
        image_nums = sum(
            1
            for s in range(seq - 1)
            if ids[s] == spec.vision_start_token_id and ids[s + 1] == spec.image_token_id
        )
        st, max_pos = 0, 0
        for k in range(image_nums):
            ed = next(
                s + 1
                for s in range(st, seq - 1)
                if ids[s] == spec.vision_start_token_id and ids[s + 1] == spec.image_token_id
            )
            t, h, w = (int(x) for x in grid[image_index])
            image_index += 1
            gh, gw = h // spec.spatial_merge_size, w // spec.spatial_merge_size
            current = max_pos + 1 if (k > 0 or b > 0) else 0
            for s in range(ed - st):
                if ids[st + s] == spec.pad_token_id:
                    pos[:, b, st + s] = 0
                else:
                    pos[:, b, st + s] = current
                    max_pos = current
                    current += 1
            start = max_pos + 1
            for s in range(t * gh * gw):
                tp, hp, wp = start, (s // gw) % gh + start, s % gw + start
                pos[:, b, ed + s] = (tp, hp, wp)
                max_pos = max(max_pos, tp, hp, wp)
            st = ed + t * gh * gw
        if st < seq:
            current = 0 if (max_pos == 0 and st == 0) else max_pos + 1
            for s in range(st, seq):
                if ids[s] == spec.pad_token_id:
                    pos[:, b, s] = 0
                else:
                    pos[:, b, s] = current
                    max_pos = current
                    current += 1
        deltas.append(max_pos + 1 - seq)
    return pos, np.array(deltas)


def test_mrope_positions_equal_the_loop_transcription(folders):
    model = genai.Model(folders["qwen2_5_vl"])
    spec = MRopeSpec(model.config)
    rng = np.random.default_rng(0)
    for _ in range(40):
        batch = int(rng.integers(1, 4))
        rows, grids = [], []
        for _ in range(batch):
            row: list[int] = []
            for _ in range(int(rng.integers(0, 3))):
                row += rng.integers(3, 90, int(rng.integers(0, 5))).tolist()
                t, h, w = 1, 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4))
                grids.append((t, h, w))
                row += [spec.vision_start_token_id] + [spec.image_token_id] * (t * h * w // 4)
                row += [spec.vision_start_token_id + 1]  # <|vision_end|>
            row += rng.integers(3, 90, int(rng.integers(1, 6))).tolist()
            rows.append(row)
        width = max(map(len, rows)) + int(rng.integers(0, 3))
        tokens = np.full((batch, width), spec.pad_token_id, np.int64)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = row
        tokens[tokens == 0] = spec.pad_token_id  # a pad inside the text now and then
        grid = np.array(grids, np.int64).reshape(-1, 3)
        expected, expected_deltas = _loop_rope_index(tokens, grid, spec)
        positions, deltas = mrope_positions(tokens, grid, spec)
        np.testing.assert_array_equal(positions, expected)
        np.testing.assert_array_equal(deltas, expected_deltas)


def _batch_inputs(kind: str, folder: Path, images: list[str], counts: list[int]) -> dict:
    """Inputs of a batch whose rows carry ``counts`` images (the reference's processor
    takes one prompt): each row's ids from its own prompt, right-padded; the pixel inputs of
    all images from one call."""
    model = og.Model(str(folder))
    processor = model.create_multimodal_processor()
    pad = genai.Model(folder).config.get("model.pad_token_id")
    rows, used = [], 0
    for count in counts:
        paths = images[used : used + count]
        used += count
        named = processor(_prompt(kind, count), images=og.Images.open(*paths) if paths else None)
        rows.append(named["input_ids"].as_numpy()[0])
    width = max(map(len, rows))
    ids = np.full((len(rows), width), pad, np.int32)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = row
    every = processor(_prompt(kind, used), images=og.Images.open(*images[:used]))
    arrays = {name: every[name].as_numpy() for name in every.keys()}  # noqa: SIM118
    arrays["input_ids"] = ids
    return arrays


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_batch_of_two_with_different_image_counts(folders, images, kind):
    folder = folders[kind]
    arrays = _batch_inputs(kind, folder, images, [1, 2] if kind == "phi3v" else [2, 0])
    max_length = arrays["input_ids"].shape[1] + NEW_TOKENS
    ref_logits, ref_seqs, _ = _generate(
        og, og.Model(str(folder)), _as_reference(arrays), max_length, batch=2
    )
    named = genai.NamedTensors()
    for name, array in arrays.items():
        named[name] = array
    our_logits, our_seqs, _ = _generate(genai, genai.Model(folder), named, max_length, batch=2)
    for ours, reference in zip(our_seqs, ref_seqs, strict=True):
        np.testing.assert_array_equal(ours, reference)
    np.testing.assert_allclose(our_logits, ref_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("back", [2, -3], ids=["into-generated", "into-prompt-text"])
@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_rewind_then_continue_as_the_reference(folders, images, kind, back):
    """Generate 5, rewind (to 2 generated, or 3 tokens before the prompt's end and append them
    again), generate back to 5: the reference's tokens and logits for the sequence straight
    through (its rewind_to fails on these kinds; genai's KV and mRoPE positions continue from
    the rewound length)."""
    folder = folders[kind]
    ref_model, named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    n = named["input_ids"].as_numpy().shape[1]
    results = []
    for module, model, inputs, detour in (
        (og, ref_model, named, False),
        (genai, genai.Model(folder), _ours(named), True),
    ):
        generator = _generator(module, model, max_length=n + 10)
        generator.set_inputs(inputs)
        for _ in range(5):
            generator.generate_next_token()
        if detour:  # back into the generated tokens, or into the prompt's closing text
            generator.rewind_to(n + back)
            while generator.token_count() < n + 5:
                if generator.token_count() < n:
                    generator.append_tokens(named["input_ids"].as_numpy()[0, n + back : n])
                generator.generate_next_token()
        results.append((generator.get_sequence(0), generator.get_logits()))
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_allclose(results[1][1], results[0][1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_snapshot_after_an_image_prompt_restores(folders, images, kind):
    """A generator restored from a snapshot taken after an image prompt continues with the
    reference's tokens (the reference continues the original generator)."""
    folder = folders[kind]
    ref_model, named = _reference_inputs(folder, _prompt(kind, 1), images[1:2])
    n = named["input_ids"].as_numpy().shape[1]
    _, ref_seqs, _ = _generate(og, ref_model, named, n + NEW_TOKENS)
    model = genai.Model(folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=n + NEW_TOKENS)
    first = genai.Generator(model, params)
    first.set_inputs(_ours(named))
    snapshot = first.snapshot()
    restored = genai.Generator(model, params)
    restored.restore(snapshot)
    while not restored.is_done():
        restored.generate_next_token()
    np.testing.assert_array_equal(restored.get_sequence(0), ref_seqs[0])


def test_text_only_append_tokens_matches_the_reference(folders):
    """A vision-language model fed plain tokens (no set_inputs), as the reference allows."""
    folder = folders["qwen2_5_vl"]
    tokens = np.array([9, 14, 22, 31, 40, 7], np.int32)
    sequences = []
    for module, model in ((og, og.Model(str(folder))), (genai, genai.Model(folder))):
        generator = _generator(module, model, max_length=16)
        generator.append_tokens(tokens)
        while not generator.is_done():
            generator.generate_next_token()
        sequences.append(generator.get_sequence(0))
    np.testing.assert_array_equal(sequences[1], sequences[0])


def test_set_inputs_errors(folders):
    model = genai.Model(folders["phi3v"])
    generator = genai.Generator(model, genai.GeneratorParams(model))
    with pytest.raises(InvalidArgumentError, match="input_ids"):
        generator.set_inputs(genai.NamedTensors())
    named = genai.NamedTensors()
    named["input_ids"] = np.array([[1, 2, model.io.vocab_size]], np.int32)
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        generator.set_inputs(named)
    qwen = genai.Model(folders["qwen2_5_vl"])
    named["input_ids"] = np.array([[5, -1, 7]], np.int32)
    with pytest.raises(InvalidArgumentError, match="negative"):
        genai.Generator(qwen, genai.GeneratorParams(qwen)).set_inputs(named)


def test_gemma3_several_images(folders, images):
    """Beyond the reference (whose gemma3 fails on a second image: its features buffer holds
    256 rows): three images run, each image's 256 features are the reference's for that
    image alone, and the embeddings carry them at the soft tokens."""
    folder = folders["gemma3"]
    _, named = _reference_inputs(folder, _prompt("gemma3", 3), images)
    model = genai.Model(folder)
    ours = _generator(genai, model, max_length=named["input_ids"].as_numpy().shape[1] + 4)
    ours.set_inputs(_ours(named))
    features = ours.get_output("image_features")
    assert features.shape[0] == 3 * GEMMA3_IMAGE_TOKENS
    image_token = model.config.get("model.image_token_id")
    for k, path in enumerate(images):
        ref_model, single = _reference_inputs(folder, _prompt("gemma3", 1), [path])
        reference = _generator(
            og, ref_model, max_length=single["input_ids"].as_numpy().shape[1] + 2
        )
        reference.set_inputs(single)
        ids = single["input_ids"].as_numpy()[0]
        expected = reference.get_output("inputs_embeds")[0][ids == image_token]
        rows = features[k * GEMMA3_IMAGE_TOKENS : (k + 1) * GEMMA3_IMAGE_TOKENS]
        np.testing.assert_allclose(rows, expected, atol=1e-5, rtol=0)
    while not ours.is_done():
        ours.generate_next_token()


@pytest.mark.parametrize(("kind", "count"), [("phi3v", 2), ("qwen2_5_vl", 3), ("gemma3", 1)])
def test_end_to_end_with_genai_processor(folders, images, kind, count):
    """genai's own processor and generator from the image files: the reference's tokens."""
    folder = folders[kind]
    sequences = []
    for module in (og, genai):
        model = module.Model(str(folder))
        processor = model.create_multimodal_processor()
        named = processor(_prompt(kind, count), images=module.Images.open(*images[:count]))
        length = np.asarray(named["input_ids"].as_numpy()).shape[1]
        generator = _generator(module, model, max_length=length + NEW_TOKENS)
        generator.set_inputs(named)
        while not generator.is_done():
            generator.generate_next_token()
        sequences.append(generator.get_sequence(0))
    np.testing.assert_array_equal(sequences[1], sequences[0])


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_append_after_generating_equals_one_prompt(folders, images, kind):
    """Generate 2 tokens, append 2: the logits are the reference's for one prompt holding
    all of them (the reference's own continuation drops the pending token on vision models)."""
    folder = folders[kind]
    _, named = _reference_inputs(folder, _prompt(kind, 1), images[1:2])
    model = genai.Model(folder)
    ours = _generator(genai, model, max_length=named["input_ids"].as_numpy().shape[1] + 8)
    ours.set_inputs(_ours(named))
    ours.generate_next_token()
    ours.generate_next_token()
    ours.append_tokens(np.array([5, 6], np.int32))
    arrays = {name: named[name].as_numpy() for name in named.keys()}  # noqa: SIM118
    arrays["input_ids"] = ours.get_sequence(0)[None, :]
    ref_model = og.Model(str(folder))
    reference = _generator(og, ref_model, max_length=arrays["input_ids"].shape[1] + 4)
    reference.set_inputs(_as_reference(arrays))
    np.testing.assert_allclose(ours.get_logits(), reference.get_logits(), atol=1e-4, rtol=0)


def test_beam_search_and_pipeline_folders_are_refused(folders, tmp_path):
    model = genai.Model(folders["qwen2_5_vl"])
    params = genai.GeneratorParams(model)
    params.set_search_options(num_beams=2, max_length=32)
    with pytest.raises(NotImplementedError, match="beam search"):
        genai.Generator(model, params)
    folder = write_qwen2_5_vl(tmp_path)
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["pipeline"] = [
        {"embeddings": {"filename": "dummy_text.onnx", "inputs": [], "outputs": []}}
    ]
    path.write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match="pipeline"):
        genai.Model(folder)


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_guidance_and_stop_strings_after_an_image_prompt(folders, images, kind):
    """The generator's Python stage (grammar, stop strings) runs over the vision driver: the
    text follows the regex, and a stop string ends it."""
    folder = folders[kind]
    _, named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    n = named["input_ids"].as_numpy().shape[1]
    model = genai.Model(folder)
    tokenizer = genai.Tokenizer(model)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=n + 40)
    params.set_guidance("regex", r"(yes|no), it is a (cat|dog)\.")
    generator = genai.Generator(model, params)
    generator.set_inputs(_ours(named))
    while not generator.is_done():
        generator.generate_next_token()
    text = tokenizer.decode(generator.get_sequence(0)[n:])
    assert re.fullmatch(r"(yes|no), it is a (cat|dog)\.", text), text
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=n + 40, stop=["it is"])
    params.set_guidance("regex", r"(yes|no), it is a (cat|dog)\.")
    generator = genai.Generator(model, params)
    generator.set_inputs(_ours(named))
    while not generator.is_done():
        generator.generate_next_token()
    assert generator.finish_reason(0) is genai.FinishReason.STOP_STRING
    assert "it is a" not in tokenizer.decode(generator.get_sequence(0)[n:])


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_rewind_to_zero_then_new_images(folders, images, kind):
    """After rewind_to(0) a new set_inputs starts over (vision, positions): the reference's
    tokens for a fresh generator on the second inputs."""
    folder = folders[kind]
    _, first = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    ref_model, second = _reference_inputs(folder, _prompt(kind, 2), images[1:3])
    length = second["input_ids"].as_numpy().shape[1] + NEW_TOKENS
    _, ref_seqs, _ = _generate(og, ref_model, second, length)
    model = genai.Model(folder)
    generator = _generator(genai, model, max_length=length)
    generator.set_inputs(_ours(first))
    for _ in range(3):
        generator.generate_next_token()
    generator.rewind_to(0)
    generator.set_inputs(_ours(second))
    while not generator.is_done():
        generator.generate_next_token()
    np.testing.assert_array_equal(generator.get_sequence(0), ref_seqs[0])


def test_images_after_the_first_prompt_are_refused(folders, images):
    folder = folders["qwen2_5_vl"]
    _, named = _reference_inputs(folder, _prompt("qwen2_5_vl", 1), images[:1])
    model = genai.Model(folder)
    generator = _generator(genai, model, max_length=2 * named["input_ids"].as_numpy().shape[1] + 4)
    generator.set_inputs(_ours(named))
    generator.generate_next_token()
    with pytest.raises(NotImplementedError, match="first prompt"):
        generator.set_inputs(_ours(named))
    _, text = _reference_inputs(folder, "and then?", [])
    generator.set_inputs(_ours(text))  # text alone continues the sequence
    generator.generate_next_token()


@pytest.mark.parametrize("kind", ["gemma3", "qwen2_5_vl"])
def test_a_large_lm_head_is_trimmed_and_matches_the_reference(tmp_path, images, kind):
    """A decoder whose lm_head is worth trimming (hidden 128 x a 32,768-token vocabulary,
    `genai.runtime.trimmed_logits`): the prompt's run computes its last two positions, yet
    the first logits, the greedy tokens and get_output("logits") (every prompt position, on
    demand) are the reference's."""
    writer = write_gemma3 if kind == "gemma3" else write_qwen2_5_vl
    folder = writer(tmp_path, hidden_size=128, num_heads=4, num_kv_heads=2, base_vocab=32768)
    model = genai.Model(folder)
    assert model.session.trimmed is not None
    ref_model, named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    prompt_length = named["input_ids"].as_numpy().shape[1]
    assert prompt_length > model.session.trimmed.above
    max_length = prompt_length + NEW_TOKENS
    ref_logits, ref_seqs, _ = _generate(og, ref_model, named, max_length)
    our_logits, our_seqs, _ = _generate(genai, model, _ours(named), max_length)
    np.testing.assert_array_equal(our_seqs[0], ref_seqs[0])
    np.testing.assert_allclose(our_logits, ref_logits, atol=1e-4, rtol=0)
    reference = _generator(og, ref_model, max_length=max_length)
    reference.set_inputs(named)
    ours = _generator(genai, model, max_length=max_length)
    ours.set_inputs(_ours(named))
    every = ours.get_output("logits")
    assert every.shape == (1, prompt_length, model.config.get("model.vocab_size"))
    np.testing.assert_allclose(every, reference.get_output("logits"), atol=1e-4, rtol=0)


def _mismatched(kind: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A processor's outputs with one changed so the vision graph makes other feature rows
    than the prompt has image placeholders (Phi-3 Vision: larger image_sizes; Qwen and
    Gemma 3: the pixels of two images for one)."""
    arrays = dict(arrays)
    if kind == "phi3v":
        arrays["image_sizes"] = arrays["image_sizes"] * 2
    else:
        arrays["pixel_values"] = np.concatenate([arrays["pixel_values"]] * 2)
        if kind == "qwen2_5_vl":
            arrays["image_grid_thw"] = np.concatenate([arrays["image_grid_thw"]] * 2)
    return arrays


@pytest.mark.parametrize("chain", [True, False], ids=["one-native-call", "python-runs"])
@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl", "gemma3"])
def test_image_features_that_num_image_tokens_does_not_count_are_refused(
    folders, images, kind, chain
):
    """Features the placeholders do not count would fill the wrong positions: the reference
    fails in onnxruntime (its vision output is allocated from num_image_tokens); genai names
    the problem and keeps no half-run prompt, so the generator takes the right inputs next.
    (A changed num_image_tokens alone, which the reference also refuses, runs in genai: the
    features still fill the placeholders.)"""
    folder = folders[kind]
    ref_model, named = _reference_inputs(folder, _prompt(kind, 1), images[:1])
    arrays = {name: named[name].as_numpy() for name in named.keys()}  # noqa: SIM118
    bad = _mismatched(kind, arrays)
    max_length = arrays["input_ids"].shape[1] + 4
    reference = _generator(og, ref_model, max_length=max_length)
    with pytest.raises(RuntimeError, match="image_features"):
        reference.set_inputs(_as_reference(bad))
    model = genai.Model(folder)
    generator = _generator(genai, model, max_length=max_length)
    generator._driver.runner._chain &= chain  # the prompt's runs from Python when False
    with pytest.raises(InvalidArgumentError, match="image feature rows for the"):
        generator.set_inputs(_ours(_as_reference(bad)))
    with pytest.raises(genai.GenerationError, match="no prior state"):
        generator.generate_next_token()
    generator.set_inputs(_ours(named))
    while not generator.is_done():
        generator.generate_next_token()
    _, ref_seqs, _ = _generate(og, ref_model, named, max_length)
    np.testing.assert_array_equal(generator.get_sequence(0), ref_seqs[0])


def test_qwen_set_inputs_without_num_image_tokens_runs_the_images(folders, images):
    """Without num_image_tokens genai still runs the vision graph on the pixels it is given
    (it used to skip it, then failed on the grid): logits and tokens equal the reference's on
    the complete inputs. (The reference's own run without num_image_tokens gives other
    logits: docs/differences.md.)"""
    folder = folders["qwen2_5_vl"]
    ref_model, named = _reference_inputs(folder, _prompt("qwen2_5_vl", 1), images[:1])
    arrays = {name: named[name].as_numpy() for name in named.keys()}  # noqa: SIM118
    del arrays["num_image_tokens"]
    max_length = arrays["input_ids"].shape[1] + NEW_TOKENS
    ref_logits, ref_seqs, _ = _generate(og, ref_model, named, max_length)
    ours = _ours(_as_reference(arrays))
    our_logits, our_seqs, generator = _generate(genai, genai.Model(folder), ours, max_length)
    np.testing.assert_allclose(our_logits, ref_logits, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(our_seqs[0], ref_seqs[0])
    assert generator.get_output("image_features").shape[0] > 0


def test_set_inputs_with_no_ids_adds_nothing(folders):
    """As the reference: empty input_ids add nothing (the next step has no prior state), and
    the generator takes a prompt afterwards."""
    folder = folders["phi3v"]
    empty = {"input_ids": np.zeros((1, 0), np.int32)}
    reference = _generator(og, og.Model(str(folder)), max_length=16)
    reference.set_inputs(_as_reference(empty))
    with pytest.raises(RuntimeError, match="no prior state"):
        reference.generate_next_token()
    generator = _generator(genai, genai.Model(folder), max_length=16)
    generator.set_inputs(_ours(_as_reference(empty)))
    with pytest.raises(genai.GenerationError, match="no prior state"):
        generator.generate_next_token()
    assert len(generator.get_sequence(0)) == 0
    generator.append_tokens([1, 2, 3])
    generator.generate_next_token()
    assert len(generator.get_sequence(0)) == 4


def test_a_list_of_prompts_is_refused_by_name(folders, images):
    """The reference's image processors read no prompt of a list (input_ids [1, 0], nothing
    said); genai refuses the list, naming images only when there are some."""
    folder = folders["phi3v"]
    prompts = [_prompt("phi3v", 0), _prompt("phi3v", 0)]
    reference = og.Model(str(folder)).create_multimodal_processor()
    assert reference(prompts)["input_ids"].as_numpy().size == 0
    processor = genai.Model(folder).create_multimodal_processor()
    with pytest.raises(genai.UnsupportedFeatureError, match="list of 2 prompts is not") as bare:
        processor(prompts)
    assert "images" not in str(bare.value).split(":")[0]
    with pytest.raises(genai.UnsupportedFeatureError, match="2 prompts with images"):
        processor(prompts, images=genai.Images.open(images[0]))


@pytest.mark.parametrize("chain", [True, False], ids=["one-native-call", "python-runs"])
def test_a_failing_first_prompt_leaves_the_generator_empty(folders, images, chain):
    """A first prompt whose vision run fails in onnxruntime (pixel rows cut short) keeps no
    half-run prompt: the corrected inputs then give the reference's tokens."""
    folder = folders["qwen2_5_vl"]
    ref_model, named = _reference_inputs(folder, _prompt("qwen2_5_vl", 1), images[:1])
    arrays = {name: named[name].as_numpy() for name in named.keys()}  # noqa: SIM118
    bad = dict(arrays)
    bad["pixel_values"] = np.ascontiguousarray(bad["pixel_values"][..., :-3])
    max_length = arrays["input_ids"].shape[1] + 4
    generator = _generator(genai, genai.Model(folder), max_length=max_length)
    generator._driver.runner._chain &= chain
    with pytest.raises(Exception, match="pixel_values|dimension"):  # onnxruntime's words
        generator.set_inputs(_ours(_as_reference(bad)))
    assert generator.token_count() == 0
    generator.set_inputs(_ours(named))
    while not generator.is_done():
        generator.generate_next_token()
    _, ref_seqs, _ = _generate(og, ref_model, named, max_length)
    np.testing.assert_array_equal(generator.get_sequence(0), ref_seqs[0])


def test_gemma3_fixture_template_takes_message_parts_as_the_published_one(folders) -> None:
    """A message whose content is a list of parts (image, text) renders as Gemma 3's template
    renders it, in both engines (the fixture's template concatenated the list: genai raised
    TypeError, the reference wrote the list's text)."""
    messages = json.dumps(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    )
    rendered = []
    for engine in (genai, og):
        tokenizer = engine.Tokenizer(engine.Model(str(folders["gemma3"])))
        rendered.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    assert rendered[0] == rendered[1]
    assert rendered[0] == (
        "<start_of_turn>user\n<start_of_image>What?<end_of_turn>\n<start_of_turn>model\n"
    )
