"""genai's backoff of speculation under adaptive K (`genai.generation.speculative.policy.Backoff`):
rounds pause while they emit fewer tokens per millisecond than plain steps.

The model runs are timed by a fake clock (one-token run: 1 ms, each further token: 0.25 ms), so
which steps are rounds and which are plain is exact; the tokens are checked against the table
model's own rule (token t is followed by t + 1), independent of either path.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import genai
from genai.generation.speculative import decoder as decoder_module
from genai.generation.speculative.policy import Backoff
from genai.testing.speculative import transition_table, write_table_decoder

VOCAB = 64  # token t is followed by (t + 1) % 63; 63 is EOS
CYCLE = VOCAB - 1
NEW_TOKENS = 40
#: Every token once, each followed by t + 5: prompt lookup proposes t + 5 after every t, and
#: the model says t + 1 (acceptance 0 for the 40 new tokens, none of which repeats).
WRONG = [(5 * i) % CYCLE for i in range(CYCLE)]
#: The cycle, then its start again: every lookup proposes what the model says.
RIGHT = list(range(CYCLE)) + list(range(10))


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = tmp_path_factory.mktemp("backoff")
    return write_table_decoder(root, transition_table(VOCAB), context_length=160)


@pytest.fixture
def clock(monkeypatch):
    """The decoder's clock, advanced only by model runs (see the module docstring)."""
    now = [0.0]
    monkeypatch.setattr(decoder_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return now


def _timed(generator, now, extra_ms: float = 0.25) -> list[int]:
    """Advance ``now`` by each model run's cost; returns the token counts of the runs."""
    driver, loop = generator._driver, generator._loop
    runs: list[int] = []

    def cost(tokens: int) -> None:
        runs.append(tokens)
        now[0] += (1.0 + extra_ms * (tokens - 1)) / 1e3

    def run(*args, **kwargs):
        cost(loop.length - loop.computed)
        return run.original(*args, **kwargs)

    def step():
        if not loop.logits_ready:
            cost(loop.length - loop.computed)
        step.original()

    def verify(tokens):
        cost(loop.length - loop.computed + tokens.shape[1])
        return verify.original(tokens)

    for wrapper in (run, step, verify):
        wrapper.original = getattr(driver, wrapper.__name__)
        setattr(driver, wrapper.__name__, wrapper)
    return runs


def _generate(folder, prompt, spec, now, extra_ms: float = 0.25, runs=None):
    model = genai.Model(str(folder))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS)
    params.set_speculative_options(**spec)
    generator = genai.Generator(model, params)
    generator.append_tokens(np.array([prompt], np.int32))
    made = _timed(generator, now, extra_ms)
    while not generator.is_done():
        generator.generate_next_token()
    if runs is not None:
        runs.extend(made)
    return [int(t) for t in generator.get_sequence(0)], generator.get_speculative_stats()


def _follows(prompt):
    return prompt + [(prompt[-1] + 1 + i) % CYCLE for i in range(NEW_TOKENS)]


ADAPTIVE = {"ngram_size": 2, "max_draft_tokens": 4, "min_adaptive_k": 1}


def test_losing_rounds_pause_for_doubling_stretches(table, clock):
    """Step 1 has no proposal (the prompt's last token never occurred before). Steps 2 and 3
    are rounds: the pending token and one proposal in one run (1.25 ms), one token each. Two
    rounds at acceptance 0 are weighed, and no plain step was measured: step 4 is a plain one
    (1 ms). Rounds are 0.8x a plain step's rate: round 3 starts a pause of 4 proposals; then
    every two rounds start one of 8, 16, then 32 (1 left when the 40 tokens end)."""
    runs: list[int] = []
    tokens, stats = _generate(table, WRONG, ADAPTIVE, clock, runs=runs)
    assert tokens == _follows(WRONG)
    assert stats["rounds"] == 9
    assert stats["draft_tokens_accepted"] == 0
    assert stats["backoff_entries"] == 4
    assert stats["backoff_steps"] == 4 + 8 + 16 + 1
    assert stats["standard_fallback_steps"] == 2 + stats["backoff_steps"]
    assert stats["rounds"] + stats["standard_fallback_steps"] == NEW_TOKENS
    # adaptive K: every round verifies the pending token with its proposal, one run each
    assert runs.count(2) == stats["rounds"] and set(runs) == {1, 2}
    # The reference's timing stats, by its formula: nine verify runs of 1.25 ms; a plain step
    # after a round re-anchors (1 ms; five of them: after rounds 2, 3, 5, 7 and 9), a round
    # after a round folds: a round costs (11.25 + 5) / 9 baseline runs
    per_round = (9 * 1.25 + 5.0) / 9
    assert stats["total_target_verify_ms"] == pytest.approx(9 * 1.25)
    assert stats["total_target_reanchor_ms"] == pytest.approx(5.0)
    assert stats["total_target_ms"] == pytest.approx(9 * 1.25 + 5.0)
    assert stats["target_baseline_ms_per_token"] == pytest.approx(1.0)
    assert stats["target_overhead_ratio"] == pytest.approx(per_round - 1.0)
    assert stats["expected_tokens_per_round"] == pytest.approx(1.0)
    assert stats["estimated_speedup"] == pytest.approx(1 / per_round)
    assert stats["observed_speedup"] == pytest.approx(1 / per_round)


