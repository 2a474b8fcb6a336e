"""The OpenAI-compatible HTTP API (FastAPI on uvicorn) over the continuous-batching
`Scheduler`.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (server-sent events with
``stream: true``), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus).
Errors have OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad
request, 401 without the API key, 404 for an unknown model or path, 413 for a body over
``max_body_bytes``, 415 for a body that is not JSON, 429 when the queue is full (with
``Retry-After``), 408 when a request ran past its timeout, 500 for a failure inside the engine
(the connection stays usable).

The event loop only parses and formats: chat templates, tokenization and grammar compilation
run on a small thread pool (`ServeEngine.edge_workers`; the tokenizer releases the GIL there),
model steps on the scheduler threads with the GIL released. A prompt that cannot fit the
context is refused from its size in bytes before it is tokenized (`ServeEngine.max_token_bytes`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hmac
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from genai.constraints.guidance import TokenConstraint
from genai.constraints.tools import prepare_tool_chat
from genai.errors import GenaiError, InvalidArgumentError
from genai.generation.search import SearchOptions
from genai.runtime.config import Config
from genai.runtime.model import Model
from genai.serve.batch_runner import make_batch_runner
from genai.serve.images import ImageInputs, has_images, refuse_images
from genai.serve.metrics import ServerMetrics
from genai.serve.middleware import BodyLimit, CountResponses, ErrorGuard
from genai.serve.protocol import (
    MAX_CHOICES,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    parse_request,
    validation_message,
)
from genai.serve.scheduler import (
    GenerationRequest,
    QueueFullError,
    Scheduler,
    TooManySequencesError,
)
from genai.serve.scheduler_group import SchedulerGroup, default_lanes
from genai.serve.speculative import SpeculativeServing
from genai.serve.transcriptions import (
    SpeechService,
    add_transcription_route,
    refuse_speech_model,
)
from genai.serve.webui import mount_webui
from genai.text.chat_template import ChatTemplateError
from genai.text.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "JSON_MODE_MAX_TOKENS",
    "MEDIA_MAX_BODY_BYTES",
    "ServeEngine",
    "create_app",
    "default_lanes",
    "max_token_bytes",
]

log = logging.getLogger("genai.serve")

#: Largest request body `create_app` reads by default (413 beyond it): 4 MiB, far above
#: any prompt that fits a context (SmolLM2's 8,192 tokens are about 40 KB of text).
DEFAULT_MAX_BODY_BYTES = 4 << 20
#: The default limit of a server that takes images or audio: 32 MiB (OpenAI's audio uploads go
#: up to 25 MB; an image part is a base64 data URL, 4/3 of the file).
MEDIA_MAX_BODY_BYTES = 32 << 20
#: ``max_tokens`` of a ``response_format`` (JSON mode) or tool-call request that sets none: a
#: model can keep writing whitespace inside JSON; this bounds how long it holds a slot doing so.
JSON_MODE_MAX_TOKENS = 2048
#: Seconds a 429 asks the client to wait (``Retry-After``).
RETRY_AFTER_SECONDS = 1
#: Seconds a request's grammar may take to compile and compute its first token mask at the
#: edge; a slower one is refused (400) instead of stalling its scheduler at the first token.
GRAMMAR_PREPARE_SECONDS = 10.0

_T = TypeVar("_T")


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most bytes of input text one token of ``tokenizer`` stands for, from its folder's
    ``tokenizer.json`` (vocabulary and added tokens), or None when it has no such bound (a
    vocabulary that fuses runs of unknown characters into one token) or it cannot be read.
    A text of B bytes then has at least B / max_token_bytes tokens."""
    path = getattr(tokenizer, "path", None)
    if path is None:
        return None
    try:
        with open(Path(path) / "tokenizer.json", encoding="utf-8") as file:
            spec = json.load(file)
        model = spec["model"]
        vocab = model["vocab"]
        pieces = [p if isinstance(p, str) else p[0] for p in vocab]  # dict keys or [piece, score]
        pieces += [t["content"] for t in spec.get("added_tokens") or ()]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if model.get("fuse_unk") and not model.get("byte_fallback"):
        return None
    byte_level = "ByteLevel" in json.dumps([spec.get("decoder"), spec.get("pre_tokenizer")])
    # byte-level pieces spell one byte per character; otherwise UTF-8 bytes (an upper bound
    # for metaspace "▁" and byte-fallback "<0x41>" pieces)
    longest = max((len(p) if byte_level else len(p.encode()) for p in pieces), default=1)
    if model.get("type") == "WordPiece":  # an unknown word becomes one [UNK]
        longest = max(longest, 4 * int(model.get("max_input_chars_per_word") or 100))
    return max(4, longest)


