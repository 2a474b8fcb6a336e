"""Speculative decoding: propose several tokens cheaply, verify them in one model run, keep
the longest prefix the model agrees with (plus one token of its own).

* `options`: the reference's options (``set_speculative_options``, the ``speculative``
  section) and their checks;
* `ngram`: prompt lookup (n-gram) proposals;
* `draft`: draft-model proposals (``model.draft``);
* `policy`: adaptive K and cooldown;
* `decoder`: the rounds inside a `genai.Generator` (verify, accept, commit, emit one token
  per call);
* `rows`: batch > 1, each row running its own rounds (one batch-1 generator per row);
* `stats`: the counters behind `Generator.get_speculative_stats`.

`make_speculative` is what a generator calls: it checks what the reference refuses and
returns the `SpeculativeDecoder` for the generator's options (a `RowSpeculation` at batch > 1),
or None when they ask for none.
"""

from __future__ import annotations

from typing import Any

from genai.errors import SearchOptionError, UnsupportedFeatureError
from genai.generation.speculative.decoder import Proposer, SpeculativeDecoder
from genai.generation.speculative.draft import DraftProposer
from genai.generation.speculative.ngram import NGramLookup, NGramProposer
from genai.generation.speculative.options import SpeculativeOptionError, SpeculativeOptions
from genai.generation.speculative.rows import RowSpeculation
from genai.generation.speculative.stats import SpeculativeCounters
from genai.kv.windowed_cache import engine_slides

__all__ = [
    "DraftProposer",
    "NGramLookup",
    "NGramProposer",
    "Proposer",
    "RowSpeculation",
    "SpeculativeCounters",
    "SpeculativeDecoder",
    "SpeculativeOptionError",
    "SpeculativeOptions",
    "check_speculative",
    "make_speculative",
    "plain_stats",
]


#: The reference's refusal of a model whose KV cache cannot rewind.
_NOT_REWINDABLE = (
    "{what} requires a rewindable KV cache; sliding-window, hybrid, and model-managed state "
    "are not supported in this release."
)


def plain_stats() -> dict[str, Any]:
    """`Generator.get_speculative_stats` of a generator without speculative decoding (every
    counter 0, as the reference)."""
    return SpeculativeCounters().as_reference_dict()


def check_speculative(
    options: SpeculativeOptions, config: Any, search: Any, draft: Any = None
) -> None:
    """What the reference refuses before anything else when a generator is made: chained
    lookup without n-gram decoding, n-gram decoding with a draft model, beam search, several
    return sequences, n-gram decoding of a model whose cache slides (``config``: the model's
    `Config`; ``search``: the generator's `SearchOptions`; ``draft``: a draft model chosen at
    run time, if any). Beyond the reference, batch > 1 runs (`RowSpeculation`)."""
    has_draft = draft is not None or config.get("model.draft") is not None
    if options.ngram_chained_lookup and not options.ngram:
        raise SpeculativeOptionError(
            "speculative.ngram_chained_lookup requires speculative.ngram_size to enable n-gram "
            "decoding."
        )
    if not options.ngram:
        if has_draft:
            _check_draft_search(search)
        return
    if has_draft:
        raise UnsupportedFeatureError(
            "N-gram decoding cannot be combined with draft-model speculative decoding."
        )
    what = "N-gram decoding"
    if search.num_beams != 1:
        raise UnsupportedFeatureError(f"{what} does not support beam search in this release.")
    if search.num_return_sequences != 1:
        raise UnsupportedFeatureError(f"{what} requires num_return_sequences=1 in this release.")
    if engine_slides(config):  # (windowed models are never verified: `WindowedDriver`)
        raise UnsupportedFeatureError(_NOT_REWINDABLE.format(what=what))


def _check_draft_search(search: Any) -> None:
    """What the reference refuses with a draft model (batch_size > 1 runs here)."""
    if search.num_beams != 1:
        raise UnsupportedFeatureError(
            "Speculative decoding does not support num_beams > 1 (beam search). Got "
            f"num_beams={search.num_beams}."
        )
    if search.no_repeat_ngram_size:
        raise UnsupportedFeatureError(
            "Speculative decoding does not support no_repeat_ngram_size != 0 in this release. "
            f"Got no_repeat_ngram_size={search.no_repeat_ngram_size}."
        )


def make_speculative(
    generator: Any, options: SpeculativeOptions, draft: Any = None, params: Any = None
) -> SpeculativeDecoder | RowSpeculation | None:
    """The speculative decoder ``generator`` (a `genai.Generator`, its driver made) runs with
    ``options`` (checked by `check_speculative`), or None when they ask for none: n-gram
    decoding (``ngram_size``) or a draft model (``draft``, chosen at run time, else the
    model's ``model.draft``). Raises what the reference raises for a model it cannot run,
    with its messages. At batch > 1 (``params``: the generator's `GeneratorParams`) a
    `RowSpeculation`: a batch-1 generator per row, each checked as one."""
    if draft is None:
        draft = getattr(generator.model, "draft", None)
    if not options.ngram and draft is None:
        return None
    if generator.rows > 1:
        if params is None:
            raise UnsupportedFeatureError(
                "speculative decoding at batch_size > 1 needs the generator's parameters"
            )
        return RowSpeculation(generator, params)
    counters = SpeculativeCounters()
    proposer: Proposer
    if options.ngram:
        check_plain_decoding(generator, "N-gram decoding")
        proposer = NGramProposer(options.ngram_size, options.ngram_chained_lookup, counters)
    else:
        # a target with the last position's logits only verifies one token per run
        check_plain_decoding(generator, "Speculative decoding", sequential=True)
        proposer = DraftProposer(draft, generator.search, generator._eos, counters)
    return SpeculativeDecoder(generator, options, proposer, counters)


def check_plain_decoding(generator: Any, what: str, sequential: bool = False) -> None:
    """Refuse, as the reference does, a model whose runs cannot be verified (windowed or
    pipeline models; last-position-only logits, unless ``sequential``: verified one token
    per run); and log-probabilities (beyond the reference)."""
    search, driver = generator.search, generator._driver
    if getattr(driver, "verify", None) is None:
        if generator.model.config.get("model.decoder.sliding_window"):
            raise UnsupportedFeatureError(_NOT_REWINDABLE.format(what=what))
        raise UnsupportedFeatureError(
            f"{what} requires a plain decoder-only text model in this release."
        )
    if not driver.verify_tokens and not (
        sequential and getattr(driver, "verify_sequentially", None) is not None
    ):
        raise UnsupportedFeatureError(
            f"{what} requires target logits for every verified token; pruned last-token-only "
            "logits are not supported in this release. (A folder built by genai's builder "
            "before new_token_logits: rebuild it, e.g. `genai pull --force` for the default "
            "model.)"
        )
    if search.logprobs or search.top_logprobs:
        raise SearchOptionError(
            "log-probabilities (logprobs) do not work with speculative decoding"
        )
