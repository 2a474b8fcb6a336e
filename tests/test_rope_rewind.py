"""The reference's Phi-3 long-RoPE rewind: a batch-1 generator of a ``phi3`` / ``phimoe`` model
re-runs its whole sequence as one prompt when it reaches 4097 tokens (8193 for ``phi3small``),
whose graphs pick their rotary factors by the sequence's length. Checked against the reference
engine on a tiny GroupQueryAttention decoder typed ``phi3``: the logits of every step across
the threshold, bit for bit (a step's numbers and a prompt's differ in the last bits, so without
the re-run the steps after the threshold differ)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.runtime.model import ROPE_REWIND_LENGTHS
from genai.testing.models import write_gqa_decoder

og = pytest.importorskip("onnxruntime_genai")

AT = ROPE_REWIND_LENGTHS["phi3"]
PROMPT_LENGTH = AT - 6
MAX_LENGTH = AT + 4


@pytest.fixture(scope="module")
def phi3(tmp_path_factory) -> Path:
    folder = write_gqa_decoder(
        tmp_path_factory.mktemp("rope"), context_length=AT + 64, name="phi3", vocab_size=64
    )
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["type"] = "phi3"
    path.write_text(json.dumps(config))
    return folder


def _prompt(repeat: bool = False) -> np.ndarray:
    rng = np.random.default_rng(0)
    if repeat:  # a pattern n-gram lookup finds
        return np.tile(rng.integers(3, 64, 7), PROMPT_LENGTH // 7 + 1)[None, :PROMPT_LENGTH]
    return rng.integers(3, 64, (1, PROMPT_LENGTH)).astype(np.int32)


def _loop(engine, folder: Path, prompt: np.ndarray, **speculative) -> tuple[list[int], list]:
    model = engine.Model(str(folder))
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    if speculative:
        params.set_speculative_options(**speculative)
    gen = engine.Generator(model, params)
    gen.append_tokens(prompt.astype(np.int32))
    logits = []
    while not gen.is_done():
        logits.append(gen.get_logits().copy())
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)], logits


def test_the_steps_across_the_threshold_are_the_references(phi3):
    prompt = _prompt()
    want, want_logits = _loop(og, phi3, prompt)
    got, got_logits = _loop(genai, phi3, prompt)
    assert got == want
    assert len(got_logits) == MAX_LENGTH - PROMPT_LENGTH
    for step, (mine, theirs) in enumerate(zip(got_logits, want_logits, strict=True)):
        np.testing.assert_array_equal(mine, theirs, err_msg=f"step {step}")


def test_generate_until_done_rewinds_at_the_same_length(phi3):
    prompt = _prompt()
    want, want_logits = _loop(genai, phi3, prompt)
    model = genai.Model(str(phi3))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH - 1)  # logits of the last step stay readable
    gen = genai.Generator(model, params)
    gen.append_tokens(prompt)
    assert gen.generate_until_done() == MAX_LENGTH - 1 - PROMPT_LENGTH
    assert [int(t) for t in gen.get_sequence(0)] == want[:-1]
    np.testing.assert_array_equal(gen.get_logits(), want_logits[-1])


def test_ngram_rounds_stop_at_the_threshold_and_keep_plain_tokens(phi3):
    """Rounds from 23 tokens before the threshold: none runs across it (its proposals end
    one before it), so the re-run happens there and the tokens are plain decoding's. (Without
    that limit, a round of this prompt runs from 4095 to 4098 tokens.)"""
    prompt = _prompt(repeat=True)[:, : AT - 23]
    plain, _ = _loop(genai, phi3, prompt)
    model = genai.Model(str(phi3))
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH)
    params.set_speculative_options(ngram_size=2, max_draft_tokens=4)
    gen = genai.Generator(model, params)
    gen.append_tokens(prompt)
    computed = []  # the sequence's length inside the engine (rounds run ahead of the visible)
    while not gen.is_done():
        gen.generate_next_token()
        computed.append(gen._loop.length)
    assert [int(t) for t in gen.get_sequence(0)] == plain
    assert AT in computed
    before = [length for length in computed if length < AT]
    assert gen.get_speculative_stats()["rounds"] > 0 and len(set(before)) < len(before)


def test_only_batch_one_of_the_listed_types_rewinds(phi3, fixture_folders):
    model = genai.Model(str(phi3))
    assert model.rope_rewind_length == AT
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=MAX_LENGTH, batch_size=2)
    assert genai.Generator(model, params)._rope_rewind_at == 0
    assert genai.Model(str(fixture_folders["gqa"])).rope_rewind_length == 0
