# cython: language_level=3
"""Per-step bookkeeping of the generation loop: attention mask and position ids for prefill and
decode, greedy argmax, and committing chosen tokens (pad after EOS, done flags).

Every kernel works on caller-owned buffers (the arrays bound to ORT through IOBinding) and
writes in place. The mask/position kernels have raw-buffer `cdef` forms (declared in the
.pxd) that the decode loop (`decoder_loop.pyx`) calls inside its nogil step; the `def`
wrappers here call the same functions, so the NumPy-twin tests cover what the loop runs.
The loops are ``nogil``; the wrappers release the GIL only when the work is large
(`NOGIL_MIN_WORK` elements): under a busy Python thread, each release costs up to a
whole switch interval (5 ms) to take the GIL back, far more than these microsecond loops.
`genai._core.reference` holds the NumPy twin of each kernel.
"""

#: Elements of work from which a kernel releases the GIL.
NOGIL_MIN_WORK = 1 << 20

#: The "pad id" of prompts without padding (`prefill_inputs`): no token has it (Phi-3
#: Vision's image placeholders are small negative ids, so -1 will not do).
NO_PAD = -(2**31)

from libc.stdint cimport int32_t, int64_t, uint8_t

import numpy as np
from libc.string cimport memcpy, memmove

from genai.errors import NonFiniteLogitsError


cdef void prefill_rows(
    const int32_t* tokens, Py_ssize_t token_stride, Py_ssize_t batch, Py_ssize_t count,
    int32_t pad_id, void* mask, void* positions, Py_ssize_t out_stride, bint wide,
    int32_t* last_index, int64_t* real_count, int32_t last_pad,
) noexcept nogil:
    # Trailing ``pad_id`` tokens are padding (mask and position 0); ``last_index`` skips the
    # trailing ``last_pad`` tokens (the reference picks the logits of a batch-1 prompt's last
    # token that is not its pad id, though it masks no padding there).
    cdef Py_ssize_t b, i, n, m
    cdef const int32_t* row
    for b in range(batch):
        row = tokens + b * token_stride
        n = count
        while n > 0 and row[n - 1] == pad_id:
            n -= 1
        for i in range(count):
            store_index(mask, wide, b * out_stride + i, 1 if i < n else 0)
            if positions != NULL:
                store_index(positions, wide, b * out_stride + i, i if i < n else 0)
        m = n if last_pad == pad_id else count
        while m > 0 and row[m - 1] == last_pad:
            m -= 1
        last_index[b] = <int32_t>(m - 1 if m > 0 else 0)
        if real_count != NULL:
            real_count[b] = n


def prefill_inputs(
    const int32_t[:, :] tokens, int32_t pad_id, index_t[:, ::1] mask,
    index_t[:, ::1] positions, int32_t[::1] last_index, object last_pad=None,
):
    """Mask and positions for a right-padded prompt batch, as the reference builds them.

    Per row, trailing ``pad_id`` tokens get mask 0 and position 0; the others mask 1 and
    positions 0..n-1. ``last_index[b]`` receives the index of row b's last token that is not
    ``last_pad`` (default ``pad_id``; 0 for a row of such tokens only). ``mask``/``positions``
    may be wider than ``tokens``: only the first ``tokens.shape[1]`` columns are written.
    ``positions`` may have zero rows (no position input).
    """
    cdef Py_ssize_t batch = tokens.shape[0], length = tokens.shape[1]
    cdef bint with_positions = positions.shape[0] > 0
    if tokens.strides[1] != sizeof(int32_t):
        raise ValueError("tokens rows must be contiguous")
    if with_positions and positions.shape[1] != mask.shape[1]:
        raise ValueError("mask and positions must have the same width")
    if batch == 0 or length == 0:
        return
    prefill_rows(
        &tokens[0, 0], tokens.strides[0] // sizeof(int32_t), batch, length, pad_id,
        &mask[0, 0], &positions[0, 0] if with_positions else NULL, mask.shape[1],
        index_t is int64_t, &last_index[0], NULL, pad_id if last_pad is None else last_pad,
    )


