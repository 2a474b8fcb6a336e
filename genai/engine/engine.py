"""`Engine`: the reference's multi-request, multi-turn API (``og.Engine``) on genai's
continuous-batching scheduler.

An `Engine` owns one `genai.serve.scheduler.Scheduler` and its batch runner, the same ones
``genai serve`` runs, but drives it from the caller's thread: `Engine.run` runs scheduler
iterations (admission, chunked prefill, one batched decode step for every generating
request, each request's own logits chain) until they produce events, and hands them out
through an `EngineEventBuffer`. There is no second scheduler; with several lanes (schedulers
side by side, as ``genai serve`` runs them) `Engine.run` steps them on lane threads at once,
each lane at its own pace (`Engine._advance`).

A `Request` is one conversation: `Request.begin_turn` appends tokens and generates a reply.
Between turns the request keeps its slot, so the next turn runs only its new tokens on the
KV cache that is already there (the slot is taken back only when a waiting request needs
it; the next turn then runs the whole conversation again, whose prompt the prefix cache may
still hold). `TurnUsage.prompt_tokens` counts a turn's own tokens, as the reference, and
`TurnUsage.cached_prompt_tokens` those of them whose KV came from the prefix cache.

Exactness: a lone request decodes one row per step, as the reference's Engine runs it, so
its tokens are the reference's on any CPU (ORT's one-row kernels round otherwise than its
several-row ones). ``genai serve`` instead never runs a one-row step, so that a request's
tokens do not depend on what else runs (`Scheduler.min_decode_rows`).

Threads: as in the reference, the thread that made the engine owns it; engine, request and
turn-options operations from any other thread raise "Engine operations must be called from
the Engine owner thread."
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import math
import queue
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, SupportsIndex, TypeAlias, TypeVar

import numpy as np

from genai.compat.engine_enums import EngineErrorCode, EngineEventFlags, FinishReason
from genai.constraints.guidance import GUIDANCE_TYPES, TokenConstraint
from genai.errors import (
    ArgumentTypeError,
    GenaiError,
    GenerationError,
    InvalidArgumentError,
    UnsupportedFeatureError,
)
from genai.generation.search import SearchOptions
from genai.generation.speculative.stats import SpeculativeCounters
from genai.runtime.model import Model
from genai.serve.batch_runner import make_batch_runner
from genai.serve.scheduler import Event, GenerationRequest, PrefixCache, Scheduler
from genai.serve.scheduler_group import default_lanes
from genai.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    import numpy.typing as npt

    #: What the number setters take (`_number`): Python and NumPy numbers.
    _Number: TypeAlias = float | np.integer[Any] | np.floating[Any]

__all__ = [
    "Engine",
    "EngineCapabilities",
    "EngineEvent",
    "EngineEventBuffer",
    "Request",
    "RequestOptions",
    "TurnOptions",
    "TurnUsage",
]

#: Slots when the folder's ``engine`` section sets no batch size (``genai serve``'s default).
DEFAULT_MAX_BATCH_SIZE = 16
#: Bytes of prompt KV kept for reuse by later requests (all lanes together).
PREFIX_CACHE_BYTES = 256 << 20
#: Stop strings a turn may have, and their total UTF-8 bytes (the reference's limits).
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_BYTES = 16 * 1024
#: The largest values the reference's bindings convert: its counts and seeds are uint64, its
#: ``top_k`` and ``no_repeat_ngram_size`` int32 (anything larger is a TypeError there).
UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1


def _count(value: Any, what: str, limit: int = UINT64_MAX) -> int:
    """A non-negative int up to ``limit`` (the reference's unsigned arguments: anything else
    is a TypeError, as its binding raises)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ArgumentTypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ArgumentTypeError(f"{what} must be >= 0, got {value}")
    if value > limit:
        raise ArgumentTypeError(f"{what} must be at most {limit}, got {value}")
    return int(value)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ArgumentTypeError(f"{what} must be a number, got {type(value).__name__}")
    return float(value)


def _greedy_conflict(search: SearchOptions, explicit: dict[str, Any]) -> str | None:
    """The reference's refusal (its words) of a turn that resolves to the top logit yet sets
    sampling options that would change a sampled choice, or that sets do_sample=true while
    only the model's defaults make it greedy; None when the turn is consistent. ``search``:
    the turn's options over the model's, ``explicit``: those the turn set."""
    causes = []  # (why, the default that says so, the turn set it)
    if not search.do_sample:
        causes.append(("do_sample is false", "search.do_sample = false", "do_sample" in explicit))
    if search.top_k == 1:
        causes.append(("top_k is 1", "search.top_k = 1", "top_k" in explicit))
    if search.temperature == 0.0:
        causes.append(("temperature is 0", "search.temperature = 0", "temperature" in explicit))
    if not causes:
        return None
    if explicit.get("do_sample") is True and not any(own for _, _, own in causes):
        defaults = " and ".join(default for _, default, _ in causes)
        return (
            "do_sample=true was explicitly set, but this turn still selects the top logit "
            f"because the model's own search defaults supply {defaults}. Set that field "
            "explicitly on the turn -- top_k above 1, or a nonzero temperature -- to request "
            "sampling, or drop do_sample to accept top-logit selection."
        )
    neutral = {  # values that choose the same token as the top logit
        "temperature": lambda v: v in (0.0, 1.0),
        "top_p": lambda v: v <= 0.0 or v >= 1.0,
        "top_k": lambda v: v <= 1,
    }
    contradicting = [
        name for name, ok in neutral.items() if name in explicit and not ok(explicit[name])
    ]
    if not contradicting:
        return None
    return (
        f"The resolved turn policy selects the top logit ({' and '.join(c[0] for c in causes)}), "
        f"so these explicitly set sampling options contradict it: {' '.join(contradicting)}. "
        "Either remove them or request sampling with do_sample=true, top_k != 1, and a nonzero "
        "temperature."
    )


