"""KV-cache layouts over IOBinding.

* `SharedKVCache` — ``past_present_share_buffer``: one ``[batch, kv_heads, max_length, head]``
  buffer per layer for K and for V, bound once as both the past input and the present output;
  the graph (GroupQueryAttention) writes new entries in place.
* `GrowingKVCache` — the default layout: past starts empty; each run's present outputs become
  the next run's past inputs (ORT allocates them). Handles combined K/V (GPT-2 ``past_%d``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

if TYPE_CHECKING:
    from .model import DecoderIO
    from .providers import ExecutionProvider

__all__ = ["GrowingKVCache", "KVCache", "SharedKVCache", "make_kv_cache"]


class KVCache:
    """Common interface: bind before a run, collect after it, read and truncate."""

    def bind(self, binding: ort.IOBinding) -> None:
        """Bind past inputs and present outputs for the next run."""
        raise NotImplementedError

    def after_run(self, binding: ort.IOBinding, outputs_start: int) -> None:
        """Take the run's present outputs (``binding.get_outputs()[outputs_start:]``)."""

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


class SharedKVCache(KVCache):
    """One preallocated buffer per K/V and layer, bound as both past and present."""

    def __init__(
        self, io: DecoderIO, provider: ExecutionProvider, batch: int, max_length: int
    ) -> None:
        if io.combined_kv:
            raise ValueError("past_present_share_buffer does not support combined past_%d KV")
        self.io = io
        self.device = provider.device
        shape = (batch, io.kv_heads, max_length, io.head_size)
        self.keys = [provider.allocate(shape, io.kv_dtype) for _ in range(io.num_layers)]
        self.values = [provider.allocate(shape, io.kv_dtype) for _ in range(io.num_layers)]
        self._bound = False
        names = zip(io.past_keys, io.present_keys, io.past_values, io.present_values, strict=True)
        self._by_name: dict[str, np.ndarray] = {}
        for layer, (pk, ck, pv, cv) in enumerate(names):
            for name in (pk, ck):
                self._by_name[name] = self.keys[layer]
            for name in (pv, cv):
                self._by_name[name] = self.values[layer]

    def bind(self, binding: ort.IOBinding) -> None:
        if self._bound:
            return  # the same buffers stay bound for the generator's lifetime
        io = self.io
        for layer in range(io.num_layers):
            for past, present, buf in (
                (io.past_keys[layer], io.present_keys[layer], self.keys[layer]),
                (io.past_values[layer], io.present_values[layer], self.values[layer]),
            ):
                binding.bind_input(
                    past, self.device, 0, buf.dtype, list(buf.shape), buf.ctypes.data
                )
                binding.bind_output(
                    present, self.device, 0, buf.dtype, list(buf.shape), buf.ctypes.data
                )
        self._bound = True

    def read(self, name: str) -> np.ndarray | None:
        buf = self._by_name.get(name)
        return None if buf is None else buf.copy()

    def truncate(self, length: int) -> None:
        # Positions past `length` are masked out by the attention mask and overwritten later.
        return

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.keys) + sum(b.nbytes for b in self.values)


class GrowingKVCache(KVCache):
    """Past/present layout: presents become the next pasts; starts with zero length."""

    def __init__(self, io: DecoderIO, provider: ExecutionProvider, batch: int) -> None:
        self.io = io
        self.device = provider.device
        head = (io.kv_heads, 0, io.head_size)
        shape = (2, batch, *head) if io.combined_kv else (batch, *head)
        self.past: dict[str, ort.OrtValue] = {}
        for name in (*io.past_keys, *io.past_values):
            self.past[name] = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, io.kv_dtype))
        self.present_names = (*io.present_keys, *io.present_values)
        self._present_to_past = dict(
            zip(self.present_names, (*io.past_keys, *io.past_values), strict=True)
        )

    def bind(self, binding: ort.IOBinding) -> None:
        for name, value in self.past.items():
            binding.bind_ortvalue_input(name, value)
        for name in self.present_names:
            binding.bind_output(name, self.device)

    def after_run(self, binding: ort.IOBinding, outputs_start: int) -> None:
        outputs = binding.get_outputs()[outputs_start:]
        for name, value in zip(self.present_names, outputs, strict=True):
            self.past[self._present_to_past[name]] = value

    def read(self, name: str) -> np.ndarray | None:
        key = self._present_to_past.get(name, name)
        value = self.past.get(key)
        return None if value is None else value.numpy().copy()

    def truncate(self, length: int) -> None:
        axis = 3 if self.io.combined_kv else 2
        for name, value in self.past.items():
            array = value.numpy()
            kept = np.ascontiguousarray(
                np.take(array, np.arange(min(length, array.shape[axis])), axis)
            )
            self.past[name] = ort.OrtValue.ortvalue_from_numpy(kept)

    @property
    def nbytes(self) -> int:
        total = 0
        for value in self.past.values():
            shape = value.shape()
            total += int(np.prod(shape)) * self.io.kv_dtype.itemsize
        return total


def make_kv_cache(
    io: DecoderIO, provider: ExecutionProvider, batch: int, max_length: int, share_buffer: bool
) -> KVCache:
    """The cache layout the search options ask for."""
    if share_buffer:
        return SharedKVCache(io, provider, batch, max_length)
    return GrowingKVCache(io, provider, batch)
