"""Sampling and logits processing through the public Generator: distributions (chi-square
against the exact top-k / top-p / temperature / min-p distributions), seeds, row independence,
greedy parity with the reference under penalties, and log-probabilities."""

from __future__ import annotations

import json

import numpy as np
import pytest

import genai
from tests.parity import assert_same_run, greedy

scipy_stats = pytest.importorskip("scipy.stats", reason="chi-square tests need scipy")
og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

VOCAB = 64
DRAWS = 20_000
BASE_LOGITS = np.full(VOCAB, -np.inf, np.float32)
BASE_LOGITS[[3, 7, 11, 20, 30, 41]] = [2.0, 1.5, 1.0, 0.5, 0.0, -1.0]


@pytest.fixture(scope="module")
def model(fixture_folders):
    return genai.Model(fixture_folders["gqa"])


def draw_many(model, count: int, logits: np.ndarray, **options) -> np.ndarray:
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=64, random_seed=1234, **options)
    generator = genai.Generator(model, params)
    tokens = np.empty(count, np.int64)
    for i in range(count):
        generator.rewind_to(0)
        generator.set_logits(logits[None, :])
        generator.generate_next_token()
        tokens[i] = generator.get_next_tokens()[0]
    return tokens


def expected(logits: np.ndarray, *, temperature=1.0, top_k=0, top_p=0.0, min_p=0.0):
    logits = logits.astype(np.float64)
    order = np.argsort(-logits, kind="stable")
    probs = np.exp((logits - logits.max()) / temperature)
    probs = np.where(np.isfinite(logits), probs, 0.0)
    keep = np.zeros(VOCAB, bool)
    ranked = order[:top_k] if top_k else order
    mass = probs[ranked] / probs[ranked].sum()
    if 0 < top_p < 1:
        cut = int(np.searchsorted(np.cumsum(mass), top_p) + 1)
        ranked = ranked[:cut]
    keep[ranked] = True
    if min_p > 0:
        keep &= probs >= min_p * probs.max()
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": 1.0, "top_k": 0},
        {"temperature": 0.7, "top_k": 3},
        {"temperature": 2.0, "top_k": 50},
        {"temperature": 1.0, "top_k": 0, "top_p": 0.8},
        {"temperature": 1.5, "top_k": 4, "top_p": 0.6},
        {"temperature": 1.0, "top_k": 0, "min_p": 0.2},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_empirical_distribution_matches_exact(model, options):
    tokens = draw_many(model, DRAWS, BASE_LOGITS, do_sample=True, **options)
    probs = expected(BASE_LOGITS, **options)
    support = probs > 0
    counts = np.bincount(tokens, minlength=VOCAB)
    assert counts[~support].sum() == 0, "drew a token outside the allowed set"
    want = probs[support] * (counts.sum() / probs[support].sum())
    result = scipy_stats.chisquare(counts[support], want)
    assert result.pvalue > 1e-3, (counts[support], probs[support] * DRAWS)


def test_greedy_when_temperature_zero_or_top_k_one(model):
    for options in ({"temperature": 0.0}, {"top_k": 1}, {"do_sample": False}):
        tokens = draw_many(model, 50, BASE_LOGITS, **{"do_sample": True, **options})
        assert set(tokens.tolist()) == {3}


def test_seeded_runs_reproduce_and_seeds_differ(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    prompt = np.array([5, 9, 12, 7, 20], np.int32)

    def run(seed):
        params = genai.GeneratorParams(model)
        params.set_search_options(
            max_length=48, do_sample=True, top_k=0, temperature=1.5, random_seed=seed
        )
        generator = genai.Generator(model, params)
        generator.append_tokens(prompt)
        while not generator.is_done():
            generator.generate_next_token()
        return generator.get_sequence(0)

    np.testing.assert_array_equal(run(7), run(7))
    assert not np.array_equal(run(7), run(8))


def test_row_draws_do_not_depend_on_neighbours(model):
    """Row 0 of a batch draws exactly what a batch-1 generator with the same seed draws."""
    rows = np.stack([BASE_LOGITS, np.roll(BASE_LOGITS, 5)])
    results = []
    for batch in (1, 2):
        params = genai.GeneratorParams(model)
        params.set_search_options(
            max_length=64, batch_size=batch, do_sample=True, top_k=0, random_seed=99
        )
        generator = genai.Generator(model, params)
        tokens = []
        for _ in range(200):
            generator.rewind_to(0)
            generator.set_logits(rows[:batch])
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
        results.append(tokens)
    assert results[0] == results[1]


def test_per_row_options(model):
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=64, batch_size=2, do_sample=True, top_k=0, random_seed=3)
    generator = genai.Generator(model, params)
    generator.set_row_search_options(1, temperature=0.0)
    seen = [set(), set()]
    for _ in range(300):
        generator.rewind_to(0)
        generator.set_logits(np.stack([BASE_LOGITS, BASE_LOGITS]))
        generator.generate_next_token()
        for row, token in enumerate(generator.get_next_tokens()):
            seen[row].add(int(token))
    assert seen[1] == {3}, "row 1 is greedy"
    assert len(seen[0]) >= 4, "row 0 still samples"
    with pytest.raises(genai.SearchOptionError, match="temperature"):
        generator.set_row_search_options(0, temperature=-1.0)