def _no_constructor(self: Any, *args: Any, **kwargs: Any) -> None:
    raise TypeError(f"{type(self).__name__}: no constructor (the Engine makes these)")


class TurnUsage:
    """Token counts of a finished turn (zero on events that do not finish one)."""

    __slots__ = ("_cached", "_generated", "_prompt")
    __init__ = _no_constructor

    @classmethod
    def _make(cls, prompt: int = 0, cached: int = 0, generated: int = 0) -> TurnUsage:
        usage = object.__new__(cls)
        usage._prompt, usage._cached, usage._generated = prompt, cached, generated
        return usage

    @property
    def prompt_tokens(self) -> int:
        """Tokens the turn appended (`Request.begin_turn`)."""
        return self._prompt

    @property
    def cached_prompt_tokens(self) -> int:
        """Of ``prompt_tokens``, those whose KV came from the prefix cache."""
        return self._cached

    @property
    def generated_tokens(self) -> int:
        """Tokens the turn generated (an EOS that ended it is not counted)."""
        return self._generated

    def __repr__(self) -> str:
        return (
            f"TurnUsage(prompt_tokens={self._prompt}, cached_prompt_tokens={self._cached}, "
            f"generated_tokens={self._generated})"
        )


_NO_USAGE = TurnUsage._make()


class EngineEvent:
    """One event of `Engine.run`: a generated token, the end of a turn, or both (``flags``)."""

    __slots__ = ("_error", "_flags", "_reason", "_request", "_stop", "_token", "_turn", "_usage")
    __init__ = _no_constructor

    @classmethod
    def _make(
        cls,
        request: Request,
        turn_id: int,
        flags: EngineEventFlags,
        token: int | None = None,
        finish_reason: FinishReason = FinishReason.NONE,
        usage: TurnUsage = _NO_USAGE,
        stop_index: int | None = None,
        error_code: EngineErrorCode = EngineErrorCode.NONE,
    ) -> EngineEvent:
        event = object.__new__(cls)
        event._request, event._turn, event._flags, event._token = request, turn_id, flags, token
        event._reason, event._usage, event._stop, event._error = (
            finish_reason,
            usage,
            stop_index,
            error_code,
        )
        return event

    @property
    def flags(self) -> EngineEventFlags:
        """What the event carries: TOKEN, TURN_FINISHED (both when the last token ends the
        turn), FAILED."""
        return self._flags

    @property
    def request(self) -> Request:
        """The `Request` the event belongs to (the same object `Engine.create_request` made)."""
        return self._request

    @property
    def turn_id(self) -> int:
        """The turn (`Request.begin_turn`'s result)."""
        return self._turn

    @property
    def token(self) -> int | None:
        """The generated token (None on an event without TOKEN)."""
        return self._token

    @property
    def finish_reason(self) -> FinishReason:
        """Why the turn finished (NONE unless TURN_FINISHED)."""
        return self._reason

    @property
    def matched_stop_string_index(self) -> int | None:
        """Index in the turn's stop strings of the one that ended it (finish reason
        STOP_STRING), else None."""
        return self._stop

    @property
    def error_code(self) -> EngineErrorCode:
        """Why the turn failed (NONE unless FAILED)."""
        return self._error

    @property
    def usage(self) -> TurnUsage:
        """Token counts of the turn (all zero unless TURN_FINISHED)."""
        return self._usage

    def __repr__(self) -> str:
        return (
            f"EngineEvent(flags={self._flags!s}, turn_id={self._turn}, token={self._token}, "
            f"finish_reason={self._reason!s})"
        )


class EngineEventBuffer:
    """Where `Engine.run` puts the events of one call: ``len(buffer)`` events, ``buffer[i]``.
    Made by `Engine.create_event_buffer`; holds at most its capacity."""

    def __init__(self, engine: Engine, capacity: int, _token: object = None) -> None:
        if _token is not _BUFFER_TOKEN:
            raise TypeError("EngineEventBuffer: use Engine.create_event_buffer(capacity)")
        self._engine = engine
        self.capacity = capacity
        self._events: list[EngineEvent] = []

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, index: int) -> EngineEvent:
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise ArgumentTypeError(f"event index must be an int, got {type(index).__name__}")
        return self._events[index]

    def __iter__(self) -> Iterator[EngineEvent]:
        """``for event in buffer``: the events in order (as iterating by index does)."""
        return iter(self._events)

    def __repr__(self) -> str:
        return f"EngineEventBuffer({len(self._events)} of {self.capacity} events)"


_BUFFER_TOKEN = object()
_REQUEST_TOKEN = object()


