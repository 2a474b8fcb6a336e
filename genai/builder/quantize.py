"""Blockwise symmetric int4 quantization in the layouts of onnxruntime's ``MatMulNBits`` and
``GatherBlockQuantized`` (com.microsoft), block size 32, no zero points (implicit 8)."""

from __future__ import annotations

import numpy as np

__all__ = ["BLOCK", "dequantize_int4", "dequantize_int8", "quantize_int4", "quantize_int8"]

BLOCK = 32
#: The largest magnitude of a quantized int8 weight (7 bits of range): x86 CPUs without VNNI
#: multiply uint8 activations by int8 weights with pairwise sums that saturate int16 beyond it
#: (255 * 64 * 2 < 32768).
INT8_RANGE = 64


def quantize_int4(weight: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` ``[N, K]`` (one row per output) -> ``(packed, scales)``.

    ``packed`` is uint8 ``[N, ceil(K / block), block / 2]`` (element ``2j`` in the low nibble),
    ``scales`` float32 ``[N, ceil(K / block)]``; value = ``scale * (q - 8)``. The element of
    largest magnitude in each block maps to ``q = 0`` (``scale = that element / -8``), so the
    block's range is used fully; when the block's minimum and maximum have the same magnitude
    the minimum is taken. ``K`` is zero-padded to whole blocks.

    Bit for bit what onnxruntime's blockwise quantizer (``quantize_matmul_4bits``, symmetric,
    which the reference builder's ``MatMulNBitsQuantizer`` calls) writes for the transposed
    weight: ``q = round_half_up(w * (1 / scale) + 8)`` in float32, clipped to ``[0, 15]``.
    """
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    blocks = -(-k // block)
    if blocks * block != k:
        w = np.pad(w, ((0, 0), (0, blocks * block - k)))
    w = w.reshape(n, blocks, block)
    low, high = w.min(axis=2), w.max(axis=2)
    scales = (np.where(-low >= high, low, high) / np.float32(-8.0)).astype(np.float32)
    safe = np.where(scales == 0, np.float32(1.0), scales).astype(np.float32)
    # the product and the sum are rounded to float32 separately, as onnxruntime computes them
    v = w * (np.float32(1.0) / safe)[..., None]
    v += np.float32(8.0)
    # round half away from zero (C's roundf) without a float64 copy: rint rounds halves to
    # even, so lift the halves it rounded down (r - v is exact here: |v| < 2**24)
    q = np.rint(v)
    q += q - v == np.float32(-0.5)
    q = np.clip(q, 0, 15).astype(np.uint8)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    return np.ascontiguousarray(packed), scales


def dequantize_int4(packed: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """Inverse of :func:`quantize_int4`: float32 ``[N, k]``."""
    q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:2], -1)
    w = (q.astype(np.float32) - 8.0) * scales[..., None]
    return w.reshape(packed.shape[0], -1)[:, :k]


def quantize_int8(weight: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` ``[N, K]`` -> ``(q, scales)`` for ``MatMulNBits`` with ``bits=8``.

    ``q`` is uint8 ``[N, ceil(K / block), block]``, ``scales`` float32 ``[N, ceil(K / block)]``;
    value = ``scale * (q - 128)`` (the op's implicit zero point). As for int4, the element of
    largest magnitude in each block maps to ``q = 0`` (``scale = that element / -128``); when
    the block's minimum and maximum have the same magnitude the minimum is taken, as
    onnxruntime's blockwise quantizer does.
    """
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    blocks = -(-k // block)
    if blocks * block != k:
        w = np.pad(w, ((0, 0), (0, blocks * block - k)))
    w = w.reshape(n, blocks, block)
    low, high = w.min(axis=2), w.max(axis=2)
    scales = np.where(-low >= high, low, high) / np.float32(-128.0)
    safe = np.where(scales == 0, np.float32(1.0), scales).astype(np.float32)
    # w * (1 / scale) + 128 in float32, rounded half up: onnxruntime's blockwise quantizer
    # (the reference builder's int8 weights, bit for bit)
    v = w * (np.float32(1.0) / safe)[..., None] + np.float32(128.0)
    q = np.clip(np.floor(v.astype(np.float64) + 0.5), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(q), scales.astype(np.float32)


def dequantize_int8(q: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """Inverse of :func:`quantize_int8`: float32 ``[N, k]``."""
    w = (q.astype(np.float32) - 128.0) * scales[..., None]
    return w.reshape(q.shape[0], -1)[:, :k]


def quantize_int8_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` ``[N, K]`` -> ``(q, scales)`` in ``DynamicQuantizeMatMul``'s layout: ``q`` int8
    ``[K, N]`` (symmetric, per output column, within ``+-INT8_RANGE``), ``scales`` float32
    ``[N]``; value = ``scale * q``."""
    w = np.asarray(weight, dtype=np.float32)
    scales = np.abs(w).max(axis=1) / np.float32(INT8_RANGE)
    safe = np.where(scales == 0, np.float32(1.0), scales)
    q = np.clip(np.rint(w / safe[:, None]), -INT8_RANGE, INT8_RANGE).astype(np.int8)
    return np.ascontiguousarray(q.T), scales.astype(np.float32)
