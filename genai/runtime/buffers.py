"""Host buffers aligned for SIMD kernels.

numpy aligns large allocations to 16 bytes only; ORT's own allocator uses 64. Kernels reading
a misaligned KV cache or logits buffer run measurably slower (AVX-512 loads split across cache
lines), so every buffer we bind to a session comes from here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ALIGNMENT", "aligned_empty", "aligned_zeros"]

#: Bytes: a cache line, and the widest SIMD register.
ALIGNMENT = 64


def aligned_empty(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an `ALIGNMENT` boundary."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def aligned_zeros(shape: int | tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """`aligned_empty`, zero-filled."""
    array = aligned_empty(shape, dtype)
    array.fill(0)
    return array
