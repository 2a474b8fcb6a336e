"""NumPy twin of `genai._core.sampling`: same names and Python signatures, written for clarity.

Full sorts and Python loops are fine here; the kernels must agree with these (tokens exactly,
log-probabilities to float32 rounding). The RNG is re-implemented in Python integer arithmetic,
independently of the C code. See ``docs/sampling.md`` for the rules both follow.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from genai._core.sampling import check_logits, check_options  # validation shared with the kernel
from genai.errors import NonFiniteLogitsError

if TYPE_CHECKING:  # the annotations of `genai._core.sampling`'s stub (sampling.pyi)
    from typing import TypeAlias

    import numpy.typing as npt

    _PerRow: TypeAlias = int | Sequence[int] | npt.NDArray[np.integer[Any]]
    _Ids: TypeAlias = Sequence[int] | npt.NDArray[np.integer[Any]]
    _Floats: TypeAlias = Sequence[float] | npt.NDArray[np.floating[Any]]

__all__ = [
    "LOWEST",
    "RowRng",
    "Sampler",
    "apply_logit_bias",
    "apply_min_length",
    "apply_no_repeat_ngram",
    "apply_presence_frequency",
    "apply_repetition_penalty",
    "check_options",
    "sample",
]

#: Lowest float32, the value of banned logits.
LOWEST = float(np.finfo(np.float32).min)

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_STREAM = 0xD1B54A32D192ED03


def splitmix64(state: int) -> tuple[int, int]:
    """One splitmix64 step: (new state, output)."""
    state = (state + _GOLDEN) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


def _rotl(x: int, k: int) -> int:
    return ((x << k) | (x >> (64 - k))) & _MASK


def _seed_value(seed: int) -> int:
    value = operator.index(seed)
    if value == -1:
        return int.from_bytes(os.urandom(8), "little")
    if value < 0:
        raise ValueError(f"seed must be >= 0 or -1 (random), got {value}")
    return value & _MASK


def stream_state(seed: int, stream: int) -> list[int]:
    """xoshiro256** state of stream ``stream`` of ``seed``."""
    x = (seed + stream * _STREAM) & _MASK
    state = []
    for _ in range(4):
        x, out = splitmix64(x)
        state.append(out)
    if not any(state):
        state[0] = 1
    return state


class RowRng:
    """See `genai._core.sampling.RowRng`."""

    def __init__(self, rows: int, seed: int = -1) -> None:
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        self.rows: int = rows
        self._states = [[0, 0, 0, 0] for _ in range(rows)]
        self.seed(seed)

    def seed(self, seed: int = -1, rows: int | None = None) -> None:
        value = _seed_value(seed)
        n = self.rows if rows is None else rows
        if not 0 <= n <= self.rows:
            raise ValueError(f"rows ({n}) must be in [0, {self.rows}]")
        for r in range(n):
            self._states[r] = stream_state(value, r)

    def seed_row(self, row: int, seed: int = -1, stream: int | None = None) -> None:
        self._check(row)
        self._states[row] = stream_state(_seed_value(seed), row if stream is None else stream)

    def next_u64(self, row: int) -> int:
        self._check(row)
        s = self._states[row]
        result = (_rotl((s[1] * 5) & _MASK, 7) * 9) & _MASK
        t = (s[1] << 17) & _MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result

    def uniform(self, row: int) -> float:
        return (self.next_u64(row) >> 11) * 2.0**-53

    def draw(self, rows: int | None = None) -> npt.NDArray[np.float64]:
        n = self.rows if rows is None else rows
        if not 0 <= n <= self.rows:
            raise ValueError(f"rows ({n}) must be in [0, {self.rows}]")
        return np.array([self.uniform(r) for r in range(n)], np.float64)

    def get_state(self) -> npt.NDArray[np.uint64]:
        return np.array(self._states, np.uint64).reshape(self.rows, 4)

    def set_state(self, state: npt.ArrayLike) -> None:
        state = np.asarray(state, np.uint64)
        if state.shape != (self.rows, 4):
            raise ValueError(f"state must have shape ({self.rows}, 4)")
        self._states = [[int(v) for v in row] for row in state]

    def _check(self, row: int) -> None:
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside [0, {self.rows})")


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------


def _per_row(values: Any, rows: int, name: str) -> npt.NDArray[np.int32]:
    """``values`` (an int, or one entry per row: `_PerRow`) as int32 [rows or more]."""
    if np.ndim(values) == 0:
        return np.full(rows, int(values), np.int32)
    out = np.asarray(values, np.int32)
    if out.ndim != 1 or out.shape[0] < rows:
        raise ValueError(f"{name} must be an int or hold one entry per row ({rows})")
    return out


def _history(
    logits: npt.NDArray[np.float32], sequences: npt.NDArray[np.int32], lengths: _PerRow
) -> Iterator[tuple[int, npt.NDArray[np.int32], npt.NDArray[np.int32]]]:
    rows, vocab = logits.shape
    lengths = _per_row(lengths, rows, "lengths")
    if sequences.shape[0] < rows:
        raise ValueError("sequences need one row per logits row")
    if rows and (lengths[:rows].min() < 0 or lengths[:rows].max() > sequences.shape[1]):
        raise ValueError(f"lengths must be in [0, {sequences.shape[1]}]")
    for r in range(rows):
        seq = np.asarray(sequences[r, : lengths[r]])
        yield r, seq[(seq >= 0) & (seq < vocab)], seq


def apply_min_length(
    logits: npt.NDArray[np.float32],
    lengths: _PerRow,
    min_length: int,
    eos_ids: npt.NDArray[np.int32],
) -> None:
    """See `genai._core.sampling.apply_min_length`."""
    rows, vocab = logits.shape
    eos_ids = np.asarray(eos_ids, np.int32)
    if ((eos_ids < 0) | (eos_ids >= vocab)).any():
        raise ValueError(f"eos ids outside the vocabulary ({vocab})")
    lengths = _per_row(lengths, rows, "lengths")
    for r in range(rows):
        if lengths[r] < min_length:
            logits[r, eos_ids] = LOWEST


def apply_repetition_penalty(
    logits: npt.NDArray[np.float32],
    sequences: npt.NDArray[np.int32],
    lengths: _PerRow,
    penalty: float,
) -> None:
    """See `genai._core.sampling.apply_repetition_penalty`."""
    if penalty <= 0:
        raise ValueError(f"repetition penalty must be > 0, got {penalty}")
    p = np.float32(penalty)
    for r, seq, _ in _history(logits, sequences, lengths):
        if p == 1:
            continue
        ids = np.unique(seq)
        v = logits[r, ids]
        with np.errstate(over="ignore"):  # lowest * p -> -inf, as in C (and the reference)
            logits[r, ids] = np.where(v < 0, v * p, v / p)


def apply_no_repeat_ngram(
    logits: npt.NDArray[np.float32], sequences: npt.NDArray[np.int32], lengths: _PerRow, n: int
) -> None:
    """See `genai._core.sampling.apply_no_repeat_ngram`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    vocab = logits.shape[1]
    for r, _, seq in _history(logits, sequences, lengths):
        length = len(seq)
        if n == 0 or length < n:
            continue
        tail = list(seq[length - n + 1 :]) if n > 1 else []
        for i in range(length - n + 1):
            if list(seq[i : i + n - 1]) == tail and 0 <= seq[i + n - 1] < vocab:
                logits[r, seq[i + n - 1]] = LOWEST