class ServeEngine:
    """A model, its tokenizer and the scheduler that serves it (one per process or replica).

    ``lanes`` (default `default_lanes`): with more than one, ``scheduler`` is a
    `SchedulerGroup` of that many schedulers, each with ``max_slots / lanes`` slots of its own
    runner; else one `Scheduler` over all slots (with ``overlap_prefill``, its prefills run on
    a second thread beside its decode steps). ``edge_workers``: threads that render chat
    templates, tokenize prompts and compile grammars for the event loop (`off_loop`).
    ``speculative``: prompt-lookup speculation in the schedulers (`genai.serve.speculative`;
    a request's ``"speculative": false`` opts out). ``single_row_steps``: a decode step with
    one sequence decoding runs that one row (default: at least two, an idle slot filling in,
    so that a request's tokens never depend on what else runs; `Scheduler.min_decode_rows`)."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        *,
        model_name: str | None = None,
        max_slots: int = 16,
        max_queue: int = 64,
        request_timeout: float = 600.0,
        prefill_chunk: int = 64,
        prefix_cache_mb: int = 256,
        initial_capacity: int = 256,
        switch_interval: float | None = None,
        overlap_prefill: bool = True,
        lanes: int | None = None,
        edge_workers: int = 2,
        speculative: SpeculativeServing | None = None,
        single_row_steps: bool = False,
    ) -> None:
        if max_slots < 2:
            raise InvalidArgumentError("max_slots must be >= 2")
        if lanes is None:
            lanes = default_lanes(model)
        if lanes < 1:
            raise InvalidArgumentError("lanes must be >= 1")
        if edge_workers < 1:
            raise InvalidArgumentError("edge_workers must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name or Path(str(model.path)).name
        config = model.config
        #: The longest sequence: the folder's search.max_length when set, else its context.
        self.context_length = int(config.max_length)
        #: How messages name that limit.
        self.limit_name = (
            "the model's search.max_length"
            if config.max_length < config.context_length
            else "the model's context"
        )
        self.vocab_size = int(model.io.vocab_size)
        #: Threads that render chat templates, tokenize and compile grammars for the event
        #: loop (more requests wait for one).
        self.edge_workers = edge_workers
        self._edge_pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: `max_token_bytes` of the tokenizer (None: prompts are always tokenized in full).
        self.max_token_bytes = max_token_bytes(tokenizer)
        self.metrics = ServerMetrics()
        options: dict[str, int] = {"max_chunk": max(3, prefill_chunk)}
        if initial_capacity:
            options["initial_capacity"] = initial_capacity
        eos = [int(e) for e in model.config.eos_token_ids]
        common: dict[str, Any] = {
            "max_queue": max_queue,
            "request_timeout": request_timeout,
            "prefill_chunk": prefill_chunk,
            "prefix_cache_bytes": prefix_cache_mb << 20,
            "metrics": self.metrics,
            "speculative": speculative,
            # a lone decoding sequence runs one row, not two (faster; its tokens then depend
            # on whether others run: Scheduler.min_decode_rows)
            "min_decode_rows": 1 if single_row_steps else 2,
        }
        # Lanes: one scheduler per lane, each with its own slots (genai.serve.scheduler_group)
        lanes = max(1, min(lanes, max_slots // 2))
        if lanes > 1:
            self.runners = [
                make_batch_runner(
                    model, max_slots * (k + 1) // lanes - max_slots * k // lanes, **options
                )
                for k in range(lanes)
            ]
            self.scheduler = SchedulerGroup(
                self.runners, tokenizer, eos, overlap_prefill=False, **common
            )
        else:
            self.runners = [make_batch_runner(model, max_slots, **options)]
            self.scheduler = Scheduler(
                self.runners[0], tokenizer, eos, overlap_prefill=overlap_prefill, **common
            )
        #: The first (or only) scheduler's runner.
        self.runner = self.runners[0]
        self.metrics.watch_engine(lambda: self.scheduler.stats)
        self.metrics.watch_load(lambda: self.scheduler.queue_depth, lambda: self.scheduler.running)
        self.created = int(time.time())
        #: The interpreter's thread switch interval set by `start` (None: leave it): the
        #: scheduler thread takes the GIL back after every model run, and beside a busy event
        #: loop that waits up to the switch interval (Python's default 5 ms).
        self.switch_interval = switch_interval
        #: A Whisper model for ``/v1/audio/transcriptions`` (`genai.serve.transcriptions`), or
        #: None (that route answers 400).
        self.speech: SpeechService | None = None
        #: Image parts of chat messages, for a vision-language model (`genai.serve.images`);
        #: None: image parts answer 400.
        self.images: ImageInputs | None = (
            ImageInputs.for_model(model) if getattr(model, "vision", None) is not None else None
        )

    @property
    def accepts_images(self) -> bool:
        """Whether the served model takes image parts: its multimodal processor is an image
        processor (`ImageInputs.for_model`); the chat page then offers an image upload."""
        return self.images is not None

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        threads: int | None = None,
        provider: str | None = None,
        provider_options: Mapping[str, str] | None = None,
        **options: Any,
    ) -> ServeEngine:
        """Load the model folder ``path`` (``threads``: ORT intra-op threads; ``provider``
        and its ``provider_options``: the execution provider, instead of the folder's)."""
        config = Config(str(path))
        if threads is not None:
            if threads < 1:
                raise InvalidArgumentError("threads must be >= 1")
            config.overlay(
                {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}
            )
        if provider is not None:
            config.select_provider(provider, provider_options)
        model = Model(config)
        return cls(model, Tokenizer(model), **options)

    def start(self) -> None:
        """Start the scheduler thread (and shorten the GIL switch interval, process-wide)."""
        if self.switch_interval:
            sys.setswitchinterval(min(sys.getswitchinterval(), self.switch_interval))
        self.scheduler.start()

    def shutdown(self) -> None:
        """Stop the scheduler thread (and the edge pool)."""
        self.scheduler.shutdown()
        if self.speech is not None:
            self.speech.shutdown()
        pool, self._edge_pool = self._edge_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the edge pool (``edge_workers`` threads) and await its result."""
        if self._edge_pool is None:
            self._edge_pool = concurrent.futures.ThreadPoolExecutor(
                self.edge_workers, thread_name_prefix="genai-edge"
            )
        return await asyncio.get_running_loop().run_in_executor(self._edge_pool, fn)

    def encode(self, text: str, param: str) -> np.ndarray:
        """Token ids of ``text`` (int32), for a prompt that must fit the context: a text of
        more bytes than the context times `max_token_bytes` is refused (`APIError` 400,
        ``context_length_exceeded``) without tokenizing it. Runs the tokenizer's batch call,
        which releases the GIL (call it off the event loop: `off_loop`)."""
        if self.max_token_bytes is not None and len(text) * 4 > self.max_token_bytes * (
            self.context_length - 1
        ):
            size = len(text.encode("utf-8", "surrogatepass"))
            at_least = -(-size // self.max_token_bytes)
            if at_least >= self.context_length:
                raise APIError(
                    f"the prompt has at least {at_least} tokens ({size} bytes, at most "
                    f"{self.max_token_bytes} per token); {self.limit_name} is "
                    f"{self.context_length}",
                    param=param,
                    code="context_length_exceeded",
                )
        encode_batch = getattr(self.tokenizer, "encode_batch", None)
        if encode_batch is not None:
            return np.asarray(encode_batch([text])[0], np.int32)
        return np.asarray(self.tokenizer.encode(text), np.int32)

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one engine per process
    def token_text(self, token: int) -> str:
        """The text of one token (for log-probabilities)."""
        return self.tokenizer.decode([token])

    def token_bytes(self, token: int) -> list[int]:
        """The bytes of one token (log-probabilities' ``bytes``: a byte-level token that is
        part of a character has its own bytes, not those of U+FFFD)."""
        return list(self.tokenizer.token_bytes(token))

    def constraint_factory(self, kind: str, data: str) -> Any:
        """A `TokenConstraint` (validated now: a bad schema raises here, not in the
        scheduler)."""
        return TokenConstraint.create(self.tokenizer, kind, data, vocab_size=self.vocab_size)


@dataclass
class _Choice:
    """A choice being collected."""

    text: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None


@dataclass
class _Prepared:
    """A validated request, ready to submit."""

    kind: str  # "chat" | "completion"
    body: ChatCompletionRequest | CompletionRequest
    sequences: list[GenerationRequest]
    prompt_tokens: int
    tools: Any = None  # genai.constraints.tools.ToolChat of a chat with tools


def create_app(
    engine: ServeEngine,
    *,
    manage_engine: bool = True,
    api_key: str | None = None,
    allowed_origins: Sequence[str] = (),
    max_body_bytes: int | None = None,
    webui: bool = True,
) -> FastAPI:
    """The FastAPI app serving ``engine``; with ``manage_engine`` the app's lifespan starts
    and stops its scheduler. With ``api_key``, the ``/v1`` endpoints answer 401 unless the
    request carries ``Authorization: Bearer <api_key>`` (what OpenAI clients send), and the
    interactive docs (``/docs``, ``/redoc``, ``/openapi.json``) are off; ``/health`` and
    ``/metrics`` stay open for load balancers and Prometheus. An empty ``api_key`` means no key
    (with a warning). ``allowed_origins``: web origins whose pages may call the API from a
    browser (CORS; ``"*"`` for any). ``max_body_bytes``: larger request bodies get 413 (None:
    `DEFAULT_MAX_BODY_BYTES`, or `MEDIA_MAX_BODY_BYTES` when the engine takes images or audio).
    ``webui``: serve the chat page at ``/`` (`genai.serve.webui`)."""
    if max_body_bytes is None:
        media = engine.accepts_images or engine.speech is not None
        max_body_bytes = MEDIA_MAX_BODY_BYTES if media else DEFAULT_MAX_BODY_BYTES
    if max_body_bytes < 1:
        raise InvalidArgumentError("max_body_bytes must be >= 1")
    if api_key is not None and not api_key.strip():
        log.warning("the API key is empty: serving WITHOUT an API key")
        api_key = None
    key = None if api_key is None else api_key.encode("utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_engine:
            engine.start()
        try:
            yield
        finally:
            if manage_engine:
                engine.shutdown()

    docs: dict[str, Any] = {}
    if key is not None:
        docs = {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="genai serve", version="1", lifespan=lifespan, **docs)
    app.state.engine = engine
    # the last added is the outermost: the response counter, CORS, the error guard, the
    # body limit
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(ErrorGuard)
    if allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
        )
    routes: list[Any] = []  # filled in below, once every route is added
    app.add_middleware(CountResponses, metrics=engine.metrics, routes=routes)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 with ``status`` "ok"; 503 with "failing" while the last finished generation
        failed (a load balancer takes the replica out until one succeeds)."""
        sched = engine.scheduler
        state = engine.metrics.health()
        state.update(running=sched.running, waiting=sched.queue_depth, pid=os.getpid())
        return JSONResponse(state, status_code=200 if state["status"] == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    def authorize(request: Request) -> None:
        if key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # header values arrive as latin-1 text: compare their bytes (any byte is allowed)
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode("latin-1"), key
        ):
            raise APIError(
                "missing or incorrect API key: send the header 'Authorization: Bearer <key>'",
                401,
                type="invalid_request_error",
                code="invalid_api_key",
            )

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": engine.model_name,
                    "object": "model",
                    "created": engine.created,
                    "owned_by": "genai",
                    "max_model_len": engine.context_length,
                }
            ],
        }

    @v1.get("/models/{name}")
    async def model_info(name: str) -> dict[str, Any]:
        if name != engine.model_name:
            raise APIError(f"the model {name!r} does not exist", 404, code="model_not_found")
        return {"id": name, "object": "model", "created": engine.created, "owned_by": "genai"}

    @v1.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        refuse_speech_model(engine.model, engine.model_name)
        body = await _parse(engine, request, ChatCompletionRequest)
        prepared = await _prepare_chat(engine, body)
        return await _respond(engine, request, prepared)

    @v1.post("/completions")
    async def completions(request: Request) -> Response:
        refuse_speech_model(engine.model, engine.model_name)
        body = await _parse(engine, request, CompletionRequest)
        prepared = await _prepare_completion(engine, body)
        return await _respond(engine, request, prepared)

    add_transcription_route(v1, lambda: engine.speech, engine.model_name)
    app.include_router(v1)
    if webui:
        mount_webui(app, engine, api_key_required=key is not None, max_body_bytes=max_body_bytes)
    routes.extend(r for r in (*v1.routes, *app.router.routes) if hasattr(r, "path_regex"))
    return app


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


