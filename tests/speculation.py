"""Helpers the speculative-decoding tests share: start a generator the same way in the
reference and in genai, and catch an error's message to compare."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
