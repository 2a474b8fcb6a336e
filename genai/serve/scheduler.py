"""Continuous batching: a scheduler thread that runs every active request in one batched
model step at a time.

Requests (`GenerationRequest`) wait in a bounded queue; the scheduler thread admits them into
free KV slots of a `BatchRunner` at step boundaries. Each iteration it

1. drops cancelled / timed-out requests (their slots are freed at once);
2. admits waiting requests into free slots (a cached prompt prefix is copied into the slot);
3. runs prefill chunks (at most ``prefill_chunk`` tokens each, ``prefill_budget`` tokens in
   all) of the oldest newcomers, so a long prompt is spread over several iterations while
   the others keep decoding;
4. runs one decode step for every slot that is generating, in one batched model run, and
   chooses each row's token through its own `LogitsChain` (options, RNG stream, logit bias,
   grammar constraint, custom processors: the chain `Generator` uses too).

With ``overlap_prefill``, steps 3 and 4 run at the same time, the prefill on a second thread,
when both have work (the newcomers' slots are filler rows of that decode step, which never
touch a prefill's positions; see `SlotBatchRunner.decode`); a small prefill backlog is then
cut to about the step's size so that both end together. To use more cores, a
`SchedulerGroup` runs several schedulers side by side. ``stats`` counts where the scheduler
thread's time goes (``/metrics``).

For `genai.engine` (the reference's ``og.Engine``) the caller's thread drives the scheduler
with `step` instead of `start`, and a sequence may `hold` its slot after it finishes: `resume`
runs its next turn on the KV it kept, `truncate` rewinds it, held slots move behind the running
ones (no filler rows for them) and are evicted when a waiting sequence needs a slot.

Results go back to the asyncio side through ``loop.call_soon_threadsafe`` into a per-request
`asyncio.Queue` (`RequestHandle`). The model runs release the GIL, so the event loop keeps
serving HTTP while a step runs.

Exactness: ONNX Runtime's CPU kernels take another code path for a single row (M = 1: the
matrix-vector kernels) than for several. Any row's logits are bit-identical whatever else is
in a run of two or more rows, and a prompt's KV is bit-identical however it is cut into
chunks of two or more tokens; a single-row run differs by ~1e-5. So a decode step always runs
at least two rows (an idle slot fills in), a prefill never leaves a one-token chunk, and a
cached prefix always leaves at least two prompt tokens to run: a request's tokens do not
depend on what else is running or on what the prefix cache holds (tests/test_serve*.py check
both).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from genai.compat.engine_enums import FinishReason
from genai.constraints.stop import StopStringMatcher
from genai.errors import GenaiError
from genai.generation.logits import LogitsChain, ProcessorLike
from genai.generation.search import SearchOptions
from genai.generation.speculative.policy import Backoff
from genai.serve.batch_runner import BatchRunner
from genai.serve.speculative import DraftSlotProposer, SlotProposer, SpeculativeServing

__all__ = [
    "Event",
    "GenerationRequest",
    "PrefixCache",
    "QueueFullError",
    "RequestHandle",
    "Scheduler",
]

#: At or below it a log-probability is a masked token's (its logit: float32's lowest).
_MASKED_LOGPROB = -1e30

log = logging.getLogger("genai.serve")


def _deliver(batch: list[tuple[RequestHandle, Event]]) -> None:
    """Event loop side of `Scheduler._flush`."""
    for handle, event in batch:
        handle._queue.put_nowait(event)


class QueueFullError(GenaiError, RuntimeError):
    """The waiting queue is full (HTTP 429)."""


class TooManySequencesError(GenaiError, ValueError):
    """A request has more sequences than the scheduler holds even when idle (HTTP 400: a
    retry cannot succeed)."""


def check_capacity(count: int, capacity: int) -> None:
    """Raise `TooManySequencesError` when ``count`` sequences exceed ``capacity``."""
    if count > capacity:
        raise TooManySequencesError(
            f"the request asks for {count} sequences (prompts x n) but the server holds at most "
            f"{capacity} at once (its slots and queue: --max-slots + --max-queue)"
        )


@dataclass
class GenerationRequest:
    """One sequence to generate (a choice of an API request)."""

    prompt: np.ndarray
    max_new_tokens: int
    #: Sampling options (only their sampling part and ``random_seed``, ``logprobs``,
    #: ``top_logprobs`` are read); the default samples at temperature 1, as OpenAI's API.
    sampling: SearchOptions = field(default_factory=SearchOptions.from_openai)
    stop: Sequence[str] = ()
    #: Made in the scheduler thread when the request is admitted (grammar constraints).
    constraint_factory: Callable[[], Any] | None = None
    #: Index of the choice in the API response.
    index: int = 0
    ignore_eos: bool = False
    #: ``{token id: bias}`` added to the logits every step (OpenAI's ``logit_bias``).
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: Custom stages of the logits chain (`genai.generation.logits.LogitsProcessor`).
    logits_processors: Sequence[ProcessorLike] = ()
    #: A multimodal prompt: the processor's `NamedTensors` (images and ``input_ids``;
    #: ``prompt`` holds the same ids). It goes in whole, in one prefill chunk, through the
    #: runner's ``prefill_inputs``, and is never taken from or put in the prefix cache.
    inputs: Any = None
    #: False: never speculate for this sequence (a server started with ``--speculative``).
    speculative: bool = True
    #: False: the events carry tokens but no text (a caller that reads tokens only, such as
    #: `genai.engine`; stop strings still decode the text they need to match).
    detokenize: bool = True


@dataclass
class Event:
    """What a request produced in one step: new text (possibly empty) and the tokens behind
    it; the last event of a sequence has ``finish_reason`` set ("stop", "length", "timeout",
    "cancelled", "error")."""

    index: int
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    #: Per token: (logprob, [(id, logprob), ...]) when log-probabilities were asked for.
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None
    finish_reason: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    #: Why the sequence finished, in the reference's terms (set with ``finish_reason``).
    reason: FinishReason = FinishReason.NONE
    #: The stop string that ended it (``reason`` STOP_STRING).
    stop: str | None = None


#: `Event.reason` of the ends that `Scheduler._finish` reports.
_REASONS = {
    "cancelled": FinishReason.CANCELLED,
    "timeout": FinishReason.CANCELLED,
    "error": FinishReason.FAILED,
    "length": FinishReason.MAX_SESSION_TOKENS,
}


class RequestHandle:
    """The asyncio side of a group of sequences (the choices of one API request): iterate
    the events with ``async for``; `cancel` stops them at the next step boundary."""

    def __init__(
        self, wake: Callable[[], None], count: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        #: Wakes the scheduler thread(s) that may hold the sequences (`cancel`).
        self._wake = wake
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._loop = loop
        self._remaining = count
        self.cancelled = False

    def cancel(self) -> None:
        """Stop generating (the client went away); frees the slots at the next step."""
        if not self.cancelled:
            self.cancelled = True
            self._wake()

    def __aiter__(self) -> RequestHandle:
        return self

    async def __anext__(self) -> Event:
        if self._remaining <= 0:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event.finish_reason is not None:
            self._remaining -= 1
        return event


@dataclass
class _Sequence:
    """Scheduler-thread state of one sequence."""

    request: GenerationRequest
    handle: RequestHandle
    deadline: float
    enqueued: float
    slot: int = -1
    #: Tokens to feed before the next choice (the prompt, then forced tokens).
    pending: np.ndarray | None = None
    prefilling: bool = True
    history: np.ndarray = field(default_factory=lambda: np.zeros((1, 0), np.int32))
    length: int = 0
    generated: int = 0
    cached: int = 0
    chain: LogitsChain | None = None
    stream: Any = None
    stopper: Any = None
    next_token: int = -1
    finished: str | None = None
    first_token: bool = True
    looked_up: bool = False
    #: Keep the slot (and its KV) once finished, for a next turn (`Scheduler.resume`);
    #: `Scheduler.evict` frees it when a waiting sequence needs the slot.
    hold: bool = False
    #: The slot was taken back while held: the KV is gone (a next turn runs it again).
    evicted: bool = False
    #: A later turn of a held sequence: its prompt does not start at position 0.
    resumed: bool = False
    #: Proposer of a speculating sequence (made at its first proposal).
    proposer: SlotProposer | DraftSlotProposer | None = None
    #: False once its proposer failed (the turn goes on with plain steps).
    speculate: bool = True
    #: Pauses its verify runs while they are slower than plain steps (made with the proposer).
    backoff: Backoff | None = None


class PrefixCache:
    """KV of earlier prompts, least recently used first out, bounded by bytes. A new prompt
    reuses the longest common prefix with any stored prompt (at least ``min_tokens``),
    leaving at least two tokens to run (see the module docstring). Thread-safe: the
    schedulers of a `SchedulerGroup` share one."""

    def __init__(self, max_bytes: int, min_tokens: int = 8) -> None:
        self._lock = threading.Lock()
        self.max_bytes = max_bytes
        self.min_tokens = max(1, min_tokens)
        self._entries: collections.OrderedDict[bytes, tuple[np.ndarray, list[np.ndarray]]] = (
            collections.OrderedDict()
        )
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def lookup(self, prompt: np.ndarray) -> tuple[int, list[np.ndarray] | None]:
        """The longest cached prefix of ``prompt`` that leaves at least two tokens to run:
        (length, kv arrays) or (0, None)."""
        with self._lock:
            return self._lookup(prompt)

    def _lookup(self, prompt: np.ndarray) -> tuple[int, list[np.ndarray] | None]:
        best, best_key = 0, None
        limit = len(prompt) - 2
        for key, (tokens, _) in self._entries.items():
            n = min(len(tokens), limit)
            if n <= max(best, self.min_tokens - 1):
                continue
            differ = np.flatnonzero(tokens[:n] != prompt[:n])
            n = int(differ[0]) if differ.size else n
            if n > best and n >= self.min_tokens:
                best, best_key = n, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.reused_tokens += best
        return best, self._entries[best_key][1]

    def covers(self, prompt: np.ndarray, length: int) -> bool:
        """True when an entry already holds ``prompt[:length]``."""
        with self._lock:
            entries = list(self._entries.values())
        for tokens, _ in entries:
            if len(tokens) >= length and np.array_equal(tokens[:length], prompt[:length]):
                return True
        return False

    def add(self, tokens: np.ndarray, kv: list[np.ndarray]) -> None:
        """Store the KV of ``tokens`` (a prompt)."""
        size = sum(a.nbytes for a in kv)
        if size > self.max_bytes:
            return
        key = tokens.tobytes()
        with self._lock:
            self._add(key, tokens, kv, size)

    def _add(self, key: bytes, tokens: np.ndarray, kv: list[np.ndarray], size: int) -> None:
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        self._entries[key] = (tokens.copy(), kv)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, (_, old) = self._entries.popitem(last=False)
            self.nbytes -= sum(a.nbytes for a in old)


class Scheduler:
    """Runs `GenerationRequest`s on a `BatchRunner` with continuous batching (see the module
    docstring). Start with `start`, stop with `shutdown`."""

    def __init__(
        self,
        runner: BatchRunner,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        *,
        max_queue: int = 64,
        request_timeout: float = 600.0,
        prefill_chunk: int = 64,
        prefill_budget: int = 64,
        prefix_cache_bytes: int = 256 << 20,
        overlap_prefill: bool = True,
        metrics: Any = None,
        prefix_cache: PrefixCache | None = None,
        speculative: SpeculativeServing | None = None,
        min_decode_rows: int = 2,
    ) -> None:
        self.runner = runner
        #: Rows a batched decode step runs at least (idle slots fill in): 2 keeps a request's
        #: tokens independent of what else runs (module docstring); 1 runs a lone sequence
        #: as the reference's Engine does (the same M = 1 kernels, hence its exact tokens).
        self.min_decode_rows = max(1, int(min_decode_rows))
        self.tokenizer = tokenizer
        self.eos = np.asarray(list(eos_token_ids), np.int32)
        self._eos_set = {int(e) for e in self.eos}
        self.max_queue = max_queue
        self.request_timeout = request_timeout
        # at least 3: a chunk of 2 before a 3-token rest becomes 3 (no one-token chunks)
        self.prefill_chunk = max(3, min(prefill_chunk, getattr(runner, "max_chunk", prefill_chunk)))
        #: Prompt tokens fed per iteration at most (whole chunks; at least one chunk).
        self.prefill_budget = max(prefill_budget, self.prefill_chunk)
        #: Prompt KV kept for reuse: ``prefix_cache`` when given (shared with other
        #: schedulers of a `SchedulerGroup`), else a cache of ``prefix_cache_bytes``.
        self.prefix_cache = prefix_cache
        owns = prefix_cache is None and prefix_cache_bytes > 0
        if owns and runner.export_prefix(0, 0) is not None:
            self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.metrics = metrics
        #: Prompt-lookup speculation for decoding sequences (None: plain steps); a runner
        #: that cannot verify serves plainly.
        self.speculative = speculative
        if speculative is not None:
            speculative.check_target(runner.vocab_size)
        if speculative is not None and runner.verify_tokens < 2:
            log.warning(
                "serving without speculative decoding: %s cannot verify proposed tokens "
                "(the graph returns the last position's logits only, or its runner has no "
                "verify runs); requests take plain decode steps",
                type(runner).__name__,
            )
            self.speculative = None
        #: Run prefill chunks on a second thread while the decode step runs.
        self.overlap_prefill = overlap_prefill and runner.batched
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: Events of this iteration, delivered at its end (`_flush`).
        self._outbox: list[tuple[RequestHandle, Event]] = []
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._active: list[_Sequence] = []  # index == slot
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: Set by a `SchedulerGroup`: takes a waiting sequence from another scheduler of the
        #: group when this one has a free slot and nothing waiting (None: no such source).
        self.steal: Callable[[Scheduler], _Sequence | None] | None = None
        #: Set by a `SchedulerGroup`: True while another scheduler of the group has requests
        #: waiting (an idle scheduler with free slots then keeps iterating to take them).
        self.others_waiting: Callable[[Scheduler], bool] | None = None
        #: Tokens generated since start (all requests).
        self.generated_tokens = 0
        #: Scheduler iterations so far.
        self.steps = 0
        #: Where the scheduler thread's time went (seconds) and what the model ran: waiting
        #: for work (``idle_seconds``), model runs (``model_seconds``, wall time: concurrent
        #: runs count once; ``model_cpu_seconds``, the CPU time of the threads running them),
        #: the rest of the iterations (``host_seconds``: admission, sampling, detokenizing,
        #: events).
        self.stats: dict[str, float] = dict.fromkeys(
            (
                "idle_seconds",
                "model_seconds",
                "model_cpu_seconds",
                "host_seconds",
                "decode_steps",
                "decode_rows",
                "decode_advancing_rows",
                "prefill_tokens",
                "prefill_runs",
                "speculative_proposed_tokens",
                "speculative_accepted_tokens",
                "speculative_emitted_tokens",
                "speculative_target_runs",
                "speculative_backoff_steps",
            ),
            0,
        )

    # --- public (asyncio side) -------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Sequences not in a slot yet (waiting for the scheduler thread to admit them)."""
        return len(self._waiting)

    @property
    def free_slots(self) -> int:
        """Slots no sequence holds."""
        return max(0, self.runner.max_slots - len(self._active))

    @property
    def queued(self) -> int:
        """Sequences waiting beyond the free slots: what ``max_queue`` bounds (a sequence
        about to move into a free slot does not count)."""
        return max(0, len(self._waiting) - self.free_slots)

    @property
    def capacity(self) -> int:
        """The most sequences one request may have: the slots and the queue."""
        return self.runner.max_slots + self.max_queue

    @property
    def running(self) -> int:
        """Sequences holding a slot."""
        return len(self._active)

    def start(self) -> None:
        """Start the scheduler thread."""
        if self._thread is None:
            self._stopping = False
            if self.overlap_prefill and self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="genai-prefill"
                )
            self._thread = threading.Thread(target=self._run, name="genai-scheduler", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread; sequences still running end with finish_reason "cancelled"."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def submit(
        self,
        requests: Sequence[GenerationRequest],
        loop: asyncio.AbstractEventLoop | None = None,
        timeout: float | None = None,
    ) -> RequestHandle:
        """Queue ``requests`` (the choices of one API request); raises `QueueFullError` when
        the queue cannot take them all."""
        loop = loop or asyncio.get_running_loop()
        handle = RequestHandle(self._wake, len(requests), loop)
        self.enqueue(handle, requests, timeout)
        return handle

    def enqueue(
        self,
        handle: RequestHandle,
        requests: Sequence[GenerationRequest],
        timeout: float | None = None,
        *,
        bounded: bool = True,
    ) -> list[_Sequence]:
        """Queue ``requests`` whose events go to ``handle`` (`submit` without making the
        handle; a `SchedulerGroup` makes it, checks its own bound and passes ``bounded=False``).
        Raises `QueueFullError` like `submit` when the sequences waiting beyond the free slots
        would exceed ``max_queue``. Returns their scheduler-side state (`resume` takes it)."""
        if bounded:
            check_capacity(len(requests), self.capacity)
        now = time.monotonic()
        deadline = now + (self.request_timeout if timeout is None else timeout)
        with self._cond:
            queued = max(0, len(self._waiting) + len(requests) - self.free_slots)
            if bounded and queued > self.max_queue:
                raise QueueFullError(
                    f"the server is busy: {self.queued} requests are waiting for a slot "
                    f"(queue limit {self.max_queue}); retry later"
                )
            added = [_Sequence(request, handle, deadline, now) for request in requests]
            self._waiting.extend(added)
            self._cond.notify_all()
        return added

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def take_waiting(self) -> _Sequence | None:
        """Any thread: remove and return the oldest waiting sequence (None: none waits)."""
        with self._cond:
            return self._waiting.popleft() if self._waiting else None

    def _post(self, handle: RequestHandle, event: Event) -> None:
        """Scheduler thread: queue ``event`` for delivery (`_flush`, once per iteration)."""
        self._outbox.append((handle, event))

    def _flush(self) -> None:
        """Deliver the queued events: one ``call_soon_threadsafe`` per event loop and
        iteration, not one per token (fewer wake-ups of the loop and GIL hand-offs)."""
        if not self._outbox:
            return
        items, self._outbox = self._outbox, []
        by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list]] = {}
        for handle, event in items:
            by_loop.setdefault(id(handle._loop), (handle._loop, []))[1].append((handle, event))
        for loop, batch in by_loop.values():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the loop is closed: nobody is listening
                for handle, _ in batch:
                    handle.cancelled = True

    # --- the scheduler thread -----------------------------------------------------------------
    def _run(self) -> None:
        stats = self.stats
        while True:
            waited = time.perf_counter()
            with self._cond:
                while not (
                    self._stopping
                    or self.has_work()
                    or (self.others_waiting is not None and self.others_waiting(self))
                ):
                    self._cond.wait()
                if self._stopping:
                    break
            began = time.perf_counter()
            stats["idle_seconds"] += began - waited
            model = stats["model_seconds"]
            self._guarded_iteration()
            self._flush()
            busy = time.perf_counter() - began
            stats["host_seconds"] += busy - (stats["model_seconds"] - model)
        with self._cond:
            pending = list(self._waiting) + list(self._active)
            self._waiting.clear()
        for seq in pending:
            self._post(
                seq.handle,
                Event(seq.request.index, finish_reason="cancelled", reason=FinishReason.CANCELLED),
            )
        self._flush()
        self._active.clear()

    def has_work(self) -> bool:
        """True while a sequence waits or generates (held finished ones do not count)."""
        return bool(self._waiting) or any(s.finished is None for s in self._active)

    def step(self) -> list[tuple[Any, Event]]:
        """Run one iteration on the calling thread and return its events as (handle,
        event) pairs, for a caller that drives the scheduler itself (`genai.engine`) instead
        of `start`-ing its thread; a handle is then any object with a ``cancelled`` flag."""
        if self.overlap_prefill and self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="genai-prefill"
            )
        if self.has_work():
            self._guarded_iteration()
        events, self._outbox = self._outbox, []
        return events

    def _guarded_iteration(self) -> None:
        try:
            self._iteration()
        except Exception as exc:  # a bug or an ORT failure: fail the running requests
            log.exception("scheduler step failed")
            for seq in list(self._active):
                self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")
            self._release_finished()

    def _iteration(self) -> None:
        now = time.monotonic()
        # 1. cancellations and timeouts
        for seq in self._active:
            if seq.handle.cancelled:
                self._finish(seq, "cancelled")
            elif now > seq.deadline:
                self._finish(seq, "timeout")
        with self._cond:
            keep: collections.deque[_Sequence] = collections.deque()
            dropped = []
            for seq in self._waiting:
                if seq.handle.cancelled or now > seq.deadline:
                    dropped.append(seq)
                else:
                    keep.append(seq)
            self._waiting = keep
        for seq in dropped:
            reason = "cancelled" if seq.handle.cancelled else "timeout"
            event = Event(seq.request.index, finish_reason=reason, reason=_REASONS[reason])
            self._post(seq.handle, event)
        self._release_finished()
        # 2. admissions: from this scheduler's queue, then from the group's others
        if self._waiting and len(self._active) >= self.runner.max_slots:
            self.evict(len(self._waiting))
        while len(self._active) < self.runner.max_slots:
            seq = self.take_waiting()
            if seq is None and self.steal is not None:
                seq = self.steal(self)
            if seq is None:
                break
            try:
                self._admit(seq)
            except Exception as exc:
                log.exception("could not start a request")
                self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")
        self._pack_held()
        # 3. prefill chunks of the oldest newcomers (up to the per-step token budget) and
        # 4. one decode step for every generating slot; with a pool, the prefills run beside
        # the decode step (their slots are filler rows of the step)
        decoding = [s for s in self._active if not s.prefilling and s.finished is None]
        speculating: list[tuple[_Sequence, list[int]]] = []
        spec = self.speculative
        if spec is not None and len(decoding) <= spec.max_streams:
            plain = []
            for seq in decoding:
                proposal = self._propose(seq)
                if proposal:
                    speculating.append((seq, proposal))
                else:
                    plain.append(seq)
            decoding = plain
        plan = self._plan_prefill(len(decoding) if self._pool is not None else 0)
        inputs = self._decode_inputs(decoding) if decoding else None
        needed = 0
        if inputs is not None:
            real = np.flatnonzero(inputs[1])
            needed = int(self.runner.lengths[real].max()) + 2
        planned: dict[int, int] = {}
        for seq, count in plan:
            planned[seq.slot] = planned.get(seq.slot, int(self.runner.lengths[seq.slot])) + count
            # room for the whole prompt at once: one growth, not one per chunk
            whole = int(self.runner.lengths[seq.slot]) + len(seq.pending) + 1
            needed = max(needed, planned[seq.slot] + 1, whole)
        needed = min(needed, self.runner.max_length)
        if needed and hasattr(self.runner, "ensure"):
            self.runner.ensure(needed)
        prefilled: list[tuple[_Sequence, np.ndarray]] = []
        logits = None
        started = time.perf_counter()
        decode_cpu = 0.0
        future = None
        if plan and inputs is not None and self._pool is not None:
            self.runner.frozen = True
            try:
                future = self._pool.submit(self._run_prefill, plan)
            except RuntimeError:  # the interpreter is shutting down (a caller outlives main):
                self.runner.frozen = False  # no new threads: prefill and decode in turn
        if future is not None:
            try:
                try:
                    decode_cpu = time.thread_time()
                    logits = self.runner.decode(*inputs, filler_at=needed - 1)
                    decode_cpu = time.thread_time() - decode_cpu
                finally:
                    prefilled = future.result()
            finally:
                self.runner.frozen = False
        else:
            if plan:
                prefilled = self._run_prefill(plan)
            if inputs is not None:
                decode_cpu, decode_started = time.thread_time(), time.perf_counter()
                logits = self.runner.decode(*inputs)
                decode_cpu = time.thread_time() - decode_cpu
                if not plan:  # a plain step's time, for the speculating sequences' backoff
                    decode_ms = (time.perf_counter() - decode_started) * 1e3
                    for seq in decoding:
                        if seq.backoff is not None:
                            seq.backoff.plain_step(decode_ms)
        self.stats["model_cpu_seconds"] += decode_cpu  # after the prefill thread added its own
        self._account(started, plan, inputs)
        self._prefilled(prefilled)
        if logits is not None:
            for seq in decoding:
                self._choose_safely(seq, logits[seq.slot : seq.slot + 1])
        if speculating:
            # a server of one-row steps whose only decoding sequence is in slot 0 would have
            # decoded it in one-row steps: its verify run gets their numbers
            alone = (
                self.min_decode_rows == 1
                and not decoding
                and len(speculating) == 1
                and speculating[0][0].slot == 0
            )
            self._verify(speculating, alone)
        self._release_finished()
        self.steps += 1

    # --- speculative decoding (genai.serve.speculative) -------------------------------------------
    def _propose(self, seq: _Sequence) -> list[int]:
        """Prompt-lookup proposals to verify after ``seq``'s pending token ([]: a plain
        step). Requests with a grammar, log-probabilities or images step plainly."""
        request, spec = seq.request, self.speculative
        assert spec is not None
        if (
            not request.speculative
            or not seq.speculate
            or request.constraint_factory is not None
            or request.inputs is not None
            or request.sampling.logprobs
            or request.sampling.top_logprobs
        ):
            return []
        # the verify run feeds the pending token and the proposals; the last emitted token
        # stays pending: no proposal beyond max_new_tokens or the context
        count = min(
            spec.max_draft_tokens,
            self.runner.verify_tokens - 1,
            request.max_new_tokens - seq.generated - 1,
            self.runner.max_length - seq.length - 1,
        )
        if count < 1:
            return []
        try:
            if seq.proposer is None:
                seq.proposer = spec.proposer(request.sampling, self.eos, self.runner.max_length)
                seq.backoff = Backoff(spec.backoff)
            history = seq.history[0, : seq.length]
            backoff = seq.backoff
            assert backoff is not None
            if backoff.active:  # a prompt lookup counts the proposals it skips, a draft steps
                check = getattr(seq.proposer, "would_propose", None)
                if backoff.skip(None if check is None else lambda: check(history)):
                    self.stats["speculative_backoff_steps"] += 1
                return []
            if backoff.wants_plain_step:
                return []
            return seq.proposer.propose(history, count)
        except Exception as exc:  # a failing draft: this turn goes on with plain steps
            log.warning("speculative proposals failed, plain steps follow: %s", exc)
            seq.speculate = False
            return []

    def _verify(self, speculating: list[tuple[_Sequence, list[int]]], alone: bool) -> None:
        """Run every speculating sequence's pending token and proposals (one run each:
        `BatchRunner.verify_many`; ``alone``: standing for one-row decode steps), then accept
        per sequence (`_speculate`)."""
        runner, stats = self.runner, self.stats
        bases = [int(runner.lengths[seq.slot]) for seq, _ in speculating]
        batch = [
            (seq.slot, np.asarray([seq.next_token, *proposal], np.int32))
            for seq, proposal in speculating
        ]
        started, cpu = time.perf_counter(), time.thread_time()
        found = runner.verify_many(batch, alone)
        elapsed = time.perf_counter() - started
        stats["model_seconds"] += elapsed
        stats["model_cpu_seconds"] += time.thread_time() - cpu
        stats["speculative_target_runs"] += len(found)
        run_ms = elapsed * 1e3 / max(len(found), 1)  # the runs are one per sequence
        for (seq, proposal), base, rows in zip(speculating, bases, found, strict=True):
            try:
                self._speculate(seq, proposal, base, rows, run_ms)
            except Exception as exc:
                log.warning("sequence failed: %s", exc)
                self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")

    def _speculate(
        self, seq: _Sequence, proposal: list[int], base: int, rows: np.ndarray, run_ms: float
    ) -> None:
        """Emit the tokens of ``seq``'s verified ``proposal`` the request's chain agrees with,
        plus its own next one, and keep their KV (``base``: the slot's length before the
        verify run; ``rows``: its logits after the pending token and each proposal; ``run_ms``:
        the verify run's milliseconds)."""
        started = time.perf_counter()
        runner, stats = self.runner, self.stats
        chain = seq.chain
        assert chain is not None
        length = seq.length
        start = length - seq.generated
        emitted: list[int] = []
        accepted = 0
        for i in range(len(proposal) + 1):
            if i:  # the accepted proposal precedes row i's choice
                seq.history[0, length + i - 1] = proposal[i - 1]
            out = chain.process(
                rows[i : i + 1].copy(), seq.history, length + i, prompt_lengths=start
            )
            token = int(out[0])
            emitted.append(token)
            if i == len(proposal) or token != proposal[i] or token in self._eos_set:
                break
            accepted += 1
        stats["speculative_proposed_tokens"] += len(proposal)
        stats["speculative_accepted_tokens"] += accepted
        stats["speculative_emitted_tokens"] += len(emitted)
        if seq.backoff is not None:
            milliseconds = run_ms + (time.perf_counter() - started) * 1e3
            judged = min(len(emitted), len(proposal))
            seq.backoff.record(len(emitted), accepted, judged, milliseconds)
        self._emit(seq, emitted, None, verified=True)
        # the KV keeps the pending token and the accepted proposals (those in the history:
        # a stop string or max_tokens may have cut them)
        runner.truncate(seq.slot, min(base + 1 + accepted, seq.length))

    def _admit(self, seq: _Sequence) -> None:
        request = seq.request
        prompt = np.asarray(request.prompt, np.int32)
        slot = len(self._active)
        seq.slot = slot
        self._active.append(seq)
        self.runner.reset(slot)
        total = len(prompt) + request.max_new_tokens + 8
        seq.history = np.zeros((1, total), np.int32)
        seq.history[0, : len(prompt)] = prompt
        seq.length = len(prompt)
        self._start_turn(seq)
        seq.cached = 0
        seq.pending = prompt
        seq.prefilling = True
        # the prefix cache is consulted at the first prefill chunk: a newcomer admitted with
        # others then reuses the prompt of one whose prefill finished meanwhile

    def _start_turn(self, seq: _Sequence) -> None:
        """Make the logits chain, text stream and stop matcher of ``seq``'s request."""
        request = seq.request
        constraint = None
        if request.constraint_factory is not None:
            constraint = request.constraint_factory()
        seq.chain = LogitsChain.for_search(
            1,
            self.runner.vocab_size,
            self.eos,
            request.sampling,
            logit_bias=request.logit_bias,
            processors=request.logits_processors,
            constraints=[constraint] if constraint is not None else None,
            ban_eos=request.ignore_eos,
        )
        needs_text = request.detokenize or bool(request.stop)
        seq.stream = self.tokenizer.create_stream() if needs_text else None
        seq.stopper = StopStringMatcher(list(request.stop)) if request.stop else None
        seq.proposer, seq.speculate = None, True

    def resume(self, seq: _Sequence, request: GenerationRequest, handle: Any) -> None:
        """Start a next turn of the held, finished ``seq`` (not evicted): ``request.prompt``
        follows what it holds, whose KV stays in its slot; events go to ``handle``. Call from
        the thread that runs the iterations (`step`)."""
        if seq.finished is None or seq.evicted or not seq.hold:
            raise RuntimeError("resume needs a held sequence whose turn finished")
        prompt = np.asarray(request.prompt, np.int32)
        kept = int(self.runner.lengths[seq.slot])
        # the last chosen token of the previous turn is in the history but not yet run
        pending = np.concatenate([seq.history[0, kept : seq.length], prompt])
        total = seq.length + len(prompt) + request.max_new_tokens + 8
        if seq.history.shape[1] < total:
            history = np.zeros((1, total), np.int32)
            history[0, : seq.length] = seq.history[0, : seq.length]
            seq.history = history
        seq.history[0, seq.length : seq.length + len(prompt)] = prompt
        seq.length += len(prompt)
        if seq.chain is not None:
            with contextlib.suppress(Exception):
                seq.chain.close()
        seq.request, seq.handle = request, handle
        self._start_turn(seq)
        seq.pending, seq.prefilling = pending, True
        seq.generated, seq.cached, seq.finished = 0, 0, None
        seq.first_token, seq.looked_up, seq.resumed = True, True, True
        seq.enqueued = time.monotonic()
        seq.deadline = seq.enqueued + self.request_timeout

    def truncate(self, seq: _Sequence, length: int) -> None:
        """Cut the held, finished ``seq`` back to its first ``length`` tokens (its KV too)."""
        if seq.finished is None:
            raise RuntimeError("truncate needs a sequence whose turn finished")
        length = min(length, seq.length)
        if not seq.evicted and seq.hold and self.runner.lengths[seq.slot] > length:
            self.runner.truncate(seq.slot, length)
        seq.length = length

    def _pack_held(self) -> None:
        """Move sequences that hold their slot between turns behind the running ones, so a
        decode step's rows end at the last running slot (no filler rows for idle ones)."""
        active = self._active

        def idle(seq: _Sequence) -> bool:
            return seq.hold and seq.finished is not None

        low, high = 0, len(active) - 1
        while True:
            while low < high and not idle(active[low]):
                low += 1
            while high > low and idle(active[high]):
                high -= 1
            if low >= high:
                return
            self.runner.swap(low, high)
            active[low], active[high] = active[high], active[low]
            active[low].slot, active[high].slot = low, high

    def evict(self, count: int = 1) -> int:
        """Free up to ``count`` slots that held, finished sequences keep (the oldest
        first); returns how many were freed."""
        idle = sorted((s for s in self._active if s.hold and s.finished), key=lambda s: s.enqueued)
        for seq in idle[:count]:
            seq.hold, seq.evicted = False, True
        self._release_finished()
        return min(count, len(idle))

    def _reuse_prefix(self, seq: _Sequence) -> None:
        """Copy the longest cached prefix of ``seq``'s prompt into its slot."""
        seq.looked_up = True
        if self.prefix_cache is None:
            return
        prompt = seq.pending
        cached, kv = self.prefix_cache.lookup(prompt)
        if kv is not None:
            self.runner.load_prefix(seq.slot, kv, cached)
            seq.cached = cached
            seq.pending = prompt[cached:]
            if self.metrics is not None:
                self.metrics.prefix_hit(cached)

    def _plan_prefill(self, decode_rows: int = 0) -> list[tuple[_Sequence, int]]:
        """The prefill chunks of this iteration: (sequence, token count), oldest newcomers
        first, at most ``prefill_budget`` tokens (at least one chunk). Beside a decode step
        of ``decode_rows`` rows (the prefill on the other thread), a small backlog is cut to
        about as many tokens (at least 4), so that both end at about the same
        time (a prompt token costs about what a decode row does: the kernels are
        compute-bound); a larger one goes in at least half per iteration (time to first
        token)."""
        plan: list[tuple[_Sequence, int]] = []
        budget = self.prefill_budget
        chunk = self.prefill_chunk
        newcomers = sorted(
            (s for s in self._active if s.prefilling and s.finished is None),
            key=lambda s: (s.enqueued, s.slot),
        )
        if decode_rows and newcomers:
            backlog = sum(len(s.pending) for s in newcomers)
            budget = min(budget, max(4, decode_rows, -(-backlog // 2)))
            chunk = min(chunk, max(4, budget))
        for seq in newcomers:
            if budget <= 0:
                break
            if seq.request.inputs is not None:  # images: the whole prompt in one run
                seq.looked_up = True
                plan.append((seq, len(seq.pending)))
                budget -= len(seq.pending)
                continue
            if not seq.looked_up:
                self._reuse_prefix(seq)
            filled = int(self.runner.lengths[seq.slot])
            if filled + len(seq.pending) > self.runner.max_length:
                self._finish(seq, "length")
                continue
            left = len(seq.pending)
            while left and (budget >= 2 or not plan):
                count = min(left, chunk, max(2, budget))
                if left - count == 1:  # never leave a one-token chunk (module docstring)
                    count = count - 1 if count > 2 else count + 1
                plan.append((seq, count))
                left -= count
                budget -= count
        return plan

    def _prefilled(self, prefilled: list[tuple[_Sequence, np.ndarray]]) -> None:
        """Sequences whose prompt (or forced tokens) is in: choose their next token."""
        for seq, last in prefilled:
            seq.prefilling = False
            if seq.finished is not None:
                continue
            if self.prefix_cache is not None and seq.generated == 0 and seq.request.inputs is None:
                self._remember_prefix(seq)
            self._choose_safely(seq, last.reshape(1, -1))

    def _run_prefill(self, plan: list[tuple[_Sequence, int]]) -> list[tuple[_Sequence, np.ndarray]]:
        """Run the planned chunks; the logits of the sequences whose pending tokens are all in
        (copies). May run on the pool thread: touches only the planned sequences."""
        done = []
        cpu = time.thread_time()
        for seq, count in plan:
            if seq.request.inputs is not None:
                logits = self.runner.prefill_inputs(seq.slot, seq.request.inputs)
            else:
                logits = self.runner.prefill(seq.slot, seq.pending[:count])
            seq.pending = seq.pending[count:]
            if not len(seq.pending):
                done.append((seq, logits.copy()))
        # (on the prefill thread: the scheduler thread adds its decode run's after this)
        self.stats["model_cpu_seconds"] += time.thread_time() - cpu
        return done

    def _account(
        self,
        started: float,
        plan: list[tuple[_Sequence, int]],
        inputs: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        """Add this iteration's model time, decode rows and prefill tokens to `stats`."""
        stats = self.stats
        stats["model_seconds"] += time.perf_counter() - started
        if inputs is not None:
            rows = len(inputs[0])
            advancing = int(np.count_nonzero(inputs[1]))
            stats["decode_steps"] += 1
            stats["decode_rows"] += rows
            stats["decode_advancing_rows"] += advancing
        stats["prefill_tokens"] += sum(c for _, c in plan)
        stats["prefill_runs"] += len(plan)

    def _remember_prefix(self, seq: _Sequence) -> None:
        prompt = np.asarray(seq.request.prompt, np.int32)
        cache = self.prefix_cache
        if seq.resumed or len(prompt) < cache.min_tokens + 2 or cache.covers(prompt, len(prompt)):
            return
        kv = self.runner.export_prefix(seq.slot, len(prompt))
        if kv is not None:
            cache.add(prompt, kv)

    def _decode_inputs(self, decoding: list[_Sequence]) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and advance flags of a decode step over slots 0..max(decoding slot)."""
        rows = 1 + max(s.slot for s in decoding)
        if rows < self.min_decode_rows and self.runner.batched:
            rows = min(self.min_decode_rows, self.runner.max_slots)  # see the module docstring
        tokens = np.zeros(rows, np.int64)
        advance = np.zeros(rows, bool)
        for seq in decoding:
            tokens[seq.slot] = seq.next_token
            advance[seq.slot] = True
        return tokens, advance

    def _choose_safely(self, seq: _Sequence, logits: np.ndarray) -> None:
        """`_choose`; a failure (e.g. a grammar that cannot continue) ends only this
        sequence."""
        try:
            self._choose(seq, logits)
        except Exception as exc:
            log.warning("sequence failed: %s", exc)
            self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")

    def _choose(self, seq: _Sequence, logits: np.ndarray) -> None:
        """Choose, record and emit the next token of ``seq`` from its logits row [1, vocab]
        (the logits chain, then the tokens its grammar forces)."""
        chain = seq.chain
        assert chain is not None
        start = seq.length - seq.generated  # where this turn's generated tokens begin
        out = chain.process(logits, seq.history, seq.length, prompt_lengths=start)
        token = int(out[0])
        forced = chain.accept(0, token)
        logprob_info = None
        if chain.logprobs is not None:
            alts: list[tuple[int, float]] = []
            if chain.top_ids is not None and chain.top_logprobs is not None:
                # a token the grammar or an EOS ban masked (logit float32's lowest) has no
                # probability: no alternative, not one at -3.4e38
                alts = [
                    (int(i), float(lp))
                    for i, lp in zip(chain.top_ids[0], chain.top_logprobs[0], strict=True)
                    if lp > _MASKED_LOGPROB
                ]
            logprob_info = [(float(chain.logprobs[0]), alts)] + [(0.0, []) for _ in forced]
        self._emit(seq, [token, *forced], logprob_info)

    def _emit(
        self, seq: _Sequence, tokens: list[int], logprob_info: Any, *, verified: bool = False
    ) -> None:
        """Record and post ``tokens``; the next run feeds them (``verified``: the model has
        run all but the last, a speculative round's: only the last is fed)."""
        request = seq.request
        text_parts = []
        finish = None
        reason = FinishReason.NONE
        emitted: list[int] = []
        for token in tokens:
            if token in self._eos_set and not request.ignore_eos:
                finish, reason = "stop", FinishReason.EOS
                break
            emitted.append(token)
            seq.history[0, seq.length] = token
            seq.length += 1
            seq.generated += 1
            piece = seq.stream.decode(token) if seq.stream is not None else ""
            if seq.stopper is not None and piece:
                piece, stopped = seq.stopper.push(piece)
                text_parts.append(piece)
                if stopped:
                    finish, reason = "stop", FinishReason.STOP_STRING
                    break
            else:
                text_parts.append(piece)
            if seq.generated >= request.max_new_tokens:
                finish, reason = "length", FinishReason.MAX_GENERATED_TOKENS
                break
            if seq.length >= self.runner.max_length:
                finish, reason = "length", FinishReason.MAX_SESSION_TOKENS
                break
        if (
            finish in (None, "length")
            and emitted
            and seq.chain is not None
            and seq.chain.finished(0)
        ):
            # the grammar is complete: "stop", also when its last token hit the limit; the
            # reference's reason is EOS only when no limit did (it keeps MAX_GENERATED_TOKENS
            # / MAX_SESSION_TOKENS then, as its own EOS step never runs)
            if finish is None:
                reason = FinishReason.EOS
            finish = "stop"
        if finish is not None:
            tail = seq.stream.flush() if seq.stream is not None else ""
            if seq.stopper is None:
                text_parts.append(tail)
            elif not seq.stopper.stopped:
                piece, stopped = seq.stopper.push(tail) if tail else ("", False)
                text_parts.append(piece)
                if not stopped:
                    text_parts.append(seq.stopper.flush())
        self.generated_tokens += len(emitted)
        if self.metrics is not None:
            self.metrics.tokens(len(emitted))
            if seq.first_token:
                self.metrics.first_token(time.monotonic() - seq.enqueued)
        seq.first_token = False
        if logprob_info is not None:
            logprob_info = logprob_info[: len(emitted)]
        event = Event(
            request.index,
            text="".join(text_parts),
            tokens=emitted,
            logprobs=logprob_info,
            finish_reason=finish,
            completion_tokens=seq.generated,
            prompt_tokens=len(request.prompt),
            cached_tokens=seq.cached,
            reason=reason,
            stop=seq.stopper.matched if reason is FinishReason.STOP_STRING else None,
        )
        if finish is not None:
            seq.finished = finish
        else:
            # the next run feeds the chosen token (and forced ones) to the model
            fed = emitted[-1:] if verified else emitted
            if len(fed) == 1:
                seq.next_token = fed[0]
            else:
                seq.pending = np.asarray(fed, np.int32)
                seq.prefilling = True
        self._post(seq.handle, event)

    def _finish(self, seq: _Sequence, reason: str, error: str | None = None) -> None:
        if seq.finished is None:
            seq.finished = reason
            self._post(
                seq.handle,
                Event(
                    seq.request.index,
                    finish_reason=reason,
                    completion_tokens=seq.generated,
                    prompt_tokens=len(seq.request.prompt),
                    cached_tokens=seq.cached,
                    error=error,
                    reason=_REASONS.get(reason, FinishReason.FAILED),
                ),
            )

    def _release_finished(self) -> None:
        """Free the slots of finished sequences, keeping the active ones compact."""
        slot = 0
        while slot < len(self._active):
            seq = self._active[slot]
            if seq.finished is None or seq.hold:
                slot += 1
                continue
            if seq.chain is not None:
                with contextlib.suppress(Exception):
                    seq.chain.close()
            moved = self.runner.release(slot, len(self._active))
            last = self._active.pop()
            if moved is not None:
                self._active[slot] = last
                last.slot = slot
            # re-check the same index: it now holds the moved sequence
