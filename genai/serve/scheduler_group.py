"""Several schedulers over one model: each with its own KV slots and thread, so that their
model runs fill the cores without waiting for each other.

One batched decode step runs its rows on one intra-op thread pool; a second core would stay
idle. Cutting every step into row groups run at the same time (this server's previous design)
uses it, but the step then waits for its slowest group, and prefills beside it must be sized
to end together: measured on SmolLM2 at 8 streams, only one run was in flight for ~30 % of
the time. A `SchedulerGroup` runs ``n`` complete `Scheduler` s instead, each on ``max_slots / n``
slots of its own runner, all sharing the model's session (ONNX Runtime runs one session from
several threads at once), its weights and one `PrefixCache`. Each steps its own rows,
prefills its own newcomers and samples on its own thread; they meet only at the queue:

* a new request goes to the scheduler with the fewest sequences (running + waiting, with a
  free slot first);
* a scheduler with a free slot and nothing waiting takes the oldest waiting sequence of one
  whose slots are all taken (`Scheduler.steal`), so no request waits while a slot is free
  anywhere.

Tokens do not change: every scheduler keeps the rule that no run has a single row, and a
row's logits are the same in any run of two rows or more (`genai.serve.scheduler`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from genai.runtime.model import default_intra_op_threads
from genai.serve.batch_runner import BatchRunner
from genai.serve.scheduler import (
    GenerationRequest,
    PrefixCache,
    QueueFullError,
    RequestHandle,
    Scheduler,
    _Sequence,
    check_capacity,
)

__all__ = ["SchedulerGroup", "default_lanes"]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_lanes(model: Any) -> int:
    """Schedulers the server runs side by side (`SchedulerGroup`), each keeping one model run
    in flight: the CPUs this process may use divided by the session's intra-op threads (at
    least 1, at most 4), so that their runs fill the cores a single run leaves idle.
    ``GENAI_SERVE_LANES`` overrides it. Providers running on a device other than the host CPU
    get 1."""
    env = os.environ.get("GENAI_SERVE_LANES")
    if env:
        return max(1, int(env))
    if getattr(getattr(model, "provider", None), "device", "cpu") != "cpu":
        return 1
    session = model.config.get("model.decoder.session_options", {}) or {}
    threads = int(session.get("intra_op_num_threads") or default_intra_op_threads())
    return max(1, min(4, _cores() // max(1, threads)))


class SchedulerGroup:
    """``len(runners)`` `Scheduler` s, one per runner, behind one queue interface (`submit`,
    `queue_depth`, `running`, `stats`) that the server uses like a single `Scheduler`'s.
    ``max_queue`` bounds the requests waiting beyond the free slots of all of them together;
    the other keyword arguments go to every `Scheduler`."""

    def __init__(
        self,
        runners: Sequence[BatchRunner],
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        *,
        max_queue: int = 64,
        prefix_cache_bytes: int = 256 << 20,
        **options: Any,
    ) -> None:
        if not runners:
            raise ValueError("a SchedulerGroup needs at least one runner")
        shared = None
        if prefix_cache_bytes > 0 and runners[0].export_prefix(0, 0) is not None:
            shared = PrefixCache(prefix_cache_bytes)
        self.members = [
            Scheduler(
                runner,
                tokenizer,
                eos_token_ids,
                max_queue=max_queue,
                prefix_cache_bytes=prefix_cache_bytes,
                prefix_cache=shared,
                **options,
            )
            for runner in runners
        ]
        for member in self.members:
            member.steal = self._steal
            member.others_waiting = self._others_waiting
        self.max_queue = max_queue
        #: The prompt KV cache all members share (None: off).
        self.prefix_cache: PrefixCache | None = shared

    # --- what the server reads --------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        """Sequences waiting for a slot (all members)."""
        return sum(m.queue_depth for m in self.members)

    @property
    def queued(self) -> int:
        """Sequences waiting beyond the free slots of all members (what ``max_queue``
        bounds: an idle member takes waiting sequences from a full one)."""
        waiting = sum(m.queue_depth for m in self.members)
        return max(0, waiting - sum(m.free_slots for m in self.members))

    @property
    def running(self) -> int:
        """Sequences holding a slot (all members)."""
        return sum(m.running for m in self.members)

    @property
    def generated_tokens(self) -> int:
        """Tokens generated since start (all members)."""
        return sum(m.generated_tokens for m in self.members)

    @property
    def stats(self) -> dict[str, float]:
        """The members' `Scheduler.stats` added up (times are summed over their threads)."""
        total: dict[str, float] = {}
        for member in self.members:
            for key, value in member.stats.items():
                total[key] = total.get(key, 0) + value
        return total

    @property
    def request_timeout(self) -> float:
        """Seconds a request may take (the same for every member)."""
        return self.members[0].request_timeout

    @request_timeout.setter
    def request_timeout(self, seconds: float) -> None:
        for member in self.members:
            member.request_timeout = seconds

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start every member's thread."""
        for member in self.members:
            member.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every member (their running sequences end with finish_reason "cancelled")."""
        for member in self.members:
            member.shutdown(timeout)

    # --- requests -------------------------------------------------------------------------------
    def submit(
        self,
        requests: Sequence[GenerationRequest],
        loop: asyncio.AbstractEventLoop | None = None,
        timeout: float | None = None,
    ) -> RequestHandle:
        """Queue ``requests`` (the choices of one API request) on the least loaded member;
        raises `QueueFullError` when the group's queue cannot take them all."""
        check_capacity(len(requests), self.capacity)
        loop = loop or asyncio.get_running_loop()
        waiting = sum(m.queue_depth for m in self.members)
        free = sum(m.free_slots for m in self.members)
        if max(0, waiting + len(requests) - free) > self.max_queue:
            raise QueueFullError(
                f"the server is busy: {self.queued} requests are waiting for a slot (queue "
                f"limit {self.max_queue}); retry later"
            )
        member = min(self.members, key=_load)
        handle = RequestHandle(self._wake, len(requests), loop)
        member.enqueue(handle, requests, timeout, bounded=False)
        # an idle member with free slots takes them over if the chosen one is full
        self._wake()
        return handle

    @property
    def capacity(self) -> int:
        """The most sequences one request may have: every member's slots and the queue."""
        return sum(m.runner.max_slots for m in self.members) + self.max_queue

    def _wake(self) -> None:
        for member in self.members:
            member._wake()

    def _steal(self, taker: Scheduler) -> _Sequence | None:
        """The oldest waiting sequence of the member with the most sequences it has no slot
        for (not ``taker``; a member's own newcomers stay with it while it has slots)."""
        for member in sorted(self.members, key=lambda m: -_surplus(m)):
            if member is not taker and _surplus(member) > 0:
                seq = member.take_waiting()
                if seq is not None:
                    return seq
        return None

    def _others_waiting(self, taker: Scheduler) -> bool:
        return any(_surplus(m) > 0 for m in self.members if m is not taker)


def _load(member: Scheduler) -> tuple[bool, int]:
    """Sort key: members with a free slot first, then by sequences held or waiting."""
    held = member.running + member.queue_depth
    return held >= member.runner.max_slots, held


def _surplus(member: Scheduler) -> int:
    """Sequences waiting at ``member`` beyond its free slots."""
    return member.queue_depth - (member.runner.max_slots - member.running)
