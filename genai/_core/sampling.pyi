"""Type stubs for the compiled `genai._core.sampling` (source: sampling.pyx).

Logits processing and sampling for one decoding step: the processing stages (min_length,
repetition penalty, no_repeat_ngram, presence/frequency penalties, logit bias) and the choice
(greedy, temperature, top-k, top-p, min-p), with one xoshiro256** stream per row (`RowRng`).
Logits are C-contiguous float32 [rows, vocab], token buffers int32.
"""

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

_PerRow: TypeAlias = int | Sequence[int] | npt.NDArray[np.integer[Any]]
_Ids: TypeAlias = Sequence[int] | npt.NDArray[np.integer[Any]]
_Floats: TypeAlias = Sequence[float] | npt.NDArray[np.floating[Any]]

#: The lowest float32 (-FLT_MAX): the logit of a banned token.
LOWEST: float

class RowRng:
    """One independent random stream per batch row (xoshiro256**, SplitMix64-seeded)."""

    @property
    def rows(self) -> int: ...
    def __new__(cls, rows: int, seed: int = -1) -> RowRng: ...
    def seed(self, seed: int = -1, rows: int | None = None) -> None: ...
    def seed_row(self, row: int, seed: int = -1, stream: int | None = None) -> None: ...
    def uniform(self, row: int) -> float: ...
    def next_u64(self, row: int) -> int: ...
    def draw(self, rows: int | None = None) -> npt.NDArray[np.float64]: ...
    def get_state(self) -> npt.NDArray[np.uint64]: ...
    def set_state(self, state: npt.ArrayLike) -> None: ...

def check_logits(logits: npt.ArrayLike, rows: int, vocab: int) -> npt.NDArray[np.float32]: ...
def check_options(options: dict[str, Any]) -> dict[str, Any]: ...

class Sampler:
    """Per-row sampling options and random streams; runs the processing chain and the choice
    for a batch of rows without the GIL."""

    @property
    def rows(self) -> int: ...
    @property
    def vocab(self) -> int: ...
    @property
    def rng(self) -> RowRng: ...
    maxima_valid: bool
    def __new__(cls, rows: int, vocab: int, seed: int = -1) -> Sampler: ...
    def load_logits(self, logits: npt.ArrayLike, rows_out: npt.NDArray[np.float32]) -> None: ...
    def forget_logits(self) -> None: ...
    def configure(self, row: int | None = None, **options: Any) -> None: ...
    def options(self, row: int) -> dict[str, Any]: ...
    def set_logit_bias(self, row: int | None, ids: _Ids, biases: _Floats) -> None: ...
    def seed(self, seed: int = -1, row: int | None = None, stream: int | None = None) -> None: ...
    def sample_batch(
        self,
        logits: npt.NDArray[np.float32],
        sequences: npt.NDArray[np.int32],
        lengths: _PerRow,
        eos_ids: _Ids,
        out: npt.NDArray[np.int32],
        *,
        done: npt.NDArray[np.uint8] | npt.NDArray[np.bool_] | None = None,
        prompt_lengths: _PerRow = 0,
        logprobs: npt.NDArray[np.float32] | None = None,
        top_ids: npt.NDArray[np.int32] | None = None,
        top_logprobs: npt.NDArray[np.float32] | None = None,
    ) -> npt.NDArray[np.int32]: ...

def apply_min_length(
    logits: npt.NDArray[np.float32],
    lengths: _PerRow,
    min_length: int,
    eos_ids: npt.NDArray[np.int32],
) -> None: ...
def apply_repetition_penalty(
    logits: npt.NDArray[np.float32],
    sequences: npt.NDArray[np.int32],
    lengths: _PerRow,
    penalty: float,
) -> None: ...
def apply_no_repeat_ngram(
    logits: npt.NDArray[np.float32], sequences: npt.NDArray[np.int32], lengths: _PerRow, n: int
) -> None: ...
def apply_presence_frequency(
    logits: npt.NDArray[np.float32],
    sequences: npt.NDArray[np.int32],
    lengths: _PerRow,
    start: _PerRow,
    presence: float,
    frequency: float,
) -> None: ...
def apply_logit_bias(
    logits: npt.NDArray[np.float32], ids: npt.ArrayLike, biases: npt.ArrayLike
) -> None: ...
def sample(
    logits: npt.NDArray[np.float32],
    uniforms: npt.NDArray[np.float64],
    out: npt.NDArray[np.int32],
    *,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 0.0,
    min_p: float = 0.0,
    logprobs: npt.NDArray[np.float32] | None = None,
    top_ids: npt.NDArray[np.int32] | None = None,
    top_logprobs: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.int32]: ...