def apply_presence_frequency(
    logits: npt.NDArray[np.float32],
    sequences: npt.NDArray[np.int32],
    lengths: _PerRow,
    start: _PerRow,
    presence: float,
    frequency: float,
) -> None:
    """See `genai._core.sampling.apply_presence_frequency`."""
    rows, vocab = logits.shape
    starts = _per_row(start, rows, "start")
    presence, frequency = np.float32(presence), np.float32(frequency)  # type: ignore[assignment]
    for r, _, seq in _history(logits, sequences, lengths):
        if presence == 0 and frequency == 0:
            continue
        generated = seq[max(int(starts[r]), 0) :]
        generated = generated[(generated >= 0) & (generated < vocab)]
        ids, counts = np.unique(generated, return_counts=True)
        logits[r, ids] -= presence + frequency * counts.astype(np.float32)


def apply_logit_bias(
    logits: npt.NDArray[np.float32], ids: npt.ArrayLike, biases: npt.ArrayLike
) -> None:
    """See `genai._core.sampling.apply_logit_bias`."""
    rows, vocab = logits.shape
    ids = np.asarray(ids, np.int32)
    biases = np.asarray(biases, np.float32)
    if ids.shape != biases.shape or ids.ndim not in (1, 2):
        raise ValueError("ids and biases must have the same shape, [n] or [rows, n]")
    if ids.ndim == 1:
        ids = np.broadcast_to(ids, (rows, ids.shape[0]))
        biases = np.broadcast_to(biases, (rows, biases.shape[0]))
    if ids.size and ids.max() >= vocab:
        raise ValueError(f"logit bias ids must be < vocab ({vocab})")
    for r in range(rows):
        keep = ids[r] >= 0
        row = logits[r]
        for i, b in zip(ids[r][keep], biases[r][keep], strict=True):
            row[i] = row[i] + b  # one at a time, as the kernel (repeated ids add up in order)


