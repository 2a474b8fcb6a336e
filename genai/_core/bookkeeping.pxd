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
