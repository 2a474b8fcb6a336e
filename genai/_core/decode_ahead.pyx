# cython: language_level=3
"""Decode ahead: a native thread runs a `DecoderLoop`'s steps while Python holds the GIL.

The per-token loop (``while not g.is_done(): g.generate_next_token()``) hands the GIL back at
every model run and, beside a busy Python thread, waits up to the switch interval to take it
again. `AheadWorker` moves the runs to a thread of its own that never takes the GIL (started
with ``PyThread_start_new_thread``, it has no Python thread state): it steps the loop into a
ring of ``ring`` slots (each slot: the step's next tokens, done flags, length, all-done flag,
return code, and the sampler's RNG state *before* the step), at most ``ring`` steps ahead of
what the caller took. `take` hands the caller the oldest slot (waiting without the GIL only
when the ring is empty); the caller's *visible* state (`length`, `all_done`, `next_tokens`,
`done`) is the last slot taken.

`settle` stops the worker (after the step in flight) and makes the loop's state the visible
one: the tokens run ahead are dropped with the driver's rewind (which keeps the KV of all but
the last visible token, the state after a plain step), the done flags, next tokens and RNG
states of the visible point are restored. The last *run* of the visible state is not kept
(the worker's runs overwrote the outputs); `replay_last_run` redoes it where a caller reads a
run's outputs or inputs. The worker runs at most ``ring`` model runs that a caller which stops
early never takes.
"""

from libc.stdint cimport int32_t, uint8_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

cimport cython

from genai._core.decoder_loop cimport DecoderLoop
from genai._core.sampling cimport RngState

import numpy as np


cdef enum:
    LOOP_NEED_GROW = -104  # decoder_loop's code for "grow the KV cache, then run"
    CMD_PAUSE = 0
    CMD_RUN = 1
    CMD_EXIT = 2

#: Slots of the ring unless told otherwise: enough to bridge the 5 ms switch interval at the
#: decode speeds of small models, and the most runs a caller that stops early never takes.
DEFAULT_RING = 3


cdef void _worker_main(void* arg) noexcept nogil:
    (<AheadWorker>arg).work()


