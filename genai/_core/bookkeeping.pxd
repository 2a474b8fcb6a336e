# cython: language_level=3
"""C-level API of the per-step bookkeeping kernels (cimport-able by other kernel families)."""

from libc.stdint cimport int32_t, int64_t, uint8_t

ctypedef fused index_t:
    int32_t
    int64_t

cdef Py_ssize_t argmax_row(const float* row, Py_ssize_t n) noexcept nogil
cdef bint commit_row_tokens(
    int32_t[:, ::1] sequences, Py_ssize_t length, int32_t[::1] tokens,
    const int32_t[::1] eos_ids, uint8_t[::1] done, int32_t pad_id,
) noexcept nogil


# Raw-buffer forms of the mask / position kernels, for the decode loop (`wide`: int64 buffers,
# else int32). The `def` wrappers in bookkeeping.pyx call the same functions.
cdef inline void store_index(void* buf, bint wide, Py_ssize_t i, int64_t value) noexcept nogil:
    if wide:
        (<int64_t*>buf)[i] = value
    else:
        (<int32_t*>buf)[i] = <int32_t>value

cdef inline int64_t load_index(const void* buf, bint wide, Py_ssize_t i) noexcept nogil:
    if wide:
        return (<const int64_t*>buf)[i]
    return (<const int32_t*>buf)[i]

cdef void prefill_rows(
    const int32_t* tokens, Py_ssize_t token_stride, Py_ssize_t batch, Py_ssize_t count,
    int32_t pad_id, void* mask, void* positions, Py_ssize_t out_stride, bint wide,
    int32_t* last_index, int64_t* real_count, int32_t last_pad,
) noexcept nogil
cdef void grow_mask(void* mask, bint wide, Py_ssize_t batch, Py_ssize_t old_length) noexcept nogil
cdef void write_positions(
    void* positions, bint wide, int64_t* next_position, Py_ssize_t batch, Py_ssize_t count,
    Py_ssize_t stride,
) noexcept nogil

# Beam reorder: row i = old row order[i], each row moved once (``work``: 3 * n ints).
cdef Py_ssize_t move_rows_raw(
    unsigned char* rows, Py_ssize_t n, Py_ssize_t width, const int32_t* order,
    unsigned char* scratch, Py_ssize_t chunks, Py_ssize_t nbytes, int32_t* work,
) noexcept nogil
