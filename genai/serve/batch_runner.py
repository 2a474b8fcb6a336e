"""Slot-based batch runners: the model side of continuous batching.

A runner owns ``max_slots`` slots; each holds one sequence's KV cache. Two kinds of runs:

* `prefill(slot, tokens)` feeds a chunk of tokens to one slot (a newcomer's prompt, a piece of
  it, or tokens forced by a grammar) and returns the logits after its last token;
* `decode(tokens)` feeds one token to each of the slots ``0..n-1`` in ONE batched model run
  and returns their logits ``[n, vocab]``.

`SlotBatchRunner` (GroupQueryAttention graphs with a shared past/present KV buffer, the
layout the reference's builder writes): every K/V tensor is one ``[max_slots, kv_heads,
capacity, head]`` buffer. Slot ``b`` is the contiguous block ``buffer[b]``: a prefill binds it
as a batch-1 view; a decode step binds ``buffer[:n]``. Each row's past length comes from its
own attention-mask row (GQA computes ``seqlens_k = sum(mask) - 1`` per row and writes the new
entry there, rotary included), so rows of different lengths decode together without padding
tokens. Capacity (positions per slot) starts at ``initial_capacity`` and doubles as the
longest sequence needs: the new buffers are fresh memory maps (no zero-filling pass) and only
the positions each slot holds are copied. Active slots are kept compact (``0..n-1``): `release`
moves the last slot into the freed one.

Lanes: up to ``lanes`` runs may be in flight at once, each on its own binding and buffers
(prefills of different slots on different lanes; a decode step cut into contiguous row groups
of two rows or more, `split_rows`, run on as many threads). A row's logits are the same in any
run of two or more rows, so the cut never changes tokens; `LaneChooser` decides per step
whether cutting pays (it costs more CPU time in all and only helps when cores are free).

`GeneratorBatchRunner` is the fallback for other layouts (separate past/present tensors,
position_ids, combined K/V): one batch-1 `Generator` per slot, run one after another in a
decode step. Same interface and tokens, no batching speed-up.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import mmap
import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..model import Model

__all__ = [
    "BatchRunner",
    "GeneratorBatchRunner",
    "LaneChooser",
    "SlotBatchRunner",
    "make_batch_runner",
]


def _lazy_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed, page-aligned array from a fresh anonymous memory map: no zero-filling pass
    (numpy's calloc'd zeros are written by glibc once its mmap threshold has grown), pages
    come from the OS as they are first written."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    region = mmap.mmap(-1, max(1, count * dtype.itemsize))
    return np.frombuffer(region, dtype, count=count).reshape(shape)


class BatchRunner:
    """Common interface of the runners (see the module docstring)."""

    max_slots: int
    vocab_size: int
    #: Tokens each slot's KV cache holds.
    lengths: np.ndarray
    #: Longest sequence a slot may hold (the model's context length).
    max_length: int
    #: True when `decode` runs every slot in one batched model run.
    batched: bool = False
    #: Threads runs may use at the same time (`prefill` ``lane`` indices, decode groups).
    lanes: int = 1

    def prefill(self, slot: int, tokens: np.ndarray, lane: int = 0) -> np.ndarray:
        """Feed ``tokens`` to ``slot`` after its cached ones; the logits after the last.
        Prefills of different slots on different lanes may run at the same time."""
        raise NotImplementedError

    def decode(self, tokens: np.ndarray, advance: np.ndarray | None = None) -> np.ndarray:
        """Feed ``tokens[b]`` to slot b for b < len(tokens) in one step; logits [n, vocab].
        Rows with ``advance[b]`` False (default: all True) are fillers: their slot's length
        is left as it was (a prefill later overwrites what the step wrote there)."""
        raise NotImplementedError

    def release(self, slot: int, active: int) -> int | None:
        """Free ``slot`` among the ``active`` compact slots 0..active-1: the last active slot
        moves into it. Returns the index that moved (now ``slot``), or None."""
        raise NotImplementedError

    def reset(self, slot: int) -> None:
        """Empty ``slot`` for a new sequence."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the threads the runner started (if any)."""

    def load_prefix(self, slot: int, kv: list[np.ndarray], length: int) -> None:
        """Fill ``slot`` with a cached prefix (arrays from `export_prefix`) of ``length``."""
        raise NotImplementedError

    def export_prefix(self, slot: int, length: int) -> list[np.ndarray] | None:
        """Copies of ``slot``'s first ``length`` KV positions (None: prefix reuse
        unsupported)."""
        return None

    @property
    def kv_bytes(self) -> int:
        """Bytes allocated for KV caches."""
        return 0


