"""Speculative sampling as the reference does it (Leviathan et al. / Chen et al.): a draft
token d drawn from the draft's distribution q is kept with probability min(1, p(d) / q(d)),
where p is the target's; the first rejected one is replaced by a draw from the residual
max(0, p - q), renormalised; after every draft was kept, a bonus is drawn from p. Every emitted
token is then distributed as a draw from p.

`truncated_distribution` is the reference's sampling distribution of a logits row (temperature,
top-k, nucleus); `ReferenceStream` its random stream (``std::mt19937`` with libstdc++'s
uniform and discrete draws), so rounds seeded alike draw alike.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "ReferenceStream",
    "probability",
    "processed_distribution",
    "speculative_sample",
    "truncated_distribution",
]

Distribution = tuple[np.ndarray, np.ndarray]


class ReferenceStream:
    """The reference's MTP random stream: ``std::mt19937`` seeded with ``seed`` (-1: from
    os.urandom), drawn as libstdc++ draws ``std::uniform_real_distribution<float>(0, 1)`` (one
    32-bit output) and ``std::discrete_distribution<int>`` (two outputs, a double in [0, 1)
    against the normalised cumulative weights; one weight draws nothing)."""

    def __init__(self, seed: int) -> None:
        if seed < 0:
            seed = int.from_bytes(os.urandom(4), "little")
        self._bits = np.random.MT19937()
        # RandomState seeds an int as std::mt19937 does (init_genrand)
        legacy = np.random.RandomState(int(seed) & 0xFFFFFFFF)
        self._bits.state = legacy.get_state(legacy=False)

    def _next(self) -> int:
        return int(self._bits.random_raw())

    def uniform(self) -> np.float32:
        """A float in [0, 1) (generate_canonical<float, 24>: one output)."""
        value = np.float32(self._next()) / np.float32(4294967296.0)
        if value >= np.float32(1.0):
            value = np.nextafter(np.float32(1.0), np.float32(0.0))
        return np.float32(value)

    def choice(self, weights: np.ndarray) -> int:
        """An index drawn with probability proportional to ``weights`` (float32)."""
        if weights.shape[0] < 2:
            return 0
        total = 0.0
        for w in weights.tolist():
            total += w
        cumulative, running = [], 0.0
        for w in weights.tolist():
            running += w / total
            cumulative.append(running)
        cumulative[-1] = 1.0
        low = float(self._next())
        draw = (low + float(self._next()) * 4294967296.0) / 18446744073709551616.0
        if draw >= 1.0:
            draw = float(np.nextafter(1.0, 0.0))
        return int(np.searchsorted(np.array(cumulative), draw, side="left"))


def truncated_distribution(
    scores: np.ndarray, top_k: int, top_p: float, temperature: float
) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities float32) of the reference's truncated sampling distribution of a
    logits row: temperature softmax over the ``top_k`` best (when ``top_k`` > 1), then the
    nucleus ``top_p`` (when 0 < p < 1), renormalised, in float32 as the reference sums. With
    ``top_k`` <= 1 the reference takes a nucleus of the whole vocabulary: its best token alone
    when ``top_p`` <= 0."""
    scores = np.asarray(scores, np.float32)
    vocab = scores.shape[0]
    if top_k > 1 and top_k < vocab:  # the k best (ties: lower id first), no full sort
        best = np.argpartition(-scores, top_k - 1)[:top_k]
        order = best[np.lexsort((best, -scores[best]))]
    elif top_k <= 1 and top_p <= 0.0:
        order = np.array([int(np.argmax(scores))])
    else:
        order = np.argsort(-scores, kind="stable")
    inv_temp = np.float32(1.0) / np.float32(temperature)
    probs = np.exp(((scores[order] - scores[order[0]]) * inv_temp).astype(np.float64))
    probs = probs.astype(np.float32)
    total = np.float32(0.0)
    for value in probs:
        total = np.float32(total + value)
    if total > 0:
        probs = (probs / total).astype(np.float32)
    keep = probs.shape[0]
    if top_k <= 1 and top_p <= 0.0:  # the reference's nucleus of p = 0: the best token
        keep = 1
    elif 0.0 < top_p < 1.0:
        running = np.float32(0.0)
        for j, value in enumerate(probs):
            running = np.float32(running + value)
            if running >= np.float32(top_p):
                keep = j + 1
                break
    kept = probs[:keep]
    total = np.float32(0.0)
    for value in kept:
        total = np.float32(total + value)
    inverse = np.float32(1.0) / total if total > 0 else np.float32(0.0)
    return order[:keep].astype(np.int32), (kept * inverse).astype(np.float32)


def probability(ids: np.ndarray, probs: np.ndarray, token: int) -> np.float32:
    found = np.flatnonzero(ids == token)
    return probs[found[0]] if found.size else np.float32(0.0)


def processed_distribution(
    chain: Any,
    row: np.ndarray,
    sequences: np.ndarray,
    length: int,
    prompt_length: Any,
    truncation: tuple[int, float, float],
) -> Distribution:
    """The truncated distribution (``truncation``: top_k, top_p, temperature) of logits
    ``row`` for the token at ``length``, after ``chain``'s penalties and bias
    (`LogitsChain.apply_stages` over ``sequences``); ``row`` is not changed."""
    logits = np.array(row, np.float32).reshape(1, -1)
    chain.apply_stages(logits, sequences, length, prompt_length)
    return truncated_distribution(logits[0], *truncation)


def speculative_sample(
    targets: Sequence[Distribution],
    drafts: Sequence[int],
    drafts_q: Sequence[Distribution],
    stream: ReferenceStream,
) -> tuple[int, int, bool]:
    """One round's accept test: ``targets[i]`` is p at draft i's position (one more for the
    bonus), ``drafts_q[i]`` the q draft i was drawn from. Returns (drafts kept, the token
    after them, True when that token is a bonus rather than a correction)."""
    for i, draft in enumerate(drafts):
        p_ids, p_probs = targets[i]
        q_ids, q_probs = drafts_q[i]
        p_t = probability(p_ids, p_probs, draft)
        p_d = probability(q_ids, q_probs, draft)
        chance = np.float32(1.0) if p_d <= 0 else min(np.float32(1.0), p_t / p_d)
        if stream.uniform() < chance:
            continue
        overlap = np.array([probability(q_ids, q_probs, int(t)) for t in p_ids], np.float32)
        residual = np.maximum(p_probs - overlap, np.float32(0.0)).astype(np.float32)
        if np.float32(residual.sum(dtype=np.float32)) > 0:
            return i, int(p_ids[stream.choice(residual)]), False
        return i, int(p_ids[stream.choice(p_probs)]), False
    ids, probs = targets[len(drafts)]
    return len(drafts), int(ids[stream.choice(probs)]), True
