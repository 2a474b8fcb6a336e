"""``POST /v1/audio/transcriptions``: OpenAI's transcription API over a Whisper model.

A server answers it when it holds a speech model (`SpeechService`, ``genai serve --whisper
DIR``) beside the text model. The request is ``multipart/form-data`` as OpenAI's: ``file``
(WAV, FLAC, OGG, MP3), ``model``, and optionally ``language``, ``temperature``, ``prompt``
(accepted, unused) and ``response_format`` (``json``, ``text``, ``srt``, ``vtt``,
``verbose_json``). The recording is decoded and transcribed whole
(`genai.multimodal.transcribe`) on the service's own worker threads, off the event loop. Bad
input is a 400 with OpenAI's error body: no file, an undecodable or empty file, an unknown
format, a temperature out of range, a language the model lacks, the text model's name as
``model``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from genai.errors import GenaiError, InvalidArgumentError
from genai.multimodal.audios import Audios
from genai.multimodal.transcribe import (
    Transcript,
    to_srt,
    to_vtt,
    transcribe,
    whisper_vocabulary,
)
from genai.runtime.config import Config
from genai.runtime.model import Model
from genai.serve.protocol import APIError

__all__ = [
    "RESPONSE_FORMATS",
    "SpeechService",
    "add_transcription_route",
    "refuse_speech_model",
    "reported_language",
]

_T = TypeVar("_T")

#: The ``response_format`` values OpenAI's API defines for transcriptions.
RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


class SpeechService:
    """A Whisper model and the worker threads that transcribe with it (``workers`` requests
    at once; more wait)."""

    def __init__(self, model: Model, *, name: str | None = None, workers: int = 1) -> None:
        if model.encoder is None:
            raise InvalidArgumentError(
                f"{model.path} is not a speech model (model.type {model.type!r}); "
                "--whisper takes a Whisper model folder"
            )
        if workers < 1:
            raise InvalidArgumentError("workers must be >= 1")
        self.model = model
        self.processor = model.create_multimodal_processor()
        self.name = name or Path(str(model.path)).name
        self.workers = workers
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @classmethod
    def from_path(cls, path: str | Path, *, threads: int | None = None) -> SpeechService:
        """Load the Whisper folder ``path`` (``threads``: ORT intra-op threads)."""
        config = Config(str(path))
        if threads is not None:
            options = {"session_options": {"intra_op_num_threads": threads}}
            sections: dict[str, Any] = {"decoder": options}
            if config.get("model.encoder") is not None:
                sections["encoder"] = options
            config.overlay({"model": sections})
        return cls(Model(config))

    async def run(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the service's threads and await its result."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.workers, thread_name_prefix="genai-speech"
            )
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def shutdown(self) -> None:
        """Stop the worker threads."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def refuse_speech_model(model: Any, name: str) -> None:
    """400 for a text request (chat, completions) to a server whose model is a speech model
    (``genai serve -m WHISPER_DIR``)."""
    if getattr(model, "encoder", None) is not None:
        raise APIError(
            f"the model {name!r} is a speech model: send audio to /v1/audio/transcriptions",
            400,
            param="model",
        )


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise APIError(f"'{name}' must be a text field", 400, param=name)
    return value


def reported_language(result: Transcript, requested: str | None, multilingual: bool) -> str:
    """verbose_json's ``language``: the one the model used (``result.language``: the
    request's, or the one a multilingual model detected); an English-only model's is "en"."""
    if not multilingual:
        return "en"
    return result.language or requested or ""


def _response(result: Transcript, fmt: str, language: str) -> Response:
    if fmt == "text":
        return PlainTextResponse(result.text + "\n")
    if fmt == "srt":
        return PlainTextResponse(to_srt(result.segments))
    if fmt == "vtt":
        return PlainTextResponse(to_vtt(result.segments), media_type="text/vtt")
    if fmt == "verbose_json":
        segments = [
            {
                "id": i,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "tokens": list(s.tokens),
            }
            for i, s in enumerate(result.segments)
        ]
        return JSONResponse(
            {
                "task": "transcribe",
                "language": language,
                "duration": round(result.duration, 3),
                "text": result.text,
                "segments": segments,
            }
        )
    return JSONResponse({"text": result.text})


def add_transcription_route(
    router: APIRouter, speech: Callable[[], SpeechService | None], text_model: str
) -> None:
    """Add ``POST /audio/transcriptions`` to ``router``; ``speech()`` is the server's speech
    service (None: the route answers 400), ``text_model`` the text model's served name."""

    @router.post("/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        service = speech()
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "multipart/form-data":
            raise APIError(
                "send the audio as multipart/form-data with a 'file' field (OpenAI's API)", 400
            )
        try:
            form = await request.form()
        except Exception as exc:  # a malformed multipart body
            raise APIError(f"cannot read the multipart body: {exc}", 400) from None
        model_name = _field(form, "model")
        if service is None or (model_name == text_model and model_name != service.name):
            raise APIError(
                f"the model {model_name or text_model!r} is a text model and takes no audio; "
                "this server has no speech model (start genai serve with --whisper DIR)"
                if service is None
                else f"the model {model_name!r} is a text model and takes no audio; send "
                f"audio to {service.name!r}",
                400,
                param="model",
            )
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise APIError("'file' must be an uploaded audio file", 400, param="file")
        fmt = _field(form, "response_format") or "json"
        if fmt not in RESPONSE_FORMATS:
            raise APIError(
                f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, not {fmt!r}",
                400,
                param="response_format",
            )
        language = _field(form, "language") or None
        raw_temperature = _field(form, "temperature") or "0"
        try:
            temperature = float(raw_temperature)
        except ValueError:
            raise APIError("temperature must be a number", 400, param="temperature") from None
        if not 0.0 <= temperature <= 1.0:
            raise APIError("temperature must be between 0 and 1", 400, param="temperature")
        data = await upload.read()
        if not data:
            raise APIError("the uploaded file is empty", 400, param="file")

        def work() -> tuple[Transcript, str]:
            audios = Audios.open_bytes(data)
            result = transcribe(
                service.model,
                audios,
                language=language,  # omitted: the model decides, as OpenAI's API
                temperature=temperature,
                processor=service.processor,
                timestamps=fmt in ("srt", "vtt", "verbose_json"),
            )
            vocab = whisper_vocabulary(service.model, service.processor)
            return result, reported_language(result, language, vocab.multilingual)

        try:
            result, used = await service.run(work)
        except GenaiError as exc:
            param = "language" if "language" in str(exc) else "file"
            raise APIError(str(exc), 400, param=param) from None
        return _response(result, fmt, used)
