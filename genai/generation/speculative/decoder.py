"""`SpeculativeDecoder`: the rounds of speculative decoding inside a `genai.Generator`.

A round (`SpeculativeDecoder.step`, when nothing is queued):

1. **propose** K tokens (a `Proposer`: prompt lookup, a draft model); none: one plain step;
2. **verify**: the driver runs the pending token and the K proposals in one model run
   (`NativeDriver.verify`) and returns a logits row per position: the row before proposal i
   judges it;
3. **accept**: each row goes through the generator's logits chain (`LogitsChain.process`:
   penalties, bias, custom processors, then the choice: greedy argmax, or a draw from the
   sampler's own random stream) in order; a proposal is accepted while it equals the chosen
   token. The first mismatch (a *correction*), or the row after the last proposal (a *bonus*),
   gives one more token. Choosing from the target's own distribution at every position is
   rejection sampling for a proposal that is a single token (Leviathan et al. with a one-hot
   draft distribution): the accepted tokens and the correction are exactly a draw from the
   target, one uniform per emitted token, the same stream plain decoding draws from;
4. **commit**: the sequences and the KV cache keep the emitted tokens (`rewind` to them; the
   last one stays pending, as after a plain step), and the tokens are queued.

Each `generate_next_token` call then emits one queued token (`drain`), so callers see one token
per call as with plain decoding: while tokens are queued the generator reports the sequence,
token count, done state and logits of what was emitted so far (`visible`). Rewinding,
appending or setting logits first discards what is still queued (`settle`).

EOS ends the round (the EOS is not added to the sequence, as a plain step that finishes the
last row); max_length and max_new_tokens cut it; stop strings are matched as tokens are
emitted, and a stop discards the rest.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from genai.compat.engine_enums import FinishReason
from genai.errors import GenerationError, NonFiniteLogitsError
from genai.generation.speculative.options import SpeculativeOptions
from genai.generation.speculative.policy import AdaptiveK, Backoff, Cooldown
from genai.generation.speculative.sampling import (
    ReferenceStream,
    processed_distribution,
    speculative_sample,
)
from genai.generation.speculative.stats import SpeculativeCounters

if TYPE_CHECKING:
    from genai.generation.logits import LogitsChain

__all__ = ["Proposer", "SpeculativeDecoder"]


class Proposer(Protocol):
    """Proposes the tokens a round verifies. One whose ``masks_with_grammar`` is true also
    takes a `genai.constraints.guidance.GrammarLookahead` as a third argument under guidance
    and proposes only what the grammar allows; others' proposals are cut where it refuses."""

    def propose(self, committed: np.ndarray, count: int) -> list[int]:
        """Up to ``count`` tokens to follow ``committed`` (the sequence so far, int32)."""
        ...

    def invalidate(self) -> None:
        """The committed sequence changed other than by appending (rewind, new prompt)."""
        ...

    def accepted(self, committed: np.ndarray) -> None:
        """A round committed tokens: ``committed`` is the sequence now."""
        ...

    # optional: ``prepare(committed)``, called after the generator ran appended tokens (a
    # draft model runs them then, not at the next round)


