"""`MtpGenerator`: self-speculative decoding with a multi-token-prediction head, the
reference's ``og.MtpGenerator(main_model, mtp_model, params)``.

The main model exports its last hidden state (``model.mtp.main_hidden_states``, default
``hidden_states``); the head (a folder of its own whose config names
``model.decoder.inputs.hidden_states``) drafts the token after next from it and the token just
committed. `MtpRounds` runs the reference's rounds: commit the pending token t, draft K
tokens, verify [t, d0 .. d(K-1)] in one main-model run (the driver's ``verify``), keep the
accepted drafts, and the next token (a correction or a bonus) becomes the next round's t; one
token is emitted per `generate_next_token`. Greedy output is the main model's own. The
reference's limits hold: batch 1, no beams, no guidance. ``max_draft_tokens`` K > 1 chains the
head K times a round: each draft after the first is made from the head's own feedback output
(``model.mtp.outputs.hidden_states``, default ``hidden_states_out``) and the previous draft; a
head without that output is refused with the reference's message. With ``do_sample`` (and a
positive temperature) the rounds are the reference's speculative sampling on its random stream
(`MtpRounds`, `ReferenceStream`).
"""

from __future__ import annotations

import copy
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.errors import GenerationError, UnsupportedFeatureError
from genai.generation.generator import Generator
from genai.generation.speculative import (
    SpeculativeCounters,
    SpeculativeOptions,
    check_plain_decoding,
)
from genai.generation.speculative.mtp import MtpProposer
from genai.generation.speculative.sampling import (
    ReferenceStream,
    processed_distribution,
    speculative_sample,
    truncated_distribution,
)

if TYPE_CHECKING:
    import numpy.typing as npt

    from genai.generation.generator_params import GeneratorParams
    from genai.runtime.model import Model

__all__ = ["MtpGenerator"]


class MtpGenerator:
    """Generates with ``main_model``, drafting with the MTP head ``mtp_model`` (see the module
    docstring); ``params``: the main model's `GeneratorParams` (``max_draft_tokens`` from its
    speculative options)."""

    def __init__(self, main_model: Model, mtp_model: Model, params: GeneratorParams) -> None:
        search = params.search
        if search.batch_size != 1 or search.num_beams != 1 or search.num_return_sequences != 1:
            raise UnsupportedFeatureError(
                "MtpGenerator supports only batch_size=1, num_beams=1, and num_return_sequences=1"
            )
        if params.guidance is not None:
            raise UnsupportedFeatureError("MtpGenerator does not support guided generation")
        if main_model.provider.name != mtp_model.provider.name:
            raise UnsupportedFeatureError(
                "MtpGenerator requires the main model and MTP head on the same device type"
            )
        if main_model.io.vocab_size != mtp_model.io.vocab_size:
            raise UnsupportedFeatureError(
                "MtpGenerator requires matching main-model and MTP-head vocabulary sizes"
            )
        hidden = main_model.config.decoder.get("hidden_size")
        if hidden != mtp_model.config.decoder.get("hidden_size"):
            raise UnsupportedFeatureError(
                "MtpGenerator requires matching main-model and MTP-head hidden sizes"
            )
        name = str(main_model.config.get("model.mtp.main_hidden_states") or "hidden_states")
        if name not in main_model.session.output_dtypes:
            raise UnsupportedFeatureError(
                "MtpGenerator: model.mtp.main_hidden_states must name a main-model output"
            )
        head_input = (mtp_model.config.decoder.get("inputs") or {}).get("hidden_states")
        dtype = main_model.session.output_dtypes[name]
        if head_input is None or mtp_model.session.input_dtypes.get(head_input) != dtype:
            message = "MtpGenerator requires matching hidden-state tensor types"
            raise UnsupportedFeatureError(message)
        drafts = max(1, params.speculative.max_draft_tokens)
        feedback = str(main_model.config.get("model.mtp.outputs.hidden_states") or "")
        feedback = feedback or "hidden_states_out"
        if drafts > 1 and feedback not in mtp_model.session.output_dtypes:
            raise UnsupportedFeatureError(
                f"MtpGenerator: max_draft_tokens={drafts} requires the configured MTP "
                f"feedback output '{feedback}' (model.mtp.outputs.hidden_states)"
            )
        self._drafts = drafts
        self._feedback = feedback if drafts > 1 else None
        #: the reference's sampled rounds (do_sample with a positive temperature)
        self._sampling = bool(search.do_sample) and search.temperature > 0.0
        self._models = (main_model, mtp_model)
        self._params = params
        self._hidden_name = name
        self.reset()

    def reset(self) -> None:
        """Forget the prompt and everything generated (a fresh generator)."""
        main_model, mtp_model = self._models
        params = copy.copy(self._params)
        params.speculative = SpeculativeOptions()  # the rounds below, not n-gram decoding
        self._gen = gen = Generator(main_model, params)
        check_plain_decoding(gen, "MtpGenerator")
        counters = SpeculativeCounters()
        proposer_type = SampledMtpProposer if self._sampling else MtpProposer
        self._proposer = proposer = proposer_type(
            mtp_model, gen, self._hidden_name, counters, self._feedback
        )
        self._rounds = MtpRounds(gen, proposer, self._drafts, counters)
        self._primed = False

    def append_tokens(self, tokens: npt.ArrayLike) -> None:
        """The prompt (1-D int32), once; the main model runs it now."""
        if self._primed:
            raise GenerationError("MtpGenerator: AppendTokens can only be called once")
        array = np.asarray(tokens, np.int32).reshape(1, -1)
        self._gen.append_tokens(array)
        self._proposer.reset(array.shape[1])
        self._proposer.observe(0)
        self._primed = True
        self._rounds.start(array[0])

    def generate_next_token(self) -> None:
        """Emit the next token (a round verifies the head's draft when none is queued)."""
        if not self._primed:
            raise GenerationError(
                "MtpGenerator: AppendTokens must be called before GenerateNextToken"
            )
        self._rounds.next_token()

    def is_done(self) -> bool:
        """True once EOS was emitted or the sequence reached max_length."""
        return self._primed and self._rounds.is_done()

    def get_sequence(self) -> npt.NDArray[np.int32]:
        """The prompt and the tokens emitted so far (an emitted EOS included, as the
        reference), int32."""
        return np.array(self._rounds.emitted, np.int32)

    def get_stats(self) -> dict[str, Any]:
        """The speculative counters (`genai.Generator.get_speculative_stats`' keys) and the
        reference's aliases ``forwards``, ``accepts``, ``trials``."""
        stats = self._rounds.stats()
        stats["forwards"] = stats["target_forward_passes"]
        stats["accepts"] = stats["draft_tokens_accepted"]
        stats["trials"] = stats["draft_tokens_evaluated"]
        return stats


