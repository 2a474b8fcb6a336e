"""Speculative decoding in the continuous-batching scheduler (``genai serve --speculative``).

`SpeculativeServing` says what the scheduler proposes; `SlotProposer` keeps one sequence's
prompt-lookup index (`genai.generation.speculative.NGramLookup`, the generator's own) in step
with its history. Each iteration the scheduler asks every decoding sequence for proposals:
those with some run ``[pending token] + proposals`` in one verify run of their slot
(`BatchRunner.verify`: a logits row per token), choose each row's token through the request's
own `LogitsChain` (penalties, bias, processors, then greedy argmax or a draw from its random
stream) while it equals the proposal, emit the accepted tokens plus the first choice that
differs (or the one after the last proposal), and truncate the slot's KV to what was emitted;
the others take the batched decode step. The choice at every row is the plain choice, one
random draw per emitted token from the same stream, so greedy and seeded requests give plain
serving's tokens (on graphs whose verify rows equal the decode step's: fp32 ones exactly) and
sampling keeps the target distribution (rejection sampling with a one-token proposal, as
`genai.generation.speculative.decoder`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from genai.errors import InvalidArgumentError, ModelError
from genai.generation.search import SearchOptions
from genai.generation.speculative import DraftProposer, NGramLookup, SpeculativeCounters

__all__ = ["DraftSlotProposer", "SlotProposer", "SpeculativeServing"]


@dataclass(frozen=True)
class SpeculativeServing:
    """Prompt lookup for served requests: the last ``ngram_size - 1`` tokens are looked up in
    the sequence's earlier tokens (prompt and output) and up to ``max_draft_tokens`` of what
    followed them are verified in one run. Only while at most ``max_streams`` sequences of
    a scheduler are decoding: each speculating sequence costs a run of its own (ONNX Runtime's
    GroupQueryAttention takes several new tokens on a past for one row only), while the plain
    step decodes every row in one run, so with more streams plain steps are faster (measured
    on SmolLM2 int4, one thread: 1.4-1.9x alone, 0.99x at 2 streams, 0.86x at 4)."""

    ngram_size: int = 3
    max_draft_tokens: int = 4
    max_streams: int = 1
    #: A draft `genai.Model` with the target's vocabulary: its greedy tokens are the
    #: proposals instead of prompt lookup's (``draft:DIR``; `loaded` loads ``draft_dir``).
    draft: Any = None
    #: The folder of ``draft:DIR`` (`parse`), loaded by `loaded`.
    draft_dir: str | None = None
    #: Pause a sequence's verify runs while they emit fewer tokens per millisecond than its
    #: plain steps (`genai.generation.speculative.policy.Backoff`, as adaptive K does in
    #: `genai.Generator`). Off by default: serving's verify runs (K 4, the pending token
    #: folded in) paid on every prompt measured, and pauses only cost (docs/serving.md).
    backoff: bool = False

    def __post_init__(self) -> None:
        if not 2 <= self.ngram_size <= 16:
            raise InvalidArgumentError(f"ngram_size must be 2..16, got {self.ngram_size}")
        if not 1 <= self.max_draft_tokens <= 16:
            raise InvalidArgumentError(
                f"max_draft_tokens must be 1..16, got {self.max_draft_tokens}"
            )
        if self.max_streams < 1:
            raise InvalidArgumentError(f"max_streams must be >= 1, got {self.max_streams}")

    @classmethod
    def parse(cls, spec: str, max_streams: int = 1, backoff: bool = False) -> SpeculativeServing:
        """``ngram``, ``ngram:N`` (n-gram size), ``ngram:N:K`` (size, proposals per step) or
        ``draft:DIR`` (a draft model folder, K 4; `loaded` loads it), what ``genai serve
        --speculative`` takes; `InvalidArgumentError` otherwise."""
        kind, _, rest = spec.partition(":")
        if kind == "draft" and rest:
            return cls(max_streams=max_streams, draft_dir=rest, backoff=backoff)
        if kind != "ngram":
            raise InvalidArgumentError(
                f"--speculative takes ngram[:N[:K]] or draft:DIR, not {spec!r}"
            )
        numbers = rest.split(":") if rest else []
        if len(numbers) > 2 or not all(n.isdigit() for n in numbers):
            raise InvalidArgumentError(f"--speculative takes ngram[:N[:K]], not {spec!r}")
        values = [int(n) for n in numbers]
        return cls(*values, max_streams=max_streams, backoff=backoff)

    def loaded(self, load: Callable[[str], Any]) -> SpeculativeServing:
        """This with ``draft`` = ``load(draft_dir)`` (unchanged without ``draft_dir``)."""
        if self.draft_dir is None or self.draft is not None:
            return self
        return dataclasses.replace(self, draft=load(self.draft_dir))

    def check_target(self, vocab_size: int) -> None:
        """`ModelError` (the generator's message) when the draft's vocabulary differs."""
        if self.draft is not None and self.draft.io.vocab_size != vocab_size:
            raise ModelError(
                "Target and draft logit dimensions don't match. Target vocab: "
                f"{vocab_size}, Draft vocab: {self.draft.io.vocab_size}. Target and "
                "draft must share the same vocabulary."
            )

    def proposer(
        self, sampling: SearchOptions, eos: Sequence[int], max_length: int
    ) -> SlotProposer | DraftSlotProposer:
        """A new sequence's proposer (``sampling``: its options; the draft applies their
        penalties, greedily)."""
        if self.draft is None:
            return SlotProposer(self.ngram_size)
        return DraftSlotProposer(self.draft, sampling, eos, max_length)


class DraftSlotProposer:
    """One sequence's draft model (`genai.generation.speculative.DraftProposer`: a driver of
    its own, batch 1, its KV rewound to the common prefix with the history before each
    proposal)."""

    def __init__(
        self, draft: Any, sampling: SearchOptions, eos: Sequence[int], max_length: int
    ) -> None:
        options = copy.deepcopy(sampling)
        self.max_length = min(max_length, int(draft.config.context_length))
        options.max_length = self.max_length
        self.draft = DraftProposer(
            draft, options, np.asarray(list(eos), np.int32), SpeculativeCounters()
        )

    def propose(self, history: np.ndarray, count: int) -> list[int]:
        """Up to ``count`` greedy draft tokens after ``history`` ([] near the draft's
        context length)."""
        if len(history) + count >= self.max_length:
            return []
        return self.draft.propose(np.ascontiguousarray(history, np.int32), count)


class SlotProposer:
    """One sequence's prompt-lookup index, synced with its history before each proposal."""

    def __init__(self, ngram_size: int) -> None:
        self.lookup = NGramLookup(ngram_size)

    def propose(self, history: np.ndarray, count: int) -> list[int]:
        """Up to ``count`` tokens to follow ``history`` (int32 [length]); the index follows
        appended tokens incrementally and is rebuilt after anything else."""
        lookup = self.lookup
        indexed = len(lookup)
        if indexed > len(history) or (indexed and lookup.history[-1] != int(history[indexed - 1])):
            lookup.reset(history.tolist())
        elif indexed < len(history):
            lookup.append(history[indexed:].tolist())
        return lookup.propose(count)

    def would_propose(self, history: np.ndarray) -> bool:
        """True when `propose` would find a proposal after ``history``."""
        return bool(self.propose(history, 1))