class EngineCapabilities:
    """What an `Engine` can do at most (`Engine.get_capabilities`)."""

    __slots__ = ("_batch", "_length", "_scheduled")
    __init__ = _no_constructor

    @classmethod
    def _make(cls, batch: int, length: int, scheduled: int) -> EngineCapabilities:
        caps = object.__new__(cls)
        caps._batch, caps._length, caps._scheduled = batch, length, scheduled
        return caps

    @property
    def configured_max_batch_size(self) -> int:
        """Requests generating at the same time (the scheduler's slots)."""
        return self._batch

    @property
    def max_request_length(self) -> int:
        """Tokens one request may hold across its turns (the folder's ``search.max_length``
        when set, else the model's context length; `RequestOptions` may lower it)."""
        return self._length

    @property
    def max_scheduled_tokens(self) -> int:
        """Tokens one step runs at most (prompt chunks plus one decode row per slot)."""
        return self._scheduled

    def __repr__(self) -> str:
        return (
            f"EngineCapabilities(configured_max_batch_size={self._batch}, "
            f"max_request_length={self._length}, max_scheduled_tokens={self._scheduled})"
        )


class RequestOptions:
    """Options of a whole `Request` (`Engine.create_request(options=...)`)."""

    def __init__(self) -> None:
        self._max_session_tokens = 0

    def set_max_session_tokens(self, max_session_tokens: SupportsIndex) -> None:
        """Total tokens (prompt plus generated, across every turn) the request may reach.
        Zero uses the configured default (``search.max_length``, else the context length)."""
        self._max_session_tokens = _count(max_session_tokens, "max_session_tokens")


_T = TypeVar("_T")
_P = ParamSpec("_P")