cdef void grow_mask(void* mask, bint wide, Py_ssize_t batch, Py_ssize_t old_length) noexcept nogil:
    cdef Py_ssize_t b = batch - 1, new_length = old_length + 1
    cdef size_t size = 8 if wide else 4
    while b >= 0:
        if b > 0:
            memmove((<char*>mask) + b * new_length * size,
                    (<char*>mask) + b * old_length * size, old_length * size)
        store_index(mask, wide, b * new_length + old_length, 1)
        b -= 1


def append_mask_column(index_t[::1] mask, Py_ssize_t batch, Py_ssize_t old_length):
    """Grow a contiguous [batch, old_length] mask stored at the start of ``mask`` into
    [batch, old_length + 1] in place, with a trailing 1 on every row."""
    if mask.shape[0] < batch * (old_length + 1):
        raise ValueError(
            f"mask buffer of {mask.shape[0]} cannot hold {batch}x{old_length + 1}"
        )
    if batch:
        grow_mask(&mask[0], index_t is int64_t, batch, old_length)


def fill_mask_ones(index_t[::1] mask, Py_ssize_t start, Py_ssize_t stop):
    """Set ``mask[start:stop]`` to 1 (batch 1: the mask is all ones of the total length)."""
    cdef Py_ssize_t i
    for i in range(start, stop):
        mask[i] = 1


cdef void write_positions(
    void* positions, bint wide, int64_t* next_position, Py_ssize_t batch, Py_ssize_t count,
    Py_ssize_t stride,
) noexcept nogil:
    cdef Py_ssize_t b, i
    for b in range(batch):
        for i in range(count):
            store_index(positions, wide, b * stride + i, next_position[b] + i)
        next_position[b] += count


def advance_positions(index_t[:, ::1] positions, index_t[::1] next_position, Py_ssize_t count):
    """Write ``count`` consecutive positions per row starting at ``next_position[b]`` into
    ``positions[b, :count]`` and advance ``next_position`` by ``count``."""
    cdef Py_ssize_t b, batch = positions.shape[0]
    if positions.shape[1] < count:
        raise ValueError("positions are narrower than count")
    cdef int64_t[::1] nxt = np.asarray(next_position, dtype=np.int64).copy()
    if batch and count:
        write_positions(
            &positions[0, 0], index_t is int64_t, &nxt[0], batch, count, positions.shape[1]
        )
    for b in range(batch):
        next_position[b] = nxt[b]


cdef Py_ssize_t argmax_row(const float* row, Py_ssize_t n) noexcept nogil:
    """Index of the largest value (ties: the lowest index); -1 when the row holds a NaN."""
    cdef Py_ssize_t i, best = 0
    cdef float value, best_value = row[0]
    if best_value != best_value:
        return -1
    for i in range(1, n):
        value = row[i]
        if value > best_value:
            best_value = value
            best = i
        elif value != value:
            return -1
    return best


cdef Py_ssize_t _argmax_rows(const float[:, ::1] logits, int32_t[::1] out) noexcept nogil:
    """Fill ``out``; return the first row holding a NaN, or -1."""
    cdef Py_ssize_t r, best
    for r in range(logits.shape[0]):
        best = argmax_row(&logits[r, 0], logits.shape[1])
        if best < 0:
            return r
        out[r] = <int32_t>best
    return -1


def argmax_rows(const float[:, ::1] logits, int32_t[::1] out):
    """Greedy choice per row of ``logits`` [rows, vocab] into ``out``; raises on NaN logits."""
    cdef Py_ssize_t bad
    cdef Py_ssize_t vocab = logits.shape[1]
    if out.shape[0] < logits.shape[0]:
        raise ValueError("output buffer is smaller than the number of rows")
    if vocab == 0:
        raise ValueError("logits have an empty vocabulary axis")
    if logits.shape[0] * vocab >= NOGIL_MIN_WORK:
        with nogil:
            bad = _argmax_rows(logits, out)
    else:
        bad = _argmax_rows(logits, out)
    if bad >= 0:
        raise NonFiniteLogitsError(f"logits of row {bad} contain NaN")