#: Request bodies larger than this are validated on the edge pool: a body of 100,000 messages
#: (4 MB) takes ~0.6 s to validate, a stall of every stream if run on the event loop.
_PARSE_OFF_LOOP_BYTES = 64 << 10


async def _parse(engine: ServeEngine, request: Request, model: type) -> Any:
    # JSON only: a web page may POST text/plain cross-origin without a CORS preflight
    if not _is_json(request.headers.get("content-type", "")):
        raise APIError(
            "the request body must be JSON: send 'Content-Type: application/json'",
            415,
            code="unsupported_media_type",
        )
    raw = await request.body()
    if len(raw) > _PARSE_OFF_LOOP_BYTES:
        return await engine.off_loop(lambda: parse_request(raw, model))
    return parse_request(raw, model)


# --- building requests ----------------------------------------------------------------------------
def _check_model(engine: ServeEngine, name: str) -> None:
    if name and name != engine.model_name:
        raise APIError(
            f"the model {name!r} does not exist; this server serves {engine.model_name!r}",
            404,
            param="model",
            code="model_not_found",
        )


def _sampling(body: Any, n_logprobs: int | None, index: int) -> SearchOptions:
    """The search options of choice ``index`` of a request (OpenAI's parameters)."""
    seed = body.seed
    if seed is not None:  # in [-2**63, 2**64) (`genai.serve.protocol`)
        # each choice its own stream; the sampler's seeds are [0, 2**64): every int64 and
        # every uint64 seed is its own (a negative one shares its stream with seed + 2**64)
        seed = (seed + index) % 2**64
    return SearchOptions.from_openai(
        temperature=1.0 if body.temperature is None else float(body.temperature),
        top_p=1.0 if body.top_p is None else float(body.top_p),
        top_k=body.top_k,
        min_p=body.min_p,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        seed=seed,
        logprobs=n_logprobs,
    )