# ---------------------------------------------------------------------------------------------
# The choice
# ---------------------------------------------------------------------------------------------


def _rank_order(row: npt.NDArray[np.float32]) -> npt.NDArray[np.intp]:
    """Token ids by logit descending, ties by lower id."""
    return np.argsort(-row, kind="stable")


def _choose(
    row: npt.NDArray[np.float32],
    u: float,
    greedy: bool,
    temperature: float | np.floating[Any],
    top_k: int,
    top_p: float | np.floating[Any],
    min_p: float | np.floating[Any],
) -> tuple[int, bool]:
    """Token and whether the row was degenerate (max not finite)."""
    if np.isnan(row).any():
        return -1, False
    temperature, top_p, min_p = np.float32(temperature), np.float32(top_p), np.float32(min_p)
    m = row.max()
    if greedy or not np.isfinite(m):
        return int(np.argmax(row)), not np.isfinite(m)
    order = _rank_order(row)
    if 0 < top_k < row.shape[0]:
        order = order[:top_k]
    inv_t = 1.0 / float(temperature)
    e = np.exp(-((np.float64(m) - row[order].astype(np.float64)) * inv_t))
    cum = np.cumsum(e)
    kept = len(order)
    if 0.0 < top_p < 1.0:
        kept = int(np.argmax(cum >= float(top_p) * cum[-1])) + 1
    if min_p > 0.0:
        kept = min(kept, int(np.count_nonzero(e >= float(min_p))))
    cum = cum[:kept]
    j = int(np.searchsorted(cum, u * cum[-1], side="right"))
    if j >= kept:  # rounding: the last kept token with positive mass
        j = int(np.flatnonzero(e[:kept] > 0)[-1])
    return int(order[j]), False


def _fill_logprobs(
    row: npt.NDArray[np.float32],
    token: int,
    degenerate: bool,
    r: int,
    logprobs: npt.NDArray[np.float32] | None,
    top_ids: npt.NDArray[np.int32] | None,
    top_logprobs: Any,  # given with top_ids
) -> None:
    m = np.float64(row.max())
    if logprobs is not None:
        if degenerate:
            logprobs[r] = 0.0
        else:
            log_z = np.log(np.sum(np.exp(row.astype(np.float64) - m)))
            logprobs[r] = (np.float64(row[token]) - m) - log_z
    if top_ids is not None:
        n_top = top_ids.shape[1]
        n = min(n_top, row.shape[0])
        ids = _rank_order(row)[:n]
        top_ids[r, :n] = ids
        top_ids[r, n:] = -1
        top_logprobs[r, n:] = -np.inf
        if degenerate:
            top_logprobs[r, :n] = np.where(ids == token, 0.0, -np.inf)
        else:
            log_z = np.log(np.sum(np.exp(row.astype(np.float64) - m)))
            top_logprobs[r, :n] = (row[ids].astype(np.float64) - m) - log_z


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
) -> npt.NDArray[np.int32]:
    """See `genai._core.sampling.sample`."""
    check_options(dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))
    greedy = not do_sample or np.float32(temperature) == 0 or top_k == 1
    if (top_ids is None) != (top_logprobs is None):
        raise ValueError("pass top_ids and top_logprobs together")
    for r in range(logits.shape[0]):
        row = logits[r]
        token, degenerate = _choose(row, uniforms[r], greedy, temperature, top_k, top_p, min_p)
        if token < 0:
            raise NonFiniteLogitsError(f"logits of row {r} contain NaN")
        out[r] = token
        _fill_logprobs(row, token, degenerate, r, logprobs, top_ids, top_logprobs)
    return out


# ---------------------------------------------------------------------------------------------
# The whole chain
# ---------------------------------------------------------------------------------------------

_DEFAULTS: dict[str, Any] = {
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 0.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "no_repeat_ngram_size": 0,
    "min_length": 0,
}


