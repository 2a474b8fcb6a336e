"""Audio inputs at the edges: 8-bit WAV decoded as the reference's dr_wav maps its bytes
(features against the reference's processor), GSM 6.10 WAV (libsndfile cannot seek in it),
decode errors without Python object addresses, ``Audios.from_arrays``'s sample rate and
layout checks, an empty Whisper prompt, and the ``language`` ``verbose_json`` reports.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.errors import InvalidArgumentError
from genai.multimodal.transcribe import Transcript
from genai.testing.whisper import synthetic_speech, write_whisper_fixture

og = pytest.importorskip("onnxruntime_genai")
sf = pytest.importorskip("soundfile")

PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_whisper_fixture(tmp_path_factory.mktemp("whisper"))


def _speech(seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    return synthetic_speech(seconds, seed, 16000, noise=0.05).astype(np.float32)


def test_8_bit_wav_is_decoded_as_the_references_dr_wav(folder: Path, tmp_path: Path) -> None:
    """dr_wav maps a byte to ``x * 0.00784313725490196078f - 1`` (libsndfile: ``(x - 128) /
    128``, log-mel up to 1.15 apart): the samples equal that mapping of the file's bytes, the
    features the reference's within 1e-4."""
    path = tmp_path / "u8.wav"
    sf.write(path, _speech(), 16000, subtype="PCM_U8")
    with wave.open(str(path)) as w:
        raw = np.frombuffer(w.readframes(w.getnframes()), np.uint8)
    expected = raw.astype(np.float32) * np.float32(0.00784313725490196078) - np.float32(1)
    clip = genai.Audios.open(path).clips[0]
    np.testing.assert_array_equal(clip.samples, expected)
    assert genai.Audios.open_bytes(path.read_bytes()).clips[0].samples.tobytes() == (
        expected.tobytes()
    )
    ours = genai.Model(folder).create_multimodal_processor()(
        PROMPT, audios=genai.Audios.open(path)
    )["audio_features"]
    theirs = og.Model(str(folder)).create_multimodal_processor()(
        [PROMPT], audios=og.Audios.open(str(path))
    )["audio_features"]
    assert np.abs(np.asarray(ours) - theirs.as_numpy()).max() < 1e-4


def test_a_gsm_wav_libsndfile_cannot_seek_in_is_decoded(tmp_path: Path) -> None:
    """GSM 6.10 WAV: every frame libsndfile decodes, from a path and from bytes (the
    reference's decoder refuses the file); 17 s is more than one block of reading."""
    path = tmp_path / "gsm.wav"
    x = _speech(17.0, seed=1)
    sf.write(path, x, 16000, format="WAV", subtype="GSM610")
    with sf.SoundFile(path) as f:
        assert not f.seekable()
        expected = f.read(frames=f.frames, dtype="float32")
    assert abs(expected.shape[0] - x.shape[0]) < 320  # whole GSM frames of 160 samples
    clip = genai.Audios.open(path).clips[0]
    assert clip.sample_rate == 16000
    np.testing.assert_array_equal(clip.samples, expected)
    np.testing.assert_array_equal(
        genai.Audios.open_bytes(path.read_bytes()).clips[0].samples, expected
    )


def test_decode_errors_give_libsndfiles_reason_without_an_object_address(tmp_path: Path) -> None:
    blob = b"RIFF\x00\x00\x00\x00this is not audio at all" * 10
    with pytest.raises(InvalidArgumentError) as caught:
        genai.Audios.open_bytes(blob)
    message = str(caught.value)
    assert message.startswith("cannot decode audio <bytes #0>: "), message
    assert "0x" not in message and "BytesIO" not in message and "<_io" not in message
    with pytest.raises(sf.LibsndfileError) as libsndfile:
        sf.SoundFile(io.BytesIO(blob))
    assert libsndfile.value.error_string in message
    path = tmp_path / "garbage.wav"
    path.write_bytes(blob)
    with pytest.raises(InvalidArgumentError) as caught_path:
        genai.Audios.open(path)
    # libsndfile's reason, the same for a path as for bytes, and the path named once
    reason = message.split(": ", 1)[1]
    assert str(caught_path.value) == f"cannot decode audio {str(path)!r}: {reason}"


@pytest.mark.parametrize("rate", [np.int64(16000), np.int32(16000), np.uint16(16000)])
def test_from_arrays_takes_any_integral_sample_rate(rate: np.integer) -> None:
    x = _speech(0.5)
    clip = genai.Audios.from_arrays(x, sample_rate=rate).clips[0]
    assert clip.sample_rate == 16000 and type(clip.sample_rate) is int
    np.testing.assert_array_equal(clip.samples, x)


@pytest.mark.parametrize("rate", [16000.0, True, "16000", np.float64(16000)])
def test_from_arrays_refuses_a_sample_rate_that_is_not_an_integer(rate: object) -> None:
    with pytest.raises(InvalidArgumentError, match="sample_rate must be a positive int"):
        genai.Audios.from_arrays(_speech(0.5), sample_rate=rate)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [(2, 1000), (1, 16000), (16000, 9)])