def _logit_bias(engine: ServeEngine, body: Any) -> dict[int, float]:
    """The request's ``logit_bias`` by token id; `APIError` for an id outside the
    vocabulary."""
    bias: dict[int, float] = {}
    for key, value in (body.logit_bias or {}).items():
        token = int(key)
        if not 0 <= token < engine.vocab_size:
            raise APIError(
                f"logit_bias token id {token} is outside the vocabulary [0, {engine.vocab_size})",
                param="logit_bias",
            )
        bias[token] = float(value)
    return bias


def _limit(
    engine: ServeEngine,
    prompt_len: int,
    requested: int | None,
    param: str = "messages",
    default_cap: int | None = None,
    limit_param: tuple[str, bool] = ("max_tokens", True),
) -> int:
    """New tokens allowed: ``requested``, or the rest of the context (at most ``default_cap``
    when given); raises `APIError` when the prompt or the request do not fit. ``limit_param``:
    the field ``requested`` came from and whether the client gave it (else its default)."""
    if prompt_len == 0:
        raise APIError("the prompt is empty", param=param)
    room = engine.context_length - prompt_len
    if room < 1:
        raise APIError(
            f"the prompt has {prompt_len} tokens; {engine.limit_name} is {engine.context_length}",
            param=param,
            code="context_length_exceeded",
        )
    if requested is None:
        return room if default_cap is None else min(room, default_cap)
    if requested > room:
        field, given = limit_param
        what = f"{field} {requested}" if given else f"{field} (default {requested})"
        hint = "" if given else f"; pass a {field} of at most {room}"
        raise APIError(
            f"{what} + prompt {prompt_len} tokens exceed {engine.limit_name} "
            f"of {engine.context_length} tokens{hint}",
            param=field,
            code="context_length_exceeded",
        )
    return requested


