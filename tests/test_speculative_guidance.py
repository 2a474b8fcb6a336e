"""Speculative decoding under guidance (constrained decoding): rounds whose proposals are cut
where the grammar stops allowing them, every row masked by the grammar before the choice.

Independent references: the reference engine's plain guided decoding on the same folder (its
tokens), Python's `re` / `json` on the text, and the reference's stats rules for guided rounds
(no speed-up estimate)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import genai
from genai.runtime.verify_rows import rows_like_steps

og = pytest.importorskip("onnxruntime_genai")
pytest.importorskip("llguidance", reason="constrained decoding needs llguidance")

REPEATED = "Copy: 123-456 123-456 123-456 123-456. The numbers are 123-456"
SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "enum": [42]},
            "note": {"type": "string", "maxLength": 12},
        },
        "required": ["answer", "note"],
        "additionalProperties": False,
    }
)
GRAMMARS = {
    "regex": ("regex", r"[0-9]{3}-[0-9]{3}( [0-9]{3}-[0-9]{3}){0,6}"),
    "json": ("json_schema", SCHEMA),
    "lark": ("lark_grammar", 'start: "answer:" /[0-9]{2}/ " and " "1 1 1 1 1 1 1 1"'),
}
PROMPTS = {
    "regex": REPEATED,
    "json": 'JSON: {"answer": 42, "note": "ok"} {"answer": 42, "note": "ok"}. Again:',
    "lark": "answer:42 and 1 1 1 1 1 1 1 1. answer:42 and 1 1 1 1 1 1 1 1. Again:",
}


def _generator(mod, folder, prompt, grammar, *, ff=False, spec=None, new=40, **search):
    model = mod.Model(str(folder))
    ids = np.asarray(mod.Tokenizer(model).encode(prompt), np.int32)
    params = mod.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, **search)
    if spec:
        params.set_speculative_options(**spec)
    params.set_guidance(*GRAMMARS[grammar], ff)
    gen = mod.Generator(model, params)
    gen.append_tokens(ids[None, :])
    return gen, len(ids)


def _finish(gen, one_per_call: bool = True) -> tuple[list[int], int]:
    calls = 0
    while not gen.is_done():
        before = gen.token_count()
        gen.generate_next_token()
        calls += 1
        if one_per_call:  # a round's tokens come one per call
            assert gen.token_count() - before <= 1
    return [int(t) for t in gen.get_sequence(0)], calls


def _check_text(folder, grammar: str, tokens: list[int]) -> None:
    text = genai.Tokenizer(str(folder)).decode(np.asarray(tokens, np.int32))
    if grammar == "json":
        value = json.loads(text)
        assert value["answer"] == 42 and isinstance(value["note"], str)
    elif grammar == "regex":
        assert re.fullmatch(GRAMMARS["regex"][1], text)
    else:
        assert re.fullmatch(r"answer:[0-9]{2} and 1 1 1 1 1 1 1 1", text)


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_rounds_give_the_references_plain_guided_tokens(smollm2_path, grammar, k):
    reference, prompt_length = _generator(og, smollm2_path, PROMPTS[grammar], grammar, new=80)
    expected = _finish_reference(reference)
    spec = {"ngram_size": 3, "max_draft_tokens": k}
    gen, _ = _generator(genai, smollm2_path, PROMPTS[grammar], grammar, spec=spec, new=80)
    found, _ = _finish(gen)
    assert found == expected
    _check_text(smollm2_path, grammar, found[prompt_length:])
    stats = gen.get_speculative_stats()
    assert stats["rounds"] > 0 and stats["draft_tokens_accepted"] > 0
    # the reference's rules for guided rounds: no speed-up estimate
    assert not stats["formula_supported"]
    assert stats["expected_tokens_per_round"] == 0.0 and stats["estimated_speedup"] == 0.0
    assert stats["tokens_queued"] == stats["tokens_emitted"] + stats["tokens_discarded"]
    assert stats["ngram_lookup_tokens_proposed"] <= stats["draft_tokens_proposed"]


def _finish_reference(gen) -> list[int]:
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)]


@pytest.mark.parametrize("grammar", ["json", "lark"])
def test_forced_tokens_give_plain_guided_tokens(smollm2_path, grammar):
    """With fast-forward tokens, a round ends at the token that forces some and queues them;
    the tokens are those of plain guided decoding (which appends them in the step that forced
    them, as a plain step between rounds does)."""
    plain, _ = _generator(genai, smollm2_path, PROMPTS[grammar], grammar, ff=True)
    jumps = 0
    while not plain.is_done():
        before = plain.token_count()
        plain.generate_next_token()
        jumps = max(jumps, plain.token_count() - before)
    expected = [int(t) for t in plain.get_sequence(0)]
    assert jumps > 1, "the grammar forced no tokens: the test checks nothing"
    gen, _ = _generator(
        genai,
        smollm2_path,
        PROMPTS[grammar],
        grammar,
        ff=True,
        spec={"ngram_size": 2, "max_draft_tokens": 4},
    )
    found, _ = _finish(gen, one_per_call=False)
    assert found == expected
    if grammar == "json":  # (the lark grammar forces all but two tokens: no round to run)
        assert gen.get_speculative_stats()["rounds"] > 0


@pytest.mark.parametrize("seed", [0, 7])
def test_sampled_k1_draws_what_plain_guided_sampling_draws(smollm2_path, seed):
    search = {"do_sample": True, "random_seed": seed, "top_k": 40, "temperature": 0.9}
    plain, _ = _generator(genai, smollm2_path, REPEATED, "regex", **search)
    expected, _ = _finish(plain)
    gen, _ = _generator(
        genai,
        smollm2_path,
        REPEATED,
        "regex",
        spec={"ngram_size": 3, "max_draft_tokens": 1},
        **search,
    )
    found, _ = _finish(gen)
    assert found == expected
    assert gen.get_speculative_stats()["rounds"] > 0


def test_proposals_are_cut_where_the_grammar_stops_them(smollm2_path):
    """The prompt repeats "123-456 " but the grammar allows one group: the lookup's proposals
    run past its end and are cut (counted as the reference counts a grammar rejection)."""
    model = genai.Model(str(smollm2_path))
    ids = genai.Tokenizer(model).encode(REPEATED)
    found = []
    for spec in (None, {"ngram_size": 3, "max_draft_tokens": 8}):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + 20)
        params.set_guidance("regex", r"[0-9]{3}-[0-9]{3}")
        if spec:
            params.set_speculative_options(**spec)
        gen = genai.Generator(model, params)
        gen.append_tokens(ids)
        found.append(_finish(gen)[0])
    stats = gen.get_speculative_stats()
    assert found[1] == found[0]
    assert stats["ngram_grammar_candidate_rejections"] >= 1
    assert stats["ngram_lookup_tokens_proposed"] == stats["draft_tokens_proposed"]


def test_a_round_cut_short_gives_the_grammar_back(smollm2_path):
    """set_logits while a guided round has tokens queued: the grammar goes back to the tokens
    emitted, so the next choice is masked as in plain guided decoding at that point."""
    runs = []
    for spec in (None, {"ngram_size": 3, "max_draft_tokens": 6}):
        gen, _ = _generator(genai, smollm2_path, REPEATED, "regex", spec=spec)
        for _ in range(3):
            gen.generate_next_token()
        if spec:
            assert gen._spec.pending, "no round in flight: the test checks nothing"
            with pytest.raises(genai.GenaiError, match="guided round has buffered tokens"):
                gen.get_logits()
        vocab = gen.vocab_size
        flat = np.zeros((1, vocab), np.float32)  # the grammar's mask decides: its first token
        gen.set_logits(flat)
        gen.generate_next_token()
        runs.append(_finish(gen)[0])
    assert runs[1] == runs[0]


def test_stop_string_inside_a_guided_round(smollm2_path):
    """A stop string met by a round's token discards the rest of the round (and gives the
    grammar back): the same tokens and finish reason as plain guided decoding."""
    found = []
    for spec in (None, {"ngram_size": 3, "max_draft_tokens": 6}):
        gen, _ = _generator(genai, smollm2_path, REPEATED, "regex", spec=spec, stop=["456 123-4"])
        found.append((_finish(gen)[0], gen.finish_reason(0)))
    assert found[1] == found[0]
    assert found[0][1] is genai.FinishReason.STOP_STRING


def test_guided_rows_of_a_batch_run_rounds_with_plain_batched_tokens(smollm2_path):
    """At batch 2 each row's generator runs its own guided rounds: the tokens are plain
    batched guided decoding's, and each row's text matches the grammar."""
    model = genai.Model(str(smollm2_path))
    tokenizer = genai.Tokenizer(model)
    ids = tokenizer.encode_batch([REPEATED, "Numbers: 777-888 777-888 777-888. Again: 777-888"])
    found = []
    for spec in (None, {"ngram_size": 3, "max_draft_tokens": 4}):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=ids.shape[1] + 40, batch_size=2)
        params.set_guidance(*GRAMMARS["regex"])
        if spec:
            params.set_speculative_options(**spec)
        gen = genai.Generator(model, params)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        found.append([[int(t) for t in gen.get_sequence(r)] for r in range(2)])
    assert found[1] == found[0]
    # (where this CPU's int4 linears give a row other bits alone than in a batch, AVX2, the
    # batch makes plain batched steps: docs/speculative.md, "Batches")
    apart = rows_like_steps(gen._driver.session.linear_ops)
    assert (gen.get_speculative_stats()["rounds"] > 0) is apart
    eos = set(model.config.eos_token_ids)
    for row in found[1]:
        out = [t for t in row[ids.shape[1] :] if t not in eos]
        pad = int(model.config.get("model.pad_token_id", 0))
        out = [t for t in out if t != pad]
        text = tokenizer.decode(np.asarray(out, np.int32))
        assert re.fullmatch(GRAMMARS["regex"][1] + " ?", text)


@pytest.mark.parametrize(
    "prompt", ["The capital of France is Paris. Again: The capital of France is", "Say:"]
)
def test_forced_spans_ride_one_verify_run(smollm2_path, prompt):
    """With fast-forward tokens, a proposal continues with what the grammar forces (from the
    start too, when the lookup finds nothing), and forced tokens the verify run holds are kept
    without a run of their own: many tokens per target run, the literal's text."""
    literal = "The capital of France is Paris and Berlin is in Germany."
    model = genai.Model(str(smollm2_path))
    tokenizer = genai.Tokenizer(model)
    ids = tokenizer.encode(prompt)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 24)
    params.set_speculative_options(ngram_size=3, max_draft_tokens=8)
    params.set_guidance("lark_grammar", f'start: "{literal}"', True)
    gen = genai.Generator(model, params)
    gen.append_tokens(ids)
    tokens, _ = _finish(gen)
    eos = set(model.config.eos_token_ids)
    out = [t for t in tokens[len(ids) :] if t not in eos]
    assert tokenizer.decode(np.asarray(out, np.int32)) == literal
    stats = gen.get_speculative_stats()
    assert stats["target_forward_passes"] >= 1
    assert len(out) / stats["target_forward_passes"] >= 2.0, stats


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
@pytest.mark.parametrize("ff", [False, True])
def test_a_self_draft_proposes_what_the_grammar_allows(smollm2_path, tmp_path, grammar, ff):
    """A draft model's rows are masked by a copy of the grammar (and take the tokens it
    forces): SmolLM2 as its own draft then proposes the target's own guided choices, so
    every proposal is accepted and nearly every round emits K + 1 tokens (unmasked, the
    regex cases took 10-11 target runs for 55 tokens, their proposals cut where the
    grammar refused the draft's choice); the tokens are plain guided decoding's."""
    from genai.runtime.verify_rows import exact_rows
    from genai.testing.speculative import with_draft

    folder = with_draft(smollm2_path, None, tmp_path, speculative={"max_draft_tokens": 6})
    if not exact_rows(genai.Model(str(folder)).session):
        pytest.skip("this CPU's int4 kernels give a run's rows other numbers than one-token steps")
    plain, _ = _generator(genai, smollm2_path, PROMPTS[grammar], grammar, ff=ff, new=80)
    expected, _ = _finish(plain, one_per_call=False)
    gen, prompt_length = _generator(genai, folder, PROMPTS[grammar], grammar, ff=ff, new=80)
    found, _ = _finish(gen, one_per_call=ff is False)
    assert found == expected
    _check_text(smollm2_path, grammar, found[prompt_length:])
    stats = gen.get_speculative_stats()
    assert stats["rounds"] > 0
    assert stats["draft_tokens_evaluated"] > 0
    assert stats["acceptance_rate"] == 1.0, stats
    generated = len(found) - prompt_length
    assert stats["target_forward_passes"] <= -(-generated // 7) + 1, stats
    assert not stats["formula_supported"] and stats["estimated_speedup"] == 0.0


def test_a_drafts_proposal_is_masked_by_a_copy_of_the_grammar(smollm2_path):
    """The draft's own choices after this prompt are digits; under a letters-only regex its
    masked proposal is letters, and the constraint itself consumed nothing."""
    from genai.constraints.guidance import TokenConstraint
    from genai.generation.speculative.draft import DraftProposer
    from genai.generation.speculative.stats import SpeculativeCounters

    model = genai.Model(str(smollm2_path))
    tokenizer = genai.Tokenizer(model)
    constraint = TokenConstraint.create(tokenizer, "regex", r"[a-z]{3}-[a-z]{3}")
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=64)
    eos = np.asarray(model.config.eos_token_ids, np.int32)
    proposer = DraftProposer(model, params.search, eos, SpeculativeCounters())
    prompt = np.asarray(tokenizer.encode(REPEATED), np.int32)
    unmasked = tokenizer.decode(np.asarray(proposer.propose(prompt, 4), np.int32))
    assert re.search(r"[0-9]", unmasked), unmasked
    masked = proposer.propose(prompt, 8, constraint.lookahead())
    body = [t for t in masked if t not in set(eos.tolist())]
    text = tokenizer.decode(np.asarray(body, np.int32))
    assert re.fullmatch(r"[a-z]{1,3}(-[a-z]{0,3})?", text), text
    assert constraint.mark() == (0, False)
    assert constraint.continue_proposal(masked, 8)[1] == len(masked)
