"""Draft-model proposals: a smaller model sharing the target's vocabulary proposes the tokens
a round verifies (``model.draft`` in ``genai_config.json``, or a draft folder chosen at run
time).

`DraftProposer` runs the draft with a driver of its own (`genai.generation.drivers`) and the
target's search options (its penalties): before each proposal it brings the draft's sequence to
the target's committed one (rewinding its KV cache to their common prefix with the driver's
rewind, then running the tokens it has not seen, as rows with one-token steps' numbers where
the target's verify runs get them: `run_as_steps`), then makes one step per proposed token.
Greedy, a step takes the draft's argmax. Sampled (`stream` set by the decoder), it draws from
the draft's truncated distribution q and keeps q for the accept test
(`genai.generation.speculative.sampling`). Under guidance a step's row is masked by a copy of
the grammar (`genai.constraints.guidance.GrammarLookahead`) before the greedy choice, and the
tokens the grammar forces join the proposal as they come.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from genai.constraints.guidance import GrammarLookahead
from genai.generation.drivers import LoopSettings, make_driver
from genai.generation.logits import LogitsChain
from genai.generation.search import SearchOptions
from genai.generation.speculative.sampling import ReferenceStream, processed_distribution

__all__ = ["DraftProposer"]


class DraftProposer:
    """Proposals from ``draft`` (a `genai.Model`) for a target generating with ``search``;
    ``counters``: the round's `SpeculativeCounters` (draft runs are counted)."""

    #: guided rounds pass a `GrammarLookahead` to `propose`, which masks the draft's rows
    masks_with_grammar = True

    def __init__(self, draft: Any, search: SearchOptions, eos: np.ndarray, counters: Any) -> None:
        # the target's options, greedy: the same penalties (min_length, repetition, presence,
        # frequency) make the draft propose what the target's processed rows choose
        options = copy.deepcopy(search)
        options.do_sample = False
        options.logprobs, options.top_logprobs, options.stop = False, 0, ()
        #: the draft's logits chain (its sampler applies the penalties; None: plain argmax)
        self.chain = LogitsChain(1, draft.io.vocab_size, eos, options)
        pad_id = int(draft.config.get("model.pad_token_id", 0))
        settings = LoopSettings(
            rows=1,
            max_length=search.max_length,
            pad_id=pad_id,
            eos=eos,
            sampler=self.chain.loop_sampler,
            padded=False,
        )
        self.model = draft
        self.driver = make_driver(draft, options, settings)
        self.loop = self.driver.loop
        self._sequence = self.loop.array("sequences")[0]
        self._next = self.loop.array("next_tokens")
        self._eos = frozenset(int(t) for t in eos)
        self.counters = counters
        #: sampled proposals: the stream they are drawn with (None: greedy), the truncation
        #: (top_k, top_p, temperature) of q, and per proposal of the last round the
        #: (ids, probabilities) of the q it was drawn from
        self.stream: ReferenceStream | None = None
        self.truncation: tuple[int, float, float] = (0, 1.0, 1.0)
        self.drafts_q: list[tuple[np.ndarray, np.ndarray]] = []

    def invalidate(self) -> None:
        """Nothing kept to rebuild: the next proposal compares the sequences."""

    def accepted(self, committed: np.ndarray) -> None:
        """Nothing to do: the next proposal catches the draft up."""

    def prepare(self, committed: np.ndarray) -> None:
        """Run the tokens the generator appended (its prompt, or a later append) now, as the
        reference's prompt run does: the next round's first proposal comes from their logits."""
        self._catch_up(committed)

    def _catch_up(self, committed: np.ndarray) -> None:
        """Make the draft's sequence ``committed`` (its KV cache kept for their common
        prefix)."""
        loop, driver = self.loop, self.driver
        have, want = loop.length, committed.shape[0]
        common = min(have, want)
        if common:
            differ = np.flatnonzero(self._sequence[:common] != committed[:common])
            if differ.size:
                common = int(differ[0])
        if common < have:
            # the draft's KV holds the common tokens (it ran all but its last proposal): the
            # catch-up then runs only the committed tokens after them
            driver.rewind(common, keep_last=common < want)
        if common < want:
            loop.append(np.ascontiguousarray(committed[None, common:want], np.int32))
            if common:
                self._run_pending()
            else:
                driver.run(prompt=True)
            if not common:  # as the reference counts: the prompt, then one run per proposal
                self.counters.draft_forward_passes += 1

    def propose(
        self, committed: np.ndarray, count: int, grammar: GrammarLookahead | None = None
    ) -> list[int]:
        """Up to ``count`` draft tokens after ``committed`` (ending at an EOS): greedy, or
        drawn from q with `stream`. With ``grammar`` (guidance) each row is masked by it
        before the choice, and the tokens it forces join the proposal without a choice (the
        draft runs them to propose what follows)."""
        self.drafts_q = []
        if count <= 0:
            return []
        self._catch_up(committed)
        if grammar is not None:
            return self._propose_guided(count, grammar)
        loop, driver = self.loop, self.driver
        sequences = loop.array("sequences")
        proposal: list[int] = []
        while len(proposal) < count and loop.length < sequences.shape[1]:
            self.counters.draft_forward_passes += 1
            if self.stream is None:
                driver.step()
                token = int(self._next[0])
            else:
                if not loop.logits_ready:
                    driver.run()
                ids, probs = processed_distribution(
                    self.chain,
                    loop.array("logits_rows")[0],
                    sequences,
                    loop.length,
                    loop.prompt_length,
                    self.truncation,
                )
                self.drafts_q.append((ids, probs))
                token = int(ids[self.stream.choice(probs)])
                loop.push_tokens(np.array([token], np.int32), False)
            proposal.append(token)
            if token in self._eos:
                break
        return proposal

    def _propose_guided(self, count: int, grammar: GrammarLookahead) -> list[int]:
        """`propose` under guidance: greedy choices from the draft's processed rows masked
        by ``grammar``, forced tokens taken as they come."""
        loop = self.loop
        sequences = loop.array("sequences")
        proposal: list[int] = []
        forced = grammar.forced()
        while len(proposal) < count and loop.length < sequences.shape[1] and not grammar.ended:
            self.counters.draft_forward_passes += 1  # as unguided: one per proposed token
            if forced:
                token = forced.pop(0)
            else:
                if not loop.logits_ready:
                    self._run_pending()
                row = np.array(loop.array("logits_rows")[0], np.float32)[None, :]
                self.chain.apply_stages(row, sequences, loop.length, loop.prompt_length)
                grammar.fill_mask(row[0])
                token = int(np.argmax(row[0]))
                forced = grammar.advance(token)
            loop.push_tokens(np.array([token], np.int32), False)
            proposal.append(token)
            if token in self._eos:
                break
        return proposal

    def _run_pending(self) -> None:
        """Run the draft's tokens not run yet (not a prompt): one after a choice, or several
        (a forced span; the last proposal and the target's token after a round) as rows
        with one-token steps' numbers, as the target's verify run gives them, where the
        driver can (a self-draft then always agrees, as in the reference, where both run
        the same rows)."""
        loop, driver = self.loop, self.driver
        if 1 < loop.length - loop.computed <= getattr(driver, "verify_tokens", 0):
            driver.run_as_steps()
        else:
            driver.run()
