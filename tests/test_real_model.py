"""Side by side with onnxruntime-genai on the real SmolLM2-135M int4 folder in ../shared."""

from __future__ import annotations

import numpy as np
import pytest

import genai
from tests.parity import assert_same_run, greedy

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

pytestmark = pytest.mark.slow

MESSAGES = '[{"role": "user", "content": "What is the capital of France?"}]'


@pytest.fixture(scope="module")
def engines(smollm2_path):
    return genai.Model(smollm2_path), og.Model(str(smollm2_path))


@pytest.fixture(scope="module")
def prompt(engines):
    tokenizer = og.Tokenizer(engines[1])
    return tokenizer.encode(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))


@pytest.mark.parametrize("share_buffer", [True, False], ids=["shared-kv", "growing-kv"])
def test_greedy_tokens_identical_batch1(engines, prompt, share_buffer):
    ours, ref = engines
    max_length = len(prompt) + 80
    opts = {"past_present_share_buffer": share_buffer, "min_length": 0}
    mine = greedy(genai, ours, prompt, max_length, **opts)
    theirs = greedy(og, ref, prompt, max_length, **opts)
    assert_same_run(mine, theirs)
    assert len(mine.next_tokens) >= 16
    text = genai.Tokenizer(ours).decode(mine.sequences[0][len(prompt) :])
    assert "Paris" in text


def test_greedy_runs_to_max_length_64_new_tokens(engines):
    ours, ref = engines
    tokenizer = og.Tokenizer(ref)
    ids = tokenizer.encode("Once upon a time, in a small village by the sea,")
    mine = greedy(genai, ours, ids, len(ids) + 64)
    theirs = greedy(og, ref, ids, len(ids) + 64)
    assert_same_run(mine, theirs)
    assert len(mine.next_tokens) == 64


@pytest.mark.parametrize("share_buffer", [True, False], ids=["shared-kv", "growing-kv"])
def test_batch2_right_padding(engines, share_buffer):
    ours, ref = engines
    tokenizer = og.Tokenizer(ref)
    batch = tokenizer.encode_batch(
        ["The quick brown fox jumps over the lazy dog because", "Hello"]
    ).as_numpy()
    mine = greedy(genai, ours, batch, batch.shape[1] + 48, past_present_share_buffer=share_buffer)
    theirs = greedy(og, ref, batch, batch.shape[1] + 48, past_present_share_buffer=share_buffer)
    assert_same_run(mine, theirs)


def test_logits_close_to_reference(engines, prompt):
    ours, ref = engines
    mine = greedy(genai, ours, prompt, len(prompt) + 8, keep_logits=True)
    theirs = greedy(og, ref, prompt, len(prompt) + 8, keep_logits=True)
    assert len(mine.logits) == len(theirs.logits)
    for a, b in zip(mine.logits, theirs.logits, strict=True):
        assert a.shape == b.shape == (1, 1, 49152)
        np.testing.assert_allclose(a, b, atol=1e-3)


def test_rewind_then_append_matches_reference(engines, prompt):
    ours, ref = engines
    results = []
    for engine, model in ((genai, ours), (og, ref)):
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + 40)
        generator = engine.Generator(model, params)
        generator.append_tokens(prompt)
        for _ in range(10):
            generator.generate_next_token()
        generator.rewind_to(len(prompt) - 3)
        generator.append_tokens(prompt[-3:])
        while not generator.is_done():
            generator.generate_next_token()
        results.append(np.array(generator.get_sequence(0)))
    np.testing.assert_array_equal(results[0], results[1])
