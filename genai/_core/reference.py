"""NumPy twins of the Cython kernels in `genai._core`, same interfaces, written for clarity.

Tests run one body over both; the kernels must agree with these exactly.
"""

from __future__ import annotations

import numpy as np


def prefill_inputs(tokens, pad_id, mask, positions, last_index):
    """See `genai._core.bookkeeping.prefill_inputs`."""
    batch, length = tokens.shape
    for b in range(batch):
        real = length
        while real > 0 and tokens[b, real - 1] == pad_id:
            real -= 1
        mask[b, :length] = np.arange(length) < real
        if positions.shape[0]:
            positions[b, :length] = np.where(np.arange(length) < real, np.arange(length), 0)
        last_index[b] = max(real - 1, 0)


def append_mask_column(mask, batch, old_length):
    """See `genai._core.bookkeeping.append_mask_column`."""
    if mask.shape[0] < batch * (old_length + 1):
        raise ValueError("mask buffer too small")
    grown = np.concatenate(
        [mask[: batch * old_length].reshape(batch, old_length), np.ones((batch, 1), mask.dtype)],
        axis=1,
    )
    mask[: batch * (old_length + 1)] = grown.ravel()


def fill_mask_ones(mask, start, stop):
    """See `genai._core.bookkeeping.fill_mask_ones`."""
    mask[start:stop] = 1


def advance_positions(positions, next_position, count):
    """See `genai._core.bookkeeping.advance_positions`."""
    positions[:, :count] = next_position[:, None] + np.arange(count)
    next_position += count


def argmax_rows(logits, out):
    """See `genai._core.bookkeeping.argmax_rows`."""
    bad = np.isnan(logits).any(axis=1)
    if bad.any():
        raise ValueError(f"logits of row {int(np.argmax(bad))} contain NaN")
    out[: logits.shape[0]] = np.argmax(logits, axis=1)


def commit_tokens(sequences, length, tokens, eos_ids, done, pad_id):
    """See `genai._core.bookkeeping.commit_tokens`."""
    if length >= sequences.shape[1]:
        raise ValueError("sequence buffer is full")
    tokens[done.astype(bool)] = pad_id
    done |= np.isin(tokens, eos_ids).astype(done.dtype)
    sequences[:, length] = tokens
    return bool(done.all())


def gather_rows(logits, index, out):
    """See `genai._core.bookkeeping.gather_rows`."""
    if ((index < 0) | (index >= logits.shape[1])).any():
        raise IndexError("position outside the logits")
    out[: logits.shape[0]] = logits[np.arange(logits.shape[0]), index]


def reorder_rows(rows, order, scratch):
    """See `genai._core.bookkeeping.reorder_rows`."""
    if ((order < 0) | (order >= rows.shape[0])).any():
        raise IndexError("row outside the buffer")
    rows[:] = rows[order]


def move_rows(rows, order, scratch, chunks=1, chunk_bytes=-1):
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


def quantize_rows(x, floor_value):
    """See `genai._core.custom_ops.quantize_rows`: float32 steps, each rounded on its own."""
    x = np.asarray(x, np.float32)
    top = np.maximum(np.abs(x).max(axis=-1, keepdims=True), np.float32(floor_value))
    inverse = np.float32(127) / top
    shifted = (x * inverse).astype(np.float32) + np.float32(128.5)
    return shifted.astype(np.uint8), (top / np.float32(127)).astype(np.float32)
