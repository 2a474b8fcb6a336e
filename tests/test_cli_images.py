"""``genai generate --image`` and ``genai chat --image`` on tiny vision-language folders
(`genai.testing.vision`): the text they print is the reference's greedy continuation of the
same prompt and images (onnxruntime_genai's processor, ``set_inputs``, greedy decoding)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from genai.testing.vision import write_phi3v, write_qwen2_5_vl

og = pytest.importorskip("onnxruntime_genai")
Image = pytest.importorskip("PIL.Image")

NEW = 6
TAGS = {"phi3v": "<|image_1|>\n", "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], str]:
    root = tmp_path_factory.mktemp("cli_vlm")
    rng = np.random.default_rng(1)
    image = root / "picture.png"
    Image.fromarray(rng.integers(0, 256, (90, 130, 3), dtype=np.uint8)).save(image)
    return {"phi3v": write_phi3v(root), "qwen2_5_vl": write_qwen2_5_vl(root)}, str(image)


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "genai", *args],
        input=stdin, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def reference_reply(folder: Path, messages: list[dict], image: str, new: int = NEW) -> str:
    """The reference's greedy reply to the templated conversation with the image."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    text = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    inputs = model.create_multimodal_processor()(text, images=og.Images.open(image))
    params = og.GeneratorParams(model)
    length = inputs["input_ids"].shape()[1]
    params.set_search_options(max_length=length + new)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        if token in tokenizer.eos_token_ids:
            break
        tokens.append(token)
    return tokenizer.decode(np.asarray(tokens, np.int32))


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_generate_with_an_image_prints_the_reference_reply(kind, setup) -> None:
    folders, image = setup
    run = run_cli(
        "generate", "-m", str(folders[kind]), "--image", image, "--chat", "what is this?",
        "--max-new-tokens", str(NEW),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    messages = [{"role": "user", "content": TAGS[kind] + "what is this?"}]
    assert run.stdout.rstrip("\n") == reference_reply(folders[kind], messages, image)


@pytest.mark.parametrize("kind", ["phi3v", "qwen2_5_vl"])
def test_chat_with_an_image_continues_as_one_prompt(kind, setup) -> None:
    """The second turn reuses the first's KV (images included): its reply is the reference's
    reply to the whole conversation sent as one prompt with the image."""
    folders, image = setup
    run = run_cli(
        "chat", "-m", str(folders[kind]), "--image", image, "--max-new-tokens", str(NEW),
        stdin="what is this?\nand now?\n",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    first, second = run.stdout.splitlines()[:2]
    messages = [{"role": "user", "content": TAGS[kind] + "what is this?"}]
    assert first == reference_reply(folders[kind], messages, image)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "and now?"}]
    assert second == reference_reply(folders[kind], messages, image)


def test_image_errors_are_one_line(setup, tmp_path) -> None:
    folders, image = setup
    bmp = tmp_path / "picture.bmp"
    Image.open(image).save(bmp)
    cases = {
        (str(bmp), "hi"): "only PNG and JPEG",
        (str(tmp_path / "missing.png"), "hi"): "Image path does not exist",
        (image, "<|image_2|> hi"): "Expected a value <= 1. Actual value: 2",
    }
    for (path, prompt), message in cases.items():
        run = run_cli("generate", "-m", str(folders["phi3v"]), "--image", path, prompt)
        assert run.returncode != 0
        assert message in run.stderr
        assert "Traceback" not in run.stderr
