"""KV-cache layouts, bound to the decoder session once.

* `SharedKVCache` — ``past_present_share_buffer``: one ``[batch, kv_heads, max_length, head]``
  buffer per layer for K and for V, bound once as both the past input and the present output;
  the graph (GroupQueryAttention) writes new entries in place.
* `GrowingKVCache` — the default layout: past starts empty; after each run the decode loop
  hands each present output to its past input without copying (ORT allocates the presents).
  Handles combined K/V (GPT-2 ``past_%d``).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import numpy as np

from ._core.bookkeeping import reorder_rows

if TYPE_CHECKING:
    from ._core.native_session import NativeSession
    from .model import DecoderIO
    from .providers import ExecutionProvider

__all__ = ["GrowingKVCache", "KVCache", "SharedKVCache", "make_kv_cache"]


class KVCache:
    """Common interface: what the decode loop hands over, reading and truncating."""

    #: (present output, past input) names the decode loop re-binds after every run.
    handover: list[tuple[str, str]]

    def read(self, name: str) -> np.ndarray | None:
        """A copy of the past/present tensor ``name``, or None if it is not a KV name."""
        raise NotImplementedError

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache."""
        raise NotImplementedError

    #: Positions the cache can hold now (-1: no limit, it grows with every run).
    capacity: int = -1

    def ensure(self, needed: int, filled: int) -> int:
        """Make room for ``needed`` positions; returns the capacity (-1: unlimited)."""
        return -1

    def export(self, positions: int) -> list[np.ndarray]:
        """Copies of every cache tensor's first ``positions`` positions (a snapshot)."""
        raise NotImplementedError

    def load(self, arrays: list[np.ndarray], length: int) -> None:
        """Fill the cache from `export` output, with room for a sequence of ``length``."""
        raise NotImplementedError

    def reorder(self, order: np.ndarray) -> None:
        """Batch row i takes the cache of row ``order[i]`` (beam search), in place."""
        for view in self._row_views():
            if view.shape[0] != len(order):
                raise ValueError("reorder needs one index per batch row")
            scratch = self._scratch.get(view.shape)
            if scratch is None:
                scratch = self._scratch[view.shape] = np.empty(view.shape, np.uint8)
            reorder_rows(view, order, scratch)

    def _row_views(self) -> list[np.ndarray]:
        """Every cache tensor as uint8 [batch, bytes per row] views over its memory."""
        raise NotImplementedError

    @property
    def _scratch(self) -> dict[tuple[int, ...], np.ndarray]:
        cache = self.__dict__.get("_scratch_buffers")
        if cache is None:
            cache = self.__dict__["_scratch_buffers"] = {}
        return cache


