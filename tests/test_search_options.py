"""`GeneratorParams`: the reference's option names, defaults, types and validation."""

from __future__ import annotations

import numpy as np
import pytest

import genai
from genai.generation.search import SearchOptions

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")


@pytest.fixture(scope="module")
def models(smollm2_path):
    return genai.Model(smollm2_path), og.Model(str(smollm2_path))


def test_defaults_equal_reference(models):
    ours, ref = models
    assert genai.GeneratorParams(ours).get_search_options() == (
        og.GeneratorParams(ref).get_search_options()
    )


def test_set_then_get_equals_reference(models):
    ours, ref = models
    # values float32 cannot hold exactly: the reference reads them back as float32 gives them
    options = dict(max_length=40, top_k=7, top_p=0.7, temperature=0.3, do_sample=True,
                   repetition_penalty=1.1, length_penalty=0.9, random_seed=3,
                   min_length=2)  # fmt: skip
    mine, theirs = genai.GeneratorParams(ours), og.GeneratorParams(ref)
    mine.set_search_options(**options)
    theirs.set_search_options(**options)
    assert mine.get_search_options() == theirs.get_search_options()
    assert mine.get_search_options()["temperature"] == float(np.float32(0.3)) != 0.3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"min_length": 2**31},
            r"min_length \(2147483648\) must be in \[-2147483648, 2147483647\]",
        ),
        ({"no_repeat_ngram_size": 2**31}, r"no_repeat_ngram_size \(2147483648\) must be in"),
        ({"chunk_size": 2**63}, r"chunk_size \(9223372036854775808\) must be in"),
        ({"top_k": 2**53 + 1}, r"top_k \(9007199254740993\) must be in"),
        ({"random_seed": 2**64}, r"random_seed \(18446744073709551616\) must be in"),
        ({"max_length": 3.5}, "max_length must be an integer, got 3.5"),
    ],
)
def test_integer_options_beyond_their_range_are_refused(models, options, message):
    """The reference's binding casts ints to C ints (a RuntimeError beyond them); genai wrapped
    seeds past 2**64 silently (2**64 sampled as seed 0), called 2**63-1 'not an integer' (a
    float comparison) and let a ValueError or OverflowError out later for the rest."""
    ours, ref = models
    with pytest.raises(genai.SearchOptionError, match=message):
        genai.GeneratorParams(ours).set_search_options(**options)
    if "random_seed" not in options and "max_length" not in options:
        with pytest.raises(RuntimeError):
            og.GeneratorParams(ref).set_search_options(**options)


def test_64_bit_seeds_are_taken_exactly(models):
    """Seeds are 64-bit in genai (beyond the reference's C int): 2**63 - 1 is accepted as it
    is (was refused as 'not an integer')."""
    params = genai.GeneratorParams(models[0])
    params.set_search_options(random_seed=2**63 - 1, do_sample=True)
    assert params.search.random_seed == 2**63 - 1


def test_reference_defaults_without_config():
    options = SearchOptions()
    assert options.top_k == 50 and options.top_p == 0.0 and options.max_length == 0
    assert options.is_greedy
    options.update(do_sample=True)
    assert not options.is_greedy
    options.update(top_k=1)
    assert options.is_greedy


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"foo": 1}, "unknown search option 'foo'"),
        ({"max_length": 1.5}, "must be an integer"),
        ({"max_length": "10"}, "expects a number"),
        ({"max_length": True}, "expects a number"),
        ({"do_sample": 1}, "expects a bool"),
        ({"temperature": float("nan")}, "must be finite"),
    ],
)
def test_bad_names_and_types(models, options, message):
    params = genai.GeneratorParams(models[0])
    with pytest.raises(genai.SearchOptionError, match=message):
        params.set_search_options(**options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_length": 9000}, r"max_length \(9000\) cannot be greater than model context_length"),
        ({"max_length": -1}, "max_length"),
        ({"batch_size": 0}, r"batch_size \(0\) must be in \[1, 32\]"),
        ({"batch_size": 33}, r"batch_size \(33\) must be in \[1, 32\]"),
        ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -1}, "temperature"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_length": -1}, "min_length"),
        ({"top_logprobs": 60000}, r"top_logprobs \(60000\) cannot exceed the vocabulary \(49152\)"),
        ({"top_logprobs": 10**9}, r"top_logprobs \(1000000000\) cannot exceed the vocabulary"),
        ({"repetition_penalty": 1e-50}, r"repetition_penalty \(1e-50\) must be > 0"),
    ],
)
def test_ranges_checked_when_generator_is_created(models, options, message):
    params = genai.GeneratorParams(models[0])
    params.set_search_options(**options)
    with pytest.raises(genai.SearchOptionError, match=message):
        genai.Generator(models[0], params)


def test_max_length_above_the_context_is_caught_as_the_references_runtime_error(models):
    """A chat app written for the reference catches RuntimeError when its conversation outgrew
    the model (genai's SearchOptionError was a ValueError only)."""
    for engine, model in zip((genai, og), models, strict=True):
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=9000)
        with pytest.raises(RuntimeError, match="context_length"):
            engine.Generator(model, params)
