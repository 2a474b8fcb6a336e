"""A KV cache kept inside the session by its execution provider (OpenVINO ``enable_causallm``).

The EP turns the graph's past/present pairs into state it holds between runs. The graph still
declares the past inputs, so each run gets empty ones ([batch, heads, 0, head]); presents are
not bound. The EP's cache is moved with a dynamic session option (`SessionKV.rewind_option`):
to 0 when a generator starts, to ``n`` on ``rewind_to(n)``. The state belongs to the session,
so one model runs one such generator at a time; a second one is refused while the first lives.
"""

from __future__ import annotations

import gc
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.errors import GenerationError, UnsupportedFeatureError
from genai.kv.base import KVCache

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.providers import SessionKV
    from genai.runtime.model import DecoderIO

# ORT session address -> the cache whose sequence that session's state holds now.
_OWNERS: dict[int, weakref.ReferenceType[SessionKVCache]] = {}


class SessionKVCache(KVCache):
    """The `KVCache` interface over a cache the EP keeps: nothing to hand over, grow or
    copy; truncation is the EP's rewind."""

    def __init__(self, io: DecoderIO, session: NativeSession, batch: int, spec: SessionKV):
        if batch != 1:
            raise UnsupportedFeatureError(
                "a session that keeps the KV cache itself (OpenVINO enable_causallm) runs "
                f"batch_size 1 with num_beams 1, got {batch} rows"
            )
        owner = _OWNERS.get(session.ort_session_address)
        if owner is not None and owner() is not None:
            gc.collect()  # a dropped generator may wait in a reference cycle
        if owner is not None and owner() is not None:
            raise GenerationError(
                "this model's session keeps the KV cache of another live Generator (OpenVINO "
                "enable_causallm holds one sequence per session): delete that generator first"
            )
        self.io, self.session, self.batch, self.spec = io, session, batch, spec
        self.handover = []
        self._windowed = [False] * (2 * io.num_layers)
        head = (io.kv_heads, 0, io.head_size)
        shape = (2, batch, *head) if io.combined_kv else (batch, *head)
        self.pasts = (*io.past_keys, *io.past_values)
        for name in self.pasts:
            session.bind_input(name, np.zeros(shape, io.kv_dtype))
        self.truncate(0)  # a new sequence: drop what an earlier generator left in the EP
        _OWNERS[session.ort_session_address] = weakref.ref(self)

    def read(self, name: str) -> np.ndarray | None:
        presents = (*self.io.present_keys, *self.io.present_values)
        if name in self.pasts or name in presents:
            raise GenerationError(
                f"{name!r} is not readable: the execution provider keeps the KV cache inside "
                "the session (OpenVINO enable_causallm)"
            )
        return None

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of the EP's cache."""
        self.session.set_ep_dynamic_options({self.spec.rewind_option: str(int(length))})

    @property
    def nbytes(self) -> int:
        """0: the cache's memory belongs to the execution provider."""
        return 0

    def used_bytes(self, positions: int) -> int:
        return 0

    def export(self, positions: int) -> list[np.ndarray]:
        raise UnsupportedFeatureError(
            "snapshots need a readable KV cache; with OpenVINO enable_causallm the execution "
            "provider keeps it"
        )

    def load(self, arrays: list[np.ndarray], length: int) -> None:
        self.export(length)

    def reorder(self, order: np.ndarray) -> None:
        raise UnsupportedFeatureError("beam search needs a KV cache the engine can reorder")

    def attach_loop(self, loop: Any) -> None:
        self._loop_ref = weakref.ref(loop)
