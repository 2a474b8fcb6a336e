"""Blockwise symmetric int4 quantization in the layouts of onnxruntime's ``MatMulNBits`` and
``GatherBlockQuantized`` (com.microsoft), block size 32, no zero points (implicit 8)."""

from __future__ import annotations

import numpy as np

__all__ = ["BLOCK", "dequantize_int4", "quantize_int4"]

BLOCK = 32


def quantize_int4(weight: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` ``[N, K]`` (one row per output) -> ``(packed, scales)``.

    ``packed`` is uint8 ``[N, ceil(K / block), block / 2]`` (element ``2j`` in the low nibble),
    ``scales`` float32 ``[N, ceil(K / block)]``; value = ``scale * (q - 8)``. The element of
    largest magnitude in each block maps to ``q = 0`` (``scale = that element / -8``), so the
    block's range is used fully. ``K`` is zero-padded to whole blocks.
    """
    w = np.asarray(weight, dtype=np.float32)
    n, k = w.shape
    blocks = -(-k // block)
    if blocks * block != k:
        w = np.pad(w, ((0, 0), (0, blocks * block - k)))
    w = w.reshape(n, blocks, block)
    pick = np.abs(w).argmax(axis=2)[..., None]
    scales = np.take_along_axis(w, pick, axis=2)[..., 0] / np.float32(-8.0)
    safe = np.where(scales == 0, np.float32(1.0), scales)
    q = np.clip(np.rint(w / safe[..., None]) + 8, 0, 15).astype(np.uint8)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    return np.ascontiguousarray(packed), scales.astype(np.float32)


def dequantize_int4(packed: np.ndarray, scales: np.ndarray, k: int) -> np.ndarray:
    """Inverse of :func:`quantize_int4`: float32 ``[N, k]``."""
    q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:2], -1)
    w = (q.astype(np.float32) - 8.0) * scales[..., None]
    return w.reshape(packed.shape[0], -1)[:, :k]