class LaneChooser:
    """Whether to cut a decode step over the lanes: keeps the recent wall time per row of
    split and whole steps (exponential averages, steps of 4 rows or more) and picks the
    faster way, trying the other one every ``explore``-th step. Splitting uses the idle
    cores of a quiet machine; on a busy one (other processes on the cores) the split step
    waits for its slowest group and costs more CPU time in all, and one run is faster."""

    def __init__(self, lanes: int, explore: int = 16, alpha: float = 0.25) -> None:
        self.max_lanes = lanes
        self.explore = explore
        self.alpha = alpha
        #: seconds per row: [whole steps, split steps] (None: not measured yet)
        self.cost: list[float | None] = [None, None]
        self.steps = 0

    def lanes(self, rows: int) -> int:
        """Lanes for a step of ``rows`` rows."""
        if self.max_lanes < 2 or rows < 4:
            return 1
        self.steps += 1
        whole, split = self.cost
        if split is None or whole is None:
            return self.max_lanes if split is None else 1
        best = split < whole
        if self.steps % self.explore == 0:
            best = not best
        return self.max_lanes if best else 1

    def record(self, rows: int, groups: int, seconds: float) -> None:
        """A step of ``rows`` rows in ``groups`` groups took ``seconds``."""
        if rows < 4:
            return
        k = 1 if groups > 1 else 0
        per_row = seconds / rows
        old = self.cost[k]
        self.cost[k] = per_row if old is None else old + self.alpha * (per_row - old)