class SpeculativeDecoder:
    """Speculative rounds for one generator (see the module docstring). ``generator`` is the
    `genai.Generator` whose loop, driver and logits chain it uses."""

    def __init__(
        self,
        generator: Any,
        options: SpeculativeOptions,
        proposer: Proposer,
        counters: SpeculativeCounters,
    ) -> None:
        self.g = weakref.proxy(generator)  # the generator owns this: no cycle keeps it
        self.options = options
        self.proposer = proposer
        #: a cheap check whether the proposer has a proposal (prompt lookup), None otherwise
        self._would_propose = getattr(proposer, "would_propose", None)
        self.counters = counters
        self.adaptive = AdaptiveK(options.max_draft_tokens, options.min_adaptive_k)
        self.cooldown = Cooldown(options.cooldown)
        self.backoff = Backoff(self.adaptive.enabled)
        self._eos = frozenset(int(t) for t in generator._eos)
        chain: LogitsChain = generator._chain
        self._chain = chain
        #: greedy with no stage that changes the logits: the choice is the plain argmax
        self._argmax = chain.loop_sampler is None and not chain.python_stage
        self._out = np.zeros(1, np.int32)
        #: per token of the round: the random stream's state after its choice (sampling) and
        #: the grammar's (guidance), so that a round cut short (an append, a rewind, a stop)
        #: gives back the draws and the grammar's steps of the tokens not emitted
        self._checkpoints: list[tuple[np.ndarray | None, tuple[int, bool] | None]] = []
        #: the round's tokens not emitted yet, and the logits rows they were chosen from
        self.queue: list[int] = []
        self._rows: np.ndarray | None = None
        self._emitted = 0
        #: the sequence length the caller sees while tokens are queued
        self.visible = 0
        self._round: dict[str, Any] = {}
        #: the last step emitted a round's last token (its token is pending: a plain step
        #: runs it, what the reference counts as a re-anchoring target run)
        self._after_round = False
        #: the last round's K
        self._last_k = 0
        #: guidance (batch 1): the row's grammar, None without; with guidance a round's
        #: proposals are cut where the grammar stops allowing them, every row is masked
        #: before the choice, and the grammar's state after each queued token is kept
        #: (`_checkpoints`; before the round: `_start_mark`)
        constraints = generator._constraints
        self._constraint = constraints[0] if constraints is not None else None
        self._start_mark: tuple[int, bool] | None = None
        #: the target returns the last position's logits only: a round verifies each proposal
        #: in a run of its own (`NativeDriver.verify_sequentially`), as the reference's
        #: fallback for a draft model
        self._sequential = not getattr(generator._driver, "verify_tokens", 0)
        #: the driver's one-time verify preparation, before the first timed verify run
        self._prepare_verify = getattr(generator._driver, "prepare_verify", None)
        #: a proposer that masks its rows with a copy of the grammar (a draft model) and takes
        #: the tokens it forces: its proposals are what the grammar allows already
        self._masked_proposals = self._constraint is not None and getattr(
            proposer, "masks_with_grammar", False
        )
        #: sampling with a proposer that draws its proposals (a draft model): the rounds'
        #: stream, shared with the proposer, for speculative sampling (`_accept_sampled`)
        self._stream: ReferenceStream | None = None
        search = generator.search
        if hasattr(proposer, "drafts_q") and search.do_sample and self._constraint is None:
            self._stream = ReferenceStream(search.random_seed)

    # --- what the generator asks ----------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """True while a round has tokens to emit."""
        return bool(self.queue)

    def next_logits(self) -> np.ndarray:
        """The raw logits the next queued token was chosen from, [1, 1, vocab]."""
        assert self._rows is not None
        return self._rows[self._emitted][None, None, :].copy()

    def logits(self) -> np.ndarray | None:
        """`Generator.get_logits` while a round has tokens to emit (`next_logits`), else None
        (the generator's own rows). Refused while a guided round has tokens queued, as the
        reference (a token the grammar forced has no row)."""
        if not self.queue:
            return None
        if self._constraint is not None:
            raise GenerationError(
                "Speculative decoding logits cannot be accessed while a guided round has "
                "buffered tokens."
            )
        return self.next_logits()

    def take_tokens(self, tokens: np.ndarray, length: int) -> bool:
        """Appended tokens: the generator runs them itself (False)."""
        return False

    def appended(self) -> None:
        """The generator ran appended tokens: a proposer that keeps a model's state (a draft)
        runs them now too, as the reference's prompt run does, so the next round proposes at
        once (and its draft time, as the reference's, leaves the prompt out)."""
        prepare = getattr(self.proposer, "prepare", None)
        if prepare is not None:
            prepare(self.g._sequences[0, : self.g._loop.length])

    @property
    def draft_driver(self) -> Any:
        """The draft model's driver (draft-model decoding; None for other proposers): the
        generator's model inputs and run options reach it too."""
        return getattr(self.proposer, "driver", None)

    def forward(self, name: str, *args: Any) -> None:
        """Nothing to pass on: the generator's own binding runs the rounds."""

    def stats(self) -> dict[str, Any]:
        """`Generator.get_speculative_stats`."""
        return self.counters.as_reference_dict(
            buffered=len(self.queue),
            effective_k=self.adaptive.k,
            adaptive=self.adaptive,
            cooldown=self.cooldown,
            backoff=self.backoff,
        )

    def reseed(self, seed: int) -> None:
        """Seed the stream of speculative sampling (a batch's row ``r`` gets seed + r)."""
        if self._stream is not None:
            self._stream = ReferenceStream(seed)

    # --- steps ----------------------------------------------------------------------------------
    def drain(self) -> bool:
        """Emit the next queued token; False when none is queued."""
        if not self.queue:
            return False
        g = self.g
        token = self.queue.pop(0)
        self._emitted += 1
        g._loop.array("next_tokens")[0] = token
        if token in self._eos:
            g._done[0] = 1  # as a plain step that finishes the last row: not in the sequence
            g._all_finished = True
            # as the reference: the EOS decision is not an emitted token; the round ends
            # interrupted, its tokens after EOS discarded
            self.counters.tokens_discarded += 1 + len(self.queue)
            self.queue.clear()
            self._end_round(interrupted=True)
            return True
        self.counters.tokens_emitted += 1
        self.visible += 1
        if g._stops is not None:
            g._match_stop(0, token)
            if g._finish[0] is FinishReason.STOP_STRING:
                if self.queue:  # the rest was not seen: drop it, keep the stop
                    self._discard()
                    g._done[0] = 1
                g._all_finished = True
        if not self.queue:
            # a bonus beyond max_length is not computed here; the reference queues and
            # discards it, ending the round interrupted
            cut = self._round.get("cut", 0)
            self._end_round(interrupted=bool(cut))
            self._after_round = True
            if not cut and self._reanchors_now():
                self._run_alone(True)
        return True

    def _reanchors_now(self) -> bool:
        """True when a round that just ended runs its last token at once, as the reference
        does where it would not verify it with the next proposals (with a fixed K: after a
        round of one proposal, and before Phi-3's rope rewind length; a target verified one
        token per run, always); its time is then the stats' per-token baseline."""
        g = self.g
        if self.adaptive.enabled or g._all_finished or g.is_done() or g._loop.logits_ready:
            return False
        length = g._loop.length
        return self._sequential or self._last_k == 1 or length + 1 == g._rope_rewind_at

    def step(self) -> None:
        """A new round (or a plain step: cooldown, backoff, nothing proposed); emits its first
        token."""
        g = self.g
        loop = g._loop
        length = loop.length
        step_started = time.perf_counter()
        after_round, self._after_round = self._after_round, False
        constraint = self._constraint
        if constraint is not None and constraint.is_finished:
            self._plain_step(after_round)  # the grammar is complete: EOS is all that is left
            return
        backoff = self.backoff
        if self.cooldown.active or backoff.active or backoff.wants_plain_step:
            # (neither: a plain step to measure, `Backoff.wants_plain_step`)
            if self.cooldown.active:
                self.cooldown.complete_step()
            elif backoff.active:
                check = self._would_propose
                backoff.skip(None if check is None else lambda: check(g._sequences[0, :length]))
            if self._plain_step(after_round):
                backoff.plain_step((time.perf_counter() - step_started) * 1e3)
            return
        # With a fixed K, as the reference: after a plain step (and after a round of one
        # proposal) the pending token runs alone (what a plain step would run), and a round
        # then verifies the proposals only; after a wider round the pending token is verified
        # with the next proposals. The run shapes, and so the kernels' numerics, are the
        # reference's: on int8-activation int4 graphs a one-token run and a wider one differ in
        # the last bits, so the same shapes give the reference's tokens (and a fixed K of 1
        # plain decoding's). With adaptive K (genai's own run shapes) the pending token is
        # always verified with the proposals: one run per round instead of two after a plain
        # step.
        # A target with the last position's logits only (`_sequential`) verifies each
        # proposal in a run of its own, after the pending tokens ran alone.
        alone = not loop.logits_ready and (
            self._sequential
            or (not self.adaptive.enabled and (not after_round or self._last_k == 1))
        )
        budget = self.adaptive.k
        # a round emits up to the stop length, or the rope rewind length: its proposals end one
        # before that (the next row's choice would lie past it), one at least, as the reference
        limit = g._run_limit(length)
        room = limit - length
        proposals = room if limit == g._stop_length else max(1, room - 1)
        # the verify run feeds the pending token(s) not run alone and the proposals
        pending = 0 if alone else length - loop.computed
        most = proposals if self._sequential else g._driver.verify_tokens - pending
        k = min(budget, proposals, most)
        started = time.perf_counter()
        truncation = self._sampled_truncation()
        if self._stream is not None:  # q drawn with the stream, or greedy (None)
            self.proposer.stream = self._stream if truncation else None
            if truncation:
                self.proposer.truncation = truncation
        committed = g._sequences[0, :length]
        if self._masked_proposals:
            proposal = self.proposer.propose(committed, k, constraint.lookahead())[:k]
        else:
            proposal = self.proposer.propose(committed, k)[:k]
        if constraint is not None and not self._masked_proposals:
            # what the grammar allows, and the tokens it forces
            guided, kept, rejected = constraint.continue_proposal(proposal, k)
            if kept < len(proposal):
                trimmed = getattr(self.proposer, "trimmed", None)
                if trimmed is not None:
                    trimmed(len(proposal), kept, rejected)
            proposal = guided
        propose_ms = (time.perf_counter() - started) * 1e3
        self.counters.total_draft_ms += propose_ms
        if not proposal:  # a plain step (it runs the pending token, if not run yet)
            if self._plain_step(after_round):
                backoff.plain_step((time.perf_counter() - step_started) * 1e3)
            return
        if alone:
            self._run_alone(after_round)
        k = len(proposal)
        filled = k == budget
        # logits already current (after a prompt, or set_logits) judge the first proposal
        ready = g._logits_rows[0].copy() if loop.logits_ready else None
        if self._prepare_verify is not None:  # (its cost is no verify run's: stats, backoff)
            self._prepare_verify()
            self._prepare_verify = None
        started = time.perf_counter()
        tokens = np.asarray(proposal, np.int32)[None, :]
        if self._sequential:
            logits = g._driver.verify_sequentially(tokens)[0]
        else:
            logits = g._driver.verify(tokens)[0]
        target_ms = (time.perf_counter() - started) * 1e3
        self.counters.target_verify_forward_passes += k if self._sequential else 1
        self.counters.total_target_verify_ms += target_ms
        if ready is not None:
            rows = np.concatenate([ready[None, :], logits[logits.shape[0] - k :]], axis=0)
        else:  # the pending token's row judges the first proposal
            rows = logits[logits.shape[0] - k - 1 :]
        if truncation:  # (only with a stream)
            emitted, accepted, evaluated, forced = self._accept_sampled(
                rows, proposal, length, room, truncation
            )
        else:
            emitted, accepted, evaluated, forced = self._accept(rows, proposal, length, room)
        cut = (
            1
            if accepted == k and len(emitted) == k and emitted[-1] not in self._eos and not forced
            else 0
        )
        matched = 0  # the emitted tokens the verify run ran (accepted or forced alike)
        while matched < min(len(emitted), k) and emitted[matched] == proposal[matched]:
            matched += 1
        self._commit(length, emitted, matched)
        counters = self.counters
        counters.rounds += 1
        counters.draft_tokens_proposed += k
        counters.draft_tokens_evaluated += evaluated
        counters.draft_tokens_accepted += accepted
        counters.tokens_queued += len(emitted) + cut
        if constraint is None:  # the reference's speed-up estimate leaves guided rounds out
            counters.formula_rounds += 1
            counters.k_counts[k] = counters.k_counts.get(k, 0) + 1
        if matched >= k:  # every proposal kept (judged or forced): the bonus follows
            counters.bonus_tokens += 1
        else:
            counters.correction_tokens += 1
        self._rows = rows
        self._last_k = k
        self._emitted = 0
        self.visible = length
        self._round = {
            "k": k,
            "evaluated": evaluated,
            "accepted": accepted,
            "filled": filled,
            "propose_ms": propose_ms,
            "target_ms": target_ms,
            "queued": len(emitted),
            "cut": cut,
            "step_ms": (time.perf_counter() - step_started) * 1e3,
        }
        self.queue = list(emitted)
        self.drain()

    def settle(self) -> None:
        """Discard the queued tokens (before a rewind, an append, set_logits, a snapshot):
        the sequences and the KV cache go back to what was emitted."""
        if self.queue:
            self._discard()
            self._end_round(interrupted=True)

    def reset(self) -> None:
        """A new sequence (rewind to 0, a new prompt): the policies and the proposer start
        over."""
        self.settle()
        self.adaptive.reset()
        self.cooldown.reset()
        self.backoff.reset()
        self.proposer.invalidate()

    # --- the parts of a round -------------------------------------------------------------------
    def _run_alone(self, after_round: bool) -> None:
        """Run the pending token alone (a re-anchor run after a round)."""
        started = time.perf_counter()
        self.g._driver.run()
        milliseconds = (time.perf_counter() - started) * 1e3
        self.backoff.plain_step(milliseconds)  # a one-token run: what a plain step costs
        if after_round:
            self.counters.target_reanchor_forward_passes += 1
            self.counters.total_target_reanchor_ms += milliseconds

    def _plain_step(self, after_round: bool) -> bool:
        """One plain step; True when it ran the model."""
        g = self.g
        ran = not g._loop.logits_ready
        started = time.perf_counter()
        if g._python_stage:
            g._guided_step()
        else:
            g._driver.step()
        if after_round and ran:
            milliseconds = (time.perf_counter() - started) * 1e3
            self.counters.target_reanchor_forward_passes += 1
            self.counters.total_target_reanchor_ms += milliseconds
        self.counters.standard_fallback_steps += 1
        return ran

    def _choose(self, row: np.ndarray, length: int) -> int:
        """The chain's choice from ``row`` for the token at ``length``."""
        if self._argmax:
            token = int(np.argmax(row))
            if np.isnan(row[token]):
                raise NonFiniteLogitsError("cannot choose a token: logits contain NaN")
            return token
        g, chain = self.g, self._chain
        logits = row[None, :].copy()
        chain.sampler.forget_logits()
        chain.process(
            logits,
            g._sequences,
            length,
            self._out,
            prompt_lengths=g._loop.prompt_length,
        )
        return int(self._out[0])

    def _sampled_truncation(self) -> tuple[int, float, float] | None:
        """(top_k, top_p, temperature) when this round samples speculatively (a proposer
        that draws, a distribution `truncated_distribution` gives as the sampler draws: no
        min_p, no custom processor); None: the one-token accept test of `_accept`."""
        if self._stream is None or self._chain.processors:
            return None
        options = self._chain.options(0)
        top_k, top_p = int(options["top_k"]), float(options["top_p"])
        temperature = float(options["temperature"])
        if not options["do_sample"] or temperature <= 0 or top_k == 1 or top_p <= 0:
            return None
        if options["min_p"]:
            return None
        return top_k, top_p, temperature

    def _accept_sampled(
        self,
        rows: np.ndarray,
        proposal: Sequence[int],
        length: int,
        room: int,
        truncation: tuple[int, float, float],
    ) -> tuple[list[int], int, int, int]:
        """`_accept` for proposals drawn from the draft's q: speculative sampling against the
        target's processed, truncated rows (`speculative_sample`); an accepted EOS ends the
        round, and no bonus is drawn past ``room``."""
        g = self.g
        self._checkpoints = []  # the stream's draws are not given back
        targets = [
            processed_distribution(
                self._chain, rows[i], g._sequences, length + i, g._loop.prompt_length, truncation
            )
            for i in range(len(proposal) + 1)
        ]
        kept, token, bonus = speculative_sample(
            targets, proposal, self.proposer.drafts_q, self._stream
        )
        evaluated = kept if bonus else kept + 1
        emitted = [int(t) for t in proposal[:kept]]
        for i, t in enumerate(emitted):
            if t in self._eos:
                return emitted[: i + 1], i + 1, min(evaluated, i + 1), 0
        if len(emitted) < room:
            emitted.append(token)
        return emitted, kept, evaluated, 0

    def _accept(
        self, rows: np.ndarray, proposal: Sequence[int], length: int, room: int
    ) -> tuple[list[int], int, int, int]:
        """The tokens the round emits (accepted proposals, then the correction or bonus, cut
        at EOS and at ``room``), how many proposals were accepted, how many judged and how
        many the grammar forced. With guidance each row is masked by the grammar as it stands
        after the tokens before it, which then consumes the choice; tokens it forces after one
        are emitted behind it, and the round goes on after them where the proposal held them
        (they ran in the verify run), else ends."""
        emitted: list[int] = []
        accepted = evaluated = 0
        rng = None if self._argmax else self._chain.sampler.rng
        constraint = self._constraint
        self._checkpoints = []
        if constraint is not None:
            self._start_mark = constraint.mark()
        n, i, forced_count = len(proposal), 0, 0
        while True:
            token = self._choose(rows[i], length + i)
            emitted.append(token)
            draw = rng.get_state() if rng is not None else None
            match = False
            if i < n:
                evaluated += 1
                match = token == proposal[i]
                accepted += match
            if constraint is None:
                self._checkpoints.append((draw, None))
            else:
                forced = self._chain.accept(0, token)
                consumed, ended = constraint.mark()
                base = consumed - len(forced)
                self._checkpoints.append((draw, (base, ended)))
                if forced:  # consumed by the grammar already; no draw of their own
                    forced = forced[: max(room - len(emitted), 0)]
                    # the forced tokens the proposal holds next ran in the verify run: the
                    # round goes on after them
                    ride = 0
                    while (
                        match
                        and ride < len(forced)
                        and i + 1 + ride < n
                        and proposal[i + 1 + ride] == forced[ride]
                    ):
                        ride += 1
                    for j, extra in enumerate(forced, 1):
                        emitted.append(extra)
                        self._checkpoints.append((draw, (base + j, False)))
                    forced_count += len(forced)
                    if base + len(forced) < consumed:  # cut at max_length
                        constraint.restore((base + len(forced), False))
                    if not match or ride < len(forced) or len(emitted) >= room:
                        break
                    i += 1 + ride
                    continue
            if not match or len(emitted) >= room:
                break
            if token in self._eos and constraint is not None:
                break  # the grammar ended with it: nothing may follow
            # (an accepted EOS: as the reference, the next proposal is still judged; the
            # tokens after the EOS are queued and discarded when it is emitted)
            i += 1
        return emitted, accepted, evaluated, forced_count

    def _commit(self, length: int, emitted: list[int], matched: int) -> None:
        """Keep the emitted tokens in the sequences and the KV cache (an EOS is not added):
        the first ``matched`` (the proposals they equal ran in the verify run) keep its KV;
        the token after them (and any the grammar forced) are pending, as after a plain
        step."""
        g = self.g
        loop, driver = g._loop, g._driver
        eos = [j for j, token in enumerate(emitted) if token in self._eos]
        body = emitted[: eos[0]] if eos else emitted
        end = length + len(body)
        if body:
            g._sequences[0, length:end] = body
        keep = length + min(matched, len(body) - 1) + 1  # through the first pending token
        if keep <= loop.length:
            driver.rewind(keep)
        else:  # every proposal accepted: the bonus follows them
            keep = loop.length
        for token in body[keep - length :]:
            loop.push_tokens(np.array([token], np.int32), False)
        self.proposer.accepted(g._sequences[0, :end])

    def _discard(self) -> None:
        if self._checkpoints:  # the stream and the grammar as after the last emitted token
            kept = len(self._checkpoints) - len(self.queue)
            draw, mark = self._checkpoints[kept - 1] if kept else (None, self._start_mark)
            if draw is not None:
                self._chain.sampler.rng.set_state(draw)
            if mark is not None and self._constraint is not None:
                self._constraint.restore(mark)
            self._checkpoints = []
        self.counters.tokens_discarded += len(self.queue)
        self.queue.clear()
        self.g._driver.rewind(self.visible)

    def _end_round(self, interrupted: bool) -> None:
        info, counters = self._round, self.counters
        self._rows = None
        if not info:
            return
        self._round = {}
        # a bonus beyond max_length was queued, never emitted (however the round ends)
        counters.tokens_discarded += info.get("cut", 0)
        if interrupted:
            counters.interrupted_rounds += 1
            return
        counters.completed_rounds += 1
        evaluated, accepted, k = info["evaluated"], info["accepted"], info["k"]
        if evaluated:
            if not accepted:
                counters.zero_accept_rounds += 1
            elif accepted == evaluated:
                counters.full_accept_rounds += 1
            else:
                counters.partial_accept_rounds += 1
        self.cooldown.record(k, self.adaptive.minimum, evaluated, accepted)
        self.backoff.record(info["queued"], accepted, evaluated, info["step_ms"])
        self.adaptive.record(
            k,
            evaluated,
            accepted,
            info["queued"],
            info["filled"],
            info["propose_ms"],
            info["target_ms"],
        )
