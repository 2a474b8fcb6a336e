"""KV-cache layouts, bound to the decoder session once.

* `SharedKVCache` — ``past_present_share_buffer``: one ``[batch, kv_heads, capacity, head]``
  buffer per layer for K and for V, bound once as both the past input and the present output;
  the graph (GroupQueryAttention) writes new entries in place. Capacity grows on demand.
* `GrowingKVCache` — the default layout: past starts empty; after each run the decode loop
  hands each present output to its past input without copying (ORT allocates the presents).
  Handles combined K/V (GPT-2 ``past_%d``).

**Sliding-window layers** (``model.decoder.sliding_window``, `DecoderIO.window_layers`): the
graph's GroupQueryAttention runs with ``local_window_size=W`` and ``sliding_window_cache=1``,
so the op indexes a cache of a fixed capacity C >= W itself: after a step that leaves a row
with T tokens, cache rows ``[0, L)`` hold its last L positions in order, with
``L = T`` while ``T <= C`` and ``L = T - G * ceil((T - C) / G)``, ``G = C - W + 1``, after
(`resident_rows`): it evicts ``G`` positions at once by compaction. Both layouts give those
layers a buffer of C positions (`window_capacity`: W plus the provider's slack, 16 on the CPU,
as the reference) instead of ``max_length``; the other layers keep the full length. Rewinds,
snapshots and restores re-lay the resident rows for the new token count (`relayout`), which
works as long as the positions the next token attends to (the last W - 1) are still resident.
"""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING

import numpy as np

from genai.errors import InvalidArgumentError
from genai.kv.base import KVCache, check_relayout, relayout, resident_rows
from genai.kv.session_kv_cache import SessionKVCache
from genai.providers import CPUProvider

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.providers import ExecutionProvider
    from genai.runtime.model import DecoderIO

log = logging.getLogger(__name__)

__all__ = [
    "UPFRONT_KV_BYTES",
    "GrowingKVCache",
    "KVCache",
    "SharedKVCache",
    "check_relayout",
    "make_kv_cache",
    "relayout",
    "resident_rows",
    "whole_cache_fits",
    "window_capacity",
    "window_capacity_for",
]

#: A shared-buffer KV cache whose whole ``max_length`` fits in this many bytes may be
#: allocated (and zero-filled) when its generator is made, as the reference allocates its
#: cache, so that a prompt run does not grow it (`whole_cache_fits`).
UPFRONT_KV_BYTES = 16 << 20


def whole_cache_fits(io: DecoderIO, batch: int, max_length: int) -> bool:
    """Whether ``batch`` rows of ``max_length`` positions of ``io``'s KV take at most
    `UPFRONT_KV_BYTES`."""
    per_position = 2 * io.num_layers * io.kv_heads * io.head_size * np.dtype(io.kv_dtype).itemsize
    return batch * max_length * per_position <= UPFRONT_KV_BYTES


def window_capacity(io: DecoderIO, provider: ExecutionProvider | None, max_length: int) -> int:
    """Positions the cache of a sliding-window layer holds: W + slack (``cache_slack`` from the
    config, else the provider's default), at most ``max_length`` but never below W (the op
    needs C >= W). 0 when the model has no windowed layers or the provider keeps them at full
    length."""
    if not io.window_size or not io.window_layers:
        return 0
    slack = getattr(provider, "kv_window_slack", None)  # declared by the provider
    if slack is None:
        return 0
    if io.window_slack > 0:
        slack = io.window_slack
    return max(io.window_size, min(io.window_size + int(slack), max_length))


def window_capacity_for(io: DecoderIO, provider: ExecutionProvider | None, max_length: int) -> int:
    """The capacity a cache gives its sliding-window layers: `window_capacity`, or, for a
    provider that keeps them at full length, ``max_length`` (at least W: the op rejects a
    smaller cache). 0 without windowed layers."""
    if not io.window_size or not io.window_layers:
        return 0
    return window_capacity(io, provider, max_length) or max(io.window_size, max_length)


