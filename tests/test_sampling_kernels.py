"""The sampling kernels (`genai._core.sampling`) against their NumPy twin
(`genai._core.sampling_reference`), exact distributions, and onnxruntime-genai 0.18."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from genai._core import sampling as kernels
from genai._core import sampling_reference as reference

IMPLS = [pytest.param(kernels, id="cython"), pytest.param(reference, id="numpy")]
VOCABS = [5, 1000, 32000, 151936]
LOWEST = np.finfo(np.float32).min


def _logits(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Spread ~25 nats; row 1 has a block of ties, row 2 some -inf entries."""
    x = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    if rows > 1:
        x[1, : max(vocab // 2, 2)] = x[1].max() + 0.5  # ties at the top
    if rows > 2:
        x[2, rng.choice(vocab, size=min(3, vocab - 1), replace=False)] = -np.inf
    return x


def _history(rng: np.random.Generator, rows: int, vocab: int, length: int) -> np.ndarray:
    """Histories drawn from a small pool, so ids repeat and n-grams recur."""
    pool = rng.choice(vocab, size=min(vocab, 12), replace=False)
    return pool[rng.integers(0, len(pool), size=(rows, length))].astype(np.int32)


# ---------------------------------------------------------------------------------------------
# RNG
# ---------------------------------------------------------------------------------------------


def test_splitmix64_known_vector():
    """The published first outputs of splitmix64 from state 0."""
    state, outputs = 0, []
    for _ in range(4):
        state, out = reference.splitmix64(state)
        outputs.append(out)
    assert outputs == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
        0xF88BB8A8724C81EC,
    ]


@pytest.mark.parametrize("impl", IMPLS)
def test_rng_known_values(impl):
    """Pinned outputs: the streams must never change across versions or machines."""
    rng = impl.RowRng(2, 42)
    assert [rng.next_u64(0) for _ in range(3)] == [
        1546998764402558742,
        6990951692964543102,
        12544586762248559009,
    ]
    assert [rng.next_u64(1) for _ in range(2)] == [106143286917858895, 9786722529041364674]
    assert [impl.RowRng(1, 0).next_u64(0)] == [11091344671253066420]
    assert impl.RowRng(1, 2**64 - 1).draw()[0] == 0.5598927040505212


@pytest.mark.parametrize("seed", [0, 1, 42, 2**63 + 5, 2**64 - 1])
def test_rng_matches_python_integers(seed):
    ours, twin = kernels.RowRng(3, seed), reference.RowRng(3, seed)
    for row in range(3):
        assert [ours.next_u64(row) for _ in range(6)] == [twin.next_u64(row) for _ in range(6)]
    for _ in range(3):
        np.testing.assert_array_equal(ours.draw(), twin.draw())
    np.testing.assert_array_equal(ours.get_state(), twin.get_state())
    ours.seed_row(1, seed + 1 if seed < 2**64 - 1 else 0, stream=7)
    twin.seed_row(1, seed + 1 if seed < 2**64 - 1 else 0, stream=7)
    assert ours.uniform(1) == twin.uniform(1)


def test_rng_streams_do_not_depend_on_the_batch():
    wide, narrow = kernels.RowRng(4, 7), kernels.RowRng(1, 7)
    for _ in range(5):
        assert wide.draw()[0] == narrow.draw()[0]
    moved = kernels.RowRng(4, 7)
    moved.seed_row(3, 7, stream=0)  # a request moved to slot 3 keeps its stream
    assert moved.uniform(3) == kernels.RowRng(1, 7).uniform(0)
    partial = kernels.RowRng(3, 1)
    before = partial.get_state()
    partial.seed(2, rows=1)
    np.testing.assert_array_equal(partial.get_state()[1:], before[1:])


def test_rng_uniformity_and_state_round_trip():
    rng = kernels.RowRng(1, 3)
    draws = np.array([rng.uniform(0) for _ in range(50_000)])
    assert draws.min() >= 0.0 and draws.max() < 1.0
    assert stats.kstest(draws, "uniform").pvalue > 1e-3
    state = rng.get_state()
    first = rng.draw(1)
    rng.set_state(state)
    np.testing.assert_array_equal(rng.draw(1), first)
    a, b = kernels.RowRng(2, -1), kernels.RowRng(2, -1)
    assert not np.array_equal(a.get_state(), b.get_state()), "-1 must seed from os.urandom"
    with pytest.raises(ValueError, match="seed"):
        kernels.RowRng(1, -2)


def test_exp_is_accurate_and_simd_matches_scalar():
    d = np.concatenate([np.linspace(0, 720, 20_001), [1e-30, 708.0, 745.0, 746.0, np.inf]])
    batch, scalar, rounded = kernels._exp_neg(d)
    np.testing.assert_array_equal(batch, scalar)
    want = np.exp(-rounded)
    nz = want > 0
    assert (np.abs(batch[nz] - want[nz]) <= 2 * np.spacing(want[nz])).all()
    assert (batch[~nz] == 0).all()


# ---------------------------------------------------------------------------------------------
# Processing stages
# ---------------------------------------------------------------------------------------------


def _run_both(stage: str, logits: np.ndarray, *args) -> np.ndarray:
    got, want = logits.copy(), logits.copy()
    getattr(kernels, stage)(got, *args)
    getattr(reference, stage)(want, *args)
    np.testing.assert_array_equal(got, want, err_msg=stage)
    return got


@pytest.mark.parametrize("vocab", VOCABS)
def test_stages_match_numpy(vocab):
    rng = np.random.default_rng(vocab)
    rows = 3
    logits = _logits(rng, rows, vocab)
    seq = _history(rng, rows, vocab, 40)
    lengths = np.array([40, 17, 0], np.int32)
    eos = np.array([0, vocab - 1], np.int32)
    for min_length in (0, 17, 18, 100):
        _run_both("apply_min_length", logits, lengths, min_length, eos)
    for penalty in (1.0, 1.3, 0.7):
        changed = _run_both("apply_repetition_penalty", logits, seq, lengths, penalty)
        assert (changed != logits).any() == (penalty != 1.0)
    _run_both("apply_repetition_penalty", logits, seq, 25, 1.1)  # common length
    for n in range(5):
        _run_both("apply_no_repeat_ngram", logits, seq, lengths, n)
    for start in (0, 10, np.array([5, 17, 0], np.int32)):
        _run_both("apply_presence_frequency", logits, seq, lengths, start, 0.5, 0.25)
    ids = rng.integers(0, vocab, size=(rows, 6)).astype(np.int32)
    ids[0, 0] = -1  # padding
    _run_both("apply_logit_bias", logits, ids, rng.standard_normal((rows, 6)))
    _run_both("apply_logit_bias", logits, ids[1], rng.standard_normal(6))


@pytest.mark.parametrize("impl", IMPLS)
def test_repetition_penalty_rule(impl):
    logits = np.array([[2.0, -2.0, 1.0, 0.5, 3.0]], np.float32)
    seq = np.array([[0, 1, 0, 0, 1, 9, -1]], np.int32)  # repeats; 9 and -1 are out of range
    impl.apply_repetition_penalty(logits, seq, 7, 2.0)
    np.testing.assert_array_equal(logits, [[1.0, -4.0, 1.0, 0.5, 3.0]])  # once per id
    impl.apply_repetition_penalty(logits, seq, 7, 1.0)
    np.testing.assert_array_equal(logits, [[1.0, -4.0, 1.0, 0.5, 3.0]])
    with pytest.raises(ValueError):
        impl.apply_repetition_penalty(logits, seq, 7, 0.0)


@pytest.mark.parametrize("impl", IMPLS)
def test_min_length_rule(impl):
    logits = np.zeros((2, 5), np.float32)
    impl.apply_min_length(logits, np.array([2, 4], np.int32), 4, np.array([1, 3], np.int32))
    np.testing.assert_array_equal(logits[0], [0, LOWEST, 0, LOWEST, 0])
    np.testing.assert_array_equal(logits[1], 0)  # length 4 is not < 4
    with pytest.raises(ValueError, match="eos"):
        impl.apply_min_length(logits, 0, 4, np.array([5], np.int32))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("tokens", "n", "banned"),
    [
        # the cases verified against onnxruntime-genai 0.18 (see test_greedy_chain_parity)
        ([5, 6, 7, 5], 1, {5, 6, 7}),
        ([5, 6, 7, 5], 2, {6}),
        ([5, 6, 7, 5], 3, set()),
        ([5, 6, 7, 5, 6], 3, {7}),
        ([5, 5, 5], 2, {5}),
        ([5], 2, set()),
        ([5, 6], 0, set()),
    ],
)
def test_no_repeat_ngram_rule(impl, tokens, n, banned):
    logits = np.zeros((1, 10), np.float32)
    impl.apply_no_repeat_ngram(logits, np.array([tokens], np.int32), len(tokens), n)
    assert set(np.flatnonzero(logits[0] == LOWEST)) == banned


