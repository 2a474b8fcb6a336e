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
moves the last slot into the freed one. A prefill and a decode step may run at the same time
(on two threads: they have their own bindings and buffers). Several runners may share one
model, each run from its own thread (`genai.serve.scheduler_group`).

`GeneratorBatchRunner` is the fallback for other layouts (separate past/present tensors,
position_ids, combined K/V): one batch-1 `Generator` per slot, run one after another in a
decode step. Same interface and tokens, no batching speed-up; each slot's generator runs its
model through the decode driver of that model's kind (`genai.generation.drivers`).

A batch runner is not a `genai.generation.drivers.Driver`: a driver advances one batch of rows
in lockstep for one generator (one length, one native loop that chooses and commits every
row's token), while a batch runner serves independent slots, each with its own length,
filled, emptied and compacted as requests come and go, and leaves the choice of tokens to
the scheduler. Like a driver it is the model side only, and it declares what it cannot do in
the same ``unsupported`` mapping (`genai.generation.drivers.require` raises its reason).
"""

from __future__ import annotations

import abc
import mmap
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.errors import ConfigError, UnsupportedFeatureError
from genai.generation.drivers import require
from genai.generation.drivers.native import NEW_TOKEN_LOGITS, verify_output
from genai.generation.generator import Generator
from genai.generation.generator_params import GeneratorParams
from genai.runtime.verify_rows import verify_rows

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.runtime.model import Model

__all__ = [
    "BatchRunner",
    "GeneratorBatchRunner",
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


class BatchRunner(abc.ABC):
    """Common interface of the runners (see the module docstring)."""

    #: Operation -> why this runner cannot do it (as `genai.generation.drivers.Driver`):
    #: ``"snapshot"`` is prefix reuse (`export_prefix` / `load_prefix`).
    unsupported: Mapping[str, str] = MappingProxyType(
        {
            "snapshot": (
                "prefix reuse (export_prefix / load_prefix) needs slots that are rows of "
                "shared KV buffers (SlotBatchRunner)"
            )
        }
    )

    max_slots: int
    vocab_size: int
    #: Tokens each slot's KV cache holds.
    lengths: np.ndarray
    #: Longest sequence a slot may hold (the model's context length).
    max_length: int
    #: True when `decode` runs every slot in one batched model run.
    batched: bool = False
    #: The most tokens `verify` runs at once (0: the runner cannot verify, e.g. the graph
    #: returns the last position's logits only; speculative decoding then steps plainly).
    verify_tokens: int = 0

    @abc.abstractmethod
    def prefill(self, slot: int, tokens: np.ndarray) -> np.ndarray:
        """Feed ``tokens`` to ``slot`` after its cached ones; the logits after the last."""

    def prefill_inputs(self, slot: int, inputs: Any) -> np.ndarray:
        """Feed a multimodal prompt (a processor's `NamedTensors`: images and ``input_ids``)
        to the empty ``slot``; the logits after its last token. Only runners whose slots
        are Generators take one."""
        raise UnsupportedFeatureError(
            f"{type(self).__name__} takes token prompts only, not images or audio"
        )

    def verify(self, slot: int, tokens: np.ndarray, alone: bool = False) -> np.ndarray:
        """Feed ``tokens`` (at most `verify_tokens`) to ``slot`` after its cached ones, as
        `prefill`, and return the logits after EVERY one of them, float32 [count, vocab]
        (speculative decoding: row i judges the token proposed after ``tokens[i]``); the
        caller `truncate` s the slot to what it accepts. ``alone``: the run stands for decode
        steps of one row (else of two rows or more), whose numbers its rows then get where the
        CPU allows (`genai.runtime.verify_rows`)."""
        raise UnsupportedFeatureError(f"{type(self).__name__} cannot verify proposed tokens")

    def verify_many(
        self, batch: list[tuple[int, np.ndarray]], alone: bool = False
    ) -> list[np.ndarray]:
        """`verify` for several ``(slot, tokens)``, one run each (ONNX Runtime's
        GroupQueryAttention refuses several rows of several new tokens on a past)."""
        return [self.verify(slot, tokens, alone) for slot, tokens in batch]

    @abc.abstractmethod
    def decode(self, tokens: np.ndarray, advance: np.ndarray | None = None) -> np.ndarray:
        """Feed ``tokens[b]`` to slot b for b < len(tokens) in one step; logits [n, vocab].
        Rows with ``advance[b]`` False (default: all True) are fillers: their slot's length
        is left as it was (a prefill later overwrites what the step wrote there)."""

    @abc.abstractmethod
    def release(self, slot: int, active: int) -> int | None:
        """Free ``slot`` among the ``active`` compact slots 0..active-1: the last active slot
        moves into it. Returns the index that moved (now ``slot``), or None."""

    @abc.abstractmethod
    def reset(self, slot: int) -> None:
        """Empty ``slot`` for a new sequence."""

    def truncate(self, slot: int, length: int) -> None:
        """Keep only the first ``length`` positions of ``slot`` (a rewound conversation)."""
        self.lengths[slot] = min(int(self.lengths[slot]), length)

    @abc.abstractmethod
    def swap(self, a: int, b: int) -> None:
        """Exchange the contents of slots ``a`` and ``b``."""

    def load_prefix(self, slot: int, kv: list[np.ndarray], length: int) -> None:
        """Fill ``slot`` with a cached prefix (arrays from `export_prefix`) of ``length``;
        `NotImplementedError` where ``"snapshot"`` is unsupported."""
        require(self, "snapshot")
        raise NotImplementedError("load_prefix")

    def export_prefix(self, slot: int, length: int) -> list[np.ndarray] | None:
        """Copies of ``slot``'s first ``length`` KV positions (None: prefix reuse
        unsupported)."""
        return None

    @property
    def kv_bytes(self) -> int:
        """Bytes allocated for KV caches."""
        return 0


class SlotBatchRunner(BatchRunner):
    """Continuous batching over one shared-buffer GQA session (see the module docstring)."""

    batched = True
    #: Set while a prefill and a decode run at the same time: growing would move buffers.
    frozen = False
    #: Slots are rows of shared buffers: prefixes export and load.
    unsupported: Mapping[str, str] = MappingProxyType({})

    def __init__(
        self,
        model: Model,
        max_slots: int = 16,
        *,
        initial_capacity: int = 256,
        growth_factor: float = 2.0,
        block: int = 64,
        max_chunk: int = 256,
    ) -> None:
        io = self.io = model.io
        if not supports_slots(model):
            raise ValueError("SlotBatchRunner needs a GQA graph with a shared past/present buffer")
        self.model = model
        self.max_slots = max_slots
        self.vocab_size = io.vocab_size
        self.max_length = int(model.config.max_length)
        self.block = block
        self.growth_factor = growth_factor
        self.max_chunk = max_chunk
        self.lengths = np.zeros(max_slots, np.int64)
        # a binding for decode steps and one for prefills (they may run at the same time)
        self._decode = model.session.new_binding()
        self._prefill = model.session.new_binding()
        for binding in (self._decode, self._prefill):
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
        # prefills and decode have their own: they may run at the same time.
        self._ids = np.zeros(max_slots, io.id_dtype)
        self._prefill_ids = np.zeros(max_chunk, io.id_dtype)
        self._mask = np.zeros(0, io.mask_dtype)
        self._prefill_mask = np.zeros(0, io.mask_dtype)
        self._grow_mask()
        self._decode_logits = np.zeros((max_slots, self.vocab_size), io.logits_dtype)
        # Graphs built for last-position logits (the builder's default) declare a sequence
        # dim of 1 and give one row per run; the others give one row per new token.
        self._last_only = model.session.output_shapes[io.logits][1] == 1
        # A trimmed graph (genai.runtime.trimmed_logits) gives its last two positions' rows
        # for a run of more than `_trim_above` tokens (the mask is all ones), one per token for
        # shorter ones.
        trimmed = model.session.trimmed
        self._trim_above = trimmed.above if trimmed is not None else 1 << 30
        rows = 1 if self._last_only else max_chunk
        self._prefill_logits = np.zeros((rows, self.vocab_size), io.logits_dtype)
        # (rows, buffer version) the decode binding's KV is bound for
        self._decode_bound = (-1, -1)
        # Speculative verification: an output with a row per new token (the logits of a graph
        # that keeps every position, or the builder's new_token_logits for short runs), run
        # through a binding of its own (prefills never bind new_token_logits)
        found = verify_output(model.session, io.logits)
        self._verify_output = found[0] if found else None
        self.verify_tokens = min(found[1], max_chunk) if found else 0
        self._verify: Any = None
        self._verify_bound = (-1, -1)
        self._verify_logits: np.ndarray | None = None
        if found is not None and found[0] == NEW_TOKEN_LOGITS:
            dtype = model.session.output_dtypes.get(NEW_TOKEN_LOGITS) or io.logits_dtype
            self._verify_logits = np.zeros((self.verify_tokens, self.vocab_size), dtype)
        # (slot, buffer version) the prefill binding's KV is bound for
        self._prefill_bound = (-1, -1)

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
    def _bind_kv(self, session: NativeSession, rows: slice) -> None:
        for (past, present), buf in zip(self._pairs, self._buffers, strict=True):
            view = buf[rows]
            session.bind_input(past, view)
            session.bind_output(present, view)

    def prefill(self, slot: int, tokens: np.ndarray) -> np.ndarray:
        """See `BatchRunner.prefill`."""
        count = len(tokens)
        if not 0 < count <= self.max_chunk:
            raise ValueError(f"a prefill chunk holds 1..{self.max_chunk} tokens, got {count}")
        past = int(self.lengths[slot])
        total = past + count
        self.ensure(total + 1)  # the last position stays free for decode filler rows
        session = self._prefill
        if self._prefill_bound != (slot, self._version):
            self._bind_kv(session, slice(slot, slot + 1))
            self._prefill_bound = (slot, self._version)
        io = self.io
        ids, logits = self._prefill_ids, self._prefill_logits
        ids[:count] = tokens
        session.bind_input(io.input_ids, ids, (1, count))
        session.bind_input(io.attention_mask, self._prefill_mask, (1, total))
        rows = 1 if self._last_only else 2 if count > self._trim_above else count
        session.bind_output(io.logits, logits, (1, rows, self.vocab_size))
        session.run()
        self.lengths[slot] = total
        return logits[rows - 1].astype(np.float32, copy=False)

    def verify(self, slot: int, tokens: np.ndarray, alone: bool = False) -> np.ndarray:
        """See `BatchRunner.verify`. A graph whose ``logits`` keep every position runs it as
        a prefill; the builder's graphs bind ``new_token_logits`` (and ``logits``, one row)
        on a binding of their own."""
        count = len(tokens)
        if not 0 < count <= self.verify_tokens:
            raise ValueError(f"a verify run holds 1..{self.verify_tokens} tokens, got {count}")
        if self._verify_logits is None:
            with verify_rows(self._prefill, batched=not alone):  # served steps' numbers
                return self.prefill_rows(slot, tokens)
        past = int(self.lengths[slot])
        total = past + count
        self.ensure(total + 1)
        session = self._verify
        if session is None:
            session = self._verify = self.model.session.new_binding()
            self.model.bind_extra_inputs(session)
        if self._verify_bound != (slot, self._version):
            self._bind_kv(session, slice(slot, slot + 1))
            self._verify_bound = (slot, self._version)
        io = self.io
        ids = np.zeros(count, io.id_dtype)
        ids[:] = tokens
        session.bind_input(io.input_ids, ids, (1, count))
        session.bind_input(io.attention_mask, self._prefill_mask, (1, total))
        last = 1 if self._last_only else count
        session.bind_output(io.logits, self._prefill_logits, (1, last, self.vocab_size))
        rows = self._verify_logits
        session.bind_output(NEW_TOKEN_LOGITS, rows, (1, count, self.vocab_size))
        with verify_rows(session, batched=not alone):  # where it gives served steps' numbers
            session.run()
        self.lengths[slot] = total
        return rows[:count].astype(np.float32)

    def prefill_rows(self, slot: int, tokens: np.ndarray) -> np.ndarray:
        """`prefill` on a graph whose logits keep every position: every token's row,
        float32 [count, vocab] (copies)."""
        if self._last_only:
            raise UnsupportedFeatureError("the graph returns the last position's logits only")
        count = len(tokens)
        self.prefill(slot, tokens)
        return self._prefill_logits[:count].astype(np.float32)

    def decode(
        self,
        tokens: np.ndarray,
        advance: np.ndarray | None = None,
        filler_at: int = 0,
    ) -> np.ndarray:
        """See `BatchRunner.decode`. A filler row (``advance[b]`` False) writes its K/V at
        position ``max(filler_at, every row's length)`` of its slot, past anything the slot
        holds: pass a ``filler_at`` beyond the positions a prefill running at the same time
        (another thread) writes. Only the advancing rows' lengths are updated."""
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
        session = self._decode
        if self._decode_bound != (rows, self._version):
            self._bind_kv(session, slice(0, rows))
            self._decode_bound = (rows, self._version)
        io = self.io
        session.bind_input(io.input_ids, self._ids[:rows], (rows, 1))
        session.bind_input(io.attention_mask, mask)
        session.bind_output(io.logits, self._decode_logits[:rows], (rows, 1, self.vocab_size))
        session.run()
        self.lengths[real] += 1
        return self._decode_logits[:rows].astype(np.float32, copy=False)

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

    def swap(self, a: int, b: int) -> None:
        la, lb = int(self.lengths[a]), int(self.lengths[b])
        for buf in self._buffers:
            held = buf[a, :, :la, :].copy()
            buf[a, :, :lb, :] = buf[b, :, :lb, :]
            buf[b, :, :la, :] = held
        self.lengths[a], self.lengths[b] = lb, la

    def load_prefix(self, slot: int, kv: list[np.ndarray], length: int) -> None:
        self.ensure(length)
        for buf, array in zip(self._buffers, kv, strict=True):
            buf[slot, :, :length, :] = array[:, :length, :]
        self.lengths[slot] = length


class GeneratorBatchRunner(BatchRunner):
    """Fallback for KV layouts without per-row lengths: a batch-1 `Generator` per slot; a
    decode step runs them one after another (same tokens, no batching speed-up). A finished
    sequence's generator is rewound to 0 and kept for the next one: at most ``max_slots``
    generators ever exist, so their KV buffers (and, on a provider with graph capture, their
    captured graphs) are made once, not once per request."""

    batched = False

    def __init__(self, model: Model, max_slots: int = 16, *, max_chunk: int = 256) -> None:
        self.model = model
        self.max_slots = max_slots
        self.max_chunk = max_chunk
        self.vocab_size = model.io.vocab_size
        self.max_length = int(model.config.max_length)
        self.lengths = np.zeros(max_slots, np.int64)
        self._params = GeneratorParams(model)
        self._params.set_search_options(max_length=self.max_length)
        self._gens: list[Generator | None] = [None] * max_slots
        #: Generators of finished sequences, rewound to 0, for the next ones.
        self._spare: list[Generator] = []
        #: Generators made so far.
        self.generators_made = 0
        self._verify_tokens: int | None = None

    @property
    def verify_tokens(self) -> int:  # type: ignore[override]
        """See `BatchRunner.verify_tokens`: what a slot generator's driver verifies
        (`NativeDriver.verify`; asked of a spare generator once, when first read)."""
        if self._verify_tokens is None:
            gen = self._spare[-1] if self._spare else Generator(self.model, self._params)
            if gen not in self._spare:
                self.generators_made += 1
                self._spare.append(gen)
            driver = gen._driver
            most = int(getattr(driver, "verify_tokens", 0) or 0)
            self._verify_tokens = min(most, self.max_chunk) if hasattr(driver, "verify") else 0
        return self._verify_tokens

    def _generator(self, slot: int) -> Generator:
        gen = self._gens[slot]
        if gen is None:
            if self._spare:
                gen = self._spare.pop()
            else:
                gen = Generator(self.model, self._params)
                self.generators_made += 1
            self._gens[slot] = gen
        return gen

    def _retire(self, slot: int) -> None:
        """Keep ``slot``'s generator (rewound to 0) for a later sequence."""
        gen, self._gens[slot] = self._gens[slot], None
        if gen is None:
            return
        try:
            gen.rewind_to(0)
        except Exception:  # a generator left broken by a failed run is not reused
            return
        self._spare.append(gen)

    def prefill(self, slot: int, tokens: np.ndarray) -> np.ndarray:
        gen = self._generator(slot)
        gen.append_tokens(np.asarray(tokens, np.int32))
        self.lengths[slot] += len(tokens)
        return gen.get_logits()[0, 0]

    def prefill_inputs(self, slot: int, inputs: Any) -> np.ndarray:
        gen = self._generator(slot)
        gen.set_inputs(inputs)  # the model's driver runs the images with the prompt
        self.lengths[slot] = gen.token_count()
        return gen.get_logits()[0, 0]

    def verify(self, slot: int, tokens: np.ndarray, alone: bool = False) -> np.ndarray:
        """See `BatchRunner.verify`: the slot generator's driver runs its pending token (after
        a `truncate`) and ``tokens`` in one run (one-row steps' numbers, as its decode steps
        are: ``alone`` changes nothing); `truncate` rewinds the generator."""
        count = len(tokens)
        if not 0 < count <= self.verify_tokens:
            raise ValueError(f"a verify run holds 1..{self.verify_tokens} tokens, got {count}")
        gen = self._generator(slot)
        rows = gen._driver.verify(np.asarray(tokens, np.int32)[None, :])[0]
        self.lengths[slot] += count
        return rows[rows.shape[0] - count :]

    def decode(self, tokens: np.ndarray, advance: np.ndarray | None = None) -> np.ndarray:
        out = np.zeros((len(tokens), self.vocab_size), np.float32)
        for row, token in enumerate(tokens):
            if advance is None or advance[row]:
                out[row] = self.prefill(row, np.asarray([token]))
        return out

    def release(self, slot: int, active: int) -> int | None:
        last = active - 1
        self._retire(slot)
        self.lengths[slot] = 0
        if slot != last:
            self._gens[slot], self._gens[last] = self._gens[last], None
            self.lengths[slot], self.lengths[last] = self.lengths[last], 0
            return last
        return None

    def reset(self, slot: int) -> None:
        self._retire(slot)
        self.lengths[slot] = 0

    def swap(self, a: int, b: int) -> None:
        self._gens[a], self._gens[b] = self._gens[b], self._gens[a]
        self.lengths[a], self.lengths[b] = self.lengths[b], self.lengths[a]

    def truncate(self, slot: int, length: int) -> None:
        gen = self._gens[slot]
        if gen is not None and length < self.lengths[slot]:
            gen.truncate(length)
            self.lengths[slot] = length


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
        # so does a decoder split over several graphs (model.decoder.pipeline)
        and model.pipeline is None
        # and models whose decoder takes more than ids: image features merged into
        # inputs_embeds (vision) or an encoder's cross-attention KV (speech) run their driver
        and model.vision is None
        and model.encoder is None
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
