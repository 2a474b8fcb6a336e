"""Shared-buffer KV caches that grow on demand: identical tokens to a full-size buffer and to
the reference across several growth boundaries, and memory that follows use."""

from __future__ import annotations

import numpy as np
import pytest

import genai
from tests.parity import assert_same_run, greedy

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

PROMPT = np.array([5, 9, 12, 7, 20, 33, 41], np.int32)
BATCH = np.array([[5, 9, 12, 7, 20, 33, 41], [30, 31, 8, 0, 0, 0, 0]], np.int32)


@pytest.mark.parametrize("prompt", [PROMPT, BATCH], ids=["batch1", "batch2-padded"])
@pytest.mark.parametrize("initial", [4, 8, 16])
def test_growth_keeps_tokens_identical(fixture_folders, prompt, initial):
    folder = fixture_folders["gqa"]
    ours, ref = genai.Model(folder), og.Model(str(folder))
    max_length = 128  # the fixture's context: several growth steps from `initial`
    grown = greedy(genai, ours, prompt, max_length, kv_initial_capacity=initial)
    full = greedy(genai, ours, prompt, max_length, kv_initial_capacity=0)
    theirs = greedy(og, ref, prompt, max_length)
    assert_same_run(grown, full)
    assert_same_run(grown, theirs)


def test_growth_policy_and_accounting(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=128, kv_initial_capacity=8, kv_growth_factor=1.5)
    generator = genai.Generator(model, params)
    per_token = generator.kv_cache_bytes // 8  # 8 positions allocated at first
    generator.append_tokens(PROMPT)
    capacities = {generator.kv_cache_bytes // per_token}
    while not generator.is_done():
        generator.generate_next_token()
        capacities.add(generator.kv_cache_bytes // per_token)
        used = generator.kv_cache_used_bytes
        assert generator.kv_cache_bytes <= max(1.5 * used, 8 * per_token) + 8 * per_token
    assert sorted(capacities) == [8, 16, 24, 40, 64, 96, 128]  # x1.5, in blocks of 8, capped


def test_full_size_up_front_as_the_reference(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=100, kv_initial_capacity=0)
    generator = genai.Generator(model, params)
    io = model.io
    assert generator.kv_cache_bytes == 2 * io.num_layers * io.kv_heads * 100 * io.head_size * 4


def test_growth_inside_generate_until_done_and_after_rewind(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])

    def run(initial, rewind):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=120, kv_initial_capacity=initial)
        generator = genai.Generator(model, params)
        generator.append_tokens(PROMPT)
        generator.generate_until_done(50)  # crosses growth boundaries without the GIL
        if rewind:
            generator.rewind_to(30)
            generator.append_tokens(np.array([11, 13], np.int32))
        generator.generate_until_done()
        return generator.get_sequence(0)

    for rewind in (False, True):
        np.testing.assert_array_equal(run(4, rewind), run(0, rewind))


def test_growth_options_validated(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    for options, message in (
        ({"kv_initial_capacity": -1}, "kv_initial_capacity"),
        ({"kv_growth_factor": 1.0}, "kv_growth_factor"),
    ):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=32, **options)
        with pytest.raises(genai.SearchOptionError, match=message):
            genai.Generator(model, params)


@pytest.mark.slow
def test_real_model_at_full_context_allocates_what_it_uses(smollm2_path):
    ours, ref = genai.Model(smollm2_path), og.Model(str(smollm2_path))
    tokenizer = og.Tokenizer(ref)
    ids = tokenizer.encode("Once upon a time, in a small village by the sea, there lived")
    steps = 300
    params = genai.GeneratorParams(ours)
    params.set_search_options(max_length=8192, min_length=len(ids) + steps)
    generator = genai.Generator(ours, params)
    generator.append_tokens(ids)
    generator.generate_until_done(steps)
    mine = generator.get_sequence(0)
    theirs = greedy(og, ref, ids, len(ids) + steps, min_length=len(ids) + steps).sequences[0]
    np.testing.assert_array_equal(mine, theirs)
    io = ours.io
    full = 2 * io.num_layers * io.kv_heads * 8192 * io.head_size * 4
    assert generator.kv_cache_bytes <= 1.5 * generator.kv_cache_used_bytes + full / 64
    assert generator.kv_cache_bytes < full / 10


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "gpt2"])
def test_used_bytes_agree_with_the_generator(fixture_folders, case):
    """`KVCache.used_bytes` (what sliding-window layers need) equals the Generator's count on
    models without windows."""
    model = genai.Model(fixture_folders[case])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40, batch_size=2)
    generator = genai.Generator(model, params)
    generator.append_tokens(BATCH)
    generator.generate_until_done(9)
    computed = generator._loop.computed
    assert generator._kv.used_bytes(computed) == generator.kv_cache_used_bytes > 0


@pytest.mark.parametrize("shared", [True, False], ids=["shared-buffer", "growing"])
def test_a_dropped_generator_frees_its_cache_without_garbage_collection(fixture_folders, shared):
    """The loop holds its KV cache (its grow hook) and the cache follows the loop weakly: no
    reference cycle, so the KV buffers go with the generator, not at a later gc pass."""
    import gc
    import weakref

    model = genai.Model(fixture_folders["gqa"])
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=64, past_present_share_buffer=shared)
    generator = genai.Generator(model, params)
    generator.append_tokens(PROMPT)
    generator.generate_next_token()
    cache = weakref.ref(generator._driver.kv)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del generator
        assert cache() is None
    finally:
        if enabled:
            gc.enable()
