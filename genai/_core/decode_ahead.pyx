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

A caller that finds the ring empty waits until ``gather`` steps are ready (or the worker
ended), not one: each wait costs a wake-up that takes a core from the worker and, beside a busy
Python thread, up to a switch interval to take the GIL back, so the caller pays them once per
``gather`` tokens; the worker keeps running meanwhile (``ring`` > ``gather`` leaves it room
for the steps made while the caller waits for the GIL).

`settle` stops the worker (after the step in flight) and makes the loop's state the visible
one: the tokens run ahead are dropped with the driver's rewind (which keeps the KV of all but
the last visible token, the state after a plain step), the done flags, next tokens and RNG
states of the visible point are restored. The last *run* of the visible state is not kept
(the worker's runs overwrote the outputs); `replay_last_run` redoes it where a caller reads a
run's outputs or inputs. The worker runs at most ``ring`` model runs that a caller which stops
early never takes.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy
from posix.time cimport CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID, clock_gettime, timespec

cimport cython

from genai._core.decoder_loop cimport DecoderLoop
from genai._core.sampling cimport RngState

import numpy as np


cdef enum:
    LOOP_NEED_GROW = -104  # decoder_loop's code for "grow the KV cache, then run"
    CMD_PAUSE = 0
    CMD_RUN = 1
    CMD_EXIT = 2

#: Slots of the ring unless told otherwise: the most runs a caller that stops early never takes.
#: `DEFAULT_GATHER` steps a waiting caller takes at once, plus room for the steps the worker
#: makes while that caller waits for the GIL (a 5 ms switch interval is about one step of a
#: small model on one core).
DEFAULT_RING = 6
#: Steps a caller that finds the ring empty waits for (docs/benchmarks.md, decode ahead: the
#: worker's time between steps beside a spinning thread, by gather).
DEFAULT_GATHER = 3


cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline int64_t _thread_cpu_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef void _worker_main(void* arg) noexcept nogil:
    (<AheadWorker>arg).work()


@cython.no_gc_clear  # the worker thread reads the loop until __dealloc__ has stopped it
cdef class AheadWorker:
    """Runs ``loop``'s steps ahead on a native thread (see the module docstring).

    ``rewind(length)`` is the driver's rewind (loop and KV cache); ``ring`` the most steps
    run ahead of the caller."""

    def __cinit__(self):
        self.mutex = self.wake_worker = self.wake_caller = self.exited = NULL

    def __init__(self, DecoderLoop loop, object rewind, Py_ssize_t ring=DEFAULT_RING,
                 Py_ssize_t gather=DEFAULT_GATHER):
        if ring < 1:
            raise ValueError(f"ring must be >= 1, got {ring}")
        if not 1 <= gather <= ring:
            raise ValueError(f"gather must be in [1, ring={ring}], got {gather}")
        self.loop = loop
        self._rewind = rewind
        self.ring = ring
        self.gather = gather
        self.batch = loop.batch
        self.sample = loop.sampler is not None
        self.rows = loop.sampler.rng.rows if self.sample else 0
        self.s_tokens = <int32_t*>calloc(ring * self.batch, sizeof(int32_t))
        self.s_done = <uint8_t*>calloc(ring * self.batch, sizeof(uint8_t))
        self.s_all_done = <uint8_t*>calloc(ring, sizeof(uint8_t))
        self.s_length = <Py_ssize_t*>calloc(ring, sizeof(Py_ssize_t))
        self.s_rc = <int*>calloc(ring, sizeof(int))
        self.s_rng = <RngState*>calloc(ring * max(self.rows, 1), sizeof(RngState))
        self.s_ready = <int64_t*>calloc(ring, sizeof(int64_t))
        if (self.s_ready == NULL or self.s_tokens == NULL or self.s_done == NULL
                or self.s_all_done == NULL or self.s_length == NULL or self.s_rc == NULL
                or self.s_rng == NULL):
            raise MemoryError()
        self._new_locks()
        self.next_tokens = np.zeros(self.batch, np.int32)
        self.done = np.zeros(self.batch, np.uint8)
        self.v_tokens = self.next_tokens
        self.v_done = self.done

    def __dealloc__(self):
        cdef bint busy
        if self.started:
            PyThread_acquire_lock(self.mutex, 1)
            self.cmd = CMD_EXIT
            busy = self.busy
            self._wake_worker_locked()
            PyThread_release_lock(self.mutex)
            if busy:
                with nogil:
                    PyThread_acquire_lock(self.exited, 1)
            else:
                # An idle thread only wakes and exits (it never takes the GIL): wait with the
                # GIL held, instead of waiting a switch interval for it beside a busy thread.
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
        free(self.s_ready)

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
        if self.caller_waiting and (self.finished or self.cmd != CMD_RUN
                                    or self.produced - self.consumed >= self.caller_need):
            self.caller_waiting = False
            self.t_signal = _now_ns()
            PyThread_release_lock(self.wake_caller)

    cdef int64_t _wait_signal(self) noexcept:
        # (the mutex held, the GIL held) wait without the GIL for the worker's next signal to
        # the caller; returns the time it came, with the mutex held again. The mutex is taken
        # back only once the GIL is: no thread may wait for the GIL while it holds the mutex,
        # because the callers' side (`in_flight`, `abandon`, `take`, ...) takes the mutex with
        # the GIL held; a waiter woken here that took the mutex first and then waited for the
        # GIL deadlocked with such a thread (at exit: `_stop_all`'s `abandon` beside a dropped
        # generator's `wait_idle` thread).
        cdef int64_t woken
        with nogil:
            self.caller_waiting = True
            PyThread_release_lock(self.mutex)
            PyThread_acquire_lock(self.wake_caller, 1)
            woken = _now_ns()
        PyThread_acquire_lock(self.mutex, 1)
        return woken

    cdef void work(self) noexcept nogil:
        cdef Py_ssize_t slot, b, batch = self.batch
        cdef int rc
        cdef bint end, full
        cdef int64_t t0, c0, last = 0
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
                    t0 = _now_ns()
                    c0 = _thread_cpu_ns()
                    if last:
                        self.ns_gaps += t0 - last
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
                    self.s_ready[slot] = _now_ns()
                    self.ns_steps_cpu += _thread_cpu_ns() - c0
                    self.n_steps += 1
                    self.ns_steps += self.s_ready[slot] - t0
                    last = self.s_ready[slot]
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
            full = self.cmd == CMD_RUN and not self.finished
            last = 0
            t0 = _now_ns() if full else 0
            self.worker_waiting = True
            PyThread_release_lock(self.mutex)
            PyThread_acquire_lock(self.wake_worker, 1)
            PyThread_acquire_lock(self.mutex, 1)
            if full:
                self.n_full += 1
                self.ns_full += _now_ns() - t0
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
        self.t_left_take = 0
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
        """The next step's result (when none is ready, waits without the GIL until ``gather``
        are, or the worker ended): 0 when it is taken and visible; else the step's error code
        (the loop's state is then the one the failed step left, taken as visible; `settle` and
        redo the step plainly), or 1 when the worker ended without a step (the limit or all
        rows done)."""
        cdef Py_ssize_t slot, b, need, batch = self.batch
        cdef int rc
        cdef int64_t t0, t1 = 0, t2
        if not self.running:
            raise RuntimeError("the decode-ahead worker is not running")
        t0 = _now_ns()
        if self.t_left_take:
            self.ns_between += t0 - self.t_left_take
            if t0 - self.t_left_take > 1000000:
                self.n_long_gaps += 1
        self.n_takes += 1
        PyThread_acquire_lock(self.mutex, 1)
        need = 1
        if self.consumed == self.produced and not self.finished:
            self.n_empty += 1
            if self.consumed:  # (the first step after `start` is not held back)
                need = max(1, min(self.gather, self.ring))
        self.caller_need = need
        while self.produced - self.consumed < need and not self.finished:
            t0 = _now_ns()
            t1 = self._wait_signal()
            t2 = _now_ns()
            self.ns_wait_token += t1 - t0
            self.ns_wait_gil += t2 - t1
        if self.consumed == self.produced:
            PyThread_release_lock(self.mutex)
            return 1
        slot = self.consumed % self.ring
        t2 = _now_ns()
        if t1:
            self.ns_wake += t1 - self.t_signal
        self.ns_lag += t2 - self.s_ready[slot]
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
        self.t_left_take = _now_ns()
        return 0

    def stats(self):
        """Counters since the worker was made (or `reset_stats`), times in ms: ``takes``,
        ``empty`` (takes that found the ring empty), ``wait_token`` (waiting for the worker,
        GIL released), ``wait_gil`` (from the wake-up to holding the GIL again), ``wake``
        (from the worker's signal to the waiting caller's wake-up), ``lag`` (from a slot's
        step ending to its take), ``between`` / ``long_gaps`` (the caller's time between takes
        / gaps over 1 ms), ``steps`` / ``step`` / ``step_cpu`` (the worker's steps, their wall
        and thread CPU time), ``gaps`` (the worker's time between consecutive steps), ``full`` /
        ``full_wait`` (the worker's waits on a full ring and their time)."""
        ms = 1e-6
        return {
            "takes": self.n_takes, "empty": self.n_empty,
            "wait_token": self.ns_wait_token * ms, "wait_gil": self.ns_wait_gil * ms,
            "wake": self.ns_wake * ms, "lag": self.ns_lag * ms,
            "between": self.ns_between * ms, "long_gaps": self.n_long_gaps,
            "steps": self.n_steps, "step": self.ns_steps * ms, "gaps": self.ns_gaps * ms,
            "step_cpu": self.ns_steps_cpu * ms,
            "full": self.n_full, "full_wait": self.ns_full * ms,
        }

    def reset_stats(self):
        """Zero the counters of `stats`."""
        PyThread_acquire_lock(self.mutex, 1)
        self.n_takes = self.n_empty = self.ns_wait_token = self.ns_wait_gil = 0
        self.ns_wake = self.ns_lag = self.ns_between = self.n_long_gaps = 0
        self.n_steps = self.ns_steps = self.n_full = self.ns_full = self.ns_gaps = 0
        self.ns_steps_cpu = 0
        PyThread_release_lock(self.mutex)

    def fill(self):
        """Wait without the GIL until the worker is ``ring`` steps ahead or has ended (for
        tests and benchmarks: the most a caller can find run ahead)."""
        if not self.running:
            return
        PyThread_acquire_lock(self.mutex, 1)
        self.caller_need = self.ring
        while self.produced - self.consumed < self.ring and not self.finished:
            self._wait_signal()
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
            self._wait_signal()
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

    def abandon(self):
        """Stop running ahead for a caller that is gone: nothing is rolled back and the step
        in flight is not waited for. True while that step runs (the loop, its session and its
        buffers must stay alive until `wait_idle` returns: this object holds them)."""
        cdef bint busy
        PyThread_acquire_lock(self.mutex, 1)
        self.cmd = CMD_PAUSE
        self.running = False
        busy = self.busy
        PyThread_release_lock(self.mutex)
        return busy

    @property
    def in_flight(self):
        """A step is running on the worker's thread."""
        cdef bint busy
        PyThread_acquire_lock(self.mutex, 1)
        busy = self.busy
        PyThread_release_lock(self.mutex)
        return busy

    def wait_idle(self):
        """Wait without the GIL until no step is in flight (after `abandon`; one waiter at a
        time: others poll `in_flight`)."""
        PyThread_acquire_lock(self.mutex, 1)
        while self.busy:
            self._wait_signal()
        PyThread_release_lock(self.mutex)

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