@cython.no_gc_clear  # the worker thread reads the loop until __dealloc__ has stopped it
cdef class AheadWorker:
    """Runs ``loop``'s steps ahead on a native thread (see the module docstring).

    ``rewind(length)`` is the driver's rewind (loop and KV cache); ``ring`` the most steps
    run ahead of the caller."""

    def __cinit__(self):
        self.mutex = self.wake_worker = self.wake_caller = self.exited = NULL

    def __init__(self, DecoderLoop loop, object rewind, Py_ssize_t ring=DEFAULT_RING):
        if ring < 1:
            raise ValueError(f"ring must be >= 1, got {ring}")
        self.loop = loop
        self._rewind = rewind
        self.ring = ring
        self.batch = loop.batch
        self.sample = loop.sampler is not None
        self.rows = loop.sampler.rng.rows if self.sample else 0
        self.s_tokens = <int32_t*>calloc(ring * self.batch, sizeof(int32_t))
        self.s_done = <uint8_t*>calloc(ring * self.batch, sizeof(uint8_t))
        self.s_all_done = <uint8_t*>calloc(ring, sizeof(uint8_t))
        self.s_length = <Py_ssize_t*>calloc(ring, sizeof(Py_ssize_t))
        self.s_rc = <int*>calloc(ring, sizeof(int))
        self.s_rng = <RngState*>calloc(ring * max(self.rows, 1), sizeof(RngState))
        if (self.s_tokens == NULL or self.s_done == NULL or self.s_all_done == NULL
                or self.s_length == NULL or self.s_rc == NULL or self.s_rng == NULL):
            raise MemoryError()
        self._new_locks()
        self.next_tokens = np.zeros(self.batch, np.int32)
        self.done = np.zeros(self.batch, np.uint8)
        self.v_tokens = self.next_tokens
        self.v_done = self.done

    def __dealloc__(self):
        if self.started:
            PyThread_acquire_lock(self.mutex, 1)
            self.cmd = CMD_EXIT
            self._wake_worker_locked()
            PyThread_release_lock(self.mutex)
            with nogil:
                PyThread_acquire_lock(self.exited, 1)
        if self.mutex != NULL:
            PyThread_free_lock(self.mutex)
        if self.wake_worker != NULL:
            PyThread_free_lock(self.wake_worker)
        if self.wake_caller != NULL:
            PyThread_free_lock(self.wake_caller)
        if self.exited != NULL:
            PyThread_free_lock(self.exited)
        free(self.s_tokens)
        free(self.s_done)
        free(self.s_all_done)
        free(self.s_length)
        free(self.s_rc)
        free(self.s_rng)

    cdef _new_locks(self):
        self.mutex = PyThread_allocate_lock()
        self.wake_worker = PyThread_allocate_lock()
        self.wake_caller = PyThread_allocate_lock()
        self.exited = PyThread_allocate_lock()
        if (self.mutex == NULL or self.wake_worker == NULL or self.wake_caller == NULL
                or self.exited == NULL):
            raise MemoryError()
        # the three signals start taken: releasing one wakes its (single) waiter
        PyThread_acquire_lock(self.wake_worker, 1)
        PyThread_acquire_lock(self.wake_caller, 1)
        PyThread_acquire_lock(self.exited, 1)

    def after_fork_in_child(self):
        """In a child process (the worker was settled before the fork): its thread does not
        exist here; the next `start` starts one."""
        self.running = self.started = self.busy = False
        self.worker_waiting = self.caller_waiting = False
        self.cmd = CMD_PAUSE
        self._new_locks()  # the parent's may be held by its thread (not freed: not ours)

    # ------------------------------------------------------------------ the worker thread
    cdef inline void _wake_worker_locked(self) noexcept nogil:
        if self.worker_waiting:
            self.worker_waiting = False
            PyThread_release_lock(self.wake_worker)

    cdef inline void _wake_caller_locked(self) noexcept nogil:
        if self.caller_waiting:
            self.caller_waiting = False
            PyThread_release_lock(self.wake_caller)

    cdef void work(self) noexcept nogil:
        cdef Py_ssize_t slot, b, batch = self.batch
        cdef int rc
        cdef bint end
        PyThread_acquire_lock(self.mutex, 1)
        while self.cmd != CMD_EXIT:
            if (self.cmd == CMD_RUN and not self.finished
                    and self.produced - self.consumed < self.ring):
                slot = self.produced % self.ring
                self.busy = True
                PyThread_release_lock(self.mutex)
                end = self.loop.all_done or self.loop.length >= self.limit
                rc = 0
                if not end:
                    if self.sample:
                        memcpy(&self.s_rng[slot * self.rows], self.loop.sampler.rng.states,
                               self.rows * sizeof(RngState))
                    rc = self.loop.step_nogil()
                    for b in range(batch):
                        self.s_tokens[slot * batch + b] = self.loop.next_tokens[b]
                        self.s_done[slot * batch + b] = self.loop.done[b]
                    self.s_all_done[slot] = self.loop.all_done
                    self.s_length[slot] = self.loop.length
                    self.s_rc[slot] = rc
                PyThread_acquire_lock(self.mutex, 1)
                self.busy = False
                if end:
                    self.finished = True
                else:
                    self.produced += 1
                    if rc != 0:
                        self.finished = True
                self._wake_caller_locked()
                continue
            self.worker_waiting = True
            PyThread_release_lock(self.mutex)
            PyThread_acquire_lock(self.wake_worker, 1)
            PyThread_acquire_lock(self.mutex, 1)
        PyThread_release_lock(self.mutex)
        PyThread_release_lock(self.exited)

    # ------------------------------------------------------------------ the caller's side
    def start(self, Py_ssize_t limit):
        """Run steps ahead from the loop's current state (taken as the visible one), up to the
        sequence length ``limit``; the loop is the worker's until `settle`. A loop switched to
        graph capture since (`DecoderLoop.use_graph_capture`) is not run ahead: nothing starts."""
        cdef Py_ssize_t b
        if self.running:
            raise RuntimeError("the decode-ahead worker is running already")
        loop = self.loop
        if loop.capture:
            return
        self.length = loop.length
        self.all_done = loop.all_done
        for b in range(self.batch):
            self.v_tokens[b] = loop.next_tokens[b]
            self.v_done[b] = loop.done[b]
        self.stale_run = False
        PyThread_acquire_lock(self.mutex, 1)
        self.produced = self.consumed = 0
        self.finished = False
        self.limit = limit
        self.cmd = CMD_RUN
        self.running = True
        self._wake_worker_locked()
        PyThread_release_lock(self.mutex)
        if not self.started:
            if PyThread_start_new_thread(_worker_main, <void*>self) == <unsigned long>-1:
                self.cmd = CMD_PAUSE
                self.running = False
                raise RuntimeError("cannot start the decode-ahead thread")
            self.started = True

    def take(self):
        """The next step's result (waits without the GIL while the worker runs it): 0 when
        it is taken and visible; else the step's error code (the loop's state is then the one
        the failed step left, taken as visible; `settle` and redo the step plainly), or 1
        when the worker ended without a step (the limit or all rows done)."""
        cdef Py_ssize_t slot, b, batch = self.batch
        cdef int rc
        if not self.running:
            raise RuntimeError("the decode-ahead worker is not running")
        PyThread_acquire_lock(self.mutex, 1)
        while self.consumed == self.produced and not self.finished:
            self.caller_waiting = True
            PyThread_release_lock(self.mutex)
            with nogil:
                PyThread_acquire_lock(self.wake_caller, 1)
            PyThread_acquire_lock(self.mutex, 1)
        if self.consumed == self.produced:
            PyThread_release_lock(self.mutex)
            return 1
        slot = self.consumed % self.ring
        rc = self.s_rc[slot]
        if rc != 0:
            PyThread_release_lock(self.mutex)
            return rc
        PyThread_release_lock(self.mutex)
        for b in range(batch):  # the slot is the caller's until `consumed` moves past it
            self.v_tokens[b] = self.s_tokens[slot * batch + b]
            self.v_done[b] = self.s_done[slot * batch + b]
        self.length = self.s_length[slot]
        self.all_done = self.s_all_done[slot]
        PyThread_acquire_lock(self.mutex, 1)
        self.consumed += 1
        self._wake_worker_locked()
        PyThread_release_lock(self.mutex)
        return 0

    def fill(self):
        """Wait without the GIL until the worker is ``ring`` steps ahead or has ended (for
        tests and benchmarks: the most a caller can find run ahead)."""
        if not self.running:
            return
        PyThread_acquire_lock(self.mutex, 1)
        while self.produced - self.consumed < self.ring and not self.finished:
            self.caller_waiting = True
            PyThread_release_lock(self.mutex)
            with nogil:
                PyThread_acquire_lock(self.wake_caller, 1)
            PyThread_acquire_lock(self.mutex, 1)
        PyThread_release_lock(self.mutex)

    def settle(self):
        """Stop the worker (after the step in flight) and make the visible state the loop's:
        returns the number of steps that were run ahead and dropped."""
        cdef Py_ssize_t b, slot, dropped
        cdef DecoderLoop loop = self.loop
        if not self.running:
            return 0
        PyThread_acquire_lock(self.mutex, 1)
        self.cmd = CMD_PAUSE
        while self.busy:
            self.caller_waiting = True
            PyThread_release_lock(self.mutex)
            with nogil:
                PyThread_acquire_lock(self.wake_caller, 1)
            PyThread_acquire_lock(self.mutex, 1)
        self.running = False
        dropped = self.produced - self.consumed
        slot = self.consumed % self.ring
        if dropped and self.s_rc[(self.produced - 1) % self.ring] != 0:
            dropped -= 1  # the failed attempt (last) left the loop as a plain failed step would
        PyThread_release_lock(self.mutex)
        if dropped == 0:
            return 0  # nothing ahead, or the next slot is a failed step: the loop holds its state
        self._rewind(self.length)
        for b in range(self.batch):
            loop.next_tokens[b] = self.v_tokens[b]
            loop.done[b] = self.v_done[b]
        loop.all_done = self.all_done
        loop.generated = True
        if self.sample:
            memcpy(loop.sampler.rng.states, &self.s_rng[slot * self.rows],
                   self.rows * sizeof(RngState))
        self.stale_run = True
        return dropped

    def replay_last_run(self):
        """After a `settle` that dropped steps: run the visible state's last run again (its
        last token on the KV before it), so that the session's outputs, the logits buffer and
        the last run's inputs are the visible state's (identical to a plain loop's)."""
        cdef Py_ssize_t b
        cdef DecoderLoop loop = self.loop
        if self.running or not self.stale_run:
            return
        length = self.length
        last = np.asarray(loop.array("sequences"))[:, length - 1].copy()
        self._rewind(length - 1)
        loop.run(False)
        loop.push_tokens(last, False)
        for b in range(self.batch):
            loop.next_tokens[b] = self.v_tokens[b]
            loop.done[b] = self.v_done[b]
        loop.all_done = self.all_done
        self.stale_run = False

    def raise_error(self, int rc):
        """Raise the error of a failed step `take` reported, as the plain step would; returns
        False for a KV cache that must grow first (redo that step plainly: it grows)."""
        if rc == LOOP_NEED_GROW:
            return False
        self.loop.raise_error(rc)
        return True

    def forget_run(self):
        """The loop ran again (its outputs are current): no replay is needed."""
        self.stale_run = False