@pytest.mark.parametrize("impl", IMPLS)
def test_presence_frequency_and_logit_bias_rules(impl):
    logits = np.zeros((1, 6), np.float32)
    seq = np.array([[4, 4, 1, 2, 2, 2, 5]], np.int32)
    impl.apply_presence_frequency(logits, seq, 7, 2, 1.0, 0.5)  # generated: 1 2 2 2 5
    np.testing.assert_array_equal(logits[0], [0, -1.5, -2.5, 0, 0, -1.5])
    impl.apply_logit_bias(logits, np.array([3, 3, -1], np.int32), np.array([1, 2, 50], np.float32))
    assert logits[0, 3] == 3.0
    with pytest.raises(ValueError):
        impl.apply_logit_bias(logits, np.array([6], np.int32), np.array([1.0], np.float32))


# ---------------------------------------------------------------------------------------------
# The choice
# ---------------------------------------------------------------------------------------------

CHOICES = [
    {"do_sample": False},
    {"temperature": 0.0},
    {"top_k": 1},
    {"top_k": 50},
    {"top_k": 50, "top_p": 0.9, "temperature": 0.7},
    {"top_k": 3, "min_p": 0.3, "temperature": 1.5},
    {"top_k": 0, "top_p": 0.9},
    {"top_k": 0, "top_p": 0.5, "min_p": 0.01, "temperature": 1.3},
    {"top_k": 0, "temperature": 0.05, "top_p": 0.99},
    {"top_k": 0},
    {"top_k": 0, "min_p": 0.05},
    {"top_k": 0, "top_p": 0.7, "temperature": 40.0},  # flat: crowded buckets, quickselect
    {"top_k": 0, "temperature": 1e4, "min_p": 0.5},
    {"top_k": 10**6},  # >= vocab: no top-k
]


