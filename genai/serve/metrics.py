"""Prometheus metrics of the server (one registry per app, so several apps can live in one
process, e.g. in tests)."""

from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServerMetrics"]


class ServerMetrics:
    """Queue depth, running requests, generated tokens (and tokens/s over the last
    ``window`` seconds), time to first token, requests by outcome, prefix-cache reuse."""

    def __init__(self, window: float = 10.0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("genai_queue_depth", "Requests waiting for a slot", registry=r)
        self.running = Gauge("genai_running_requests", "Sequences holding a KV slot", registry=r)
        self.generated = Counter(
            "genai_generated_tokens", "Tokens generated (all requests)", registry=r
        )
        self.prompt_tokens = Counter("genai_prompt_tokens", "Prompt tokens received", registry=r)
        self.tokens_per_second = Gauge(
            "genai_tokens_per_second",
            f"Generated tokens per second over the last {window:g} s",
            registry=r,
        )
        self.ttft = Histogram(
            "genai_time_to_first_token_seconds",
            "Time from queueing a sequence to its first token",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.requests = Counter(
            "genai_requests", "Finished API requests by outcome", ["outcome"], registry=r
        )
        self.prefix_tokens = Counter(
            "genai_prefix_cache_reused_tokens",
            "Prompt tokens whose KV came from the cache",
            registry=r,
        )
        self._window = window
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()
        self.tokens_per_second.set_function(self._rate)

    def set_load(self, waiting: int, running: int) -> None:
        """Scheduler thread: current queue depth and running sequences."""
        self.queue_depth.set(waiting)
        self.running.set(running)

    def tokens(self, count: int) -> None:
        """Scheduler thread: ``count`` tokens were generated now."""
        if count:
            self.generated.inc(count)
            with self._lock:
                self._recent.append((time.monotonic(), count))

    def first_token(self, seconds: float) -> None:
        """Scheduler thread: a sequence produced its first token ``seconds`` after queueing."""
        self.ttft.observe(seconds)

    def prefix_hit(self, tokens: int) -> None:
        """A prompt reused the KV of ``tokens`` cached tokens."""
        self.prefix_tokens.inc(tokens)

    def _rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - self._window:
                self._recent.popleft()
            total = sum(n for _, n in self._recent)
        return total / self._window

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
