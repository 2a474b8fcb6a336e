"""The Cython bookkeeping kernels against their NumPy twins (`genai._core.reference`)."""

from __future__ import annotations

import numpy as np
import pytest

from genai._core import bookkeeping as kernels
from genai._core import reference

IMPLS = [pytest.param(kernels, id="cython"), pytest.param(reference, id="numpy")]


def _prompt_batch(rng: np.random.Generator, batch: int, length: int, pad: int) -> np.ndarray:
    tokens = rng.integers(3, 50, size=(batch, length), dtype=np.int32)
    for b in range(batch):
        real = int(rng.integers(0, length + 1))
        tokens[b, real:] = pad
    return tokens


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("seed", range(5))
def test_prefill_inputs_match_numpy(dtype, seed):
    rng = np.random.default_rng(seed)
    tokens = _prompt_batch(rng, batch=4, length=9, pad=0)
    tokens[0, 3] = 0  # a pad id inside the prompt is a real token: only trailing pads count
    results = []
    for impl in (kernels, reference):
        mask = np.full((4, 12), 7, dtype)
        positions = np.full((4, 12), 7, dtype)
        last = np.zeros(4, np.int32)
        impl.prefill_inputs(tokens, 0, mask, positions, last)
        results.append((mask, positions, last))
    for got, want in zip(results[0], results[1], strict=True):
        np.testing.assert_array_equal(got, want)
    # independent expectation for row 0
    real = 9 - np.argmax(tokens[0, ::-1] != 0) if (tokens[0] != 0).any() else 0
    assert results[0][0][0, :9].sum() == real
    assert (results[0][0][:, 9:] == 7).all(), "columns past the prompt must be left alone"


@pytest.mark.parametrize("impl", IMPLS)
def test_prefill_inputs_unpadded_rows_keep_the_last_real_logits(impl):
    # batch 1 as the reference: pad_id -1 (nothing masked), yet the kept logits are those of
    # the last token that is not the model's pad id (0); a row of pads only keeps index 0
    tokens = np.array([[5, 0, 9, 0, 0], [0, 0, 0, 0, 0], [4, 4, 4, 4, 4]], np.int32)
    mask = np.zeros((3, 5), np.int64)
    positions = np.zeros((3, 5), np.int64)
    last = np.full(3, 9, np.int32)
    impl.prefill_inputs(tokens, -1, mask, positions, last, 0)
    assert (mask == 1).all()
    np.testing.assert_array_equal(positions, np.tile(np.arange(5), (3, 1)))
    np.testing.assert_array_equal(last, [2, 0, 4])


@pytest.mark.parametrize("impl", IMPLS)
def test_append_mask_column(impl):
    batch, old = 3, 4
    rows = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.int64)
    mask = np.zeros(batch * 8, np.int64)
    mask[: batch * old] = rows.ravel()
    impl.append_mask_column(mask, batch, old)
    expected = np.concatenate([rows, np.ones((batch, 1), np.int64)], axis=1)
    np.testing.assert_array_equal(mask[: batch * (old + 1)].reshape(batch, old + 1), expected)
    with pytest.raises(ValueError):
        impl.append_mask_column(np.zeros(5, np.int64), batch, old)


@pytest.mark.parametrize("impl", IMPLS)
def test_advance_positions(impl):
    positions = np.zeros((2, 3), np.int32)
    nxt = np.array([5, 2], np.int32)
    impl.advance_positions(positions, nxt, 3)
    np.testing.assert_array_equal(positions, [[5, 6, 7], [2, 3, 4]])
    np.testing.assert_array_equal(nxt, [8, 5])