async def _constraints(
    engine: ServeEngine, kind: str, data: str, count: int, param: str
) -> list[Any]:
    """``count`` grammar constraints, compiled now with their first token mask (off the event
    loop): an invalid grammar, or one that takes more than `GRAMMAR_PREPARE_SECONDS`, is a 400
    before the request is queued."""

    def build() -> list[Any]:
        made = [engine.constraint_factory(kind, data) for _ in range(count)]
        for constraint in made:
            constraint.allowed_tokens()  # waits for the first mask; raises if the grammar failed
        return made

    try:
        return await asyncio.wait_for(engine.off_loop(build), GRAMMAR_PREPARE_SECONDS)
    except TimeoutError:
        raise APIError(
            f"invalid {param}: the grammar took more than {GRAMMAR_PREPARE_SECONDS:g} s to "
            "prepare (simplify the schema or its patterns)",
            param=param,
        ) from None
    except ImportError as exc:
        raise APIError(f"{param} is not available on this server: {exc}", param=param) from None
    except GenaiError as exc:  # the grammar's own complaint (GuidanceError): a 400
        raise APIError(f"invalid {param}: {exc}", param=param) from None


async def _prepare_chat(engine: ServeEngine, body: ChatCompletionRequest) -> _Prepared:
    _check_model(engine, body.model)
    tools = body.tools if body.tools and body.tool_choice != "none" else None
    if body.response_format and tools:
        raise APIError("use either response_format or tools, not both", param="response_format")
    tool_chat = None
    images = None
    if has_images(body.messages):
        images = engine.images
        if images is None:
            raise refuse_images(engine.model_name)
        if body.tools:
            raise APIError("tools with images are not supported", param="tools")
    inputs = None

    def render() -> np.ndarray:
        nonlocal tool_chat, inputs
        if images is not None:  # image parts: the model's tags in the text, then its processor
            tagged, blobs = images.render(body.messages)
            try:
                text = engine.tokenizer.apply_chat_template(tagged, add_generation_prompt=True)
            except ChatTemplateError as exc:
                raise APIError(
                    f"could not apply the chat template: {exc}", param="messages"
                ) from None
            inputs = images.inputs(text, blobs)
            return np.asarray(inputs["input_ids"].as_numpy()[0], np.int32)
        messages = [m.for_template() for m in body.messages]
        try:
            if body.tools:
                tool_chat = prepare_tool_chat(
                    engine.tokenizer,
                    messages,
                    body.tools,
                    tool_choice=body.tool_choice,
                    parallel_tool_calls=body.parallel_tool_calls is not False,
                )
                text = tool_chat.prompt
            else:
                text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except ChatTemplateError as exc:
            raise APIError(f"could not apply the chat template: {exc}", param="messages") from None
        except GenaiError as exc:
            raise APIError(f"invalid tools: {exc}", param="tools") from None
        return engine.encode(text, "messages")

    # off the event loop: a long conversation takes a while to render and encode
    ids = await engine.off_loop(render)
    n_logprobs = body.n_logprobs
    guidance: tuple[str, str] | None = None
    param = "response_format"
    cap = None
    if body.response_format:
        kind = body.response_format.get("type")
        if kind == "json_schema":
            schema = body.response_format["json_schema"]["schema"]
            guidance = ("json_schema", json.dumps(schema))
        elif kind == "json_object":
            guidance = ("json_schema", json.dumps({"type": "object"}))
        if guidance is not None:
            cap = JSON_MODE_MAX_TOKENS
    elif tool_chat is not None and tool_chat.guidance is not None:
        param = "tools"
        guidance = tool_chat.guidance
        cap = JSON_MODE_MAX_TOKENS  # the calls are JSON too
    max_new = _limit(
        engine, len(ids), body.new_tokens_limit, default_cap=cap, limit_param=body.new_tokens_param
    )
    constraints = (
        await _constraints(engine, guidance[0], guidance[1], body.n, param) if guidance else None
    )
    sequences = []
    for i in range(body.n):
        factory = None
        if constraints is not None:
            factory = functools.partial(lambda c: c, constraints[i])
        sequences.append(
            GenerationRequest(
                prompt=ids,
                max_new_tokens=max_new,
                sampling=_sampling(body, n_logprobs, i),
                logit_bias=_logit_bias(engine, body),
                stop=body.stops,
                constraint_factory=factory,
                index=i,
                ignore_eos=body.ignore_eos,
                inputs=inputs,
                speculative=body.speculative,
            )
        )
    offered = tool_chat if tool_chat is not None and tool_chat.guidance is not None else None
    return _Prepared("chat", body, sequences, len(ids), offered)