def _owner_only(
    method: Callable[Concatenate[TurnOptions, _P], _T],
) -> Callable[Concatenate[TurnOptions, _P], _T]:
    """A `TurnOptions` method only the request's Engine owner thread may call (as the
    reference, which raises its owner-thread error for each)."""

    @functools.wraps(method)
    def checked(self: TurnOptions, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        self._request._engine._owner.check()
        return method(self, *args, **kwargs)

    return checked


class TurnOptions:
    """Options of one turn of ``request`` (passed to `Request.begin_turn`); unset options
    take the model's ``search`` defaults."""

    def __init__(self, request: Request) -> None:
        if not isinstance(request, Request):
            raise ArgumentTypeError(f"TurnOptions needs a Request, got {type(request).__name__}")
        with request._engine._owner:
            if request._closed:
                raise GenerationError("Cannot use a closed request.")
        self._request = request
        self._reset()

    @_owner_only
    def reset(self) -> None:
        """Restore every option to its unset state."""
        self._reset()

    def _reset(self) -> None:
        self._options: dict[str, Any] = {}
        self._stop: tuple[str, ...] = ()
        self._guidance: tuple[str, str] | None = None
        self._seed: int | None = None
        self._max_generated = 0
        self._min_generated = 0

    @_owner_only
    def set_max_generated_tokens(self, max_generated_tokens: SupportsIndex) -> None:
        """Cap the tokens this turn generates (zero: no cap but the session's)."""
        self._max_generated = _count(max_generated_tokens, "max_generated_tokens")

    @_owner_only
    def set_min_generated_tokens(self, min_generated_tokens: SupportsIndex) -> None:
        """Mask the end-of-sequence token until this turn generated this many (zero: none)."""
        self._min_generated = _count(min_generated_tokens, "min_generated_tokens")

    @_owner_only
    def set_do_sample(self, do_sample: bool | np.bool_) -> None:
        """Random sampling (True) or the top logit (False) for this turn."""
        if not isinstance(do_sample, bool | np.bool_):
            raise ArgumentTypeError(f"do_sample must be a bool, got {type(do_sample).__name__}")
        self._options["do_sample"] = bool(do_sample)

    @_owner_only
    def set_temperature(self, temperature: _Number) -> None:
        """Sampling temperature (zero: the top logit)."""
        self._options["temperature"] = _number(temperature, "temperature")

    @_owner_only
    def set_top_p(self, top_p: _Number) -> None:
        """Nucleus bound, between 0.0 and 1.0."""
        self._options["top_p"] = _number(top_p, "top_p")

    @_owner_only
    def set_top_k(self, top_k: SupportsIndex) -> None:
        """Top-k bound (one: the top logit; zero: no top-k)."""
        self._options["top_k"] = _count(top_k, "top_k", INT32_MAX)

    @_owner_only
    def set_repetition_penalty(self, repetition_penalty: _Number) -> None:
        """Repetition penalty; finite and greater than zero."""
        self._options["repetition_penalty"] = _number(repetition_penalty, "repetition_penalty")

    @_owner_only
    def set_no_repeat_ngram_size(self, no_repeat_ngram_size: SupportsIndex) -> None:
        """Forbid repeating any n-gram of this size (zero: off)."""
        self._options["no_repeat_ngram_size"] = _count(
            no_repeat_ngram_size, "no_repeat_ngram_size", INT32_MAX
        )

    @_owner_only
    def set_seed(self, seed: SupportsIndex) -> None:
        """Reseed the request's random streams at the start of this turn (zero is a seed; at
        most 2**64 - 1, the reference's uint64)."""
        self._seed = _count(seed, "seed")

    @_owner_only
    def clear_seed(self) -> None:
        """Remove a pending reseed."""
        self._seed = None

    @_owner_only
    def set_stop_strings(self, stop_strings: Sequence[str]) -> None:
        """Decoded-text stop strings of the turn (an empty list clears them); at most 16,
        none empty, 16 KiB in all."""
        if isinstance(stop_strings, str) or not isinstance(stop_strings, Sequence):
            raise ArgumentTypeError("stop strings must be a list of str")
        stops = list(stop_strings)
        if len(stops) > MAX_STOP_STRINGS:
            raise GenerationError(
                f"Too many stop strings: {len(stops)}, the maximum is {MAX_STOP_STRINGS}."
            )
        total = 0
        for index, stop in enumerate(stops):
            if not isinstance(stop, str):
                raise ArgumentTypeError(f"stop string {index} is a {type(stop).__name__}")
            try:  # the reference's binding cannot convert a lone surrogate: a TypeError
                size = len(stop.encode("utf-8"))
            except UnicodeEncodeError:
                raise ArgumentTypeError(
                    f"stop string {index} is not valid Unicode (it has a lone surrogate)"
                ) from None
            if not stop:
                raise GenerationError(f"Stop string at index {index} is empty.")
            if "\0" in stop:  # the reference's ValueError
                raise InvalidArgumentError("Stop strings must not contain an embedded NUL byte.")
            total += size
        if total > MAX_STOP_STRING_BYTES:
            raise GenerationError(
                f"Stop strings total {total} bytes, the maximum is {MAX_STOP_STRING_BYTES}."
            )
        self._stop = tuple(stops)

    @_owner_only
    def set_guidance(self, type: str, data: str) -> None:
        """Constrain this turn's output to a grammar: ``json_schema``, ``regex`` or
        ``lark_grammar`` (this turn only)."""
        if type not in GUIDANCE_TYPES:
            raise GenerationError(
                f"Unsupported guidance type: {type} (only json_schema, regex, and lark_grammar "
                "are supported)."
            )
        if not isinstance(data, str):
            raise ArgumentTypeError(f"guidance data must be a str, got {type(data).__name__}")
        self._guidance = (type, data)

    @_owner_only
    def clear_guidance(self) -> None:
        """Remove the grammar: the turn is unguided."""
        self._guidance = None


class _OwnerThread:
    """``with engine._owner:`` guards an operation: only the thread that made the engine may
    run it (the reference's rule; it keeps the scheduler single-threaded).

    On the main thread (where Python delivers Ctrl-C) with Python's own SIGINT handler, a
    Ctrl-C during an operation is held and raised as KeyboardInterrupt when the operation
    ends: a scheduler step or a lane's result cut half way would leave requests that never
    finish. Loops that run many steps stop early once one is held (`held`)."""

    __slots__ = ("_depth", "_previous", "held", "ident")

    def __init__(self) -> None:
        self.ident = threading.get_ident()
        self._depth = 0
        self._previous: Any = None
        self.held = False

    def check(self) -> None:
        if threading.get_ident() != self.ident:
            raise GenerationError("Engine operations must be called from the Engine owner thread.")

    def _hold(self, signum: int, frame: Any) -> None:
        self.held = True

    def __enter__(self) -> None:
        self.check()
        if (
            self._depth == 0
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self.held = False
            self._previous = signal.signal(signal.SIGINT, self._hold)
        self._depth += 1

    def __exit__(self, kind: object, *rest: object) -> None:
        self._depth -= 1
        if self._depth or self._previous is None:
            return None
        signal.signal(signal.SIGINT, self._previous)
        self._previous = None
        if self.held:
            self.held = False
            if kind is None:
                raise KeyboardInterrupt
        return None


class _Turn:
    """One turn: the scheduler's handle of its events (``cancelled`` is what it reads)."""

    __slots__ = (
        "cancelled",
        "finished",
        "generated",
        "id",
        "prompt_tokens",
        "request",
        "rerun",
        "session_bound",
        "stops",
    )

    def __init__(self, request: Request, turn_id: int, prompt_tokens: int) -> None:
        self.request = request
        self.id = turn_id
        self.prompt_tokens = prompt_tokens
        self.cancelled = False
        self.finished = False
        self.generated = 0
        #: Tokens of earlier turns run again with this one (the slot had been taken back).
        self.rerun = 0
        #: The session's limit, not the turn's, caps the tokens it generates.
        self.session_bound = False
        self.stops: tuple[str, ...] = ()


class Request:
    """One conversation of an `Engine` (`Engine.create_request`): turns one after another,
    its KV cache kept between them."""

    def __init__(
        self, engine: Engine, options: RequestOptions | None = None, _token: object = None
    ) -> None:
        if _token is not _REQUEST_TOKEN:  # e.g. og.Request(params), as newer reference examples
            raise TypeError(
                "Request objects are not created directly: use Engine.create_request() "
                "(as onnxruntime-genai 0.18, which has no Request constructor)"
            )
        self._engine = engine
        self._max_session = options._max_session_tokens if options is not None else 0
        self._closed = False
        self._turn: _Turn | None = None
        self._turns = 0
        self._failed = False
        #: Scheduler-side state (`genai.serve.scheduler._Sequence`) once a turn began, and
        #: the lane (scheduler) that holds it.
        self._seq: Any = None
        self._lane = 0
        #: The conversation's tokens so far (all turns), and where each turn began.
        self._tokens: list[int] = []
        self._starts: dict[int, int] = {}

    @property
    def _length(self) -> int:
        return len(self._tokens)

    # --- the reference's methods --------------------------------------------------------------
    def begin_turn(self, tokens: npt.ArrayLike, turn_options: TurnOptions | None = None) -> int:
        """Append ``tokens`` (int32 [n]) to the conversation and start generating; returns
        the turn's id (1, 2, ...). Only for a new request or once the last turn finished
        and its events were read (`Engine.run`)."""
        engine = self._engine
        with engine._owner:
            engine._settle()
            if self._closed:
                if self._turn is None:
                    raise GenerationError("Cannot use a closed request.")
                raise GenerationError("Cannot begin a turn for a closed request.")
            if turn_options is not None:
                if not isinstance(turn_options, TurnOptions):
                    raise ArgumentTypeError(
                        f"turn_options must be TurnOptions, got {type(turn_options).__name__}"
                    )
                if turn_options._request is not self:
                    raise GenerationError(
                        "Turn options belong to a different or destroyed Request."
                    )
            self._check_idle("continue")
            ids = engine._check_tokens(tokens)
            limit = engine._session_limit(self._max_session)
            room = limit - self._length - len(ids)
            if room < 1:
                raise GenerationError(
                    f"Appending input_tokens_count ({len(ids)}) to current_sequence_length "
                    f"({self._length}) must leave room for at least one generated token before "
                    f"max_session_tokens ({limit})."
                )
            options = turn_options if turn_options is not None else _DEFAULT_TURN
            request = engine._generation_request(ids, options, self._length, room)
            self._turns += 1
            turn = _Turn(self, self._turns, len(ids))
            cap = options._max_generated
            turn.session_bound = cap == 0 or room < cap
            turn.stops = options._stop
            engine._start(self, turn, request)
            self._starts[turn.id] = self._length
            self._tokens.extend(ids.tolist())
            self._turn = turn
            return turn.id

    def cancel_turn(self, turn_id: int) -> bool:
        """Stop turn ``turn_id`` at the next step boundary (its TURN_FINISHED event says
        CANCELLED). False when that turn is not the one running."""
        turn_id = _count(turn_id, "turn_id")
        with self._engine._owner:
            self._engine._settle()
            if self._closed:
                raise GenerationError("Cannot cancel a closed request.")
            turn = self._turn
            if turn is None:
                raise GenerationError("Cannot cancel a request before a turn has begun.")
            if turn.id != turn_id or turn.finished or turn.cancelled:
                return False
            turn.cancelled = True
            return True

    def rewind_to_start_of_turn(self, turn_id: int) -> None:
        """Rewind a request whose turn finished to where turn ``turn_id`` began (its tokens
        and every later turn's are dropped, KV included)."""
        turn_id = _count(turn_id, "turn_id")
        with self._engine._owner:
            self._engine._settle()
            if self._closed:
                raise GenerationError("Cannot rewind a closed request.")
            # the reference's words, also before any turn began
            if self._turn is None or not self._turn.finished:
                raise GenerationError(
                    "Request rewind is only valid after the current turn is complete."
                )
            self._check_idle("rewind")
            if turn_id not in self._starts:
                raise GenerationError(f"Cannot rewind to unknown Turn ID {turn_id}.")
            start = self._starts[turn_id]
            for later in [t for t in self._starts if t >= turn_id]:
                del self._starts[later]
            if self._engine._resident(self._seq):
                self._engine._schedulers[self._lane].truncate(self._seq, start)
            del self._tokens[start:]

    def set_draft_tokens(self, tokens: Any) -> None:
        """Propose speculative draft tokens for the next decode operation (needs an engine
        with speculative decoding: `Engine.max_draft_tokens_per_proposal` > 0)."""
        self._engine._owner.check()
        raise UnsupportedFeatureError(
            "This engine does not support speculative draft verification "
            "(Engine.max_draft_tokens_per_proposal() is 0)."
        )

    def close(self) -> None:
        """End the conversation: a running turn stops (no more events) and its slot is freed.
        Closing twice does nothing."""
        engine = self._engine
        with engine._owner:
            engine._settle()
            if self._closed:
                return
            self._closed = True
            if self._turn is not None:
                self._turn.cancelled = True
            if self._seq is not None:
                self._seq.hold = False
            engine._drop_events(self)

    # --- helpers ---------------------------------------------------------------------------------
    def _check_idle(self, action: str) -> None:
        turn = self._turn
        if turn is None:
            return
        if not turn.finished:
            raise GenerationError(
                "BeginTurn is only valid for a new request or after the current turn is complete."
            )
        if self._engine._has_events(self):
            raise GenerationError(
                f"Cannot {action} a request while an Engine event is pending; call "
                "Engine::Run() to drain the event before continuing."
            )
        if self._failed:
            raise GenerationError(f"Cannot {action} a Request whose current turn failed.")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._turns} turns, {self._length} tokens"
        return f"<genai.Request {state}>"


_DEFAULT_TURN: TurnOptions = TurnOptions.__new__(TurnOptions)
TurnOptions._reset(_DEFAULT_TURN)


class Engine:
    """Runs many `Request`s together with continuous batching (the reference's
    ``og.Engine``). See the module docstring."""

    def __init__(self, model: Model) -> None:
        if not isinstance(model, Model):
            raise ArgumentTypeError(f"Engine needs a Model, got {type(model).__name__}")
        config = model.config
        self._model = model
        slots = (
            config.get("engine.dynamic_batching.max_batch_size")
            or config.get("engine.static_batching.max_batch_size")
            or DEFAULT_MAX_BATCH_SIZE
        )
        slots = max(2, int(slots))
        self._tokenizer = Tokenizer(model)
        self._eos = [int(e) for e in config.eos_token_ids]
        # lanes: schedulers side by side, each on its own slots, as `genai serve` runs them
        # (genai.serve.scheduler_group); `run` steps them at the same time (`_advance`)
        lanes = max(1, min(default_lanes(model), slots // 2))
        self._runners = [
            make_batch_runner(
                model,
                slots * (k + 1) // lanes - slots * k // lanes,
                max_chunk=64,
                initial_capacity=256,
            )
            for k in range(lanes)
        ]
        shared = None
        if self._runners[0].export_prefix(0, 0) is not None:
            shared = PrefixCache(PREFIX_CACHE_BYTES)
        self._schedulers = [
            Scheduler(
                runner,
                self._tokenizer,
                self._eos,
                max_queue=1 << 30,
                request_timeout=math.inf,
                prefill_chunk=64,
                prefix_cache=shared,
                prefix_cache_bytes=PREFIX_CACHE_BYTES,
                overlap_prefill=lanes == 1,
                # a lone request decodes one row, as the reference's Engine runs it
                min_decode_rows=1,
            )
            for runner in self._runners
        ]
        #: Requests with a turn running, per lane (a new conversation goes to the least busy).
        self._busy = [0] * lanes
        #: Lane threads (several lanes), the lanes with a step in flight, finished steps.
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: set[int] = set()
        self._finished: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._context = int(config.context_length)
        self._vocab = int(model.io.vocab_size)
        search = SearchOptions()
        search.update(**(config.get("search", {}) or {}))
        self._search = search
        self._owner = _OwnerThread()
        #: Events made by the scheduler and not yet handed out by `run`.
        self._events: collections.deque[EngineEvent] = collections.deque()

    # --- the reference's methods ----------------------------------------------------------------
    def create_request(self, *, options: RequestOptions | None = None) -> Request:
        """A new conversation (no tokens yet: `Request.begin_turn` starts its first turn)."""
        if options is not None and not isinstance(options, RequestOptions):
            raise ArgumentTypeError(f"options must be RequestOptions, got {type(options).__name__}")
        with self._owner:
            if options is not None:
                session, bound = options._max_session_tokens, self._search.max_length
                bound = bound or self._context
                if session > bound:  # the reference refuses it here, with these words
                    raise GenerationError(
                        f"max_session_tokens ({session}) must be greater than zero and no "
                        f"greater than the model-configured search.max_length ({bound})."
                    )
                if session > self._context:  # (a folder's search.max_length above it)
                    raise GenerationError(
                        f"max_session_tokens ({session}) must be no greater than the model's "
                        f"context_length ({self._context})."
                    )
            return Request(self, options, _REQUEST_TOKEN)

    def create_event_buffer(self, capacity: int) -> EngineEventBuffer:
        """A buffer for `run`, holding at most ``capacity`` events per call."""
        capacity = _count(capacity, "capacity")
        with self._owner:
            return EngineEventBuffer(self, capacity, _BUFFER_TOKEN)

    def run(self, buffer: EngineEventBuffer) -> EngineEventBuffer:
        """Fill ``buffer`` with the next events (at most its capacity), running scheduler
        steps until there are some or no request has work left; returns ``buffer``. Events
        that do not fit wait for the next call."""
        if not isinstance(buffer, EngineEventBuffer):
            raise ArgumentTypeError(f"run needs an EngineEventBuffer, got {type(buffer).__name__}")
        if buffer._engine is not self:
            raise GenerationError("buffer must be used with the Engine that created it.")
        try:
            with self._owner:
                buffer._events = []
                if buffer.capacity == 0:
                    return buffer
                if len(self._schedulers) == 1:
                    scheduler = self._schedulers[0]
                    while not self._events and scheduler.has_work() and not self._owner.held:
                        self._translate(scheduler.step())
                else:
                    self._advance()
                take = min(buffer.capacity, len(self._events))
                buffer._events = [self._events.popleft() for _ in range(take)]
            return buffer
        except KeyboardInterrupt:  # the caller never sees them: they wait for the next call
            self._events.extendleft(reversed(buffer._events))
            buffer._events = []
            raise

    def has_pending_requests(self) -> bool:
        """True while a turn is generating or events wait for `run`."""
        with self._owner:
            return (
                bool(self._events)
                or bool(self._inflight)
                or any(s.has_work() for s in self._schedulers)
            )

    def get_capabilities(self) -> EngineCapabilities:
        """The engine's limits."""
        self._owner.check()
        slots = sum(int(runner.max_slots) for runner in self._runners)
        scheduled = slots + sum(s.prefill_budget for s in self._schedulers)
        return EngineCapabilities._make(slots, self._session_limit(0), scheduled)

    def max_draft_tokens_per_proposal(self) -> int:
        """Speculative draft tokens a request may attach to one proposal (0: unsupported)."""
        self._owner.check()
        return 0

    def get_speculative_stats(self) -> dict[str, Any]:
        """Cumulative speculative-decoding telemetry (all zero: no speculative decoding)."""
        self._owner.check()
        return SpeculativeCounters().as_reference_dict()  # the reference's keys, all zero

    # --- stepping ------------------------------------------------------------------------------
    def _advance(self) -> None:
        """Several lanes: step them on the lane threads until some events are made. A lane
        steps independently of the others (no lane waits for a slower one): `run` returns
        once a step made events, and the steps of other lanes may still be in flight then.

        Every step starts after the caller saw every event handed out so far (at a call of
        `run` that found none waiting, or right after a step that made none), and an
        operation that changes a request (`_settle`) first waits for the steps in flight and
        takes their events: so each request's events come one step at a time and a reaction
        to them applies from its next step (its tokens are those of lanes stepped together;
        only how far the lanes are from each other may differ)."""
        inflight = self._inflight
        while not self._events and not self._owner.held:
            for lane, scheduler in enumerate(self._schedulers):
                if lane not in inflight and scheduler.has_work():
                    self._launch(lane)
            if not inflight:
                return
            self._collect()

    def _launch(self, lane: int) -> None:
        """Start one iteration of ``lane``'s scheduler on a lane thread."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                len(self._schedulers), thread_name_prefix="genai-engine-lane"
            )
        self._inflight.add(lane)
        try:
            self._pool.submit(self._lane_step, lane)
        except RuntimeError:  # the interpreter is shutting down (a thread outlives main)
            self._lane_step(lane)  # the step on this thread: its result is queued all the same

    def _lane_step(self, lane: int) -> None:
        """Lane thread: one iteration; its events (or what it raised) go to `_collect`."""
        try:
            result: list[tuple[Any, Event]] | BaseException = self._schedulers[lane].step()
        except BaseException as exc:  # re-raised on the owner thread
            result = exc
        self._finished.put((lane, result))

    def _collect(self) -> None:
        """Wait for a lane step to finish; translate the events of every finished one."""
        done = [self._finished.get()]
        while not self._finished.empty():
            done.append(self._finished.get())
        failure = None
        for lane, result in done:
            self._inflight.discard(lane)
            if isinstance(result, BaseException):
                failure = failure or result
            else:
                self._translate(result)
        if failure is not None:
            raise failure

    def _settle(self) -> None:
        """Wait for every lane step in flight and take its events (before an operation that
        reads or changes what the schedulers hold)."""
        while self._inflight:
            self._collect()

    # --- helpers for Request ----------------------------------------------------------------------
    def _check_tokens(self, tokens: Any) -> np.ndarray:
        """``tokens`` as int32 [n]. As the reference's binding: any other shape (also [1, n])
        is a ValueError, and bool or float arrays are cast (floats toward zero); genai also
        refuses non-finite floats and ids outside the vocabulary."""
        try:
            ids = np.asarray(tokens)
        except Exception as exc:
            raise ArgumentTypeError(f"tokens must be an int32 array: {exc}") from None
        if ids.size and ids.dtype.kind not in "iubf":
            raise ArgumentTypeError(f"tokens must be integers, got {ids.dtype}")
        if ids.ndim != 1:
            raise InvalidArgumentError(
                f"tokens must be a one-dimensional array, got shape {ids.shape}."
            )
        if ids.dtype.kind == "f":
            if not np.isfinite(ids).all():
                raise InvalidArgumentError("tokens must be finite (got NaN or infinity)")
            ids = np.trunc(ids)
        if ids.size == 0:
            raise GenerationError("Expected at least one input token for generation. Received 0.")
        bad = np.flatnonzero((ids < 0) | (ids >= self._vocab))
        if bad.size:
            raise InvalidArgumentError(
                f"token {int(ids[bad[0]])} at index {int(bad[0])} is outside the vocabulary "
                f"[0, {self._vocab})"
            )
        return ids.astype(np.int32)

    def _session_limit(self, max_session: int) -> int:
        default = self._search.max_length or self._context
        limit = max_session or default
        return min(limit, self._context)

    def _generation_request(
        self, ids: np.ndarray, options: TurnOptions, start: int, room: int
    ) -> GenerationRequest:
        search = SearchOptions()
        search.update(**{name: getattr(self._search, name) for name in SearchOptions.names()})
        conflict = None
        try:  # a bad option is a RuntimeError, as the reference's
            search.update(**options._options)
            conflict = _greedy_conflict(search, options._options)
            search.max_length = 0
            if options._seed is not None:
                search.random_seed = options._seed
            if search.temperature == 0.0:
                search.do_sample, search.temperature = False, 1.0
            search.validate(self._context, self._vocab)
        except GenaiError as exc:
            raise GenerationError(str(exc)) from None
        # the reference's order: values, then the policy, then the lengths, then the grammar
        if conflict is not None:
            raise GenerationError(conflict)
        if search.do_sample and search.top_k > self._vocab and "top_k" in options._options:
            raise GenerationError(
                f"top_k ({search.top_k}) must be less than or equal to vocab_size ({self._vocab})."
            )
        if search.do_sample and search.top_k == 0 and search.top_p <= 0.0:
            raise GenerationError(
                "A sampled turn requires a positive top_k or a positive top_p; both are 0."
            )
        least, cap, prompt = options._min_generated, options._max_generated, start + len(ids)
        if cap and least > cap:
            raise GenerationError(
                f"min_generated_tokens ({least}) must not exceed max_generated_tokens ({cap})."
            )
        if least > room:
            raise GenerationError(
                f"min_generated_tokens ({least}) does not fit between the turn's prompt length "
                f"({prompt}) and max_session_tokens ({prompt + room})."
            )
        search.min_length = prompt + least
        factory = None
        if options._guidance is not None:
            kind, data = options._guidance
            tokenizer, vocab = self._tokenizer, self._vocab
            try:  # a bad grammar is a RuntimeError, as the reference's
                TokenConstraint.create(tokenizer, kind, data, vocab_size=vocab)
            except GenaiError as exc:
                raise GenerationError(str(exc)) from None

            def factory() -> TokenConstraint:
                return TokenConstraint.create(tokenizer, kind, data, vocab_size=vocab)

        cap = options._max_generated
        return GenerationRequest(
            prompt=ids,
            max_new_tokens=min(cap, room) if cap else room,
            sampling=search,
            stop=options._stop,
            constraint_factory=factory,
            detokenize=False,  # events carry token ids (stop strings decode their own text)
        )

    def _start(self, request: Request, turn: _Turn, generation: GenerationRequest) -> None:
        """Queue ``turn``: a next turn on the request's held slot, or a new sequence (its
        first turn, or the whole conversation again when its slot was taken back)."""
        seq = request._seq
        if self._resident(seq):
            self._schedulers[request._lane].resume(seq, generation, turn)
            self._busy[request._lane] += 1
            return
        if request._tokens:  # the slot was taken back: run the conversation again
            history = np.asarray(request._tokens, np.int32)
            turn.rerun = len(history)
            generation.prompt = np.concatenate([history, generation.prompt])
        lane = min(range(len(self._busy)), key=self._busy.__getitem__)
        (request._seq,) = self._schedulers[lane].enqueue(turn, [generation], bounded=False)
        request._seq.hold = True
        request._lane = lane
        self._busy[lane] += 1

    @staticmethod
    def _resident(seq: Any) -> bool:
        """True when ``seq`` (a finished turn's sequence) still holds its slot and KV."""
        return (
            seq is not None
            and seq.hold
            and not seq.evicted
            and seq.slot >= 0
            and seq.finished is not None
        )

    def _has_events(self, request: Request) -> bool:
        return any(event._request is request for event in self._events)

    def _drop_events(self, request: Request) -> None:
        self._events = collections.deque(e for e in self._events if e._request is not request)

    def _translate(self, events: list[tuple[Any, Event]]) -> None:
        """Scheduler events -> `EngineEvent`s, one per token; the last one of a turn is
        TURN_FINISHED too, or a TURN_FINISHED of its own when no token ends it (EOS, also a
        completed grammar's, cancellation), as the reference's."""
        for turn, event in events:
            request = turn.request
            if turn.finished:
                continue
            if request._closed:  # no more events; the turn ends at this step
                if event.finish_reason is not None:
                    turn.finished = True
                    self._busy[request._lane] -= 1
                continue
            tokens = event.tokens
            turn.generated = event.completion_tokens or turn.generated + len(tokens)
            done = event.finish_reason is not None
            # the token that ends the turn comes on its TURN_FINISHED event; an EOS end (a
            # grammar's too: the reference's next step samples the EOS it forces) is an event
            # of its own
            closing = None
            if done and tokens and event.reason is not FinishReason.EOS:
                closing = tokens[-1]
            request._tokens.extend(tokens)
            for token in tokens[: len(tokens) - (closing is not None)]:
                self._events.append(
                    EngineEvent._make(request, turn.id, EngineEventFlags.TOKEN, token)
                )
            if done:
                self._finish(turn, event, closing)

    def _finish(self, turn: _Turn, event: Event, token: int | None) -> None:
        request = turn.request
        turn.finished = True
        self._busy[request._lane] -= 1
        reason = event.reason
        if reason is FinishReason.MAX_GENERATED_TOKENS and turn.session_bound:
            reason = FinishReason.MAX_SESSION_TOKENS
        flags = EngineEventFlags.TURN_FINISHED
        if token is not None:
            flags |= EngineEventFlags.TOKEN
        error = EngineErrorCode.NONE
        if reason is FinishReason.FAILED:
            flags |= EngineEventFlags.FAILED
            error = EngineErrorCode.ENGINE_EXECUTION_FAILURE
            request._failed = True
        stop = None
        if event.stop is not None and event.stop in turn.stops:
            stop = turn.stops.index(event.stop)
        cached = max(0, event.cached_tokens - turn.rerun)
        usage = TurnUsage._make(turn.prompt_tokens, min(cached, turn.prompt_tokens), turn.generated)
        self._events.append(
            EngineEvent._make(request, turn.id, flags, token, reason, usage, stop, error)
        )
