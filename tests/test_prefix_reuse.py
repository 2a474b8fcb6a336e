"""Prefix reuse: generators started from a snapshot give the tokens of a full prefill."""

from __future__ import annotations

import numpy as np
import pytest

import genai

PREFIX = np.array([5, 9, 12, 7, 20, 33, 41, 8, 17, 23, 29], np.int32)
QUESTIONS = [np.array([30, 31, 8], np.int32), np.array([44, 6], np.int32), np.array([19], np.int32)]


def fresh(model, tokens, new=30, **options):
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(tokens) + new, **options)
    generator = genai.Generator(model, params)
    generator.append_tokens(tokens)
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0)


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "optimum", "gpt2"])
def test_generators_from_a_snapshot_match_a_full_prefill(fixture_folders, case):
    model = genai.Model(fixture_folders[case])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=64)
    base = genai.Generator(model, params)
    base.append_tokens(PREFIX)
    snapshot = base.snapshot()
    assert snapshot.tokens.tolist() == [PREFIX.tolist()]
    for question in QUESTIONS:  # several generators from one snapshot
        full = np.concatenate([PREFIX, question])
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=len(full) + 30)
        generator = genai.Generator(model, params)
        generator.restore(snapshot)
        assert generator.token_count() == len(PREFIX)
        generator.append_tokens(question)
        while not generator.is_done():
            generator.generate_next_token()
        np.testing.assert_array_equal(generator.get_sequence(0), fresh(model, full))


def test_snapshot_after_generating_and_generate_straight_from_it(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=60)
    base = genai.Generator(model, params)
    base.append_tokens(PREFIX)
    for _ in range(5):
        base.generate_next_token()
    snapshot = base.snapshot()
    other = genai.Generator(model, params)
    other.restore(snapshot)
    other.generate_until_done()
    base.generate_until_done()
    np.testing.assert_array_equal(other.get_sequence(0), base.get_sequence(0))


def test_snapshot_survives_kv_growth(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=100, kv_initial_capacity=4)
    base = genai.Generator(model, params)
    base.append_tokens(PREFIX)
    generator = genai.Generator(model, params)
    generator.restore(base.snapshot())
    generator.append_tokens(QUESTIONS[0])
    generator.generate_until_done(40)
    full = np.concatenate([PREFIX, QUESTIONS[0]])
    np.testing.assert_array_equal(
        generator.get_sequence(0), fresh(model, full, new=40, kv_initial_capacity=0)
    )


def test_restore_errors(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    other = genai.Model(fixture_folders["optimum"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=32)
    base = genai.Generator(model, params)
    with pytest.raises(genai.GenerationError, match="nothing to snapshot"):
        base.snapshot()
    base.append_tokens(PREFIX)
    snapshot = base.snapshot()
    with pytest.raises(genai.GenerationError, match="fresh generator"):
        base.restore(snapshot)
    other_params = genai.GeneratorParams(other)
    other_params.set_search_options(max_length=32)
    with pytest.raises(ValueError, match="another model or KV layout"):
        genai.Generator(other, other_params).restore(snapshot)
    short = genai.GeneratorParams(model)
    short.set_search_options(max_length=8)
    with pytest.raises(ValueError, match="exceed max_length 8"):
        genai.Generator(model, short).restore(snapshot)


@pytest.mark.slow
def test_real_model_system_prompt_reuse(smollm2_path):
    model = genai.Model(smollm2_path)
    tokenizer = genai.Tokenizer(model)
    system = [{"role": "system", "content": "You are a concise geography assistant."}]
    prefix_text = tokenizer.apply_chat_template(system, add_generation_prompt=False)
    prefix = tokenizer.encode(prefix_text)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=256)
    base = genai.Generator(model, params)
    base.append_tokens(prefix)
    snapshot = base.snapshot()
    for question in ("What is the capital of France?", "What is the capital of Italy?"):
        messages = [*system, {"role": "user", "content": question}]
        full = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        assert full[: len(prefix)].tolist() == prefix.tolist()
        generator = genai.Generator(model, params)
        generator.restore(snapshot)
        generator.append_tokens(full[len(prefix) :])
        generator.generate_until_done(40)
        np.testing.assert_array_equal(generator.get_sequence(0), fresh(model, full, new=40))