class SharedKVCache(KVCache):
    """One buffer per K/V and layer, bound as both past and present, that grows with use.

    Capacity starts at ``initial_capacity`` tokens (0: ``max_length`` at once, as the
    reference) and grows geometrically by ``growth_factor``, in whole blocks, up to
    ``max_length``: a larger buffer is allocated, the filled positions copied, and the new
    buffers re-bound. Only what is allocated is zero-filled.
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
    ) -> None:
        if io.combined_kv:
            raise ValueError("past_present_share_buffer does not support combined past_%d KV")
        self.io, self.provider, self.session = io, provider, session
        self.batch, self.max_length = batch, max_length
        self.block = max(1, initial_capacity) if initial_capacity else max_length
        self.growth_factor = growth_factor
        self.handover = []
        self._buffers: list[np.ndarray] = []
        self._by_name: dict[str, np.ndarray] = {}
        self.capacity = 0
        self._allocate(min(max_length, initial_capacity or max_length), filled=0)

    def _allocate(self, capacity: int, filled: int) -> None:
        io = self.io
        shape = (self.batch, io.kv_heads, capacity, io.head_size)
        old = self._buffers
        self._buffers, self._by_name = [], {}
        names = zip(io.past_keys, io.present_keys, io.past_values, io.present_values, strict=True)
        index = 0
        for past_k, present_k, past_v, present_v in names:
            for past, present in ((past_k, present_k), (past_v, present_v)):
                buf = self.provider.allocate(shape, io.kv_dtype)
                if old and filled:
                    buf[:, :, :filled, :] = old[index][:, :, :filled, :]
                self.session.bind_input(past, buf)
                self.session.bind_output(present, buf)
                self._by_name[past] = self._by_name[present] = buf
                self._buffers.append(buf)
                index += 1
        self.capacity = capacity

    def ensure(self, needed: int, filled: int) -> int:
        """Grow so that ``needed`` positions fit (``filled`` of them hold data); returns the
        capacity."""
        if needed <= self.capacity:
            return self.capacity
        if needed > self.max_length:
            raise ValueError(f"{needed} positions exceed max_length {self.max_length}")
        target = max(needed, int(self.capacity * self.growth_factor))
        target = -(-target // self.block) * self.block
        self._allocate(min(target, self.max_length), filled)
        return self.capacity

    def read(self, name: str) -> np.ndarray | None:
        buf = self._by_name.get(name)
        return None if buf is None else buf.copy()

    def truncate(self, length: int) -> None:
        # Positions past `length` are masked out by the attention mask and overwritten later.
        return

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    def _row_views(self) -> list[np.ndarray]:
        return [b.reshape(b.shape[0], -1).view(np.uint8) for b in self._buffers]

    def export(self, positions: int) -> list[np.ndarray]:
        return [b[:, :, :positions, :].copy() for b in self._buffers]

    def load(self, arrays: list[np.ndarray], length: int) -> None:
        if len(arrays) != len(self._buffers):
            raise ValueError("the snapshot has another number of KV tensors")
        self.ensure(length, 0)
        for buf, array in zip(self._buffers, arrays, strict=True):
            buf[:, :, : array.shape[2], :] = array


class GrowingKVCache(KVCache):
    """Past/present layout: presents become the next pasts; starts with zero length.

    ``device_memory``: ORT allocates the presents where the session produces them (a GPU
    provider's device memory), so the cache never crosses to the host while decoding; reads,
    rewinds and beam reorders copy through the host."""

    def __init__(
        self, io: DecoderIO, session: NativeSession, batch: int, device_memory: bool = False
    ) -> None:
        self.io = io
        self.session = session
        self.device_memory = device_memory
        head = (io.kv_heads, 0, io.head_size)
        self._empty_shape = (2, batch, *head) if io.combined_kv else (batch, *head)
        self._axis = 3 if io.combined_kv else 2
        self.pasts = (*io.past_keys, *io.past_values)
        self.presents = (*io.present_keys, *io.present_values)
        self.handover = list(zip(self.presents, self.pasts, strict=True))
        for name in self.pasts:
            session.bind_input(name, np.zeros(self._empty_shape, io.kv_dtype))
        for name in self.presents:
            session.bind_output_to_device(name, device_memory)
        self._present_to_past = dict(self.handover)

    def read(self, name: str) -> np.ndarray | None:
        past = self._present_to_past.get(name, name)
        if past not in self.pasts:
            return None
        return self.session.input_value(past)

    def truncate(self, length: int) -> None:
        for name in self.pasts:
            current = self.session.input_value(name)
            kept = np.take(current, np.arange(min(length, current.shape[self._axis])), self._axis)
            self.session.bind_input(name, np.ascontiguousarray(kept))

    @property
    def nbytes(self) -> int:
        return sum(self.session.input_value(name).nbytes for name in self.pasts)

    def export(self, positions: int) -> list[np.ndarray]:
        return [
            np.take(self.session.input_value(name), np.arange(positions), self._axis)
            for name in self.pasts
        ]

    def load(self, arrays: list[np.ndarray], length: int) -> None:
        if len(arrays) != len(self.pasts):
            raise ValueError("the snapshot has another number of KV tensors")
        for name, array in zip(self.pasts, arrays, strict=True):
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
                raise ValueError("reorder needs one index per batch row")
            self.session.bind_input(name, np.ascontiguousarray(np.take(current, order, axis)))

    def _row_views(self) -> list[np.ndarray]:
        # After a run the pasts hold the presents' memory (handed over without copies).
        views = []
        for name in self.presents:
            shape, address = self.session.output_value_info(name)
            nbytes = int(np.prod(shape)) * self.io.kv_dtype.itemsize
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
            if self.io.combined_kv:  # [2, batch, ...]: each half is its own [batch, ...] block
                views.extend(raw.reshape(2, shape[1], -1))
            else:
                views.append(raw.reshape(shape[0], -1))
        return views


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
    kept in device memory when the provider places the KV cache on its device."""
    if share_buffer and "shared" in provider.capabilities.kv_layouts:
        return SharedKVCache(
            io, provider, session, batch, max_length, initial_capacity, growth_factor
        )
    return GrowingKVCache(io, session, batch, provider.placement.kv_cache != "cpu")