cdef bint commit_row_tokens(
    int32_t[:, ::1] sequences, Py_ssize_t length, int32_t[::1] tokens,
    const int32_t[::1] eos_ids, uint8_t[::1] done, int32_t pad_id,
) noexcept nogil:
    cdef Py_ssize_t b, e
    cdef bint all_done = True
    for b in range(tokens.shape[0]):
        if done[b]:
            tokens[b] = pad_id
        else:
            for e in range(eos_ids.shape[0]):
                if tokens[b] == eos_ids[e]:
                    done[b] = 1
                    break
        sequences[b, length] = tokens[b]
        if not done[b]:
            all_done = False
    return all_done


def commit_tokens(
    int32_t[:, ::1] sequences, Py_ssize_t length, int32_t[::1] tokens,
    const int32_t[::1] eos_ids, uint8_t[::1] done, int32_t pad_id,
):
    """Store each row's chosen token at ``sequences[b, length]``.

    A row that already finished gets ``pad_id`` instead (its token in ``tokens`` is replaced
    too); a token in ``eos_ids`` marks its row done. Returns True when every row is done.
    """
    if length >= sequences.shape[1]:
        raise ValueError(f"sequence buffer of length {sequences.shape[1]} is full")
    if tokens.shape[0] != sequences.shape[0] or done.shape[0] != sequences.shape[0]:
        raise ValueError("tokens/done must have one entry per sequence row")
    return commit_row_tokens(sequences, length, tokens, eos_ids, done, pad_id)


cdef void _gather_rows(
    const float[:, :, ::1] logits, const int32_t[::1] index, float[:, ::1] out,
) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(logits.shape[0]):
        memcpy(&out[b, 0], &logits[b, index[b], 0], logits.shape[2] * sizeof(float))


def gather_rows(
    const float[:, :, ::1] logits, const int32_t[::1] index, float[:, ::1] out,
):
    """``out[b] = logits[b, index[b]]``: each row's logits at its last real token."""
    cdef Py_ssize_t b, vocab = logits.shape[2]
    if out.shape[0] < logits.shape[0] or out.shape[1] != vocab:
        raise ValueError("output buffer shape does not match the logits")
    for b in range(logits.shape[0]):
        if index[b] < 0 or index[b] >= logits.shape[1]:
            raise IndexError(f"row {b}: position {index[b]} outside the logits")
    if logits.shape[0] * vocab >= NOGIL_MIN_WORK:
        with nogil:
            _gather_rows(logits, index, out)
    else:
        _gather_rows(logits, index, out)


cdef inline void _copy_row(unsigned char* dst, const unsigned char* src, Py_ssize_t chunks,
                           Py_ssize_t stride, Py_ssize_t nbytes) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(chunks):
        memcpy(dst + k * stride, src + k * stride, nbytes)