def test_logprobs_are_log_softmax_of_processed_logits(model):
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=32, logprobs=True, top_logprobs=3)
    generator = genai.Generator(model, params)
    generator.append_tokens(np.array([5, 9, 12], np.int32))
    for _ in range(4):
        logits = generator.get_logits()[0, 0].astype(np.float64)
        generator.generate_next_token()
        chosen, top_ids, top_lp = generator.get_next_logprobs()
        log_softmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        token = int(generator.get_next_tokens()[0])
        assert token == int(np.argmax(logits))
        np.testing.assert_allclose(chosen[0], log_softmax[token], atol=1e-5)
        order = np.argsort(-log_softmax, kind="stable")[:3]
        np.testing.assert_array_equal(top_ids[0], order)
        np.testing.assert_allclose(top_lp[0], log_softmax[order], atol=1e-5)


def test_logit_bias(model):
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=64)
    params.set_logit_bias({41: 10.0})
    tokens = draw_many_with_params(params, BASE_LOGITS, 20)
    assert set(tokens) == {41}
    with pytest.raises(ValueError, match="outside"):
        params.set_logit_bias({VOCAB: 1.0})


def draw_many_with_params(params, logits, count):
    generator = genai.Generator(params.model, params)
    out = []
    for _ in range(count):
        generator.rewind_to(0)
        generator.set_logits(logits[None, :])
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def test_top_k_over_vocab_is_an_error_as_the_reference(model):
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=16, do_sample=True, top_k=VOCAB + 1)
    with pytest.raises(genai.SearchOptionError, match=r"top_k \(65\) must be less than or equal"):
        genai.Generator(model, params)


PROMPT = np.array([5, 9, 12, 7, 20, 33, 41], np.int32)
BATCH = np.array([[5, 9, 12, 7, 20, 33, 41], [30, 31, 8, 0, 0, 0, 0]], np.int32)


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "optimum", "gpt2"])
@pytest.mark.parametrize(
    "options",
    [
        {"repetition_penalty": 1.3},
        {"repetition_penalty": 0.8},
        {"no_repeat_ngram_size": 2},
        {"no_repeat_ngram_size": 3, "repetition_penalty": 1.1},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_greedy_processing_parity_with_reference(fixture_folders, case, options):
    folder = fixture_folders[case]
    ours, ref = genai.Model(folder), og.Model(str(folder))
    for prompt in (PROMPT, BATCH):
        max_length = prompt.shape[-1] + 48
        mine = greedy(genai, ours, prompt, max_length, **options)
        theirs = greedy(og, ref, prompt, max_length, **options)
        assert_same_run(mine, theirs)


@pytest.mark.parametrize("case", ["gqa", "optimum"])
def test_min_length_parity_with_reference(fixture_folders, case):
    """An early, frequent token is made the EOS: min_length keeps it out until the length."""
    folder = fixture_folders[case]
    probe = greedy(genai, genai.Model(folder), PROMPT, len(PROMPT) + 12)
    eos = int(probe.next_tokens[1][0])
    overlay = json.dumps({"model": {"eos_token_id": [eos]}})
    ours_cfg, ref_cfg = genai.Config(folder), og.Config(str(folder))
    ours_cfg.overlay(overlay)
    ref_cfg.overlay(overlay)
    ours, ref = genai.Model(ours_cfg), og.Model(ref_cfg)
    for min_length in (0, len(PROMPT) + 6):
        mine = greedy(genai, ours, PROMPT, len(PROMPT) + 40, min_length=min_length)
        theirs = greedy(og, ref, PROMPT, len(PROMPT) + 40, min_length=min_length)
        assert_same_run(mine, theirs)


def test_set_logits_at_a_large_vocabulary_matches_the_numpy_chain(tmp_path):
    """set_logits copies the row in while recording block maxima for the bounded top-k; each
    step must still choose exactly what the NumPy twin chooses from the same logits, history
    and RNG stream (penalties and a bias move the maxima of the history's blocks)."""
    from genai._core import sampling_reference
    from genai.testing.models import write_gqa_decoder

    vocab = 32000
    folder = write_gqa_decoder(tmp_path, vocab_size=vocab, hidden_size=64, name="v32k")
    model = genai.Model(folder)
    options = dict(do_sample=True, top_k=50, top_p=0.9, temperature=0.7, repetition_penalty=1.5)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=64, random_seed=77, **options)
    params.set_logit_bias({5: 30.0})
    generator = genai.Generator(model, params)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab, 24).astype(np.int32)
    generator.append_tokens(prompt)
    twin = sampling_reference.Sampler(1, vocab, seed=77)
    twin.configure(**options)
    twin.set_logit_bias(None, [5], [30.0])
    eos = np.asarray(model.config.eos_token_ids, np.int32)
    for _ in range(12):
        history = generator.get_sequence(0).astype(np.int32)
        logits = (rng.standard_normal(vocab) * 3).astype(np.float32)
        logits[history[:8]] += 20.0  # the best tokens are penalised history tokens
        generator.get_logits()
        generator.set_logits(logits[None, :])
        generator.generate_next_token()
        out = np.zeros(1, np.int32)
        twin.sample_batch(
            logits[None, :].copy(), history[None, :], len(history), eos, out,
            prompt_lengths=len(prompt),
        )  # fmt: skip
        assert generator.get_next_tokens()[0] == out[0]
