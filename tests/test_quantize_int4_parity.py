"""The builder's int4 weights are bit for bit what onnxruntime's own blockwise quantizer writes.

The reference builder quantizes every MatMul (and, for tied embeddings, the shared embedding)
through ``MatMulNBitsQuantizer``, whose default (symmetric, QOperator) path calls the C++
``quantize_matmul_4bits`` on the transposed ``[K, N]`` weight, zero-padded to whole blocks. These
tests run that function on the same matrices and compare packed nibbles and scales exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.capi._pybind_state import quantize_matmul_4bits

from genai.builder.quantize import BLOCK, quantize_int4


def onnxruntime_int4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``quantize_matmul_4bits`` (symmetric) on ``w`` ``[N, K]``, called as
    ``DefaultWeightOnlyQuantizer.qbits_block_quant`` calls it: ``(packed, scales, zero_points)``."""
    n, k = w.shape
    blocks = -(-k // BLOCK)
    padded = np.ascontiguousarray(np.pad(w.T, ((0, blocks * BLOCK - k), (0, 0))))
    packed = np.zeros((n, blocks, BLOCK // 2), np.uint8)
    scales = np.zeros((n, blocks), np.float32)
    zero_points = np.zeros((n, (blocks + 1) // 2), np.uint8)
    quantize_matmul_4bits(packed, padded, scales, zero_points, BLOCK, n, blocks * BLOCK, True)
    return packed, scales, zero_points


def assert_same_as_onnxruntime(w: np.ndarray) -> None:
    packed, scales, zero_points = onnxruntime_int4(w)
    assert not zero_points.any()  # symmetric: no zero points written, 8 is implicit
    ours_packed, ours_scales = quantize_int4(w)
    assert ours_packed.dtype == np.uint8 and ours_scales.dtype == np.float32
    np.testing.assert_array_equal(ours_scales, scales)
    np.testing.assert_array_equal(ours_packed, packed)


def nibbles(packed: np.ndarray) -> np.ndarray:
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:2], -1)


@pytest.mark.parametrize(
    ("n", "k", "seed"),
    [(1, 32, 0), (7, 100, 1), (3, 17, 2), (64, 576, 3), (33, 1000, 4), (128, 1536, 5)],
)
def test_random_normal_matrices(n: int, k: int, seed: int) -> None:
    """Shapes with K a multiple of the block, K not one (a zero-padded last block), K < block."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    assert_same_as_onnxruntime(w)


def test_fp16_valued_weights() -> None:
    """Weights that came from float16 checkpoints: few mantissa bits, so w / scale often lands on a
    half step; the ordinary half-to-even rounding differs there."""
    w = np.random.default_rng(6).standard_normal((200, 1000)).astype(np.float16).astype(np.float32)
    assert_same_as_onnxruntime(w)


def test_q4_1_grid_weights() -> None:
    """Weights dequantized from a GGUF Q4_1 file (the default model's source): ``d * q + m`` per
    block of 32, with float16 ``d`` and ``m``, which puts many of them on exact half steps."""
    rng = np.random.default_rng(7)
    n, k = 96, 576
    q = rng.integers(0, 16, (n, k)).astype(np.float32)
    d = np.repeat(rng.uniform(1e-3, 5e-2, (n, k // 32)).astype(np.float16), 32, axis=1)
    m = np.repeat(-rng.uniform(0.0, 0.4, (n, k // 32)).astype(np.float16), 32, axis=1)
    w = q * d.astype(np.float32) + m.astype(np.float32)
    assert_same_as_onnxruntime(w)


def test_exact_half_steps_round_up() -> None:
    """Blocks on a grid of a quarter with -4 in them (scale 0.5): every odd quarter is a half step,
    and onnxruntime rounds those up (roundf of w * (1 / scale) + 8)."""
    rng = np.random.default_rng(8)
    w = rng.integers(-15, 16, (100, 256)).astype(np.float32) / 4
    w[:, ::32] = -4.0
    v = w.reshape(100, 8, 32) / 0.5 + 8
    assert np.any(np.rint(v) != np.floor(v + 0.5))  # the data tells the two roundings apart
    assert_same_as_onnxruntime(w)
    q = nibbles(quantize_int4(w)[0]).astype(np.float32)
    np.testing.assert_array_equal(q, np.clip(np.floor(v + 0.5), 0, 15))  # 3.75 -> 15.5 -> 15


def test_blocks_whose_max_and_minus_min_tie_take_the_minimum() -> None:
    """|max| == |min|: the scale is minimum / -8 (positive), whichever comes first in the block."""
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((20, 70)) * 0.1).astype(np.float32)
    w[:10, 0], w[:10, 5] = 1.0, -1.0  # max first
    w[10:, 0], w[10:, 5] = -1.0, 1.0  # min first
    w[:, 40], w[:, 50] = 0.5, -0.5  # in the second block too
    w[0, 64], w[0, 66] = 2.0, -2.0  # and in the zero-padded last one
    assert_same_as_onnxruntime(w)
    scales = quantize_int4(w)[1]
    np.testing.assert_array_equal(scales[:, 0], np.float32(0.125))
    np.testing.assert_array_equal(scales[:, 1], np.float32(0.0625))
    assert scales[0, 2] == np.float32(0.25)


def test_all_zero_blocks_and_one_signed_blocks() -> None:
    rng = np.random.default_rng(10)
    w = rng.standard_normal((12, 100)).astype(np.float32)
    w[0] = 0.0  # a whole row
    w[1, 32:64] = 0.0  # one block
    w[2, 96:] = 0.0  # the padded last block
    w[3, 5] = -0.0
    w[4] = np.abs(w[4])  # all positive: scale negative
    w[5] = -np.abs(w[5])  # all negative
    w[6, :32] = 0.3  # a constant block
    assert_same_as_onnxruntime(w)
    assert_same_as_onnxruntime(np.zeros((4, 64), np.float32))
    packed, scales = quantize_int4(np.zeros((2, 40), np.float32))
    assert not scales.any() and np.all(nibbles(packed) == 8)


def test_float16_range_and_extreme_magnitudes() -> None:
    """Values near float16's limit (+-65504), near float32's (3.4e38), and tiny but normal ones
    (the block scale and its reciprocal stay finite, so nothing turns NaN)."""
    rng = np.random.default_rng(11)
    sign = rng.choice(np.float32([-1, 1]), (40, 64))
    w = rng.uniform(60000, 65504, (40, 64)).astype(np.float16).astype(np.float32) * sign
    w[0, :2] = 65504.0, -65504.0
    assert_same_as_onnxruntime(w)
    huge = (rng.standard_normal((40, 96)) * 1e37).astype(np.float32)
    huge[0, 0], huge[1, 0] = 3.4e38, -3.4e38
    huge[2, 0], huge[2, 1] = np.finfo(np.float32).max, -np.finfo(np.float32).max
    assert_same_as_onnxruntime(huge)
    tiny = (rng.standard_normal((40, 96)) * 1e-30).astype(np.float32)
    tiny[0, :32] = rng.choice(np.float32([-1e-36, 1e-36]), 32)
    assert_same_as_onnxruntime(tiny)


def test_many_random_shapes_and_scales() -> None:
    """A sweep: 120 matrices, 1-40 rows, 1-300 columns, magnitudes from 1e-30 to 1e30."""
    rng = np.random.default_rng(12)
    for _ in range(120):
        n, k = int(rng.integers(1, 41)), int(rng.integers(1, 301))
        magnitude = np.float32(10.0 ** rng.uniform(-30, 30))
        assert_same_as_onnxruntime(rng.standard_normal((n, k)).astype(np.float32) * magnitude)
