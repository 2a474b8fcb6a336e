"""Prompt lookup: propose the tokens that followed the current context where it occurred
before in the sequence (prompt and generated tokens alike).

`NGramLookup` indexes every ``ngram_size - 1``-token key of the committed history by its most
recent position whose continuation is known, incrementally as tokens are committed; a rewind
(a shorter or different history) rebuilds it. A proposal copies the continuation after the
most recent earlier occurrence of the last key (up to ``max_tokens``); a *chained* proposal
instead advances its own context token by token, looking each next token up anew, so it can
cross from one occurrence to another (the history and the index are not changed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["NGramLookup", "NGramProposer"]


class NGramLookup:
    """Incremental exact n-gram index over a token history (see the module docstring)."""

    def __init__(self, ngram_size: int) -> None:
        if ngram_size < 2:
            raise ValueError(f"n-gram lookup needs ngram_size >= 2, got {ngram_size}")
        self.ngram_size = ngram_size
        self.key_length = ngram_size - 1
        self.history: list[int] = []
        #: key (tuple of key_length tokens) -> its latest start with a known continuation
        self._where: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.history)

    def reset(self, committed: Sequence[int] = ()) -> None:
        """Forget everything, then index ``committed``."""
        self.history.clear()
        self._where.clear()
        self.append(committed)

    def append(self, tokens: Sequence[int]) -> None:
        """Index newly committed ``tokens``."""
        history, where, n = self.history, self._where, self.key_length
        for token in tokens:
            history.append(int(token))
            start = len(history) - n - 1
            if start >= 0:
                where[tuple(history[start : start + n])] = start

    def propose(self, max_tokens: int, chained: bool = False) -> list[int]:
        """Up to ``max_tokens`` tokens predicted after the history ([] when its last key did
        not occur before)."""
        history, n = self.history, self.key_length
        if max_tokens <= 0 or len(history) < n:
            return []
        context = tuple(history[len(history) - n :])
        start = self._where.get(context)
        if start is None:
            return []
        if not chained:
            begin = start + n
            return history[begin : begin + max_tokens]
        proposal: list[int] = []
        while start is not None and len(proposal) < max_tokens:
            token = history[start + n]
            proposal.append(token)
            context = (*context[1:], token)
            start = self._where.get(context)
        return proposal


class NGramProposer:
    """Prompt-lookup proposals for `genai.generation.speculative.decoder.SpeculativeDecoder`:
    the `NGramLookup` kept in step with the committed sequence, with the reference's lookup
    and history counters (``counters``: a `SpeculativeCounters`)."""

    def __init__(self, ngram_size: int, chained: bool, counters: Any) -> None:
        self.lookup = NGramLookup(ngram_size)
        self.chained = chained
        self.counters = counters
        self._stale = False

    def invalidate(self) -> None:
        """Rebuild the index from the committed sequence at the next proposal."""
        self._stale = True

    def accepted(self, committed: np.ndarray) -> None:
        """Nothing to do: the next proposal indexes what was committed."""

    def _sync(self, committed: np.ndarray) -> None:
        lookup, counters = self.lookup, self.counters
        indexed = len(lookup)
        started = time.perf_counter()
        if self._stale or committed.shape[0] < indexed:
            lookup.reset(committed.tolist())
            synced = committed.shape[0]
            self._stale = False
        elif committed.shape[0] == indexed:
            return
        else:
            lookup.append(committed[indexed:].tolist())
            synced = committed.shape[0] - indexed
        counters.ngram_history_syncs += 1
        counters.ngram_history_tokens_synced += synced
        counters.total_ngram_history_sync_ms += (time.perf_counter() - started) * 1e3

    def would_propose(self, committed: np.ndarray) -> bool:
        """True when `propose` would find a proposal (not counted as a lookup)."""
        self._sync(committed)
        return bool(self.lookup.propose(1))

    def trimmed(self, proposed: int, kept: int, rejected: bool) -> None:
        """The caller kept the first ``kept`` of the ``proposed`` tokens (guidance refused the
        next one, ``rejected``, or forces tokens after them): the counters count those, as
        the reference's."""
        counters = self.counters
        counters.ngram_lookup_tokens_proposed -= proposed - kept
        if self.chained:
            counters.ngram_chained_tokens_proposed -= max(proposed - 1, 0) - max(kept - 1, 0)
        counters.ngram_grammar_candidate_rejections += rejected

    def propose(self, committed: np.ndarray, count: int) -> list[int]:
        """Up to ``count`` tokens that followed the last ``ngram_size - 1`` committed ones."""
        self._sync(committed)
        started = time.perf_counter()
        proposal = self.lookup.propose(count, self.chained)
        counters = self.counters
        counters.total_ngram_lookup_ms += (time.perf_counter() - started) * 1e3
        if proposal:
            counters.ngram_lookup_hits += 1
        else:
            counters.ngram_lookup_misses += 1
        counters.ngram_lookup_tokens_proposed += len(proposal)
        if self.chained and len(proposal) > 1:
            counters.ngram_chained_tokens_proposed += len(proposal) - 1
        return proposal
