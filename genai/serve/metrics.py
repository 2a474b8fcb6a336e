"""Prometheus metrics of the server (one registry per app, so several apps can live in one
process, e.g. in tests)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["ServerMetrics"]

#: The speculative counters of `Scheduler.stats` (``speculative_<name>``) and their help.
_SPECULATIVE = (
    (
        "proposed_tokens",
        "Tokens proposed by prompt lookup and verified (genai serve --speculative)",
    ),
    ("accepted_tokens", "Proposed tokens the model agreed with"),
    ("emitted_tokens", "Tokens emitted by verify runs (accepted + one of the model's own each)"),
    ("target_runs", "Verify runs of the model (each checks a sequence's proposals)"),
    (
        "backoff_steps",
        "Plain steps made instead of verify runs that were slower than plain steps",
    ),
)


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
        self.responses = Counter(
            "genai_http_responses",
            "HTTP responses by route and status code (refusals such as 400, 401, 404, 413 too)",
            ["route", "status"],
            registry=r,
        )
        #: Requests whose generation failed (500s), those since the last success, and the
        #: last failure's message: `/health` reports them.
        self.failed_requests = 0
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self._window = window
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()
        self.tokens_per_second.set_function(self._rate)

    def watch_load(self, waiting: Callable[[], int], running: Callable[[], int]) -> None:
        """Read the queue depth and the running sequences from these callables at each
        scrape."""
        self.queue_depth.set_function(waiting)
        self.running.set_function(running)

    def outcome(self, label: str, error: str | None = None) -> None:
        """A request finished as ``label`` ("ok", "error", "timeout", "rejected",
        "disconnected", "invalid": its own grammar could not be followed); ``error``: why a
        generation failed."""
        self.requests.labels(label).inc()
        with self._lock:
            if label == "error":
                self.failed_requests += 1
                self.consecutive_failures += 1
                self.last_error = error
            elif label == "ok":
                self.consecutive_failures = 0

    def response(self, route: str, status: int) -> None:
        """An HTTP response with ``status`` started for ``route`` (a route's path template, or
        "other" for a path no route serves: the label's values stay few)."""
        self.responses.labels(route, str(status)).inc()

    def health(self) -> dict[str, Any]:
        """``status`` "ok", or "failing" while the last finished generation failed (none has
        succeeded since), with the failure counts and the last error."""
        with self._lock:
            return {
                "status": "failing" if self.consecutive_failures else "ok",
                "failed_requests": self.failed_requests,
                "consecutive_failures": self.consecutive_failures,
                "last_error": self.last_error,
            }

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

    def watch_engine(self, stats: Callable[[], Mapping[str, float]]) -> None:
        """Export the scheduler's `Scheduler.stats` (read at each scrape):
        ``genai_engine_seconds_total{phase="idle|model|host"}``, ``genai_decode_steps_total``,
        ``genai_decode_rows_total{kind="advancing|filler"}``,
        ``genai_prefill_tokens_total``, ``genai_prefill_runs_total`` and the speculative
        counters (``genai_speculative_proposed_tokens_total``, ``..._accepted_tokens_total``,
        ``..._emitted_tokens_total``, ``..._target_runs_total``: acceptance rate = accepted /
        proposed, tokens per target run = emitted / target runs; both also as gauges since start:
        ``genai_speculative_acceptance_rate``, ``genai_speculative_tokens_per_target_run``)."""

        class _Engine:
            def collect(self):
                s = dict(stats())
                seconds = CounterMetricFamily(
                    "genai_engine_seconds",
                    "Scheduler threads' time (summed): waiting, model runs (wall), the rest",
                    labels=["phase"],
                )
                for phase in ("idle", "model", "host"):
                    seconds.add_metric([phase], s.get(f"{phase}_seconds", 0.0))
                yield seconds
                yield CounterMetricFamily(
                    "genai_decode_steps", "Batched decode steps", value=s.get("decode_steps", 0)
                )
                rows = CounterMetricFamily(
                    "genai_decode_rows", "Rows of decode steps", labels=["kind"]
                )
                advancing = s.get("decode_advancing_rows", 0)
                rows.add_metric(["advancing"], advancing)
                rows.add_metric(["filler"], s.get("decode_rows", 0) - advancing)
                yield rows
                yield CounterMetricFamily(
                    "genai_prefill_tokens",
                    "Tokens fed by prefill runs (prompts after the prefix cache, forced tokens)",
                    value=s.get("prefill_tokens", 0),
                )
                yield CounterMetricFamily(
                    "genai_prefill_runs", "Prefill runs", value=s.get("prefill_runs", 0)
                )
                for name, text in _SPECULATIVE:
                    yield CounterMetricFamily(
                        f"genai_speculative_{name}", text, value=s.get(f"speculative_{name}", 0)
                    )
                proposed = s.get("speculative_proposed_tokens", 0)
                runs = s.get("speculative_target_runs", 0)
                yield GaugeMetricFamily(
                    "genai_speculative_acceptance_rate",
                    "Accepted / proposed tokens since start (0 before any proposal)",
                    value=s.get("speculative_accepted_tokens", 0) / proposed if proposed else 0.0,
                )
                yield GaugeMetricFamily(
                    "genai_speculative_tokens_per_target_run",
                    "Tokens emitted per verify run since start (0 before any)",
                    value=s.get("speculative_emitted_tokens", 0) / runs if runs else 0.0,
                )

        self.registry.register(_Engine())

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
