"""How many tokens a round proposes (adaptive K) and when to pause speculation (cooldown), with
the reference's rules.

`AdaptiveK` (``min_adaptive_k`` > 0): K starts at ``min_adaptive_k`` and moves by one between
it and 16, from smoothed per-K estimates (EWMA, alpha 0.25) of tokens per millisecond and of
the acceptance rate, recorded only for completed rounds that filled their proposal budget.
After two stable observations of the current K, an acceptance below 0.5 probes K - 1, one of
0.75 or more probes K + 1; a probe runs two rounds and is kept when its throughput is at least
0.97x the origin's (and, probing up, its acceptance stays >= 0.75); a probe below 0.8x is
abandoned at once. A kept probe waits one round before the next, a rejected one six. With
``min_adaptive_k`` 0, K is ``max_draft_tokens``, fixed.

`Cooldown` (``cooldown``): three completed rounds in a row at the minimum K that accept
nothing make the next step a plain one.

`Backoff` (genai's own rule, with adaptive K only): at adaptive K's minimum a round can still
cost more than the plain steps it replaces. After each completed round it compares the tokens
emitted per millisecond by the rounds since the last pause (at most `Backoff.WINDOW`; their
whole steps: proposal, run, choosing) with a plain step's (the median of the last plain steps
that ran the model and of the one-token runs before rounds; while none was measured, rounds that
would be weighed make the next step a plain one: `Backoff.wants_plain_step`). At or above it,
nothing changes. Below it over at least `Backoff.MIN_ROUNDS` rounds, with an acceptance under
0.75 (where adaptive K would not grow) or a full window, the next ``pause`` rounds are not made:
the steps are plain ones. With prompt lookup a pause counts the lookups that found a proposal,
so it spans as many chances to speculate whatever their rate; with a draft model, every step.
The pause starts at `Backoff.FIRST_PAUSE` and doubles up to `Backoff.LONGEST_PAUSE` while rounds
keep losing, and goes back to the first length once they pay.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MAX_K", "AdaptiveK", "Backoff", "Cooldown"]

#: The largest K adaptive speculation reaches (and max_draft_tokens' upper bound).
MAX_K = 16

_ALPHA = 0.25
_HIGH_ACCEPTANCE = 0.75
_LOW_ACCEPTANCE = 0.50
_PROBE_RETENTION = 0.97
_SEVERE_REGRESSION = 0.80
_MIN_SAMPLES = 2
_PROBE_SAMPLES = 2
_KEPT_PROBE_WAIT = 1
_REJECTED_PROBE_WAIT = 6


@dataclass
class _Estimate:
    tokens: float = 0.0
    milliseconds: float = 0.0
    acceptance: float = 0.0
    samples: int = 0

    def update(self, tokens: float, milliseconds: float, acceptance: float) -> None:
        if not self.samples:
            self.tokens, self.milliseconds, self.acceptance = tokens, milliseconds, acceptance
        else:
            self.tokens += _ALPHA * (tokens - self.tokens)
            self.milliseconds += _ALPHA * (milliseconds - self.milliseconds)
            self.acceptance += _ALPHA * (acceptance - self.acceptance)
        self.samples += 1

    @property
    def throughput(self) -> float:
        return self.tokens / self.milliseconds if self.milliseconds > 0 else 0.0


class AdaptiveK:
    """The number of tokens each round proposes (see the module docstring)."""

    def __init__(self, fixed_k: int, min_adaptive_k: int) -> None:
        self.enabled = min_adaptive_k > 0
        self.minimum = min_adaptive_k if self.enabled else fixed_k
        self.maximum = MAX_K if self.enabled else fixed_k
        self.increases = self.decreases = self.observations = self.probes = 0
        self.reset()

    def reset(self) -> None:
        """Back to the first K, forgetting every estimate (the counters stay)."""
        self.k = self.minimum
        self._estimates = [_Estimate() for _ in range(MAX_K + 1)]
        self._origin = 0  # the K a probe started from (0: not probing)
        self._probe_rounds = 0
        self._stable_rounds = 0
        self._wait = 0

    @property
    def throughput(self) -> float:
        """The current K's estimated tokens per millisecond (the probe origin's while a
        probe has no sample yet)."""
        current = self._estimates[self.k]
        if current.samples:
            return current.throughput
        return self._estimates[self._origin].throughput if self._origin else 0.0

    def record(
        self,
        k: int,
        evaluated: int,
        accepted: int,
        emitted: int,
        filled: bool,
        propose_ms: float,
        target_ms: float,
    ) -> None:
        """A completed round that proposed ``k`` tokens (``filled``: as many as asked),
        judged ``evaluated`` of them, accepted ``accepted`` and emitted ``emitted``."""
        total = propose_ms + target_ms
        if (
            not self.enabled
            or k != self.k
            or evaluated <= 0
            or not emitted
            or not filled
            or not math.isfinite(total)
            or total <= 0
        ):
            return
        estimate = self._estimates[k]
        estimate.update(float(emitted), total, accepted / evaluated)
        self.observations += 1
        if self._origin:
            self._probe_rounds += 1
            origin = self._estimates[self._origin]
            if origin.throughput > 0 and estimate.throughput < origin.throughput * (
                _SEVERE_REGRESSION
            ):
                self._finish_probe(keep=False)
            elif self._probe_rounds >= _PROBE_SAMPLES:
                fast_enough = (
                    origin.throughput <= 0
                    or estimate.throughput >= origin.throughput * _PROBE_RETENTION
                )
                accepts_enough = self.k < self._origin or estimate.acceptance >= _HIGH_ACCEPTANCE
                self._finish_probe(keep=fast_enough and accepts_enough)
            return
        self._stable_rounds += 1
        if self._wait:
            self._wait -= 1
            return
        if estimate.samples < _MIN_SAMPLES:
            return
        if estimate.acceptance < _LOW_ACCEPTANCE and self.k > self.minimum:
            self._start_probe(self.k - 1)
        elif (
            estimate.acceptance >= _HIGH_ACCEPTANCE
            and self.k < self.maximum
            and self._stable_rounds >= _MIN_SAMPLES
        ):
            self._start_probe(self.k + 1)

    def _move(self, k: int) -> None:
        if k > self.k:
            self.increases += 1
        elif k < self.k:
            self.decreases += 1
        self.k = k

    def _start_probe(self, k: int) -> None:
        self._origin = self.k
        self._probe_rounds = self._stable_rounds = 0
        self.probes += 1
        self._move(k)

    def _finish_probe(self, keep: bool) -> None:
        if not keep:
            self._move(self._origin)
        self._origin = self._probe_rounds = self._stable_rounds = 0
        self._wait = _KEPT_PROBE_WAIT if keep else _REJECTED_PROBE_WAIT


class Cooldown:
    """One plain step after three zero-acceptance rounds in a row (see the module docstring)."""

    THRESHOLD = 3

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.entries = self.steps = 0
        self.reset()

    def reset(self) -> None:
        """Forget the streak and any pending plain step (the counters stay)."""
        self._streak = 0
        self.remaining = 0

    @property
    def active(self) -> bool:
        """True when the next step is a plain one."""
        return self.remaining > 0

    def record(self, k: int, minimum_k: int, evaluated: int, accepted: int) -> None:
        """A completed round (see `AdaptiveK.record`)."""
        if not self.enabled or evaluated <= 0:
            return
        if accepted or k != minimum_k:
            self._streak = 0
            return
        self._streak += 1
        if self._streak == self.THRESHOLD:
            self.remaining, self._streak = 1, 0
            self.entries += 1

    def complete_step(self) -> None:
        """The plain step was made."""
        self.remaining -= 1
        self.steps += 1


class Backoff:
    """Plain steps while rounds emit fewer tokens per millisecond than plain steps (see the
    module docstring)."""

    WINDOW = 8
    MIN_ROUNDS = 2
    PLAIN_SAMPLES = 16
    FIRST_PAUSE = 4
    LONGEST_PAUSE = 64

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.entries = self.steps = 0
        self.reset()

    def reset(self) -> None:
        """Forget the measurements and any pause (the counters stay)."""
        self.remaining = 0
        self.pause = self.FIRST_PAUSE
        self._plain: deque[float] = deque(maxlen=self.PLAIN_SAMPLES)
        #: the rounds since the last pause: (emitted, accepted, evaluated, milliseconds)
        self._rounds: deque[tuple[int, int, int, float]] = deque(maxlen=self.WINDOW)

    @property
    def active(self) -> bool:
        """True while rounds are paused."""
        return self.remaining > 0

    @property
    def acceptance(self) -> float:
        """The acceptance of the rounds since the last pause (1 before any)."""
        judged = sum(round_[2] for round_ in self._rounds)
        return sum(round_[1] for round_ in self._rounds) / judged if judged else 1.0

    @property
    def wants_plain_step(self) -> bool:
        """True when rounds would be weighed (`MIN_ROUNDS` of them, acceptance under 0.75)
        and no plain step was measured yet: the next step is a plain one, to have a rate to
        compare with."""
        return (
            self.enabled
            and not self._plain
            and len(self._rounds) >= self.MIN_ROUNDS
            and self.acceptance < _HIGH_ACCEPTANCE
        )

    @property
    def plain_ms(self) -> float:
        """The median plain step's milliseconds (0 before the first)."""
        return statistics.median(self._plain) if self._plain else 0.0

    @property
    def gain(self) -> float:
        """Tokens per millisecond of the recent rounds over a plain step's (0 when unknown)."""
        plain = self.plain_ms
        milliseconds = sum(round_[3] for round_ in self._rounds)
        if plain <= 0 or milliseconds <= 0:
            return 0.0
        return sum(round_[0] for round_ in self._rounds) * plain / milliseconds

    def plain_step(self, milliseconds: float) -> None:
        """A plain step that ran the model took ``milliseconds``."""
        if self.enabled and math.isfinite(milliseconds) and milliseconds > 0:
            self._plain.append(milliseconds)

    def record(self, emitted: int, accepted: int, evaluated: int, milliseconds: float) -> None:
        """A completed round judged ``evaluated`` proposals, accepted ``accepted`` and emitted
        ``emitted`` tokens; its step took ``milliseconds``."""
        if not self.enabled or not math.isfinite(milliseconds) or milliseconds <= 0:
            return
        self._rounds.append((emitted, accepted, evaluated, milliseconds))
        if not self._plain:
            return
        if self.gain >= 1.0:
            self.pause = self.FIRST_PAUSE
            return
        if len(self._rounds) < self.MIN_ROUNDS:
            return  # one unlucky round is no trend
        if self.acceptance < _HIGH_ACCEPTANCE or len(self._rounds) == self.WINDOW:
            self.remaining = self.pause
            self.pause = min(self.pause * 2, self.LONGEST_PAUSE)
            self.entries += 1
            self._rounds.clear()

    def skip(self, found: Callable[[], bool] | None = None) -> bool:
        """A paused step: it counts towards the pause when ``found`` (a cheap check whether
        the proposer had a proposal: prompt lookup) says so, always without one (a draft
        model). True when it counted."""
        if found is not None and not found():
            return False
        self.remaining -= 1
        self.steps += 1
        return True
