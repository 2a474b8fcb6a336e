"""`MtpGenerator`: self-speculative decoding with a multi-token-prediction head, the
reference's ``og.MtpGenerator(main_model, mtp_model, params)``.

The main model exports its last hidden state (``model.mtp.main_hidden_states``, default
``hidden_states``); the head (a folder of its own whose config names
``model.decoder.inputs.hidden_states``) drafts the token after next from it and the token just
committed. Each round verifies the draft in one main-model run with the pending token
(`genai.generation.speculative.decoder`) and emits one token per `generate_next_token`; greedy
output is the main model's own. The reference's limits hold: batch 1, no beams, no guidance.
``max_draft_tokens`` K > 1 chains the head K times a round: each draft after the first is made
from the head's own feedback output (``model.mtp.outputs.hidden_states``, default
``hidden_states_out``) and the previous draft; a head without that output is refused with the
reference's message.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.compat.engine_enums import FinishReason
from genai.errors import GenerationError, UnsupportedFeatureError
from genai.generation.generator import Generator
from genai.generation.speculative import (
    SpeculativeCounters,
    SpeculativeDecoder,
    SpeculativeOptions,
    check_plain_decoding,
)
from genai.generation.speculative.mtp import MtpProposer

if TYPE_CHECKING:
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
        self._proposer = MtpProposer(mtp_model, gen, self._hidden_name, counters, self._feedback)
        options = SpeculativeOptions(max_draft_tokens=self._drafts)
        gen._spec = decoder = SpeculativeDecoder(gen, options, self._proposer, counters)
        decoder.fold_k1 = True  # [t, d] in one run, as the reference's MTP rounds
        self._primed = False

    def append_tokens(self, tokens: np.ndarray | list[int]) -> None:
        """The prompt (1-D int32), once; the main model runs it now."""
        if self._primed:
            raise GenerationError("MtpGenerator: AppendTokens can only be called once")
        array = np.asarray(tokens, np.int32).reshape(1, -1)
        self._gen.append_tokens(array)
        self._proposer.reset(array.shape[1])
        self._proposer.observe(0)
        self._primed = True

    def generate_next_token(self) -> None:
        """Emit the next token (a round verifies the head's draft when none is queued)."""
        if not self._primed:
            raise GenerationError(
                "MtpGenerator: AppendTokens must be called before GenerateNextToken"
            )
        if not self._gen.is_done():
            self._gen.generate_next_token()

    def is_done(self) -> bool:
        """True once EOS was emitted or the sequence reached max_length."""
        return self._primed and self._gen.is_done()

    def get_sequence(self) -> np.ndarray:
        """The prompt and the tokens emitted so far (an emitted EOS included, as the
        reference), int32."""
        sequence = self._gen.get_sequence(0)
        if self._gen.is_done() and self._gen.finish_reason() is FinishReason.EOS:
            sequence = np.append(sequence, self._gen.get_next_tokens()[:1])
        return sequence.astype(np.int32)

    def get_stats(self) -> dict[str, Any]:
        """The speculative counters (`genai.Generator.get_speculative_stats`' keys) and the
        reference's aliases ``forwards``, ``accepts``, ``trials``."""
        stats = self._gen.get_speculative_stats()
        stats["forwards"] = stats["target_forward_passes"]
        stats["accepts"] = stats["draft_tokens_accepted"]
        stats["trials"] = stats["draft_tokens_evaluated"]
        return stats