class SlotBatchRunner(BatchRunner):
    """Continuous batching over one shared-buffer GQA session (see the module docstring)."""

    batched = True
    #: Set while a prefill and a decode run at the same time: growing would move buffers.
    frozen = False

    def __init__(
        self,
        model: Model,
        max_slots: int = 16,
        *,
        initial_capacity: int = 256,
        growth_factor: float = 2.0,
        block: int = 64,
        max_chunk: int = 256,
        lanes: int = 1,
    ) -> None:
        io = self.io = model.io
        if not supports_slots(model):
            raise ValueError("SlotBatchRunner needs a GQA graph with a shared past/present buffer")
        self.model = model
        self.max_slots = max_slots
        self.vocab_size = io.vocab_size
        self.max_length = int(model.config.context_length)
        self.block = block
        self.growth_factor = growth_factor
        self.max_chunk = max_chunk
        self.lengths = np.zeros(max_slots, np.int64)
        #: Decode lanes: a decode step of 2 x lanes rows or more is cut into row groups (two
        #: rows or more each) that run at the same time on as many threads.
        self.lanes = max(1, min(int(lanes), max_slots // 2))
        self._lane_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._chooser = LaneChooser(self.lanes)
        #: Decode steps cut over several lanes so far.
        self.split_steps = 0
        # one binding per lane for decode groups and one per lane for prefills (runs of
        # different lanes may be in flight at the same time)
        self._decodes = [model.session.new_binding() for _ in range(self.lanes)]
        self._prefills = [model.session.new_binding() for _ in range(self.lanes)]
        for binding in (*self._decodes, *self._prefills):
            model.bind_extra_inputs(binding)
        self._pairs = [
            (past, present)
            for pk, ck, pv, cv in zip(
                io.past_keys, io.present_keys, io.past_values, io.present_values, strict=True
            )
            for past, present in ((pk, ck), (pv, cv))
        ]
        self._buffers: list[np.ndarray] = []
        self.capacity = 0
        self._version = 0
        first = initial_capacity or self.max_length
        self._allocate(min(self.max_length, max(block, first)))
        # Inputs and outputs, allocated once for the largest shapes and bound as prefixes;
        # prefills (one set per lane) and decode have their own: they may run at the same time.
        self._ids = np.zeros(max_slots, io.id_dtype)
        self._prefill_ids = [np.zeros(max_chunk, io.id_dtype) for _ in range(self.lanes)]
        self._mask = np.zeros(0, io.mask_dtype)
        self._prefill_mask = np.zeros(0, io.mask_dtype)
        self._grow_mask()
        self._decode_logits = np.zeros((max_slots, self.vocab_size), io.logits_dtype)
        self._prefill_logits = [
            np.zeros((max_chunk, self.vocab_size), io.logits_dtype) for _ in range(self.lanes)
        ]
        # per lane: (first row, rows, buffer version) the KV is bound for
        self._decode_bound: list[tuple[int, int, int]] = [(-1, -1, -1)] * self.lanes
        # per lane: (slot, buffer version) the prefill binding's KV is bound for
        self._prefill_bound: list[tuple[int, int]] = [(-1, -1)] * self.lanes

    # --- memory ---------------------------------------------------------------------------------
    def _allocate(self, capacity: int) -> None:
        io = self.io
        shape = (self.max_slots, io.kv_heads, capacity, io.head_size)
        old = self._buffers
        used = [(b, int(n)) for b, n in enumerate(self.lengths) if n > 0]
        self._buffers = []
        for index in range(len(self._pairs)):
            buf = _lazy_zeros(shape, io.kv_dtype)
            for slot, n in used:  # only what the slots hold
                buf[slot, :, :n, :] = old[index][slot, :, :n, :]
            self._buffers.append(buf)
        self.capacity = capacity
        self._version += 1

    def _grow_mask(self) -> None:
        self._mask = np.ones(self.max_slots * self.capacity, self.io.mask_dtype)
        self._prefill_mask = np.ones(self.capacity, self.io.mask_dtype)

    def ensure(self, needed: int) -> None:
        """Grow every slot's capacity to at least ``needed`` positions (not while a run is in
        flight: call it before running prefill and decode at the same time)."""
        if needed <= self.capacity:
            return
        if self.frozen:
            raise RuntimeError("KV buffers cannot grow while runs are in flight")
        if needed > self.max_length:
            raise ValueError(f"{needed} positions exceed the context length {self.max_length}")
        target = max(needed, int(self.capacity * self.growth_factor))
        target = -(-target // self.block) * self.block
        self._allocate(min(target, self.max_length))
        self._grow_mask()

    @property
    def kv_bytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    # --- runs -----------------------------------------------------------------------------------
    def _bind_kv(self, session, rows: slice) -> None:
        for (past, present), buf in zip(self._pairs, self._buffers, strict=True):
            view = buf[rows]
            session.bind_input(past, view)
            session.bind_output(present, view)

    def prefill(self, slot: int, tokens: np.ndarray, lane: int = 0) -> np.ndarray:
        """See `BatchRunner.prefill`; ``lane`` picks the binding and buffers, so prefills of
        different slots on different lanes may run at the same time (on as many threads)."""
        count = len(tokens)
        if not 0 < count <= self.max_chunk:
            raise ValueError(f"a prefill chunk holds 1..{self.max_chunk} tokens, got {count}")
        past = int(self.lengths[slot])
        total = past + count
        self.ensure(total + 1)  # the last position stays free for decode filler rows
        session = self._prefills[lane]
        if self._prefill_bound[lane] != (slot, self._version):
            self._bind_kv(session, slice(slot, slot + 1))
            self._prefill_bound[lane] = (slot, self._version)
        io = self.io
        ids, logits = self._prefill_ids[lane], self._prefill_logits[lane]
        ids[:count] = tokens
        session.bind_input(io.input_ids, ids, (1, count))
        session.bind_input(io.attention_mask, self._prefill_mask, (1, total))
        session.bind_output(io.logits, logits, (1, count, self.vocab_size))
        session.run()
        self.lengths[slot] = total
        return logits[count - 1].astype(np.float32, copy=False)

    @staticmethod
    def split_rows(rows: int, lanes: int) -> list[tuple[int, int]]:
        """``rows`` cut into at most ``lanes`` contiguous groups of two rows or more, as even
        as possible: [(first row, end), ...]."""
        groups = max(1, min(lanes, rows // 2))
        bounds = [rows * k // groups for k in range(groups + 1)]
        return list(itertools.pairwise(bounds))

    def decode(
        self,
        tokens: np.ndarray,
        advance: np.ndarray | None = None,
        filler_at: int = 0,
        lanes: int | None = None,
    ) -> np.ndarray:
        """See `BatchRunner.decode`. A filler row (``advance[b]`` False) writes its K/V at
        position ``max(filler_at, every row's length)`` of its slot, past anything the slot
        holds: pass a ``filler_at`` beyond the positions a prefill running at the same time
        (another thread) writes. Only the advancing rows' lengths are updated.

        ``lanes``: the step's rows are cut into that many groups of two rows or more
        (`split_rows`, at most the runner's lanes), run at the same time on as many threads.
        A row's logits are the same whatever group it runs in (the kernels give any row of a
        run of two or more rows the same result). Default: `LaneChooser` picks 1 or all lanes
        from the step times measured so far (splitting costs more CPU time in all, so it pays
        only when the other cores are free)."""
        rows = len(tokens)
        if not 0 < rows <= self.max_slots:
            raise ValueError(f"decode needs 1..{self.max_slots} rows, got {rows}")
        moving = np.ones(rows, bool) if advance is None else np.asarray(advance[:rows], bool)
        real = np.flatnonzero(moving)
        if real.size == 0:
            raise ValueError("decode needs at least one advancing row")
        lengths = self.lengths[:rows].copy()
        if real.size < rows:
            position = max(int(filler_at), int(lengths.max()))
            lengths[~moving] = position
        width = int(lengths.max()) + 1
        self.ensure(width)
        self._ids[:rows] = tokens
        mask = self._mask[: rows * width].reshape(rows, width)
        # Row b attends to its own past plus the new token: ones then zeros.
        mask[:] = np.arange(width)[None, :] <= lengths[:, None]
        chosen = lanes is None
        if chosen:
            lanes = self._chooser.lanes(rows) if self.lanes > 1 else 1
        groups = self.split_rows(rows, min(lanes, self.lanes))
        self.split_steps += len(groups) > 1
        started = time.perf_counter()
        if len(groups) == 1:
            self._run_group(0, 0, rows, mask)
        else:
            if self._lane_pool is None:
                self._lane_pool = concurrent.futures.ThreadPoolExecutor(
                    self.lanes - 1, thread_name_prefix="genai-lane"
                )
            futures = [
                self._lane_pool.submit(self._run_group, lane, lo, hi, mask)
                for lane, (lo, hi) in enumerate(groups)
                if lane
            ]
            try:
                self._run_group(0, *groups[0], mask)
            finally:
                for future in futures:
                    future.result()
        if chosen:  # steps beside a prefill (lanes given) would skew the comparison
            self._chooser.record(rows, len(groups), time.perf_counter() - started)
        self.lengths[real] += 1
        return self._decode_logits[:rows].astype(np.float32, copy=False)

    def _run_group(self, lane: int, lo: int, hi: int, mask: np.ndarray) -> None:
        """One model run over rows ``lo..hi-1`` of a decode step (inputs already written)."""
        session = self._decodes[lane]
        rows = hi - lo
        if self._decode_bound[lane] != (lo, rows, self._version):
            self._bind_kv(session, slice(lo, hi))
            self._decode_bound[lane] = (lo, rows, self._version)
        io = self.io
        session.bind_input(io.input_ids, self._ids[lo:hi], (rows, 1))
        session.bind_input(io.attention_mask, mask[lo:hi])
        session.bind_output(io.logits, self._decode_logits[lo:hi], (rows, 1, self.vocab_size))
        session.run()

    def close(self) -> None:
        """Stop the lane threads (if any)."""
        if self._lane_pool is not None:
            self._lane_pool.shutdown(wait=True)
            self._lane_pool = None

    # --- slots ----------------------------------------------------------------------------------
    def release(self, slot: int, active: int) -> int | None:
        last = active - 1
        moved = None
        if slot != last:
            used = int(self.lengths[last])
            for buf in self._buffers:
                buf[slot, :, :used, :] = buf[last, :, :used, :]
            self.lengths[slot] = used
            moved = last
        self.lengths[last] = 0
        return moved

    def reset(self, slot: int) -> None:
        """Empty ``slot`` (its KV positions are overwritten by the next prefill)."""
        self.lengths[slot] = 0

    def export_prefix(self, slot: int, length: int) -> list[np.ndarray]:
        return [buf[slot, :, :length, :].copy() for buf in self._buffers]

    def load_prefix(self, slot: int, kv: list[np.ndarray], length: int) -> None:
        self.ensure(length)
        for buf, array in zip(self._buffers, kv, strict=True):
            buf[slot, :, :length, :] = array[:, :length, :]
        self.lengths[slot] = length


class GeneratorBatchRunner(BatchRunner):
    """Fallback for KV layouts without per-row lengths: a batch-1 `Generator` per slot; a
    decode step runs them one after another (same tokens, no batching speed-up)."""

    batched = False

    def __init__(self, model: Model, max_slots: int = 16, *, max_chunk: int = 256) -> None:
        from ..generator_params import GeneratorParams

        self.model = model
        self.max_slots = max_slots
        self.max_chunk = max_chunk
        self.vocab_size = model.io.vocab_size
        self.max_length = int(model.config.context_length)
        self.lengths = np.zeros(max_slots, np.int64)
        self._params = GeneratorParams(model)
        self._params.set_search_options(max_length=self.max_length)
        self._gens: list = [None] * max_slots

    def _generator(self, slot: int):
        from ..generator import Generator

        if self._gens[slot] is None:
            self._gens[slot] = Generator(self.model, self._params)
        return self._gens[slot]

    def prefill(self, slot: int, tokens: np.ndarray, lane: int = 0) -> np.ndarray:
        gen = self._generator(slot)
        gen.append_tokens(np.asarray(tokens, np.int32))
        self.lengths[slot] += len(tokens)
        return gen.get_logits()[0, 0]

    def decode(self, tokens: np.ndarray, advance: np.ndarray | None = None) -> np.ndarray:
        out = np.zeros((len(tokens), self.vocab_size), np.float32)
        for row, token in enumerate(tokens):
            if advance is None or advance[row]:
                out[row] = self.prefill(row, np.asarray([token]))
        return out

    def release(self, slot: int, active: int) -> int | None:
        last = active - 1
        self._gens[slot] = None
        self.lengths[slot] = 0
        if slot != last:
            self._gens[slot], self._gens[last] = self._gens[last], None
            self.lengths[slot], self.lengths[last] = self.lengths[last], 0
            return last
        return None

    def reset(self, slot: int) -> None:
        self._gens[slot] = None
        self.lengths[slot] = 0


def supports_slots(model: Model) -> bool:
    """True when ``model``'s graph suits `SlotBatchRunner`: GroupQueryAttention-style inputs
    (ids + attention mask, no position_ids), split K/V, shared past/present buffer."""
    io = model.io
    share = bool(model.config.get("search.past_present_share_buffer", False))
    slid = (model.config.get("model.decoder.sliding_window") or {}).get("slide_key_value_cache")
    return (
        share
        and io.attention_mask is not None
        and io.position_ids is None
        and not io.combined_kv
        and "shared" in model.provider.capabilities.kv_layouts
        # row views of host buffers: a provider keeping KV on its device takes the fallback
        and model.provider.placement.kv_cache == "cpu"
        # a static cache the engine slides (QNN-style windows) runs through Generators
        and not slid
        and bool(io.past_keys)
    )


def make_batch_runner(model: Model, max_slots: int = 16, **options: int) -> BatchRunner:
    """The best runner for ``model``: `SlotBatchRunner` when its layout allows, else the
    `GeneratorBatchRunner` fallback."""
    if model.provider.session_kv is not None:
        raise ConfigError(
            f"genai serve needs a KV cache the engine holds per request; {model.provider.name} "
            "keeps one sequence inside the session (OpenVINO enable_causallm): turn it off "
            "to serve this model"
        )
    if supports_slots(model):
        return SlotBatchRunner(model, max_slots, **options)
    return GeneratorBatchRunner(model, max_slots, max_chunk=options.get("max_chunk", 256))
