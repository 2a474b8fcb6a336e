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
    of a run of ``count`` tokens (position 0 when the graph returned the last position only);
    ``logits`` of another shape than ``[rows, count or 1, vocab]`` is a `ModelError` naming
    the output ``name``."""
    rows = last.shape[0]
    if logits.ndim != 3 or logits.shape[0] != rows or logits.shape[1] not in (count, 1):
        raise ModelError(
            f"logits output {name!r} has shape {list(logits.shape)}; expected "
            f"[{rows}, {count} or 1, vocab]"
        )
    positions = last if logits.shape[1] == count else np.zeros(rows, np.int64)
    out[:] = logits[np.arange(rows), positions, :]