# --- the rounds ----------------------------------------------------------------------------------


class SampledMtpProposer(MtpProposer):
    """`MtpProposer` whose drafts are drawn from the head's truncated distribution q (the
    search's top_k / top_p / temperature) with the rounds' `ReferenceStream`; keeps each
    chain position's q for the accept test."""

    stream: ReferenceStream
    #: per chain position: (ids, probabilities) of the distribution its draft was drawn from
    drafts_q: list[tuple[np.ndarray, np.ndarray]]

    def draft_token(self, logits: np.ndarray, index: int) -> int:
        """Draw the draft at chain position ``index`` from the head's truncated ``logits``."""
        search = self.generator.search
        ids, probs = truncated_distribution(logits, search.top_k, search.top_p, search.temperature)
        del self.drafts_q[index:]
        self.drafts_q.append((ids, probs))
        return int(ids[self.stream.choice(probs)])


class MtpRounds:
    """The reference's MTP rounds, one token emitted per call. Greedy (``proposer`` an
    `MtpProposer`): drafts and the main model's choices are argmax of the rows (after the
    penalties); a draft is kept while it equals the choice. Sampled (a `SampledMtpProposer`,
    ``do_sample`` with a positive temperature): a round commits the token drawn last, draws K
    chained drafts d_i ~ q_i from the head, verifies them with that token in one main run,
    accepts d_i with
    probability min(1, p_i(d_i) / q_i(d_i)) (p_i: the main model's processed, truncated row),
    and on the first rejection draws the next token from the residual norm(max(0, p_i - q_i));
    with every draft accepted, from the last row (a bonus). That is speculative sampling
    (Leviathan et al., Chen et al.): every token is distributed as plain sampling draws it. The
    draws follow the reference's order and stream, so a seed gives its tokens (up to kernel
    numerics). The main model's KV keeps the accepted prefix (the driver's rewind; the
    reference re-runs it: its ``target_forward_passes`` counts one more run per rejection),
    and the head re-runs the accepted drafts with the main model's hidden states in the run
    that makes the next round's first draft."""

    def __init__(
        self, generator: Generator, proposer: MtpProposer, drafts: int, counters: Any
    ) -> None:
        self.g = weakref.proxy(generator)  # the generator owns this: no cycle keeps it
        self.proposer = proposer
        self.drafts = drafts
        self.counters = counters
        search = generator.search
        self._truncation = (search.top_k, search.top_p, search.temperature)
        self._eos = frozenset(int(t) for t in generator._eos)
        #: greedy rounds: drafts and targets are argmax choices, a draft is kept while equal
        self.greedy = not isinstance(proposer, SampledMtpProposer)
        self.stream = ReferenceStream(search.random_seed if not self.greedy else 0)
        if isinstance(proposer, SampledMtpProposer):
            proposer.stream = self.stream
            proposer.drafts_q = []
        #: prompt + tokens emitted so far; tokens committed and not emitted yet
        self.emitted: list[int] = []
        self.queue: list[int] = []
        self._committed = 0
        self._next = -1
        self._done = False

    def start(self, prompt: np.ndarray) -> None:
        """After the prompt run: draw the first token from its last row."""
        self.emitted = [int(t) for t in prompt]
        self._committed = len(self.emitted)
        if self._committed >= self.g.max_length:
            self._done = True
            return
        row = self.g._logits_rows[0]
        self._next = self._choose(row, self._committed)
        self.g._loop.push_tokens(np.array([self._next], np.int32), False)  # pending

    def is_done(self) -> bool:
        """True when the last round ended the generation and its tokens were emitted."""
        return self._done and not self.queue

    def next_token(self) -> None:
        """Emit one token (a round runs when none is queued)."""
        if not self.queue and not self._done:
            before = self._committed
            self._round()
            self.counters.tokens_queued += self._committed - before
        if self.queue:
            self.emitted.append(self.queue.pop(0))
            self.counters.tokens_emitted += 1

    def stats(self) -> dict[str, Any]:
        """The reference's MTP stats: its counters, acceptance rate and per-round means."""
        counters = self.counters
        stats = counters.as_reference_dict(buffered=len(self.queue), effective_k=0)
        rounds = counters.rounds
        for key in ("full_accept_rounds", "partial_accept_rounds", "zero_accept_rounds"):
            stats[key] = 0
        stats["completed_rounds"] = rounds
        stats["standard_fallback_steps"] = 0
        stats["target_verify_forward_passes"] = 0
        stats["expected_tokens_per_round"] = 0.0
        stats["formula_supported"] = False
        evaluated = counters.draft_tokens_evaluated
        stats["acceptance_rate"] = counters.draft_tokens_accepted / evaluated if evaluated else 0.0
        if rounds:
            stats["avg_draft_tokens_per_round"] = counters.draft_tokens_proposed / rounds
            stats["mean_emitted_tokens_per_round"] = counters.tokens_emitted / rounds
        return stats

    # --- a round ------------------------------------------------------------------------------
    def _target(self, row: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The main model's truncated distribution of ``row`` (the token at ``length``) after
        the penalties (min_length, repetition, no_repeat_ngram, bias)."""
        g = self.g
        return processed_distribution(
            g._chain, row, g._sequences, length, g._loop.prompt_length, self._truncation
        )

    def _choose(self, row: np.ndarray, length: int) -> int:
        """The token at ``length`` from the main model's ``row``: argmax of the processed row
        (greedy), else a draw from its truncated distribution."""
        if self.greedy:
            logits = np.array(row, np.float32)[None, :]
            g = self.g
            g._chain.apply_stages(logits, g._sequences, length, g._loop.prompt_length)
            return int(np.argmax(logits[0]))
        return self._draw(self._target(row, length))

    def _draw(self, target: tuple[np.ndarray, np.ndarray]) -> int:
        ids, probs = target
        return int(ids[self.stream.choice(probs)])

    def _commit(self, token: int) -> bool:
        """Commit ``token``; True when it ends the generation (EOS, max_length)."""
        self.queue.append(token)
        self._committed += 1
        if token in self._eos or self._committed >= self.g.max_length:
            self._done = True
        return self._done

    def _round(self) -> None:
        g, counters, proposer = self.g, self.counters, self.proposer
        loop, driver = g._loop, g._driver
        t = self._next
        if self._commit(t):
            return
        length = self._committed  # t is pending at length - 1
        n = min(self.drafts, g.max_length - length)
        counters.rounds += 1
        counters.draft_tokens_proposed += n
        drafts = proposer.propose(g._sequences[0, :length], n)
        first = loop.computed
        rows = driver.verify(np.array([drafts], np.int32))[0]
        proposer.observe(first)
        counters.target_verify_forward_passes += 1
        rows = rows[rows.shape[0] - n - 1 :]
        if self.greedy:
            self._finish(*self._greedy_accept(rows, drafts, length))
            return
        targets = [self._target(rows[i], length + i) for i in range(n + 1)]
        accepted, token, bonus = speculative_sample(targets, drafts, proposer.drafts_q, self.stream)
        correction = -1 - token if bonus else token
        self._finish(drafts, accepted, correction)

    def _greedy_accept(
        self, rows: np.ndarray, drafts: list[int], length: int
    ) -> tuple[list[int], int, int]:
        """Greedy: the drafts kept while each equals the row's choice, then that choice (a
        correction; ``-1 - token`` for the bonus after them all)."""
        for i, draft in enumerate(drafts):
            token = self._choose(rows[i], length + i)
            if token != draft:
                return drafts, i, token
        return drafts, len(drafts), -1 - self._choose(rows[len(drafts)], length + len(drafts))

    def _finish(self, drafts: list[int], accepted: int, token: int) -> None:
        """Count the round, commit the ``accepted`` drafts and keep the next token pending
        (``token``: a correction, or ``-1 - bonus``)."""
        g, counters = self.g, self.counters
        loop, driver = g._loop, g._driver
        rejected = token >= 0
        counters.draft_tokens_evaluated += accepted + 1 if rejected else len(drafts)
        counters.draft_tokens_accepted += accepted
        if rejected:
            counters.correction_tokens += 1
        else:
            counters.bonus_tokens += 1
        for draft in drafts[:accepted]:
            if self._commit(draft):
                return
        self._next = token if rejected else -1 - token
        end = self._committed + 1  # the committed tokens, then the next one pending
        g._sequences[0, end - 1] = self._next
        if end <= loop.length:
            driver.rewind(end)
        else:
            loop.push_tokens(np.array([self._next], np.int32), False)
