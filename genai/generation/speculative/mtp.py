"""Multi-token-prediction proposals: a one-layer MTP head drafts the token after next from the
main model's last hidden state and the token just committed (Qwen3.6 / DeepSeek style).

`MtpProposer` runs the head (a `genai.Model` whose config names
``model.decoder.inputs.hidden_states``) with a driver of its own. The head's sequence pairs
each generated token t(i+1) with the main model's hidden state h(i) at the position before it,
from the first generated token on (as the reference's `MtpGenerator`): to propose the token at
length L it has run (h(L-2), t(L-1)). The main model's hidden rows come from its runs
(`observe`, called after every run with the positions it fed); the head catches up with the
committed tokens as a draft model does (rewind to the common prefix, run the rest).

Chained drafts (``count`` > 1, as the reference's ``max_draft_tokens`` > 1): the head's own
feedback output (``feedback_name``, the last row) is fed back with the draft just made to draft
the next one. Those speculative positions are dropped at the next proposal (the head re-runs the
committed tokens with the main model's hidden states), as the reference rolls its head back.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from genai.errors import InvalidArgumentError
from genai.generation.drivers import LoopSettings, make_driver

__all__ = ["MtpProposer"]


class MtpProposer:
    """Proposals of ``head`` for ``generator`` (a `genai.Generator` on the main model, whose
    graph outputs ``hidden_name``); ``counters``: the round's `SpeculativeCounters`."""

    def __init__(
        self,
        head: Any,
        generator: Any,
        hidden_name: str,
        counters: Any,
        feedback_name: str | None = None,
    ) -> None:
        settings = LoopSettings(
            rows=1,
            max_length=generator.max_length,
            pad_id=-1,  # one unpadded row: a generated pad id is a token like any other
            eos=generator._eos,
        )
        self.head = head
        self.generator = weakref.proxy(generator)  # owned through the generator: no cycle
        self.hidden_name = hidden_name
        #: the head's feedback output (chained drafts), None: one draft per proposal
        self.feedback_name = feedback_name
        #: the head's positions paired with main-model hidden states (the rest: chained drafts)
        self._valid = 0
        self.driver = make_driver(head, generator.search, settings)
        self.loop = self.driver.loop
        self._head_tokens = self.loop.array("sequences")[0]
        self._next = self.loop.array("next_tokens")
        self._eos = frozenset(int(t) for t in generator._eos)
        self.counters = counters
        #: the main model's hidden state per position (rows filled by `observe`)
        self.hidden: np.ndarray | None = None
        #: the prompt length: the head's sequence starts after it
        self.start = 0

    def reset(self, prompt_length: int) -> None:
        """A new prompt of ``prompt_length`` tokens (its run observed next)."""
        self.start = prompt_length
        self._valid = 0
        if self.loop.length:
            self.driver.rewind(0)

    def invalidate(self) -> None:
        """Nothing kept to rebuild: the next proposal compares the sequences."""

    def accepted(self, committed: np.ndarray) -> None:
        """Nothing to do: the next proposal catches the head up."""

    def observe(self, first: int) -> None:
        """The main model just ran the tokens from position ``first``: keep their hidden
        states."""
        rows = self.generator._driver.read_output(self.hidden_name)[0]
        if self.hidden is None:
            self.hidden = np.zeros((self.generator.max_length, rows.shape[-1]), rows.dtype)
        count = self.generator._loop.computed - first
        self.hidden[first : first + count] = rows[rows.shape[0] - count :]

    def draft_token(self, logits: np.ndarray, index: int) -> int:
        """The draft at chain position ``index`` from the head's logits row: greedy (a sampled
        MTP round draws it instead, `genai.generation.mtp`)."""
        return int(np.argmax(logits))

    def propose(self, committed: np.ndarray, count: int) -> list[int]:
        """The head's greedy drafts of the tokens after ``committed``: one, or ``count`` chained
        through the feedback output when the head has one."""
        length = committed.shape[0]
        want = committed[self.start : length]  # the head's tokens t(P) .. t(L-1)
        if count <= 0 or not want.size or self.hidden is None:
            return []
        loop, driver = self.loop, self.driver
        have = loop.length
        common = min(have, want.size, self._valid)
        if common:
            differ = np.flatnonzero(self._head_tokens[:common] != want[:common])
            if differ.size:
                common = int(differ[0])
        if common < have:
            driver.rewind(common)
        if common < want.size:
            loop.append(np.ascontiguousarray(want[None, common:], np.int32))
        first = loop.computed  # the head runs its tokens from here: pair each with h(i - 1)
        rows = self.hidden[self.start - 1 + first : self.start - 1 + loop.length]
        if rows.shape[0] != loop.length - first:
            raise InvalidArgumentError("the main model's hidden states miss the head's positions")
        driver.set_hidden_states(rows[None, :, :])
        driver.run(prompt=first == 0)
        self.counters.draft_forward_passes += 1
        tokens = [self.draft_token(loop.array("logits_rows")[0], 0)]
        self._valid = loop.length
        if self.feedback_name is None:
            return tokens
        while len(tokens) < count:
            fed = driver.read_output(self.feedback_name)[0, -1:]
            loop.append(np.array([tokens[-1:]], np.int32))
            driver.set_hidden_states(fed[None, :, :])
            driver.run()
            self.counters.draft_forward_passes += 1
            tokens.append(self.draft_token(loop.array("logits_rows")[0], len(tokens)))
        return tokens
