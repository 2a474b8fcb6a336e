"""`GeneratorParams`: search options for a generator, as onnxruntime-genai exposes them."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.constraints.guidance import check_guidance
from genai.errors import ArgumentTypeError, InvalidArgumentError, ModelError, check_type
from genai.generation.logits import ProcessorLike, check_processor
from genai.generation.search import SearchOptions
from genai.generation.speculative.options import SpeculativeOptions

if TYPE_CHECKING:
    from genai.runtime.model import Model

__all__ = ["GeneratorParams"]


def _text(value: Any, what: str) -> str:
    """A str argument, or UTF-8 bytes decoded (the reference's bindings take both)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ArgumentTypeError(f"{what} must be UTF-8 text") from None
    return check_type(value, str, what)


class GeneratorParams:
    """Search options for `Generator`, starting from the model's ``search`` section.

    Names, defaults and types follow the reference; see `genai.generation.search.SearchOptions`.
    Ranges are checked when the `Generator` is created (they depend on the model).
    """

    def __init__(self, model: Model) -> None:
        from genai.runtime.model import Model  # lazy: the runtime imports the generation

        if not isinstance(model, Model):
            raise ArgumentTypeError(
                f"GeneratorParams: model must be a genai.Model, not {type(model).__name__}"
            )
        self.model = model
        self.search = SearchOptions()
        self.search.update(**(model.config.get("search", {}) or {}))
        if not self.search.max_length:  # as the reference's config load: 0 or none
            self.search.max_length = model.config.context_length
        #: (type, data) from `set_guidance`, or None
        self.guidance: tuple[str, str] | None = None
        self.guidance_ff_tokens = False
        self.logit_bias: dict[int, float] = {}
        #: custom stages of the logits chain, in order (`add_logits_processor`)
        self.logits_processors: list[ProcessorLike] = []
        #: speculative decoding (`set_speculative_options`), from the model's section
        self.speculative = SpeculativeOptions.from_config(model.config)
        #: a draft model chosen at run time (`set_draft_model`), or None
        self.draft_model: Model | None = None

    def set_search_options(self, **options: Any) -> None:
        """Set search options by name (unknown names and wrong types raise).

        Beyond the reference: ``max_new_tokens`` (0 = no limit) and ``stop`` (a str or a list
        of str, matched on the decoded text; ``[]`` clears), see `Generator.finish_reason`.
        """
        self.search.update(**options)

    def get_search_options(self) -> dict[str, float | bool | list[str]]:
        """All options; numbers as floats, as the reference returns them."""
        return self.search.as_reference_dict()

    def set_speculative_options(self, **options: Any) -> None:
        """Set speculative-decoding options by name, as the reference (``ngram_size``,
        ``max_draft_tokens``, ``ngram_chained_lookup``, ``min_adaptive_k``, ``cooldown``; see
        `genai.generation.speculative.options`); a bad name, type or range raises
        `SpeculativeOptionError` with the reference's message."""
        self.speculative.update(**options)

    def get_speculative_options(self) -> dict[str, float | bool]:
        """All speculative options; numbers as floats, as the reference returns them."""
        return self.speculative.as_reference_dict()

    def set_draft_model(self, draft: Model | None) -> None:
        """Draft-model speculative decoding with ``draft`` (beyond the reference, which reads
        the draft from the folder's ``model.draft``): a `Model` with this model's vocabulary
        (e.g. a smaller model of the same family); the speculative options (``max_draft_tokens``
        ...) apply. ``None`` clears it. Raises `ModelError` for another vocabulary."""
        if draft is not None and draft.io.vocab_size != self.model.io.vocab_size:
            raise ModelError(
                "Target and draft logit dimensions don't match. Target vocab: "
                f"{self.model.io.vocab_size}, Draft vocab: {draft.io.vocab_size}. Target and "
                "draft must share the same vocabulary."
            )
        self.draft_model = draft

    def set_logit_bias(self, bias: dict[int, float]) -> None:
        """Add ``bias[id]`` to token ``id``'s logit every step (OpenAI's ``logit_bias``;
        beyond the reference). An empty dict clears it."""
        checked = {}
        for token, value in bias.items():
            if isinstance(token, bool) or not isinstance(token, int | np.integer):
                raise ArgumentTypeError(f"logit_bias keys must be token ids, got {token!r}")
            if not 0 <= int(token) < self.model.io.vocab_size:
                raise InvalidArgumentError(
                    f"logit_bias token id {token} is outside [0, {self.model.io.vocab_size})"
                )
            if not np.isfinite(value):
                raise InvalidArgumentError(
                    f"logit_bias for token {token} must be finite, got {value!r}"
                )
            checked[int(token)] = float(value)
        self.logit_bias = checked

    def add_logits_processor(self, processor: ProcessorLike) -> None:
        """Add a custom stage to the logits chain (beyond the reference; as Hugging Face's
        ``LogitsProcessor``): ``processor(token_ids, logits)`` is called every step for each
        row still generating, with the row's tokens so far (int32 [length], prompt
        included, read-only) and its float32 [vocab] logits **after** the guidance mask,
        min_length, the penalties and the logit bias, **before** temperature, top-k, top-p
        and min-p (and the log-probabilities). It edits ``logits`` in place and returns
        None, or returns the new row. Processors run in the order they were added; see
        `genai.generation.logits` and docs/sampling.md. Not with beam search."""
        self.logits_processors.append(check_processor(processor))

    def clear_logits_processors(self) -> None:
        """Remove every custom logits processor."""
        self.logits_processors.clear()

    def set_guidance(self, type: str, data: str, enable_ff_tokens: bool = False) -> None:
        """Constrain every row's output (onnxruntime-genai's API): ``type`` is
        ``"json_schema"`` (``data``: the schema as a JSON string), ``"regex"`` or
        ``"lark_grammar"`` (llguidance's Lark dialect). The token mask is the first stage of
        the logits chain; once the grammar is complete the row can only emit EOS.
        ``enable_ff_tokens``: append the tokens the grammar forces without running the model
        for each (batch 1 only, as the reference). ``set_guidance("", "")`` clears it.

        Raises `GuidanceError` (a ValueError) for an unknown type or an invalid
        schema, regex or grammar, with llguidance's message. Needs ``llguidance``.
        """
        # as the reference's binding: strings or UTF-8 bytes; a flag from anything a number
        # converts (None is False), not text or containers
        type, data = _text(type, "set_guidance: type"), _text(data, "set_guidance: data")
        if enable_ff_tokens is None:
            enable_ff_tokens = False
        check_type(
            enable_ff_tokens, (bool, np.bool_, numbers.Number), "set_guidance: enable_ff_tokens"
        )
        if type == "" and data == "":
            self.guidance = None
            self.guidance_ff_tokens = False
            return
        check_guidance(type, data)
        self.guidance = (type, data)
        self.guidance_ff_tokens = bool(enable_ff_tokens)