async def _prepare_completion(engine: ServeEngine, body: CompletionRequest) -> _Prepared:
    _check_model(engine, body.model)
    if body.suffix:
        raise APIError("suffix is not supported", param="suffix")
    if body.echo:
        raise APIError("echo is not supported", param="echo")
    prompts = body.prompts()
    if len(prompts) * body.n > MAX_CHOICES:
        raise APIError(f"at most {MAX_CHOICES} choices (prompts x n) per request", param="n")
    texts = [p for p in prompts if isinstance(p, str)]
    # off the event loop (the tokenizer releases the GIL there)
    encoded = iter(
        await engine.off_loop(lambda: [engine.encode(t, "prompt") for t in texts]) if texts else []
    )
    sequences = []
    prompt_tokens = 0
    for p, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            ids = next(encoded)
        else:
            ids = np.asarray(prompt, np.int64)
            if ids.size and ids.max() >= engine.vocab_size:
                raise APIError("prompt token ids are outside the vocabulary", param="prompt")
            ids = ids.astype(np.int32)
        prompt_tokens += len(ids)
        max_new = _limit(
            engine, len(ids), body.new_tokens_limit, "prompt", limit_param=body.new_tokens_param
        )
        for i in range(body.n):
            index = p * body.n + i
            sequences.append(
                GenerationRequest(
                    prompt=ids,
                    max_new_tokens=max_new,
                    sampling=_sampling(body, body.n_logprobs, index),
                    logit_bias=_logit_bias(engine, body),
                    stop=body.stops,
                    index=index,
                    ignore_eos=body.ignore_eos,
                    speculative=body.speculative,
                )
            )
    return _Prepared("completion", body, sequences, prompt_tokens)