def test_fixed_k_keeps_the_references_rounds_and_run_shapes(table, clock):
    """Without adaptive K speculation never backs off, and a round after a plain step or a
    round of one proposal runs the pending token alone, then verifies (the reference's run
    shapes): two one-token runs per round here."""
    runs: list[int] = []
    spec = {"ngram_size": 2, "max_draft_tokens": 1}
    tokens, stats = _generate(table, WRONG, spec, clock, runs=runs)
    assert tokens == _follows(WRONG)
    assert "backoff_entries" not in stats and "backoff_steps" not in stats  # the reference's keys
    assert stats["rounds"] == NEW_TOKENS - 1
    assert runs == [1] * (2 * stats["rounds"])  # step 1 chose from the prompt run


def test_rounds_that_are_accepted_never_pause(table, clock):
    """Every proposal accepted: adaptive K grows, rounds pay, no pause."""
    tokens, stats = _generate(table, RIGHT, ADAPTIVE, clock)
    assert tokens == _follows(RIGHT)
    assert stats["acceptance_rate"] == 1.0
    assert stats["backoff_entries"] == stats["backoff_steps"] == 0
    assert stats["effective_k"] > 1
    assert stats["rounds"] < NEW_TOKENS / 2


def test_policy_rules():
    backoff = Backoff(enabled=True)
    backoff.record(emitted=1, accepted=0, evaluated=1, milliseconds=5.0)
    assert not backoff.active  # no plain step measured yet: nothing to compare with
    backoff.plain_step(2.0)
    backoff.plain_step(3.0)
    backoff.plain_step(100.0)  # the median: one slow step does not move the baseline
    assert backoff.plain_ms == 3.0
    backoff.record(emitted=2, accepted=1, evaluated=1, milliseconds=4.0)
    assert backoff.gain == pytest.approx(3 * 3.0 / 9.0)
    assert not backoff.active  # 1.0: rounds pay as much as plain steps
    backoff.record(emitted=1, accepted=0, evaluated=2, milliseconds=6.0)
    assert backoff.active and backoff.remaining == Backoff.FIRST_PAUSE
    assert backoff.gain == 0.0  # the window starts over after a pause
    for _ in range(Backoff.FIRST_PAUSE):
        backoff.skip()
    assert not backoff.active and backoff.steps == Backoff.FIRST_PAUSE
    backoff.record(emitted=1, accepted=0, evaluated=1, milliseconds=6.0)
    assert not backoff.active  # one round is no trend (`MIN_ROUNDS`)
    backoff.record(emitted=1, accepted=0, evaluated=1, milliseconds=6.0)
    assert backoff.remaining == 2 * Backoff.FIRST_PAUSE  # lost again: twice as long
    backoff.remaining = 0
    backoff.record(emitted=5, accepted=4, evaluated=4, milliseconds=6.0)
    assert not backoff.active and backoff.pause == Backoff.FIRST_PAUSE  # paid: back to 4
    while backoff.pause < Backoff.LONGEST_PAUSE:
        for _ in range(Backoff.MIN_ROUNDS):
            backoff.record(emitted=1, accepted=0, evaluated=1, milliseconds=60.0)
        backoff.remaining = 0
    for _ in range(Backoff.MIN_ROUNDS):
        backoff.record(emitted=1, accepted=0, evaluated=1, milliseconds=60.0)
    assert backoff.remaining == Backoff.LONGEST_PAUSE


def test_high_acceptance_waits_for_a_full_window():
    """Below a plain step's rate with acceptance >= 0.75 adaptive K is left to grow; a full
    window of such rounds pauses."""
    backoff = Backoff(enabled=True)
    backoff.plain_step(1.0)
    for _ in range(Backoff.WINDOW - 1):
        backoff.record(emitted=2, accepted=1, evaluated=1, milliseconds=2.5)
        assert not backoff.active
    backoff.record(emitted=2, accepted=1, evaluated=1, milliseconds=2.5)
    assert backoff.active


def test_disabled_never_pauses():
    backoff = Backoff(enabled=False)
    backoff.plain_step(1.0)
    for _ in range(20):
        backoff.record(emitted=1, accepted=0, evaluated=4, milliseconds=50.0)
    assert not backoff.active and backoff.entries == 0