@pytest.mark.parametrize("vocab", [5, 1000, 32000, 151936])
def test_argmax_rows_matches_numpy(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal((3, vocab)).astype(np.float32)
    logits[1, :] = 0.5  # all ties: lowest index wins
    logits[2, vocab // 2] = np.inf
    logits[0, :2] = -np.inf
    out_k = np.zeros(3, np.int32)
    out_r = np.zeros(3, np.int32)
    kernels.argmax_rows(logits, out_k)
    reference.argmax_rows(logits, out_r)
    np.testing.assert_array_equal(out_k, out_r)
    np.testing.assert_array_equal(out_k, np.argmax(logits, axis=1))
    assert out_k[1] == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_argmax_rejects_nan(impl):
    logits = np.zeros((2, 10), np.float32)
    logits[1, 4] = np.nan
    with pytest.raises(ValueError, match="row 1 contain NaN"):
        impl.argmax_rows(logits, np.zeros(2, np.int32))


@pytest.mark.parametrize("impl", IMPLS)
def test_commit_tokens_pads_after_eos(impl):
    seqs = np.zeros((3, 6), np.int32)
    done = np.array([0, 1, 0], np.uint8)
    tokens = np.array([9, 7, 2], np.int32)
    eos = np.array([2, 5], np.int32)
    all_done = impl.commit_tokens(seqs, 2, tokens, eos, done, 0)
    assert not all_done
    np.testing.assert_array_equal(seqs[:, 2], [9, 0, 2])  # done row 1 gets the pad id
    np.testing.assert_array_equal(done, [0, 1, 1])
    tokens = np.array([5, 3, 3], np.int32)
    assert impl.commit_tokens(seqs, 3, tokens, eos, done, 0)
    np.testing.assert_array_equal(tokens, [5, 0, 0])
    with pytest.raises(ValueError):
        impl.commit_tokens(seqs, 6, tokens, eos, done, 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_gather_rows(impl):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 4, 7)).astype(np.float32)
    out = np.zeros((2, 7), np.float32)
    impl.gather_rows(logits, np.array([3, 1], np.int32), out)
    np.testing.assert_array_equal(out, np.stack([logits[0, 3], logits[1, 1]]))
    with pytest.raises(IndexError):
        impl.gather_rows(logits, np.array([4, 0], np.int32), out)


def _orders(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Beam-like orders: any mapping, a permutation, one beam forked, the identity."""
    forked = np.arange(n, dtype=np.int32)
    forked[int(rng.integers(0, n))] = int(rng.integers(0, n))
    return [
        rng.integers(0, n, n).astype(np.int32),
        rng.permutation(n).astype(np.int32),
        forked,
        np.arange(n, dtype=np.int32),
    ]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", range(40))
def test_move_rows_matches_fancy_indexing(impl, seed):
    rng = np.random.default_rng(seed)
    n, chunks, chunk = int(rng.integers(1, 9)), int(rng.integers(1, 4)), int(rng.integers(1, 7))
    moved = int(rng.integers(0, chunk + 1))
    for order in _orders(rng, n):
        rows = rng.integers(0, 255, size=(n, chunks * chunk), dtype=np.uint8)
        expected = rows.reshape(n, chunks, chunk).copy()
        expected[:, :, :moved] = expected[order, :, :moved]  # the tail of each chunk stays
        impl.move_rows(rows, order, np.empty(rows.shape[1], np.uint8), chunks, moved)
        np.testing.assert_array_equal(rows.reshape(n, chunks, chunk), expected)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("order", "copies"),
    [
        ([0, 1, 2, 3], 0),  # every beam keeps its cache: nothing moves
        ([0, 0, 2, 3], 1),  # beam 1 continues beam 0: one row
        ([1, 0, 2, 3], 3),  # a swap: one cycle through scratch
        ([1, 2, 3, 0], 5),  # a 4-cycle
        ([0, 0, 0, 0], 3),  # everything from beam 0
        ([1, 1, 0, 0], 3),  # 1 stays; 2 and 3 read the old 0 before 0 takes 1: no scratch
    ],
)
def test_move_rows_copies_each_row_once(impl, order, copies):
    rows = np.arange(4 * 6, dtype=np.uint8).reshape(4, 6)
    expected = rows[order].copy()
    order = np.array(order, np.int32)
    assert impl.move_rows(rows, order, np.empty(6, np.uint8)) == copies
    np.testing.assert_array_equal(rows, expected)


@pytest.mark.parametrize("impl", IMPLS)
def test_move_rows_rejects_bad_input(impl):
    rows = np.zeros((3, 4), np.uint8)
    with pytest.raises(IndexError):
        impl.move_rows(rows, np.array([0, 1, 3], np.int32), np.empty(4, np.uint8))
    with pytest.raises(ValueError):
        impl.move_rows(rows, np.array([0, 1], np.int32), np.empty(4, np.uint8))