# --- answering ------------------------------------------------------------------------------------
async def _respond(engine: ServeEngine, request: Request, prepared: _Prepared) -> Response:
    try:
        handle = engine.scheduler.submit(prepared.sequences)
    except TooManySequencesError as exc:  # the prompts of a list, or the choices n
        raise APIError(str(exc), param="n" if prepared.body.n > 1 else "prompt") from None
    except QueueFullError as exc:
        engine.metrics.outcome("rejected")
        raise APIError(
            str(exc),
            429,
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from None
    engine.metrics.prompt_tokens.inc(prepared.prompt_tokens)
    rid = ("chatcmpl-" if prepared.kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
    if prepared.body.stream:
        return StreamingResponse(
            _stream(engine, prepared, handle, rid),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _complete(engine, request, prepared, handle, rid)


async def _collect(handle: Any, count: int) -> list[_Choice]:
    choices = [_Choice() for _ in range(count)]
    async for event in handle:
        choice = choices[event.index]
        choice.text.append(event.text)
        choice.tokens.extend(event.tokens)
        if event.logprobs:
            choice.logprobs.extend(event.logprobs)
        if event.finish_reason is not None:
            choice.finish_reason = event.finish_reason
            choice.completion_tokens = event.completion_tokens
            choice.cached_tokens = event.cached_tokens
            choice.error = event.error
    return choices


#: How the scheduler reports a sequence whose own grammar cannot continue (no token of this
#: model's vocabulary follows it): the request's fault, a 400 that leaves /health alone.
_GRAMMAR_FAILURE = "GuidanceError:"


def _generation_failure(engine: ServeEngine, error: str | None) -> APIError:
    """The answer to a failed generation (``error``: the scheduler's reason), counted."""
    if error and error.startswith(_GRAMMAR_FAILURE):
        engine.metrics.outcome("invalid", error)
        reason = error[len(_GRAMMAR_FAILURE) :].strip()
        return APIError(
            f"the request's grammar cannot be followed with this model's vocabulary: {reason}",
            param="response_format",
        )
    engine.metrics.outcome("error", error)
    return APIError(f"generation failed: {error}", 500)


def _raise_for(engine: ServeEngine, choices: Sequence[_Choice]) -> None:
    reasons = {c.finish_reason for c in choices}
    if "error" in reasons:
        raise _generation_failure(
            engine, next(c.error for c in choices if c.finish_reason == "error")
        )
    if "timeout" in reasons:
        engine.metrics.outcome("timeout")
        raise APIError("the request ran past its timeout", 408, code="timeout")


async def _complete(
    engine: ServeEngine, request: Request, prepared: _Prepared, handle: Any, rid: str
) -> Response:
    task = asyncio.ensure_future(_collect(handle, len(prepared.sequences)))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                break
            if await request.is_disconnected():
                handle.cancel()
                task.cancel()
                engine.metrics.outcome("disconnected")
                return Response(status_code=499)
    except asyncio.CancelledError:
        handle.cancel()
        task.cancel()
        raise
    choices = task.result()
    _raise_for(engine, choices)
    engine.metrics.outcome("ok")
    completion_tokens = sum(c.completion_tokens for c in choices)
    n = prepared.body.n
    usage = {
        "prompt_tokens": prepared.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prepared.prompt_tokens + completion_tokens,
        # prompt tokens whose KV came from the prefix cache (each prompt's first choice)
        "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in choices[::n])},
    }
    created = int(time.time())
    if prepared.kind == "chat":
        out = []
        for i, c in enumerate(choices):
            text = "".join(c.text)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = c.finish_reason
            if prepared.tools:
                result = prepared.tools.result(text, c.finish_reason)
                message, finish = result.message(), result.finish_reason
            out.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": _chat_logprobs(engine, c.tokens, c.logprobs)
                    if prepared.body.n_logprobs is not None
                    else None,
                    "finish_reason": finish,
                }
            )
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": engine.model_name,
                "choices": out,
                "usage": usage,
                "system_fingerprint": "genai",
            }
        )
    out = [
        {
            "index": i,
            "text": "".join(c.text),
            "logprobs": _completion_logprobs(engine, c.tokens, c.logprobs)
            if prepared.body.n_logprobs is not None
            else None,
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(choices)
    ]
    return JSONResponse(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": engine.model_name,
            "choices": out,
            "usage": usage,
            "system_fingerprint": "genai",
        }
    )


