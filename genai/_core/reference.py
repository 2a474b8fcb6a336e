"""NumPy twins of the Cython kernels in `genai._core`, same interfaces, written for clarity.

Tests run one body over both; the kernels must agree with these exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from genai.errors import NonFiniteLogitsError

if TYPE_CHECKING:  # the annotations of the kernels' stubs (bookkeeping.pyi, custom_ops.pyi)
    from typing import TypeAlias

    import numpy.typing as npt

    _IndexArray: TypeAlias = npt.NDArray[np.int32] | npt.NDArray[np.int64]


def _real_length(row: npt.NDArray[np.int32], pad_id: int) -> int:
    """The length of ``row`` without its trailing ``pad_id`` tokens."""
    real = len(row)
    while real > 0 and row[real - 1] == pad_id:
        real -= 1
    return real


def prefill_inputs(
    tokens: npt.NDArray[np.int32],
    pad_id: int,
    mask: _IndexArray,
    positions: _IndexArray,
    last_index: npt.NDArray[np.int32],
    last_pad: int | None = None,
) -> None:
    """See `genai._core.bookkeeping.prefill_inputs`."""
    batch, length = tokens.shape
    last_pad = pad_id if last_pad is None else last_pad
    for b in range(batch):
        real = _real_length(tokens[b], pad_id)
        mask[b, :length] = np.arange(length) < real
        if positions.shape[0]:
            positions[b, :length] = np.where(np.arange(length) < real, np.arange(length), 0)
        last_index[b] = max(_real_length(tokens[b], last_pad) - 1, 0)


def append_mask_column(mask: _IndexArray, batch: int, old_length: int) -> None:
    """See `genai._core.bookkeeping.append_mask_column`."""
    if mask.shape[0] < batch * (old_length + 1):
        raise ValueError("mask buffer too small")
    grown = np.concatenate(
        [mask[: batch * old_length].reshape(batch, old_length), np.ones((batch, 1), mask.dtype)],
        axis=1,
    )
    mask[: batch * (old_length + 1)] = grown.ravel()


def fill_mask_ones(mask: _IndexArray, start: int, stop: int) -> None:
    """See `genai._core.bookkeeping.fill_mask_ones`."""
    mask[start:stop] = 1


def advance_positions(positions: _IndexArray, next_position: _IndexArray, count: int) -> None:
    """See `genai._core.bookkeeping.advance_positions`."""
    positions[:, :count] = next_position[:, None] + np.arange(count)
    next_position += count


def argmax_rows(logits: npt.NDArray[np.float32], out: npt.NDArray[np.int32]) -> None:
    """See `genai._core.bookkeeping.argmax_rows`."""
    bad = np.isnan(logits).any(axis=1)
    if bad.any():
        raise NonFiniteLogitsError(f"logits of row {int(np.argmax(bad))} contain NaN")
    out[: logits.shape[0]] = np.argmax(logits, axis=1)


def commit_tokens(
    sequences: npt.NDArray[np.int32],
    length: int,
    tokens: npt.NDArray[np.int32],
    eos_ids: npt.NDArray[np.int32],
    done: npt.NDArray[np.uint8],
    pad_id: int,
) -> bool:
    """See `genai._core.bookkeeping.commit_tokens`."""
    if length >= sequences.shape[1]:
        raise ValueError("sequence buffer is full")
    tokens[done.astype(bool)] = pad_id
    done |= np.isin(tokens, eos_ids).astype(done.dtype)
    sequences[:, length] = tokens
    return bool(done.all())


def gather_rows(
    logits: npt.NDArray[np.float32], index: npt.NDArray[np.int32], out: npt.NDArray[np.float32]
) -> None:
    """See `genai._core.bookkeeping.gather_rows`."""
    if ((index < 0) | (index >= logits.shape[1])).any():
        raise IndexError("position outside the logits")
    out[: logits.shape[0]] = logits[np.arange(logits.shape[0]), index]


def reorder_rows(
    rows: npt.NDArray[np.uint8], order: npt.NDArray[np.int32], scratch: npt.NDArray[np.uint8]
) -> None:
    """See `genai._core.bookkeeping.reorder_rows`."""
    if ((order < 0) | (order >= rows.shape[0])).any():
        raise IndexError("row outside the buffer")
    rows[:] = rows[order]


def move_rows(
    rows: npt.NDArray[np.uint8],
    order: npt.NDArray[np.int32],
    scratch: npt.NDArray[np.uint8],
    chunks: int = 1,
    chunk_bytes: int = -1,
) -> int:
    """See `genai._core.bookkeeping.move_rows` (same result; the copy count is the minimum the
    kernel reaches: one per moved row plus one per cycle, which goes through scratch)."""
    n, width = rows.shape
    if order.shape[0] != n:
        raise ValueError("order needs one entry per row")
    if ((order < 0) | (order >= n)).any():
        raise IndexError("row outside the buffer")
    if chunk_bytes < 0:
        chunk_bytes = width // chunks
    pieces = rows.reshape(n, chunks, width // chunks)
    pieces[:, :, :chunk_bytes] = pieces[order, :, :chunk_bytes]
    moved = order != np.arange(n)
    # cycles of the moved rows' "reads from" graph (trees hanging off them are copied first)
    state = np.zeros(n, np.int8)  # 0 unseen, 1 on the current path, 2 finished
    cycles = 0
    for start in range(n):
        path, row = [], start
        while moved[row] and state[row] == 0:
            state[row] = 1
            path.append(row)
            row = int(order[row])
        cycles += bool(moved[row] and state[row] == 1)
        state[path] = 2
    return int(moved.sum()) + cycles


def quantize_rows(
    x: npt.ArrayLike, floor_value: float
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """See `genai._core.custom_ops.quantize_rows`: float32 steps, each rounded on its own."""
    x = np.asarray(x, np.float32)
    top = np.maximum(np.abs(x).max(axis=-1, keepdims=True), np.float32(floor_value))
    inverse = np.float32(127) / top
    shifted = (x * inverse).astype(np.float32) + np.float32(128.5)
    return shifted.astype(np.uint8), (top / np.float32(127)).astype(np.float32)


def _fma32(a: npt.ArrayLike, b: npt.ArrayLike, c: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Correctly rounded float32 ``a * b + c``: the float64 product is exact, the float64 sum
    is made round-to-odd (its lost part known from TwoSum) before the one rounding to float32."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    product = a * b
    total = product + c
    back = total - c
    lost = (product - back) + (c - (total - back))
    inexact_even = (lost != 0) & ((total.view(np.int64) & 1) == 0)
    total = np.where(inexact_even, np.nextafter(total, np.where(lost > 0, np.inf, -np.inf)), total)
    return total.astype(np.float32)


def _add32(a: npt.ArrayLike, b: npt.ArrayLike) -> npt.NDArray[np.float32]:
    return (np.asarray(a, np.float32) + np.asarray(b, np.float32)).astype(np.float32)


def step_rows_matmul(
    a: npt.ArrayLike,
    b: npt.NDArray[np.uint8],
    scales: npt.ArrayLike,
    zero_points: npt.NDArray[np.uint8] | None = None,
) -> npt.NDArray[np.float32]:
    """See `genai._core.custom_ops.step_rows_matmul` and ``step_rows_kernels.h``: ``a``
    float32 [rows, K], ``b`` uint8 [N, K / 32, 16], ``scales`` float32 [N, K / 32],
    ``zero_points`` None or uint8 [N, (K / 32 + 1) / 2] -> float32 [rows, N]."""
    a = np.asarray(a, np.float32)
    rows, k = a.shape
    n, blocks = b.shape[0], k // 32
    x = a.reshape(rows, blocks, 32)
    top = np.abs(x).max(axis=-1)
    sa = (top / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(top != 0, np.float32(127) / top, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((x * inverse[..., None]).astype(np.float32)), -128, 127).astype(np.int64)
    nibbles = np.empty((n, blocks, 32), np.int64)
    nibbles[..., 0::2] = b.reshape(n, blocks, 16) & 15
    nibbles[..., 1::2] = b.reshape(n, blocks, 16) >> 4
    if zero_points is None:
        s = nibbles - 8
    else:
        points = np.empty((n, zero_points.reshape(n, -1).shape[1] * 2), np.int64)
        points[:, 0::2] = zero_points.reshape(n, -1) & 15
        points[:, 1::2] = zero_points.reshape(n, -1) >> 4
        s = nibbles - points[:, :blocks, None]
    scales = np.asarray(scales, np.float32).reshape(n, blocks)
    # dot[r, col, blk, i]: exact sums of 4 products (lane i of a block on its own)
    dot4 = np.einsum("rbji,cbji->rcbj", q.reshape(rows, blocks, 8, 4), s.reshape(n, blocks, 8, 4))
    acc = np.zeros((rows, n, 8), np.float32)
    blk = 0
    while blk + 1 < blocks:
        c0 = (sa[:, None, blk] * scales[None, :, blk]).astype(np.float32)[..., None]
        c1 = (sa[:, None, blk + 1] * scales[None, :, blk + 1]).astype(np.float32)[..., None]
        if zero_points is not None:
            acc = _fma32(dot4[:, :, blk], c0, acc)
            acc = _fma32(dot4[:, :, blk + 1], c1, acc)
        else:
            # lane l: 8 elements (l & 1) * 8 + (l >> 2) * 16 of block blk + ((l >> 1) & 1)
            lanes = np.empty((rows, n, 8), np.int64)
            scale = np.empty((rows, n, 8), np.float32)
            for lane in range(8):
                second, first = (lane >> 1) & 1, (lane & 1) * 2 + (lane >> 2) * 4
                pair = dot4[:, :, blk + second]
                lanes[..., lane] = pair[..., first] + pair[..., first + 1]
                scale[..., lane] = (c1 if second else c0)[..., 0]
            acc = _fma32(lanes, scale, acc)
        blk += 2
    if blk < blocks:
        c0 = (sa[:, None, blk] * scales[None, :, blk]).astype(np.float32)[..., None]
        acc = _fma32(dot4[:, :, blk], c0, acc)
    whole = n - n % 4
    out = np.empty((rows, n), np.float32)
    lo = _add32(_add32(_add32(acc[..., 0], acc[..., 1]), acc[..., 2]), acc[..., 3])
    hi = _add32(_add32(_add32(acc[..., 4], acc[..., 5]), acc[..., 6]), acc[..., 7])
    out[:, :whole] = _add32(lo, hi)[:, :whole]
    pairs = [_add32(acc[..., i], acc[..., i + 4]) for i in range(4)]
    out[:, whole:] = _add32(_add32(pairs[0], pairs[2]), _add32(pairs[1], pairs[3]))[:, whole:]
    return out
