"""Decode ahead for `genai.Generator`'s per-token loop (`genai._core.decode_ahead`).

An unconstrained generator on the native driver (no guidance, stop strings, custom logits
processors, beams, speculative decoding, logprobs, graph capture or sliding-window KV) runs its
model steps on a native thread while the caller's Python holds the GIL: `generate_next_token`
then usually only takes a ready token, and beside a busy Python thread the loop no longer waits
for the GIL at every token. Everything that observes or changes more than the visible tokens
first stops the worker and drops what it ran ahead (`Generator._settle`), so results are those
of the plain loop. A caller that finds no token ready waits for `GATHER` of them (one wake-up and
one wait for the GIL per `GATHER` tokens, see `genai._core.decode_ahead`). At most `RING` runs
are made that a caller which stops early never takes; dropping such a generator does not wait
for the run in flight (a short-lived thread keeps its buffers until that run ends).

``GENAI_DECODE_AHEAD=0`` in the environment turns it off for generators created afterwards.
"""

from __future__ import annotations

import _thread
import atexit
import os
import time
import weakref
from typing import TYPE_CHECKING

from genai._core.decode_ahead import DEFAULT_GATHER, DEFAULT_RING, AheadWorker
from genai.generation.drivers.native import NativeDriver

if TYPE_CHECKING:
    from genai.generation.generator import Generator

__all__ = ["GATHER", "RING", "make_ahead", "take_step"]

#: The most steps the worker runs ahead of the caller.
RING = DEFAULT_RING
#: Steps a caller that finds none ready waits for.
GATHER = DEFAULT_GATHER


def enabled() -> bool:
    """False when ``GENAI_DECODE_AHEAD`` is ``0`` (read at each generator's creation)."""
    return os.environ.get("GENAI_DECODE_AHEAD", "1").strip() != "0"


def make_ahead(generator: Generator) -> AheadWorker | None:
    """The worker for ``generator``, or None when its steps need Python or state the worker
    cannot roll back."""
    driver = generator._driver
    loop = generator._loop
    if not enabled() or type(driver) is not NativeDriver or generator._spec is not None:
        return None
    if generator._beams is not None or generator._python_stage:
        return None
    search = generator.search
    if search.logprobs or search.top_logprobs:
        return None
    if loop.capture or loop.kv_rewind is not None:
        return None
    if getattr(driver.session, "graph_id", None) is not None:
        return None  # a session with graph capture: its runs stay in the caller's order
    worker = AheadWorker(loop, driver.rewind, RING, min(GATHER, RING))
    # No run may be in flight once the generator's buffers go (garbage collection clears a
    # cycle's objects after their weak-reference callbacks) or the interpreter shuts down: the
    # worker holds the loop and the driver (its rewind), so they outlive the generator while a
    # run is in flight. At exit `_stop_all` stops every worker instead.
    weakref.finalize(generator, _release, worker).atexit = False
    _LIVE.add(worker)
    return worker


def take_step(worker: AheadWorker) -> bool:
    """Make the running ``worker``'s next step the generator's step: True when it is taken (or
    its error raised, as the plain step raises it); False when it is to run plainly (the worker
    ended, or the KV cache must grow first), after settling the worker."""
    rc = worker.take()
    if rc == 0:
        return True
    worker.settle()
    return rc != 1 and worker.raise_error(rc)


def _release(worker: AheadWorker) -> None:
    """The generator is gone: stop its worker without waiting for the run in flight; a bare
    thread (``threading.Thread.start`` would wait for it to take the GIL) holds the worker, and
    through it the buffers that run writes, until the run ends (`_stop_all` waits for it at
    exit)."""
    if worker.abandon():
        try:
            _thread.start_new_thread(worker.wait_idle, ())
        except RuntimeError:  # no new threads (the interpreter is shutting down)
            worker.wait_idle()


#: Every worker alive: settled before a fork (no run in flight in the copied state), told
#: after it in the child that its thread is not there.
_LIVE: weakref.WeakSet[AheadWorker] = weakref.WeakSet()


def _until_idle(worker: AheadWorker) -> None:
    """Wait until ``worker`` has no run in flight (polling: an abandoned worker's drain thread
    may be its one `wait_idle` waiter)."""
    while worker.in_flight:
        time.sleep(0.0005)


def _before_fork() -> None:
    for worker in list(_LIVE):
        worker.settle()
        _until_idle(worker)  # one abandoned by a generator that is gone


@atexit.register
def _stop_all() -> None:
    """At exit: no run in flight while the interpreter and ONNX Runtime shut down."""
    for worker in list(_LIVE):
        worker.abandon()
        _until_idle(worker)


def _after_fork_in_child() -> None:
    for worker in list(_LIVE):
        worker.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