def test_from_arrays_names_the_layout_of_a_channels_first_array(shape: tuple[int, int]) -> None:
    samples = np.zeros(shape, np.float32)
    with pytest.raises(InvalidArgumentError, match=r"\[frames, channels\]; transpose") as caught:
        genai.Audios.from_arrays(samples)
    assert str(shape) in str(caught.value)
    # the same samples the right way round (up to the channel limit) are taken
    if shape[0] <= 8:
        assert genai.Audios.from_arrays(samples.T).clips[0].samples.shape == (shape[1],)


def test_an_empty_prompt_is_refused_as_the_reference_does(folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    sf.write(path, _speech(1.0), 16000, subtype="PCM_16")
    message = "No prompt or prompts provided to WhisperProcessor::Process."
    with pytest.raises(RuntimeError, match=message):
        og.Model(str(folder)).create_multimodal_processor()("", audios=og.Audios.open(str(path)))
    with pytest.raises(InvalidArgumentError, match=message):
        genai.Model(folder).create_multimodal_processor()("", audios=genai.Audios.open(path))


# --- /v1/audio/transcriptions ---------------------------------------------------------------


def test_verbose_json_reports_the_language_the_model_used() -> None:
    from genai.serve.transcriptions import reported_language

    detected = Transcript(text="", language="fr")
    assert reported_language(detected, None, multilingual=True) == "fr"
    assert reported_language(detected, "de", multilingual=True) == "fr"
    assert reported_language(Transcript(text=""), "de", multilingual=True) == "de"
    assert reported_language(Transcript(text=""), None, multilingual=True) == ""
    # an English-only model hears English whatever the request says
    assert reported_language(Transcript(text=""), None, multilingual=False) == "en"
    assert reported_language(Transcript(text="", language="fr"), "fr", multilingual=False) == "en"


def test_the_transcription_route_reports_language_and_clean_decode_errors(
    folder: Path, tmp_path: Path
) -> None:
    """The route on the tiny (English-only) fixture: ``verbose_json`` with no ``language``
    field says "en"; an undecodable upload's 400 carries no Python object address."""
    pytest.importorskip("httpx")
    pytest.importorskip("python_multipart")
    fastapi = pytest.importorskip("fastapi")
    from fastapi.responses import JSONResponse
    from fastapi.testclient import TestClient

    from genai.serve.protocol import APIError
    from genai.serve.transcriptions import SpeechService, add_transcription_route

    app = fastapi.FastAPI()

    @app.exception_handler(APIError)
    async def _api_error(request: fastapi.Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    service = SpeechService(genai.Model(folder))
    router = fastapi.APIRouter(prefix="/v1")
    add_transcription_route(router, lambda: service, "text-model")
    app.include_router(router)
    blob = io.BytesIO()
    sf.write(blob, _speech(1.0), 16000, format="WAV", subtype="PCM_16")
    try:
        with TestClient(app) as client:

            def post(data: bytes, **fields: str) -> object:
                return client.post(
                    "/v1/audio/transcriptions",
                    data={"model": "whisper", **fields},
                    files={"file": ("a.wav", data, "audio/wav")},
                )

            answer = post(blob.getvalue(), response_format="verbose_json")
            assert answer.status_code == 200, answer.text
            assert answer.json()["language"] == "en"
            answer = post(b"RIFF\x00\x00\x00\x00not audio" * 20)
            assert answer.status_code == 400
            message = answer.json()["error"]["message"]
            assert message.startswith("cannot decode audio <bytes #0>: "), message
            assert "0x" not in message and "BytesIO" not in message
    finally:
        service.shutdown()


@pytest.mark.parametrize("rate", [16000, 44100])
def test_a_clip_shorter_than_a_hop_names_the_clip_and_the_minimum(folder: Path, rate) -> None:
    """Was "the audio is too short for log-mel features", naming neither."""
    from genai.multimodal.transcribe import transcribe

    model = genai.Model(folder)
    processor = model.create_multimodal_processor()
    clip = genai.Audios.from_arrays(np.zeros(5, np.float32), sample_rate=rate)
    with pytest.raises(InvalidArgumentError, match=r"<array #0> is too short .*5 samples at") as a:
        transcribe(model, clip)
    assert f"at {rate} Hz, at least 10 ms needed" in str(a.value)
    with pytest.raises(InvalidArgumentError, match="<array #0> is too short"):
        processor("<|startoftranscript|>", audios=clip)
    long_enough = genai.Audios.from_arrays(np.zeros(rate // 100, np.float32), sample_rate=rate)
    transcribe(model, long_enough)  # 10 ms: two feature frames, as the reference takes


def test_genai_transcribe_names_stdin(folder: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    command = [sys.executable, "-m", "genai", "transcribe", "-", "-m", str(folder)]
    empty = subprocess.run(command, input=b"", capture_output=True, timeout=120)
    assert empty.returncode == 1
    assert empty.stderr.decode().strip() == "genai: error: no audio came on stdin (FILE '-')"
    junk = subprocess.run(command, input=b"not audio", capture_output=True, timeout=120)
    assert junk.returncode == 1 and "stdin" in junk.stderr.decode()
    assert "<bytes" not in junk.stderr.decode() and "Traceback" not in junk.stderr.decode()