def _choose(impl, logits, u, n_top=4, **options):
    rows = logits.shape[0]
    out = np.full(rows, -7, np.int32)
    lp = np.zeros(rows, np.float32)
    ids = np.zeros((rows, n_top), np.int32)
    lps = np.zeros((rows, n_top), np.float32)
    impl.sample(logits, u, out, logprobs=lp, top_ids=ids, top_logprobs=lps, **options)
    return out, lp, ids, lps


@pytest.mark.parametrize("vocab", VOCABS)
def test_choice_matches_numpy(vocab):
    rng = np.random.default_rng(vocab + 1)
    logits = _logits(rng, 3, vocab)
    before = logits.copy()
    for options in CHOICES:
        for _ in range(2 if vocab > 10_000 else 6):
            u = rng.random(3)
            got = _choose(kernels, logits, u, **options)
            want = _choose(reference, logits, u, **options)
            np.testing.assert_array_equal(got[0], want[0], err_msg=str(options))
            np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(got[2], want[2])
            np.testing.assert_allclose(got[3], want[3], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(logits, before)  # the choice does not modify the logits


@pytest.mark.parametrize("impl", IMPLS)
def test_greedy_is_argmax_lowest_index(impl):
    rng = np.random.default_rng(0)
    logits = _logits(rng, 3, 1000)
    logits[0, [10, 20, 700]] = 99.0  # ties: lowest index
    u = rng.random(3)
    for options in ({"do_sample": False}, {"temperature": 0.0}, {"top_k": 1, "top_p": 0.5}):
        out, lp, ids, _ = _choose(impl, logits, u, **options)
        np.testing.assert_array_equal(out, np.argmax(logits, axis=1))
        assert out[0] == 10 and list(ids[0, :3]) == [10, 20, 700]
        log_z = np.log(np.exp(logits[1].astype(np.float64) - logits[1].max()).sum())
        assert lp[1] == pytest.approx(-log_z, rel=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_top_k_ties_prefer_lower_ids(impl):
    logits = np.array([[0.0, 1.0, 1.0, 1.0, 1.0, -1.0]], np.float32)
    seen = set()
    for u in np.linspace(0, 0.999, 50):
        seen.add(int(_choose(impl, logits, np.array([u]), top_k=2)[0][0]))
    assert seen == {1, 2}


@pytest.mark.parametrize("impl", IMPLS)
def test_degenerate_rows(impl):
    logits = np.full((2, 300), -np.inf, np.float32)
    logits[1, [17, 250]] = np.inf
    out, lp, _, lps = _choose(impl, logits, np.array([0.7, 0.7]), top_k=0, top_p=0.9)
    np.testing.assert_array_equal(out, [0, 17])
    np.testing.assert_array_equal(lp, [0.0, 0.0])
    np.testing.assert_array_equal(lps[:, 0], [0.0, 0.0])
    assert (lps[:, 1:] == -np.inf).all()
    banned = np.full((1, 6), LOWEST, np.float32)  # everything banned: uniform, as the reference
    draws = {int(_choose(impl, banned, np.array([u]), top_k=0)[0][0]) for u in (0.1, 0.5, 0.9)}
    assert len(draws) == 3


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("where", [0, 63, 64, 200, 4999])
def test_nan_raises_naming_the_row(impl, where):
    logits = np.zeros((3, 5000), np.float32)
    logits[2, where] = np.nan
    for options in ({"do_sample": False}, {"top_k": 50}, {"top_k": 0, "top_p": 0.5}):
        with pytest.raises(ValueError, match="row 2"):
            _choose(impl, logits, np.zeros(3), **options)
    sampler = impl.Sampler(3, 5000, seed=0)
    sampler.configure(do_sample=True, top_k=5)
    with pytest.raises(ValueError, match="row 2 contain NaN"):
        sampler.sample_batch(
            logits, np.zeros((3, 1), np.int32), 0, np.zeros(0, np.int32), np.zeros(3, np.int32)
        )


# ---------------------------------------------------------------------------------------------
# Exact distributions
# ---------------------------------------------------------------------------------------------

SMALL = np.array([2.0, 1.5, 1.5, 1.0, 0.2, -0.5, -1.0, -3.0], np.float32)


def _exact(logits, temperature=1.0, top_k=0, top_p=0.0, min_p=0.0):
    """The target distribution, computed independently of both implementations."""
    x = logits.astype(np.float64)
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    if 0 < top_k < len(x):
        order = order[:top_k]
    p = np.exp((x[order] - x.max()) / temperature)
    p /= p.sum()
    if 0 < top_p < 1:
        order = order[: int(np.searchsorted(np.cumsum(p), top_p)) + 1]
        p = p[: len(order)]
    if min_p > 0:
        keep = p >= min_p * p.max()
        order, p = [i for i, k in zip(order, keep, strict=True) if k], p[keep]
    full = np.zeros(len(x))
    full[order] = p / p.sum()
    return full


DISTRIBUTIONS = [
    {"temperature": 0.7, "top_k": 3},
    {"temperature": 1.0, "top_k": 0, "top_p": 0.8},
    {"temperature": 1.5, "top_k": 5, "top_p": 0.9},
    {"temperature": 1.0, "top_k": 0, "min_p": 0.2},
    {"temperature": 2.0, "top_k": 0},
    {"temperature": 0.5, "top_k": 0, "top_p": 0.95, "min_p": 0.05},
    {"temperature": 1.0, "top_k": 2},  # tie at the boundary: id 1 in, id 2 out
]


def _option_id(options: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items())


@pytest.mark.parametrize("options", DISTRIBUTIONS, ids=_option_id)
def test_empirical_distribution(options):
    draws, vocab = 24_000, len(SMALL)
    sampler = kernels.Sampler(draws, vocab, seed=11)  # one stream per row: 24k independent draws
    sampler.configure(do_sample=True, **options)
    logits = np.tile(SMALL, (draws, 1))
    out = np.zeros(draws, np.int32)
    sampler.sample_batch(logits, np.zeros((draws, 0), np.int32), 0, np.zeros(0, np.int32), out)
    expected = _exact(SMALL, **options)
    counts = np.bincount(out, minlength=vocab)
    allowed = expected > 0
    assert counts[~allowed].sum() == 0, f"drew outside the allowed set: {counts}"
    if allowed.sum() > 1:
        result = stats.chisquare(counts[allowed], expected[allowed] * draws)
        assert result.pvalue > 1e-3, (counts, expected * draws)
    # the twin draws the very same tokens from the same streams
    twin = reference.Sampler(200, vocab, seed=11)
    twin.configure(do_sample=True, **options)
    twin_out = np.zeros(200, np.int32)
    twin.sample_batch(logits[:200].copy(), np.zeros((200, 0), np.int32), 0, [], twin_out)
    np.testing.assert_array_equal(twin_out, out[:200])


@pytest.mark.parametrize("options", [{"top_p": 0.6}, {"top_p": 0.9, "min_p": 0.9}], ids=_option_id)
def test_empirical_distribution_flat_row(options):
    """300 tokens within 0.6 nat: one crowded bucket, searched by quickselect, not sorted."""
    draws, vocab = 24_000, 300
    flat = np.random.default_rng(1).uniform(0, 0.6, vocab).astype(np.float32)
    sampler = kernels.Sampler(draws, vocab, seed=5)
    sampler.configure(do_sample=True, top_k=0, **options)
    out = np.zeros(draws, np.int32)
    sampler.sample_batch(np.tile(flat, (draws, 1)), np.zeros((draws, 0), np.int32), 0, [], out)
    expected = _exact(flat, top_k=0, **options)
    counts = np.bincount(out, minlength=vocab)
    allowed = expected > 0
    assert 30 < allowed.sum() < vocab and counts[~allowed].sum() == 0
    assert stats.chisquare(counts[allowed], expected[allowed] * draws).pvalue > 1e-3


# ---------------------------------------------------------------------------------------------
# The whole chain
# ---------------------------------------------------------------------------------------------

ROW_OPTIONS = [
    {"do_sample": False, "repetition_penalty": 1.3, "min_length": 30},
    {"do_sample": True, "top_k": 50, "top_p": 0.9, "temperature": 0.7,
     "presence_penalty": 0.5, "frequency_penalty": 0.2},
    {"do_sample": True, "top_k": 0, "top_p": 0.8, "min_p": 0.02, "no_repeat_ngram_size": 2,
     "min_length": 100, "repetition_penalty": 0.9},
    {"do_sample": True, "top_k": 5, "temperature": 1.2, "no_repeat_ngram_size": 1},
]  # fmt: skip


def _samplers(impl, vocab, rows=4, seed=5):
    sampler = impl.Sampler(rows, vocab, seed=seed)
    for row, options in enumerate(ROW_OPTIONS[:rows]):
        sampler.configure(row, **options)
    sampler.set_logit_bias(2, [1, 2, 1], [5.0, -100.0, 1.5])
    return sampler


@pytest.mark.parametrize("vocab", VOCABS)
def test_sample_batch_matches_numpy(vocab):
    rng = np.random.default_rng(vocab + 2)
    rows, steps, prompt = 4, 3, 20
    ours, twin = _samplers(kernels, vocab), _samplers(reference, vocab)
    sequences = np.zeros((rows, prompt + steps), np.int32)
    sequences[:, :prompt] = _history(rng, rows, vocab, prompt)
    done = np.array([0, 0, 0, 1], np.uint8)
    eos = np.array([vocab - 1, 0], np.int32)
    for step in range(steps):
        logits = _logits(rng, rows, vocab)
        results = []
        for sampler in (ours, twin):
            got = logits.copy()
            out = np.full(rows, -5, np.int32)
            lp = np.zeros(rows, np.float32)
            ids, lps = np.zeros((rows, 3), np.int32), np.zeros((rows, 3), np.float32)
            sampler.sample_batch(
                got, sequences, prompt + step, eos, out, done=done, prompt_lengths=prompt,
                logprobs=lp, top_ids=ids, top_logprobs=lps,
            )  # fmt: skip
            results.append((got, out, lp, ids, lps))
        (got, out, lp, ids, lps), want = results
        np.testing.assert_array_equal(got, want[0])  # the in-place processing agrees exactly
        np.testing.assert_array_equal(out, want[1])
        np.testing.assert_allclose(lp[:3], want[2][:3], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(ids[:3], want[3][:3])
        np.testing.assert_allclose(lps[:3], want[4][:3], rtol=1e-5, atol=1e-5)
        assert out[3] == -5 and (got[3] == logits[3]).all(), "a done row is skipped"
        assert out[0] == np.argmax(got[0])
        sequences[:, prompt + step] = out
    np.testing.assert_array_equal(ours.rng.get_state(), twin.rng.get_state())


@pytest.mark.parametrize("impl", IMPLS)
def test_seeded_runs_repeat_and_rows_are_independent(impl):
    vocab, steps = 1000, 6
    rng = np.random.default_rng(3)
    all_logits = [_logits(rng, 4, vocab) for _ in range(steps)]

    def run(rows, seed):
        sampler = impl.Sampler(rows, vocab, seed=seed)
        sampler.configure(do_sample=True, top_k=0, temperature=1.5)
        sampler.configure(0, top_k=40, top_p=0.95)
        tokens = []
        for logits in all_logits:
            out = np.zeros(rows, np.int32)
            sampler.sample_batch(logits[:rows].copy(), np.zeros((rows, 0), np.int32), 0, [], out)
            tokens.append(out.copy())
        return np.array(tokens)

    four = run(4, 123)
    np.testing.assert_array_equal(four, run(4, 123))
    np.testing.assert_array_equal(four[:, 0], run(1, 123)[:, 0])
    assert not np.array_equal(four, run(4, 124))


@pytest.mark.parametrize("impl", IMPLS)
def test_done_rows_keep_their_stream(impl):
    sampler = impl.Sampler(2, 50, seed=1)
    before = sampler.rng.get_state()
    logits = np.zeros((2, 50), np.float32)
    sampler.sample_batch(logits, np.zeros((2, 0), np.int32), 0, [], np.zeros(2, np.int32),
                         done=np.array([True, False]))  # fmt: skip
    after = sampler.rng.get_state()
    np.testing.assert_array_equal(after[0], before[0])
    assert not np.array_equal(after[1], before[1])


@pytest.mark.parametrize("impl", IMPLS)
def test_sampler_options_and_argument_checks(impl):
    sampler = impl.Sampler(2, 10, seed=0)
    assert sampler.options(1) == {
        "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 0.0, "min_p": 0.0,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "no_repeat_ngram_size": 0, "min_length": 0,
    }  # fmt: skip
    sampler.configure(1, top_p=0.5, do_sample=True)
    assert sampler.options(1)["top_p"] == 0.5 and sampler.options(0)["top_p"] == 0.0
    for bad in ({"top_p": 1.5}, {"temperature": -1}, {"top_k": -1}, {"top_k": 2.5},
                {"repetition_penalty": 0}, {"min_p": float("nan")}):  # fmt: skip
        with pytest.raises(ValueError):
            sampler.configure(**bad)
    with pytest.raises(TypeError, match="unknown"):
        sampler.configure(top_q=1)
    with pytest.raises(IndexError):
        sampler.configure(2, top_k=1)
    with pytest.raises(ValueError):
        sampler.set_logit_bias(0, [10], [1.0])
    seq, out = np.zeros((2, 4), np.int32), np.zeros(2, np.int32)
    for logits, lengths, eos in (
        (np.zeros((2, 11), np.float32), 0, []),  # wrong vocabulary
        (np.zeros((3, 10), np.float32), 0, []),  # more rows than the sampler
        (np.zeros((2, 10), np.float32), 5, []),  # length beyond the sequences
        (np.zeros((2, 10), np.float32), 0, [10]),  # EOS outside the vocabulary
    ):
        with pytest.raises(ValueError):
            sampler.sample_batch(logits, seq, lengths, np.array(eos, np.int32), out)


# ---------------------------------------------------------------------------------------------
# Parity with onnxruntime-genai 0.18 through og.Generator + set_logits
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def og_model(tmp_path_factory):
    og = pytest.importorskip("onnxruntime_genai", reason="the reference engine")
    from genai.testing.models import write_gqa_decoder

    folder = write_gqa_decoder(tmp_path_factory.mktemp("sampling"), vocab_size=64)
    return og, og.Model(str(folder))


def _og_token(og, model, logits, prompt=None, **options):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64, **options)
    generator = og.Generator(model, params)
    if prompt is not None:
        generator.append_tokens(np.array(prompt, np.int32))
    generator.set_logits(logits.reshape(1, -1))
    generator.generate_next_token()
    return int(generator.get_next_tokens()[0])


GREEDY_CASES = [
    {"repetition_penalty": 1.8},
    {"repetition_penalty": 0.6},
    {"min_length": 9},
    {"min_length": 8},
    {"no_repeat_ngram_size": 1},
    {"no_repeat_ngram_size": 2},
    {"no_repeat_ngram_size": 3},
    {"min_length": 20, "repetition_penalty": 1.5, "no_repeat_ngram_size": 2},
]


@pytest.mark.parametrize("options", GREEDY_CASES, ids=_option_id)
def test_greedy_chain_parity(og_model, options):
    og, model = og_model
    rng = np.random.default_rng(len(str(options)))
    for _ in range(4):
        prompt = rng.choice([2, 5, 6, 7, 9], size=8).astype(np.int32)  # 2 is the EOS id
        logits = rng.standard_normal(64).astype(np.float32)
        logits[[2, 5, 6, 7, 9]] += 3.0 * rng.standard_normal(5).astype(np.float32) + 2.0
        want = _og_token(og, model, logits.copy(), prompt, **options)
        sampler = kernels.Sampler(1, 64, seed=0)
        sampler.configure(**options)
        out = np.zeros(1, np.int32)
        sampler.sample_batch(logits.copy()[None], prompt[None], 8, np.array([2], np.int32), out)
        assert out[0] == want, (prompt, options)


@pytest.mark.parametrize(
    "options",
    [
        {"top_k": 0, "top_p": 0.8},
        {"top_k": 0, "top_p": 0.5, "temperature": 3.0},
        {"top_k": 3, "temperature": 2.0},
        {"top_k": 6, "top_p": 0.6},
    ],
    ids=_option_id,
)
def test_sampling_support_parity(og_model, options):
    """Top-k, top-p (also with top_k == 0) and temperature select the same token set."""
    og, model = og_model
    logits = np.full(64, -30.0, np.float32)
    logits[:8] = [3.0, 2.5, 2.0, 1.6, 1.2, 0.5, 0.0, -1.0]
    theirs = {
        _og_token(og, model, logits.copy(), do_sample=True, random_seed=s, **options)
        for s in range(150)
    }
    allowed = set(np.flatnonzero(_exact(logits, **options) > 0))
    assert theirs == allowed


@pytest.mark.parametrize("vocab", [32000, 151936])
def test_block_bounded_top_k_keeps_tie_order(vocab):
    """Large vocabularies take the block-maximum bound path of top-k: with heavy ties at the
    boundary it must still keep the lowest ids, token for token as the twin's full sort."""
    rng = np.random.default_rng(vocab)
    logits = np.zeros((1, vocab), np.float32)
    logits[0, rng.choice(vocab, 20, replace=False)] = 3.0  # 20 clear winners, then a sea of ties
    logits[0, rng.choice(vocab, 7, replace=False)] = -np.inf
    out_k = np.zeros(1, np.int32)
    out_t = np.zeros(1, np.int32)
    for u in np.linspace(0.0, 0.999, 97):
        uniforms = np.array([u])
        kernels.sample(logits, uniforms, out_k, do_sample=True, top_k=50, temperature=0.5)
        reference.sample(logits, uniforms, out_t, do_sample=True, top_k=50, temperature=0.5)
        assert out_k[0] == out_t[0]


@pytest.mark.parametrize("impl", IMPLS)
def test_load_logits_checks_dtype_and_shape(impl):
    sampler = impl.Sampler(2, 100)
    rows = np.zeros((2, 100), np.float32)
    with pytest.raises(TypeError, match="float32"):
        sampler.load_logits(np.zeros((2, 100)), rows)
    with pytest.raises(ValueError, match=r"rows=2, vocab=100"):
        sampler.load_logits(np.zeros((1, 100), np.float32), rows)
    source = np.arange(200, dtype=np.float32).reshape(2, 1, 100)
    sampler.load_logits(source[:, :, ::-1], rows)  # non-contiguous input is copied right
    np.testing.assert_array_equal(rows, source[:, 0, ::-1])


@pytest.mark.parametrize("vocab", [32000, 151936])
def test_load_logits_maxima_follow_every_stage(vocab):
    """`load_logits` records block maxima for the bounded top-k; the stages then move logits
    (penalties on the history, a large bias, min_length on the best token): the refreshed
    maxima must give exactly the twin's tokens and processed rows, and a NaN is still named."""
    rng = np.random.default_rng(vocab)
    rows, prompt, steps = 4, 40, 4
    options = [
        {"do_sample": True, "top_k": 50, "temperature": 0.7, "repetition_penalty": 1.5},
        {"do_sample": True, "top_k": 40, "top_p": 0.9, "presence_penalty": 9.0,
         "frequency_penalty": 2.0},
        {"do_sample": True, "top_k": 30, "min_length": 1000, "no_repeat_ngram_size": 1},
        {"do_sample": True, "top_k": 50, "repetition_penalty": 0.5},  # raises negatives' mass
    ]  # fmt: skip
    samplers = []
    for impl in (kernels, reference):
        sampler = impl.Sampler(rows, vocab, seed=11)
        for row, opts in enumerate(options):
            sampler.configure(row, **opts)
        sampler.set_logit_bias(1, [vocab - 3, 5], [60.0, 40.0])  # low logits become the best
        samplers.append(sampler)
    sequences = np.zeros((rows, prompt + steps), np.int32)
    for step in range(steps):
        logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
        best = np.argsort(logits, axis=1)[:, -8:]  # the history holds each row's best tokens
        sequences[:, :8] = best
        sequences[:, 8:prompt] = rng.integers(0, vocab, (rows, prompt - 8))
        eos = np.array([int(best[2, -1])], np.int32)  # min_length bans row 2's best token
        outs = []
        for sampler in samplers:
            buf = np.zeros((rows, vocab), np.float32)
            sampler.load_logits(logits, buf)
            out = np.zeros(rows, np.int32)
            sampler.sample_batch(buf, sequences, prompt + step, eos, out, prompt_lengths=20)
            outs.append((out, buf))
        np.testing.assert_array_equal(outs[0][1], outs[1][1])
        np.testing.assert_array_equal(outs[0][0], outs[1][0])
        sequences[:, prompt + step] = outs[0][0]
    bad = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    bad[3, 7] = np.nan
    buf = np.zeros((rows, vocab), np.float32)
    samplers[0].load_logits(bad, buf)
    with pytest.raises(ValueError, match="row 3"):
        samplers[0].sample_batch(buf, sequences, prompt, eos, np.zeros(rows, np.int32))


def test_stale_block_maxima_are_never_used():
    """Maxima hold for one chain call on the loaded rows: a second call, `forget_logits`, or
    other rows must scan afresh (here the rows change so that stale maxima would mislead)."""
    vocab = 32000
    sampler = kernels.Sampler(1, vocab, seed=1)
    sampler.configure(do_sample=True, top_k=50, temperature=0.01)
    history = np.zeros((1, 1), np.int32)
    eos = np.zeros(0, np.int32)
    buf = np.zeros((1, vocab), np.float32)
    out = np.zeros(1, np.int32)
    sampler.load_logits(np.zeros((1, vocab), np.float32), buf)
    buf[0, 12345] = 100.0  # written after loading: stale maxima would miss this block
    sampler.forget_logits()
    sampler.sample_batch(buf, history, 0, eos, out)
    assert out[0] == 12345
    sampler.load_logits(np.zeros((1, vocab), np.float32), buf)
    sampler.sample_batch(buf, history, 0, eos, out)  # consumes the maxima
    buf[0, 777] = 100.0
    sampler.sample_batch(buf, history, 0, eos, out)
    assert out[0] == 777
    other = np.zeros((1, vocab), np.float32)
    other[0, 31000] = 100.0
    sampler.load_logits(np.zeros((1, vocab), np.float32), buf)
    sampler.sample_batch(other, history, 0, eos, out)  # not the loaded rows
    assert out[0] == 31000
