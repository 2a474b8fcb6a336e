# cython: language_level=3
"""C-level state of the decode-ahead worker (see decode_ahead.pyx)."""

from libc.stdint cimport int32_t, int64_t, uint8_t

from genai._core.decoder_loop cimport DecoderLoop
from genai._core.sampling cimport RngState


cdef extern from "pythread.h":
    ctypedef void* PyThread_type_lock
    PyThread_type_lock PyThread_allocate_lock() nogil
    void PyThread_free_lock(PyThread_type_lock lock) nogil
    int PyThread_acquire_lock(PyThread_type_lock lock, int waitflag) nogil
    void PyThread_release_lock(PyThread_type_lock lock) nogil
    unsigned long PyThread_start_new_thread(void (*func)(void*), void* arg)


cdef class AheadWorker:
    cdef DecoderLoop loop
    cdef object _rewind
    cdef PyThread_type_lock mutex, wake_worker, wake_caller, exited
    cdef int cmd
    cdef bint started, worker_waiting, caller_waiting, busy, finished
    cdef readonly bint running
    cdef readonly Py_ssize_t ring, produced, consumed
    cdef Py_ssize_t batch, rows, limit
    #: a caller that finds the ring empty waits for this many steps (or the worker's end)
    cdef public Py_ssize_t gather
    cdef Py_ssize_t caller_need      # the waiting caller wakes at this many steps ahead
    cdef bint sample
    # ring slots
    cdef int32_t* s_tokens
    cdef uint8_t* s_done
    cdef uint8_t* s_all_done
    cdef Py_ssize_t* s_length
    cdef int* s_rc
    cdef RngState* s_rng
    cdef int64_t* s_ready            # when the worker finished the slot's step (monotonic ns)
    # counters (see `stats`): caller side, then worker side
    cdef int64_t n_takes, n_empty, ns_wait_token, ns_wait_gil, ns_wake, ns_lag, ns_between
    cdef int64_t n_long_gaps, t_left_take, t_signal
    cdef int64_t n_steps, ns_steps, n_full, ns_full, ns_gaps, ns_steps_cpu
    # the visible state (the last slot taken, or the state at `start`)
    cdef readonly Py_ssize_t length
    cdef readonly bint all_done
    cdef readonly object next_tokens
    cdef readonly object done
    cdef int32_t[::1] v_tokens
    cdef uint8_t[::1] v_done
    #: the loop's outputs are not those of the visible state's last run (see replay_last_run)
    cdef readonly bint stale_run
    cdef object __weakref__

    cdef _new_locks(self)
    cdef inline void _wake_worker_locked(self) noexcept nogil
    cdef inline void _wake_caller_locked(self) noexcept nogil
    cdef int64_t _wait_signal(self) noexcept
    cdef void work(self) noexcept nogil
