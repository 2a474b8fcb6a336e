"""The step logits a runner outside the native loop hands the decoder loop: each row's row of
the logits its graphs returned (`genai.generation.pipeline`, `genai.generation.vision_runner`)."""

from __future__ import annotations

import numpy as np

from genai.errors import ModelError

__all__ = ["copy_last_rows"]


def copy_last_rows(
    logits: np.ndarray, out: np.ndarray, last: np.ndarray, count: int, name: str
) -> None:
    """Copy into ``out`` ``[rows, vocab]`` each row's logits at position ``last`` (``[rows]``)
    of a run of ``count`` tokens (the output's last row when it has fewer rows than the run: a
    last-position or trimmed graph, `genai.runtime.trimmed_logits`); ``logits`` of another
    shape than ``[rows, 1 to count, vocab]`` is a `ModelError` naming the output ``name``."""
    rows = last.shape[0]
    if logits.ndim != 3 or logits.shape[0] != rows or not 1 <= logits.shape[1] <= count:
        raise ModelError(
            f"logits output {name!r} has shape {list(logits.shape)}; expected "
            f"[{rows}, 1 to {count}, vocab]"
        )
    kept = logits.shape[1]
    positions = last if kept == count else np.full(rows, kept - 1, np.int64)
    out[:] = logits[np.arange(rows), positions, :]