class SharedKVCache(KVCache):
    """One buffer per K/V and layer, bound as both past and present, that grows with use.

    Capacity starts at ``initial_capacity`` tokens (0: ``max_length`` at once, as the
    reference) and grows geometrically by ``growth_factor``, in whole blocks, up to
    ``max_length``: a larger buffer is allocated, the filled positions copied, and the new
    buffers re-bound. Only what is allocated is zero-filled. Sliding-window layers follow the
    same capacity up to ``window_capacity`` positions (at least W), and stay there.
    """

    def __init__(
        self,
        io: DecoderIO,
        provider: ExecutionProvider,
        session: NativeSession,
        batch: int,
        max_length: int,
        initial_capacity: int = 0,
        growth_factor: float = 1.5,
        window_capacity: int | None = None,
    ) -> None:
        if io.combined_kv:
            raise InvalidArgumentError(
                "past_present_share_buffer does not support combined past_%d KV"
            )
        self.io, self.provider, self.session = io, provider, session
        self.batch, self.max_length = batch, max_length
        self.block = max(1, initial_capacity) if initial_capacity else max_length
        self.growth_factor = growth_factor
        if window_capacity is None:
            window_capacity = window_capacity_for(io, provider, max_length)
        self.window_capacity = window_capacity
        windowed = set(io.window_layers) if window_capacity else set()
        #: Per buffer (layer-major, K then V): whether its layer has a windowed cache.
        self._windowed = [i in windowed for i in range(io.num_layers) for _ in (0, 1)]
        self.handover = []
        self._buffers: list[np.ndarray] = []
        self._by_name: dict[str, np.ndarray] = {}
        self._names: list[str] = []
        self.capacity = 0
        self._allocate(min(max_length, initial_capacity or max_length), filled=0)

    def _buffer_capacity(self, capacity: int, windowed: bool) -> int:
        if not windowed:
            return capacity
        return max(self.io.window_size, min(self.window_capacity, capacity))

    def _allocate(self, capacity: int, filled: int) -> None:
        io = self.io
        old = self._buffers
        self._buffers, self._by_name, self._names = [], {}, []
        names = zip(io.past_keys, io.present_keys, io.past_values, io.present_values, strict=True)
        index = 0
        for past_k, present_k, past_v, present_v in names:
            for past, present in ((past_k, present_k), (past_v, present_v)):
                size = self._buffer_capacity(capacity, self._windowed[index])
                previous = old[index] if old else None
                if previous is not None and previous.shape[2] == size:
                    buf = previous  # a windowed layer at its full capacity: nothing to do
                else:
                    shape = (self.batch, io.kv_heads, size, io.head_size)
                    buf = self.provider.allocate(shape, io.kv_dtype)
                    # (a windowed buffer below its final capacity has evicted nothing yet)
                    if previous is not None and filled:
                        keep = min(filled, previous.shape[2])
                        buf[:, :, :keep, :] = previous[:, :, :keep, :]
                    self.session.bind_input(past, buf)
                    self.session.bind_output(present, buf)
                self._by_name[past] = self._by_name[present] = buf
                self._buffers.append(buf)
                self._names.append(past)
                index += 1
        self.capacity = capacity

    def ensure(self, needed: int, filled: int) -> int:
        """Grow so that ``needed`` positions fit (``filled`` of them hold data); returns the
        capacity."""
        if needed <= self.capacity:
            return self.capacity
        if needed > self.max_length:
            raise InvalidArgumentError(f"{needed} positions exceed max_length {self.max_length}")
        target = max(needed, int(self.capacity * self.growth_factor))
        target = -(-target // self.block) * self.block
        before = self.capacity
        self._allocate(min(target, self.max_length), filled)
        log.debug(
            "shared KV cache grows from %d to %d positions (%.1f MiB)",
            before,
            self.capacity,
            self.nbytes / 2**20,
        )
        return self.capacity

    def read(self, name: str) -> np.ndarray | None:
        buf = self._by_name.get(name)
        return None if buf is None else buf.copy()

    def truncate(self, length: int) -> None:
        # Positions past `length` are masked out by the attention mask and overwritten later
        # (sliding-window rows were re-laid by the loop's rewind hook).
        return

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    def reorder(self, order: np.ndarray) -> None:
        if self._buffers and not isinstance(self._buffers[0], np.ndarray):
            # Device buffers (DeviceTensor): no host memory to move rows in; through the host.
            order = np.asarray(order, dtype=np.intp)
            if len(order) != self.batch:
                raise InvalidArgumentError("reorder needs one index per batch row")
            for buf in self._buffers:
                buf.write(buf.numpy()[order])
            return
        super().reorder(order)

    def _row_blocks(self) -> list[tuple[np.ndarray, int, int]]:
        filled = self._filled()
        blocks = []
        for buf in self._buffers:
            batch, heads, size, head = buf.shape
            used = size if filled < 0 else min(filled, size)
            view = buf.reshape(batch, -1).view(np.uint8)
            blocks.append((view, heads, used * head * buf.itemsize))
        return blocks

    def _windowed_names(self) -> list[str]:
        return [n for n, w in zip(self._names, self._windowed, strict=True) if w]

    def _window_get(self, name: str) -> np.ndarray:
        return self._by_name[name]  # host memory, edited in place

    def _window_put(self, name: str, array: np.ndarray) -> None:
        return

    def export(self, positions: int) -> list[np.ndarray]:
        out = []
        for buf, windowed in zip(self._buffers, self._windowed, strict=True):
            if windowed:
                out.append(self._export_window(buf, positions))
            else:
                out.append(buf[:, :, :positions, :].copy())
        return out

    def load(self, arrays: list[np.ndarray], length: int) -> None:
        if len(arrays) != len(self._buffers):
            raise InvalidArgumentError("the snapshot has another number of KV tensors")
        self.ensure(length, 0)
        for buf, array, windowed in zip(self._buffers, arrays, self._windowed, strict=True):
            if windowed:
                self._load_window(array, length - 1, buf)
            else:
                buf[:, :, : array.shape[2], :] = array


class GrowingKVCache(KVCache):
    """Past/present layout: presents become the next pasts; starts with zero length.

    ``device_memory``: ORT allocates the presents where the session produces them (a GPU
    provider's device memory), so the cache never crosses to the host while decoding; reads,
    rewinds and beam reorders copy through the host. Sliding-window layers start from a
    zero past of ``window_capacity`` positions and the op keeps that size (the reference
    cannot run this layout with such layers: their op rejects an empty past)."""

    def __init__(
        self,
        io: DecoderIO,
        session: NativeSession,
        batch: int,
        device_memory: bool = False,
        window_capacity: int | None = None,
    ) -> None:
        self.io = io
        self.session = session
        self.batch = batch
        self.device_memory = device_memory
        if window_capacity is None:
            window_capacity = _default_window_capacity(io)
        self.window_capacity = window_capacity
        head = (io.kv_heads, 0, io.head_size)
        self._empty_shape = (2, batch, *head) if io.combined_kv else (batch, *head)
        self._axis = 3 if io.combined_kv else 2
        self.pasts = (*io.past_keys, *io.past_values)
        self.presents = (*io.present_keys, *io.present_values)
        self.handover = list(zip(self.presents, self.pasts, strict=True))
        windowed = set(io.window_layers) if window_capacity and not io.combined_kv else set()
        layers = (*range(len(io.past_keys)), *range(len(io.past_values)))
        self._windowed = [layer in windowed for layer in layers]
        window_shape = (batch, io.kv_heads, window_capacity, io.head_size)
        for name, is_windowed in zip(self.pasts, self._windowed, strict=True):
            shape = window_shape if is_windowed else self._empty_shape
            session.bind_input(name, np.zeros(shape, io.kv_dtype))
        for name in self.presents:
            session.bind_output_to_device(name, device_memory)
        self._present_to_past = dict(self.handover)

    def read(self, name: str) -> np.ndarray | None:
        past = self._present_to_past.get(name, name)
        if past not in self.pasts:
            return None
        return self.session.input_value(past)

    def truncate(self, length: int) -> None:
        for name, windowed in zip(self.pasts, self._windowed, strict=True):
            if windowed:
                continue  # re-laid by the loop's rewind hook; its size stays the capacity
            current = self.session.input_value(name)
            kept = np.take(current, np.arange(min(length, current.shape[self._axis])), self._axis)
            self.session.bind_input(name, np.ascontiguousarray(kept))

    @property
    def nbytes(self) -> int:
        return sum(self.session.input_value(name).nbytes for name in self.pasts)

    def export(self, positions: int) -> list[np.ndarray]:
        out = []
        for name, windowed in zip(self.pasts, self._windowed, strict=True):
            current = self.session.input_value(name)
            if windowed:
                out.append(self._export_window(current, positions))
            else:
                out.append(np.take(current, np.arange(positions), self._axis))
        return out

    def load(self, arrays: list[np.ndarray], length: int) -> None:
        if len(arrays) != len(self.pasts):
            raise InvalidArgumentError("the snapshot has another number of KV tensors")
        for name, array, windowed in zip(self.pasts, arrays, self._windowed, strict=True):
            if windowed:
                b, heads, _, head = array.shape
                buf = np.zeros((b, heads, self.window_capacity, head), array.dtype)
                self._load_window(array, length - 1, buf)
                array = buf
            self.session.bind_input(name, np.ascontiguousarray(array))

    def _windowed_names(self) -> list[str]:
        return [n for n, w in zip(self.pasts, self._windowed, strict=True) if w]

    def _window_get(self, name: str) -> np.ndarray:
        return np.array(self.session.input_value(name))  # a host copy to edit

    def _window_put(self, name: str, array: np.ndarray) -> None:
        self.session.bind_input(name, np.ascontiguousarray(array))

    def reorder(self, order: np.ndarray) -> None:
        if not self.device_memory:
            super().reorder(order)
            return
        # Device memory has no host address: reorder host copies, bound as the next pasts
        # (the run after copies them in once; its presents are device-resident again).
        axis = 1 if self.io.combined_kv else 0
        for name in self.pasts:
            current = self.session.input_value(name)
            if current.shape[axis] != len(order):
                raise InvalidArgumentError("reorder needs one index per batch row")
            self.session.bind_input(name, np.ascontiguousarray(np.take(current, order, axis)))

    def _row_blocks(self) -> list[tuple[np.ndarray, int, int]]:
        # After a run the pasts hold the presents' memory (handed over without copies), whose
        # positions are all filled: whole rows move.
        blocks = []
        for name in self.presents:
            shape, address = self.session.output_value_info(name)
            nbytes = int(np.prod(shape)) * self.io.kv_dtype.itemsize
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
            if self.io.combined_kv:  # [2, batch, ...]: each half is its own [batch, ...] block
                blocks.extend((half, 1, half.shape[1]) for half in raw.reshape(2, shape[1], -1))
            else:
                view = raw.reshape(shape[0], -1)
                blocks.append((view, 1, view.shape[1]))
        return blocks


def _default_window_capacity(io: DecoderIO) -> int:
    """The capacity of sliding-window layers for a cache built without one: the CPU's."""
    if not io.window_size or not io.window_layers:
        return 0
    return io.window_size + (io.window_slack or CPUProvider.kv_window_slack)


def make_kv_cache(
    io: DecoderIO,
    provider: ExecutionProvider,
    session: NativeSession,
    batch: int,
    max_length: int,
    share_buffer: bool,
    initial_capacity: int = 0,
    growth_factor: float = 1.5,
) -> KVCache:
    """The cache layout the search options ask for, bound to ``session``; a provider that
    does not declare the shared layout gets the growing one (same tokens, its own memory),
    kept in device memory when the provider places the KV cache on its device. A combined
    ``past_%d`` KV (GPT-2 style) gets the growing one too: the reference ignores the option
    there.

    Sliding-window layers get `window_capacity_for` positions."""
    if provider.session_kv is not None:
        return SessionKVCache(io, session, batch, provider.session_kv)
    windows = window_capacity_for(io, provider, max_length)
    if share_buffer and not io.combined_kv and "shared" in provider.capabilities.kv_layouts:
        return SharedKVCache(
            io,
            provider,
            session,
            batch,
            max_length,
            initial_capacity,
            growth_factor,
            window_capacity=windows,
        )
    return GrowingKVCache(
        io, session, batch, provider.placement.kv_cache != "cpu", window_capacity=windows
    )