def _chat_logprobs(
    engine: ServeEngine, tokens: list[int], info: list[tuple[float, list[tuple[int, float]]]]
) -> dict[str, Any]:
    content = []
    for token, (lp, alts) in zip(tokens, info, strict=False):
        text = engine.token_text(token)
        content.append(
            {
                "token": text,
                "logprob": lp,
                "bytes": engine.token_bytes(token),
                "top_logprobs": [
                    {
                        "token": engine.token_text(t),
                        "logprob": a,
                        "bytes": engine.token_bytes(t),
                    }
                    for t, a in alts
                ],
            }
        )
    return {"content": content}


def _completion_logprobs(
    engine: ServeEngine,
    tokens: list[int],
    info: list[tuple[float, list[tuple[int, float]]]],
    start: int = 0,
) -> dict[str, Any]:
    """OpenAI's completion ``logprobs``; ``text_offset`` counts from ``start`` (a stream's
    later chunks continue where the earlier ones ended)."""
    texts = [engine.token_text(t) for t in tokens]
    offsets, pos = [], start
    for t in texts:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": texts,
        "token_logprobs": [lp for lp, _ in info],
        "top_logprobs": [{engine.token_text(t): a for t, a in alts} for _, alts in info],
        "text_offset": offsets,
    }


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def _stream(
    engine: ServeEngine, prepared: _Prepared, handle: Any, rid: str
) -> AsyncIterator[bytes]:
    body = prepared.body
    chat = prepared.kind == "chat"
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    count = len(prepared.sequences)
    completion_tokens = [0] * count
    cached_tokens = [0] * count
    started = [False] * count
    buffered = [[] for _ in range(count)]  # tool calls are sent whole at the end
    text_offset = [0] * count  # completions' logprobs.text_offset, continued over chunks
    want_lp = body.n_logprobs is not None

    def chunk(index: int, delta: Any, finish: str | None, logprobs: Any = None) -> bytes:
        if chat:
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": finish}
        return _sse(
            {
                "id": rid,
                "object": obj,
                "created": created,
                "model": engine.model_name,
                "system_fingerprint": "genai",
                "choices": [choice],
            }
        )

    finished_ok = False
    try:
        async for event in handle:
            i = event.index
            if event.finish_reason in ("error", "timeout"):
                if event.finish_reason == "error":
                    failure = _generation_failure(engine, event.error)
                else:
                    engine.metrics.outcome("timeout")
                    failure = APIError("the request ran past its timeout", 408, code="timeout")
                yield _sse(failure.body())
                finished_ok = True
                handle.cancel()
                return
            lp = None
            if want_lp and event.logprobs:
                if chat:
                    lp = _chat_logprobs(engine, event.tokens, event.logprobs)
                else:
                    lp = _completion_logprobs(engine, event.tokens, event.logprobs, text_offset[i])
                    text_offset[i] += sum(len(t) for t in lp["tokens"])
            if chat and not started[i]:
                started[i] = True
                yield chunk(i, {"role": "assistant", "content": ""}, None)
            if prepared.tools:
                buffered[i].append(event.text)
            elif event.text or lp:
                yield chunk(i, {"content": event.text} if chat else event.text, None, lp)
            if event.finish_reason is not None:
                completion_tokens[i] = event.completion_tokens
                cached_tokens[i] = event.cached_tokens
                finish = event.finish_reason
                if prepared.tools:
                    result = prepared.tools.result("".join(buffered[i]), finish)
                    finish = result.finish_reason
                    calls = result.tool_calls
                    if calls:
                        delta = {"tool_calls": [dict(c, index=k) for k, c in enumerate(calls)]}
                    else:
                        delta = {"content": result.content or ""}
                    yield chunk(i, delta, None)
                yield chunk(i, {} if chat else "", finish)
        finished_ok = True
        engine.metrics.outcome("ok")
        if body.include_usage:
            total = sum(completion_tokens)
            yield _sse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": engine.model_name,
                    "system_fingerprint": "genai",
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prepared.prompt_tokens,
                        "completion_tokens": total,
                        "total_tokens": prepared.prompt_tokens + total,
                        "prompt_tokens_details": {"cached_tokens": sum(cached_tokens[:: body.n])},
                    },
                }
            )
        yield b"data: [DONE]\n\n"
    finally:
        if not finished_ok:
            handle.cancel()  # the client went away: free the slots
            engine.metrics.outcome("disconnected")
