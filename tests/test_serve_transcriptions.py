"""``POST /v1/audio/transcriptions`` through the real server on loopback (``genai serve -m
TEXT_MODEL --whisper WHISPER_DIR``): the transcript equals `genai.multimodal.transcribe`'s on
the same file, in each response format, and bad requests get 400s with OpenAI's error body."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import genai
from genai.multimodal.transcribe import to_srt, transcribe
from genai.testing.whisper import write_whisper_fixture
from tests.serve_helpers import serve_command

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("python_multipart")
sf = pytest.importorskip("soundfile")


@pytest.fixture(scope="module")
def whisper_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_whisper_fixture(tmp_path_factory.mktemp("whisper-serve"))


@pytest.fixture(scope="module")
def wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = np.arange(16000 * 4) / 16000
    x = (0.3 * np.sin(2 * np.pi * 500 * t * (1 + 0.1 * t))).astype(np.float32)
    path = tmp_path_factory.mktemp("serve-audio") / "talk.wav"
    sf.write(path, x, 16000, subtype="PCM_16")
    return path


def test_transcriptions_endpoint(
    fixture_folders: dict[str, Path], whisper_folder: Path, wav: Path
) -> None:
    model = genai.Model(whisper_folder)
    plain = transcribe(model, genai.Audios.open(wav), timestamps=False)
    timed = transcribe(model, genai.Audios.open(wav), timestamps=True)
    text_model = fixture_folders["gqa"]
    with serve_command(text_model, "--whisper", str(whisper_folder)) as (url, _):
        endpoint = url + "/v1/audio/transcriptions"

        def post(data: dict, files: dict | None = None) -> httpx.Response:
            if files is None:
                files = {"file": ("talk.wav", wav.read_bytes(), "audio/wav")}
            return httpx.post(endpoint, data=data, files=files, timeout=120)

        answer = post({"model": "whisper"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"text": plain.text}
        answer = post({"model": "whisper", "response_format": "text"})
        assert answer.text == plain.text + "\n"
        answer = post({"model": "whisper", "response_format": "srt"})
        assert answer.text == to_srt(timed.segments)
        answer = post({"model": "whisper", "response_format": "verbose_json"})
        body = answer.json()
        assert body["text"] == timed.text
        assert body["duration"] == pytest.approx(4.0)
        assert [s["text"] for s in body["segments"]] == [s.text for s in timed.segments]

        # bad requests: 400 with OpenAI's error body
        for data, files, param in (
            ({"model": "whisper", "response_format": "xml"}, None, "response_format"),
            ({"model": "whisper", "temperature": "7"}, None, "temperature"),
            (
                {"model": "whisper"},
                {"file": ("x.wav", b"not audio at all" * 20, "audio/wav")},
                "file",
            ),
            ({"model": "whisper"}, {"file": ("x.wav", b"", "audio/wav")}, "file"),
            ({"model": "whisper"}, {"other": ("x.wav", b"abc", "audio/wav")}, "file"),
            ({"model": text_model.name}, None, "model"),
        ):
            answer = post(data, files)
            assert answer.status_code == 400, (data, answer.text)
            error = answer.json()["error"]
            assert error["param"] == param, error
            assert error["type"] == "invalid_request_error"
        answer = httpx.post(endpoint, json={"model": "whisper"}, timeout=30)
        assert answer.status_code == 400
        assert "multipart" in answer.json()["error"]["message"]


def test_a_server_without_a_speech_model_answers_400(
    fixture_folders: dict[str, Path], wav: Path
) -> None:
    with serve_command(fixture_folders["gqa"]) as (url, _):
        answer = httpx.post(
            url + "/v1/audio/transcriptions",
            data={"model": "gqa"},
            files={"file": ("talk.wav", wav.read_bytes(), "audio/wav")},
            timeout=30,
        )
        assert answer.status_code == 400
        assert "--whisper" in answer.json()["error"]["message"]


def test_a_whisper_model_served_alone(whisper_folder: Path, wav: Path) -> None:
    """``genai serve -m WHISPER_DIR``: transcriptions work, text requests get a 400."""
    model = genai.Model(whisper_folder)
    expected = transcribe(model, genai.Audios.open(wav), timestamps=False).text
    with serve_command(whisper_folder) as (url, _):
        answer = httpx.post(
            url + "/v1/audio/transcriptions",
            data={"model": whisper_folder.name},
            files={"file": ("talk.wav", wav.read_bytes(), "audio/wav")},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"text": expected}
        answer = httpx.post(
            url + "/v1/completions",
            json={"model": whisper_folder.name, "prompt": "hello", "max_tokens": 4},
            timeout=30,
        )
        assert answer.status_code == 400
        assert "speech model" in answer.json()["error"]["message"]
