"""Aligned host buffers (what we bind to sessions)."""

from __future__ import annotations

import numpy as np
import pytest

from genai.runtime.buffers import ALIGNMENT, aligned_empty, aligned_zeros


@pytest.mark.parametrize("shape", [1, 7, (3, 5), (2, 3, 1000, 64)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.int32, np.uint8])
def test_aligned_and_shaped(shape, dtype):
    array = aligned_zeros(shape, dtype)
    assert array.ctypes.data % ALIGNMENT == 0
    assert array.shape == ((shape,) if isinstance(shape, int) else shape)
    assert array.dtype == np.dtype(dtype)
    assert array.flags.c_contiguous and array.flags.writeable
    assert not array.any()
    empty = aligned_empty(shape, dtype)
    assert empty.ctypes.data % ALIGNMENT == 0
    empty[...] = 1
    assert (empty == 1).all()