cdef Py_ssize_t move_rows_raw(
    unsigned char* rows, Py_ssize_t n, Py_ssize_t width, const int32_t* order,
    unsigned char* scratch, Py_ssize_t chunks, Py_ssize_t nbytes, int32_t* work,
) noexcept nogil:
    """``row i = old row order[i]`` in place, moving each row at most once (see `move_rows`).
    ``work`` holds 3 * n ints. Returns the number of row copies (scratch ones included)."""
    cdef int32_t* refs = work          # pending readers of each row's old content
    cdef int32_t* stack = work + n     # rows whose old content nobody needs any more
    cdef int32_t* written = work + 2 * n
    cdef Py_ssize_t i, j, src, top = 0, copies = 0
    cdef Py_ssize_t stride = width // chunks
    for i in range(n):
        refs[i] = 0
        written[i] = 0
    for i in range(n):
        if order[i] != i:
            refs[order[i]] += 1
    for i in range(n):
        if order[i] != i and refs[i] == 0:
            stack[top] = <int32_t>i
            top += 1
    # Trees first: a row is overwritten once every row that reads its old content has read it.
    while top > 0:
        top -= 1
        i = stack[top]
        src = order[i]
        _copy_row(rows + i * width, rows + src * width, chunks, stride, nbytes)
        written[i] = 1
        copies += 1
        refs[src] -= 1
        if refs[src] == 0 and order[src] != src and not written[src]:
            stack[top] = <int32_t>src
            top += 1
    # What is left are disjoint cycles: one row of scratch each.
    for i in range(n):
        if order[i] == i or written[i]:
            continue
        _copy_row(scratch, rows + i * width, chunks, stride, nbytes)
        j = i
        while order[j] != i:
            _copy_row(rows + j * width, rows + order[j] * width, chunks, stride, nbytes)
            written[j] = 1
            copies += 1
            j = order[j]
        _copy_row(rows + j * width, scratch, chunks, stride, nbytes)
        written[j] = 1
        copies += 2
    return copies


def move_rows(unsigned char[:, ::1] rows, const int32_t[::1] order, unsigned char[::1] scratch,
              Py_ssize_t chunks=1, Py_ssize_t chunk_bytes=-1):
    """``rows[i] = old rows[order[i]]`` in place (beam search: KV rows follow their beams),
    moving each row once: a row that keeps its own content (``order[i] == i``) is not touched,
    a row whose old content others still need is overwritten after they copied it, and each
    cycle of the permutation goes through ``scratch`` (one row, caller-owned). Each row is
    ``chunks`` equal pieces (e.g. the heads of a ``[batch, heads, capacity, head]`` cache) of
    which only the first ``chunk_bytes`` are moved (-1: whole pieces), so a cache's unfilled
    capacity is never copied. Returns the number of row copies made (scratch ones included)."""
    cdef Py_ssize_t i, copies, n = rows.shape[0], width = rows.shape[1]
    cdef int32_t[::1] work
    if order.shape[0] != n:
        raise ValueError("order needs one entry per row")
    if chunks < 1 or width % chunks:
        raise ValueError(f"rows of {width} bytes do not split into {chunks} chunks")
    if chunk_bytes < 0:
        chunk_bytes = width // chunks
    if chunk_bytes > width // chunks:
        raise ValueError("chunk_bytes exceeds the chunk size")
    if scratch.shape[0] < width:
        raise ValueError("scratch is smaller than one row")
    for i in range(n):
        if not 0 <= order[i] < n:
            raise IndexError(f"row {order[i]} outside [0, {n})")
    if n == 0 or chunk_bytes == 0:
        return 0
    work = np.empty(3 * n, np.int32)
    with nogil:
        copies = move_rows_raw(&rows[0, 0], n, width, &order[0], &scratch[0], chunks,
                               chunk_bytes, &work[0])
    return copies


def reorder_rows(unsigned char[:, ::1] rows, const int32_t[::1] order,
                 unsigned char[:, ::1] scratch):
    """``rows[i] = old rows[order[i]]`` in place (`move_rows` over whole rows; ``scratch``
    [>= 1, row_bytes] is caller-owned, so nothing is allocated per step)."""
    if order.shape[0] != rows.shape[0] or scratch.shape[0] < 1 or scratch.shape[1] != rows.shape[1]:
        raise ValueError("order/scratch do not match the rows")
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        for i in range(order.shape[0]):
            if not 0 <= order[i] < rows.shape[0]:
                raise IndexError(f"row {order[i]} outside [0, {rows.shape[0]})")
        return
    move_rows(rows, order, scratch[0])
