"""Beam search: hypotheses identical to onnxruntime-genai's on the fixture layouts, with EOS
hits, padding, length penalties, early stopping on/off and several returned sequences."""

from __future__ import annotations

import json

import numpy as np
import pytest

import genai
from genai._core import bookkeeping, reference

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

PROMPT = np.array([[5, 9, 12, 7, 20, 33, 41]], np.int32)
BATCH = np.array([[5, 9, 12, 7, 20, 33, 41], [30, 31, 8, 0, 0, 0, 0]], np.int32)
NEW = 20


def run(engine, model, prompt, **options):
    params = engine.GeneratorParams(model)
    params.set_search_options(
        max_length=prompt.shape[1] + NEW, batch_size=prompt.shape[0], **options
    )
    generator = engine.Generator(model, params)
    generator.append_tokens(prompt)
    steps = []
    while not generator.is_done():
        generator.generate_next_token()
        steps.append(np.array(generator.get_next_tokens()).tolist())
    returned = prompt.shape[0] * options.get("num_return_sequences", 1)
    return steps, [np.array(generator.get_sequence(i)).tolist() for i in range(returned)]


def models(folder, eos=None):
    pair = []
    for engine in (genai, og):
        config = engine.Config(str(folder))
        if eos is not None:
            config.overlay(json.dumps({"model": {"eos_token_id": [eos]}}))
        pair.append(engine.Model(config))
    return pair


OPTIONS = [
    {"num_beams": 3},
    {"num_beams": 4, "num_return_sequences": 3, "length_penalty": 0.5},
    {"num_beams": 2, "early_stopping": False, "length_penalty": 2.0},
    {"num_beams": 3, "repetition_penalty": 1.5},
]


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "optimum", "gpt2"])
@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())
)
@pytest.mark.parametrize("with_eos", [False, True], ids=["no-eos", "eos-hits"])
def test_hypotheses_identical_to_reference(fixture_folders, case, options, with_eos):
    folder = fixture_folders[case]
    eos = None
    if with_eos:
        # A token the beams produce early: hypotheses finish before max_length.
        probe, _ = run(genai, genai.Model(folder), PROMPT, num_beams=3)
        eos = probe[1][0]  # the best candidate of step 2: it ends a hypothesis there
    ours, ref = models(folder, eos)
    finished_early = False
    for prompt in (PROMPT, BATCH):
        mine = run(genai, ours, prompt, **options)
        theirs = run(og, ref, prompt, **options)
        assert mine[0] == theirs[0], "next tokens differ"
        assert mine[1] == theirs[1], "hypotheses differ"
        finished_early |= len(mine[0]) < NEW or any(len(s) < prompt.shape[1] + NEW for s in mine[1])
    if with_eos:
        assert finished_early, "the EOS never ended a hypothesis: the test lost its point"


def test_beam_errors(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=20, num_beams=2, do_sample=True)
    with pytest.raises(genai.SearchOptionError, match="does not sample"):
        genai.Generator(model, params)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=20, num_beams=2, num_return_sequences=2)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    with pytest.raises(IndexError, match=r"outside \[0, 2\)"):
        generator.get_sequence(2)
    with pytest.raises(NotImplementedError, match="num_beams 1"):
        generator.append_tokens(PROMPT)


@pytest.mark.parametrize("impl", [bookkeeping, reference], ids=["cython", "numpy"])
def test_reorder_rows_kernel(impl):
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 255, size=(5, 24), dtype=np.uint8)
    order = np.array([2, 2, 0, 4, 1], np.int32)
    expected = rows[order].copy()
    impl.reorder_rows(rows, order, np.empty_like(rows))
    np.testing.assert_array_equal(rows, expected)
    with pytest.raises(IndexError):
        impl.reorder_rows(rows, np.array([0, 1, 2, 3, 5], np.int32), np.empty_like(rows))


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "gpt2"])
def test_kv_reorder_moves_rows_and_only_filled_positions(fixture_folders, case):
    """`KVCache.reorder` against NumPy indexing of the cache read before; in the shared
    buffer, positions past the filled ones stay as they were (they are never copied)."""
    model = genai.Model(fixture_folders[case])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40, batch_size=4, kv_initial_capacity=0)
    generator = genai.Generator(model, params)
    generator.append_tokens(np.array([[5, 9, 12, 7], [30, 31, 8, 4], [6, 7, 8, 9], [3, 4, 5, 6]]))
    for _ in range(3):
        generator.generate_next_token()
    generator.get_logits()  # the pending token runs: 7 positions filled
    cache = generator._kv
    names = [*model.io.past_keys, *model.io.past_values]
    shared = hasattr(cache, "_buffers")
    if shared:  # mark the unfilled capacity of every row differently
        for buf in cache._buffers:
            buf[:, :, 7:] = np.arange(4, dtype=buf.dtype)[:, None, None, None]
    before = {name: cache.read(name) for name in names}
    order = np.array([2, 2, 0, 1], np.int32)
    cache.reorder(order)
    for name in names:
        after, old = cache.read(name), before[name]
        axis = 1 if model.io.combined_kv else 0
        np.testing.assert_array_equal(
            np.take(after, np.arange(7), axis=-2), np.take(np.take(old, order, axis), range(7), -2)
        )
        if shared:
            np.testing.assert_array_equal(after[:, :, 7:], old[:, :, 7:])


def test_beam_search_applies_presence_and_frequency_penalties(tmp_path):
    """Beam search runs the logits chain's stages 3-7, presence/frequency penalties included
    (they were silently ignored with beams): the penalty changes the beams' tokens."""
    from genai.testing.models import write_gqa_decoder

    model = genai.Model(write_gqa_decoder(tmp_path / "m", vocab_size=64))

    def best(**options):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=24, num_beams=3, **options)
        generator = genai.Generator(model, params)
        generator.append_tokens(np.array([5, 6, 7, 5, 6], np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return generator.get_sequence(0).tolist()

    plain = best()
    assert best(presence_penalty=2.0) != plain
    assert best(frequency_penalty=2.0) != plain
    assert best(presence_penalty=0.0) == plain


@pytest.mark.parametrize("first_run", ["cut", "finished-on-eos"])
def test_rewind_to_zero_starts_a_new_search(fixture_folders, first_run):
    """rewind_to(0) then a new prompt searches afresh: the same hypotheses as a new generator
    (the scorer kept the old run's scores and finished hypotheses: duplicate hypotheses, or
    the old prompt's after one step). The reference refuses rewind_to with beam search."""
    model = genai.Model(fixture_folders["gqa"])
    prompt = np.array([8, 3, 4], np.int32)

    def generator():
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=14, num_beams=3, num_return_sequences=2)
        return genai.Generator(model, params)

    fresh = generator()
    fresh.append_tokens(prompt)
    while not fresh.is_done():
        fresh.generate_next_token()
    reused = generator()
    reused.append_tokens(np.array([5, 9, 13, 22, 7], np.int32))
    if first_run == "cut":
        for _ in range(3):
            reused.generate_next_token()
    else:  # a confident EOS: a short finished hypothesis scores high
        logits = reused.get_logits()
        logits[:] = -50.0
        logits[:, 0, 2] = 50.0
        logits[:, 0, 40] = 49.0
        reused.set_logits(logits)
        while not reused.is_done():
            reused.generate_next_token()
    reused.rewind_to(0)
    reused.append_tokens(prompt)
    while not reused.is_done():
        reused.generate_next_token()
    for i in range(2):
        np.testing.assert_array_equal(reused.get_sequence(i), fresh.get_sequence(i))