class Sampler:
    """See `genai._core.sampling.Sampler`."""

    def __init__(self, rows: int, vocab: int, seed: int = -1) -> None:
        if rows < 1 or vocab < 1 or vocab > 2**31 - 1:
            raise ValueError(f"need rows >= 1 and 1 <= vocab < 2**31, got {rows}, {vocab}")
        self.rows: int = rows
        self.vocab: int = vocab
        self.rng = RowRng(rows, seed)
        self._params = [dict(_DEFAULTS) for _ in range(rows)]
        self._bias = [(np.zeros(0, np.int32), np.zeros(0, np.float32)) for _ in range(rows)]

    def configure(self, row: int | None = None, **options: Any) -> None:
        options = check_options(options)
        for r in self._rows_of(row):
            self._params[r].update(options)

    def options(self, row: int) -> dict[str, Any]:
        self._rows_of(row)
        out = dict(self._params[row])
        for name, value in out.items():  # stored as float32 in the kernel
            if isinstance(value, float):
                out[name] = float(np.float32(value))
        return out

    def set_logit_bias(self, row: int | None, ids: _Ids, biases: _Floats) -> None:
        ids = np.asarray(ids, np.int64).reshape(-1)
        biases = np.asarray(biases, np.float32).reshape(-1)
        if ids.shape != biases.shape:
            raise ValueError("ids and biases must have the same length")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            raise ValueError(f"logit bias ids must be in [0, {self.vocab})")
        if not np.isfinite(biases).all():
            raise ValueError("logit biases must be finite")
        for r in self._rows_of(row):
            self._bias[r] = (ids.astype(np.int32), biases.copy())

    def load_logits(self, logits: npt.ArrayLike, rows_out: npt.NDArray[np.float32]) -> None:
        """Copy ``logits`` into ``rows_out`` (the kernel also records block maxima)."""
        rows_out.reshape(self.rows, self.vocab)[:] = check_logits(logits, self.rows, self.vocab)

    def forget_logits(self) -> None:
        """Nothing to forget: the twin keeps no maxima."""

    def seed(self, seed: int = -1, row: int | None = None, stream: int | None = None) -> None:
        if row is None:
            self.rng.seed(seed)
        else:
            self.rng.seed_row(row, seed, stream)

    def _rows_of(self, row: int | None) -> Sequence[int]:
        if row is None:
            return range(self.rows)
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside [0, {self.rows})")
        return (row,)

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
    ) -> npt.NDArray[np.int32]:
        """See `genai._core.sampling.Sampler.sample_batch`."""
        batch, vocab = logits.shape
        if vocab != self.vocab:
            raise ValueError(f"logits have {vocab} columns, the sampler {self.vocab}")
        if batch > self.rows:
            raise ValueError(f"{batch} logit rows exceed the sampler's {self.rows} rows")
        if (top_ids is None) != (top_logprobs is None):
            raise ValueError("pass top_ids and top_logprobs together")
        lengths = _per_row(lengths, batch, "lengths")
        starts = _per_row(prompt_lengths, batch, "prompt_lengths")
        if batch and (lengths[:batch].min() < 0 or lengths[:batch].max() > sequences.shape[1]):
            raise ValueError(f"lengths must be in [0, {sequences.shape[1]}]")
        eos_ids = np.asarray(eos_ids, np.int32)
        if ((eos_ids < 0) | (eos_ids >= vocab)).any():
            raise ValueError(f"eos ids outside the vocabulary ({vocab})")
        for r in range(batch):
            if done is not None and done[r]:
                continue
            p = self._params[r]
            u = self.rng.uniform(r)
            one = logits[r : r + 1]  # a view: the stages write through
            seq = sequences[r : r + 1]
            apply_min_length(one, lengths[r], p["min_length"], eos_ids)  # type: ignore[arg-type]
            apply_repetition_penalty(one, seq, lengths[r], p["repetition_penalty"])
            apply_no_repeat_ngram(one, seq, lengths[r], p["no_repeat_ngram_size"])
            apply_presence_frequency(
                one, seq, lengths[r], starts[r], p["presence_penalty"], p["frequency_penalty"]
            )
            ids, biases = self._bias[r]
            apply_logit_bias(one, ids, biases)
            greedy = not p["do_sample"] or np.float32(p["temperature"]) == 0 or p["top_k"] == 1
            token, degenerate = _choose(
                logits[r], u, greedy, p["temperature"], p["top_k"], p["top_p"], p["min_p"]
            )
            if token < 0:
                raise NonFiniteLogitsError(f"logits of row {r} contain NaN")
            out[r] = token
            _fill_logprobs(logits[r], token, degenerate, r, logprobs, top_ids, top_logprobs)
        return out
