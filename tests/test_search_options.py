"""`GeneratorParams`: the reference's option names, defaults, types and validation."""

from __future__ import annotations

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
    options = dict(max_length=40, top_k=7, top_p=0.5, temperature=0.25, do_sample=True,
                   repetition_penalty=1.5, random_seed=3, min_length=2)  # fmt: skip
    mine, theirs = genai.GeneratorParams(ours), og.GeneratorParams(ref)
    mine.set_search_options(**options)
    theirs.set_search_options(**options)
    got, want = mine.get_search_options(), theirs.get_search_options()
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6), key


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
        ({"top_k": 2**40}, r"top_k \(1099511627776\) must be in \[0, 2147483647\]"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -1}, "temperature"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_length": -1}, "min_length"),
        ({"top_logprobs": 60000}, r"top_logprobs \(60000\) cannot exceed the vocabulary \(49152\)"),
        ({"top_logprobs": 10**9}, r"top_logprobs \(1000000000\) cannot exceed the vocabulary"),
    ],
)
def test_ranges_checked_when_generator_is_created(models, options, message):
    params = genai.GeneratorParams(models[0])
    params.set_search_options(**options)
    with pytest.raises(genai.SearchOptionError, match=message):
        genai.Generator(models[0], params)
