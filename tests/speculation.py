"""Helpers the speculative-decoding tests share: start a generator the same way in the
reference and in genai, and catch an error's message to compare."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import genai
from genai.testing.speculative import markov_distribution

#: Keys of ``get_speculative_stats`` both engines count the same way whatever drafts the tokens
#: (timings, the history sync counts and draft_forward_passes differ).
STATS = [
    "rounds",
    "completed_rounds",
    "interrupted_rounds",
    "active_rounds",
    "draft_tokens_proposed",
    "draft_tokens_evaluated",
    "draft_tokens_accepted",
    "correction_tokens",
    "bonus_tokens",
    "tokens_queued",
    "tokens_emitted",
    "tokens_discarded",
    "tokens_buffered",
    "target_forward_passes",
    "standard_fallback_steps",
    "full_accept_rounds",
    "partial_accept_rounds",
    "zero_accept_rounds",
    "effective_k",
    "acceptance_rate",
]


def start(
    mod: Any,
    folder: str | Path,
    prompt: Sequence[int],
    max_length: int,
    spec: dict[str, Any] | None = None,
    **search: Any,
) -> tuple[Any, Any]:
    """``mod``'s (model, generator) on ``folder`` with greedy search (unless ``search`` says
    otherwise), ``max_length``, the speculative options ``spec`` and ``prompt`` appended
    (the model is returned to keep it alive as long as the generator)."""
    model = mod.Model(str(folder))
    params = mod.GeneratorParams(model)
    params.set_search_options(**{"do_sample": False, "max_length": max_length, **search})
    if spec:
        params.set_speculative_options(**spec)
    gen = mod.Generator(model, params)
    gen.append_tokens(np.array([prompt], np.int32))
    return model, gen


def error_text(call: Callable[[], object]) -> str | None:
    """The message ``call`` raises (stripped), None when it succeeds."""
    try:
        call()
    except Exception as exc:  # compared with the reference's message
        return str(exc).strip()
    return None


def assert_first_tokens_follow_the_chain(
    model: Any, table: np.ndarray, prompt: Sequence[int], spec: dict[str, Any], draws: int = 1500
) -> None:
    """Sample the three tokens after ``prompt`` with genai ``model`` (a
    `genai.testing.speculative.write_table_decoder` chain of ``table``, ids [0, 8), with
    speculative options ``spec``) once per seed in ``range(draws)``: drafts were both accepted
    and rejected, and each step's counts pass a chi-square test against the chain's exact
    marginal (`markov_distribution`)."""
    from scipy import stats  # lazy: scipy is a test-only dependency

    counts = np.zeros((3, 8), np.int64)
    accepted = 0
    for seed in range(draws):
        params = genai.GeneratorParams(model)
        params.set_search_options(
            do_sample=True, top_k=8, max_length=len(prompt) + 3, random_seed=seed
        )
        params.set_speculative_options(**spec)
        gen = genai.Generator(model, params)
        gen.append_tokens(np.array([prompt], np.int32))
        for step in range(3):
            gen.generate_next_token()
            counts[step, int(gen.get_next_tokens()[0])] += 1
        accepted += gen.get_speculative_stats()["draft_tokens_accepted"]
    assert 0 < accepted < draws * 3  # proposals were both accepted and rejected
    for step in range(3):
        want = markov_distribution(table, prompt[-1], step + 1)
        keep = want > 1e-6
        result = stats.chisquare(counts[step, keep], want[keep] / want[keep].sum() * draws)
        assert result.pvalue > 1e-3, (step, counts[step], want)


def assert_freed_at_once(box: list[Any]) -> None:
    """Drop ``box``'s only item (the last reference to a generator) with the cycle collector
    off: it must be freed at once (no reference cycle keeps it and its KV caches)."""
    gone = weakref.ref(box[0])
    gc.disable()
    try:
        box.clear()
        assert gone() is None, "the generator outlived its last reference"
    finally:
        gc.enable()
