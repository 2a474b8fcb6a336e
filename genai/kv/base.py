"""The interface every KV-cache layout implements (`KVCache`) and the sliding-window row
arithmetic they share (`resident_rows`, `relayout`, `check_relayout`).

The layouts live beside it: `genai.kv.kv_cache` (shared and growing buffers, and
`make_kv_cache`, which picks one), `genai.kv.session_kv_cache` (a cache the execution provider
keeps inside the session). See `genai.kv.kv_cache` for how sliding-window layers are laid out.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from genai._core.bookkeeping import move_rows
from genai.errors import GenerationError, InvalidArgumentError

if TYPE_CHECKING:
    from genai.runtime.model import DecoderIO

__all__ = ["KVCache", "check_relayout", "relayout", "resident_rows"]


def resident_rows(tokens: int, capacity: int, window: int) -> int:
    """How many positions a windowed cache of ``capacity`` holds after ``tokens`` tokens
    (GroupQueryAttention ``sliding_window_cache=1``): all of them up to the capacity, then the
    op evicts ``capacity - window + 1`` at a time."""
    if tokens <= capacity:
        return tokens
    group = capacity - window + 1
    return tokens - group * math.ceil((tokens - capacity) / group)


def relayout(
    rows: np.ndarray, first: int, tokens: int, capacity: int, window: int, out: np.ndarray
) -> int:
    """Lay out a windowed cache for a row with ``tokens`` tokens from ``rows`` ``[heads, k,
    head]``, which hold positions ``[first, first + k)``: ``out[:, :L]`` (``out`` is ``[heads,
    >= L, head]``, it may share memory with ``rows``) receives positions ``[tokens - L,
    tokens)``, ``L = resident_rows(tokens, capacity, window)``. Positions ``rows`` lacks are
    zero-filled when they are out of the next token's window (before ``tokens - window + 1``);
    a missing position inside it raises `GenerationError` (see `check_relayout`). Returns L."""
    check_relayout(first, rows.shape[1], tokens, capacity, window)
    length = resident_rows(tokens, capacity, window)
    if length == 0:
        return 0
    start = tokens - length
    lo = max(start, first)  # the first position copied; those before it are out of the window
    kept = rows[:, lo - first : tokens - first].copy()
    out[:, : lo - start] = 0
    out[:, lo - start : length] = kept
    return length


def check_relayout(first: int, count: int, tokens: int, capacity: int, window: int) -> None:
    """Raise `GenerationError` unless ``count`` rows holding positions ``[first, first +
    count)`` contain what a windowed cache needs after ``tokens`` tokens: every resident
    position the next token attends to (its last ``window - 1`` predecessors)."""
    length = resident_rows(tokens, capacity, window)
    if length == 0:
        return
    needed = max(tokens - length, tokens - window + 1)
    if needed < first or first + count < tokens:
        raise GenerationError(
            f"the sliding-window KV cache no longer holds positions {needed}..{tokens - 1} "
            f"(it keeps positions {first}..{first + count - 1} of a row): a rewind or snapshot "
            f"can go back only while the last {window - 1} positions before it are resident"
        )


class KVCache:
    """Common interface: what the decode loop hands over, reading, truncating, reordering."""

    #: (present output, past input) names the decode loop re-binds after every run.
    handover: list[tuple[str, str]]
    #: A weak reference to the decode loop following this cache (set by `attach_loop`): the
    #: loop holds the cache (its ``grow_kv``), so a strong one back would make a cycle that
    #: keeps a dropped generator's buffers until the garbage collector runs.
    _loop_ref: Any = None

    @property
    def _loop(self) -> Any:
        """The decode loop following this cache, or None."""
        return self._loop_ref() if self._loop_ref is not None else None

    def read(self, name: str) -> np.ndarray | None:
        """A copy of the past/present tensor ``name``, or None if it is not a KV name."""
        raise NotImplementedError

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (sliding-window layers were re-laid already by
        the loop's rewind hook)."""
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

    io: DecoderIO
    #: Rows (batch entries x beams) and, per cache tensor, whether its layer is windowed.
    batch: int
    _windowed: list[bool]

    def used_bytes(self, positions: int) -> int:
        """Bytes that ``positions`` positions per row occupy in every cache tensor; a
        sliding-window layer holds only its resident ones (`resident_rows`)."""
        io = self.io
        per_position = self.batch * io.kv_heads * io.head_size * io.kv_dtype.itemsize
        if io.combined_kv:
            per_position *= 2  # past_%d holds K and V
        held = positions
        if any(self._windowed):
            held = resident_rows(positions, self.window_capacity, io.window_size)
        return sum((held if windowed else positions) * per_position for windowed in self._windowed)

    def export(self, positions: int) -> list[np.ndarray]:
        """Copies of every cache tensor's first ``positions`` positions (a snapshot; batch 1).
        A sliding-window layer's tensor holds its resident positions before ``positions``."""
        raise NotImplementedError

    def load(self, arrays: list[np.ndarray], length: int) -> None:
        """Fill the cache from `export` output, with room for a sequence of ``length`` (the
        cache then holds ``length - 1`` positions)."""
        raise NotImplementedError

    # --- the decode loop ----------------------------------------------------------------------
    def attach_loop(self, loop: Any) -> None:
        """Follow ``loop`` (a `DecoderLoop`; it calls this when built with this cache's
        ``ensure``): token counts for reorders and windowed layers, and the rewind hook that
        re-lays sliding-window rows before the loop commits a rewind."""
        self._loop_ref = weakref.ref(loop)
        if self._windowed_names():
            loop.kv_rewind = self._rewind_windows

    def _row_tokens(self) -> np.ndarray:
        """Each row's token count (what GroupQueryAttention's ``seqlens_k + 1`` says)."""
        if self._loop is None:
            raise RuntimeError("this KV cache is not attached to a decode loop")
        return self._loop.row_tokens()

    def _filled(self) -> int:
        """Positions any row may occupy (the longest row); the capacity when unknown."""
        return int(self._loop.computed) if self._loop is not None else -1

    # --- sliding-window layers ----------------------------------------------------------------
    #: Positions of a sliding-window layer's cache (0: none).
    window_capacity: int = 0

    def _windowed_names(self) -> list[str]:
        """The past inputs of sliding-window layers (empty without them)."""
        return []

    def _window_get(self, name: str) -> np.ndarray:
        """A host array [batch, heads, capacity, head] of windowed past ``name`` to edit."""
        raise NotImplementedError

    def _window_put(self, name: str, array: np.ndarray) -> None:
        """Store an edited `_window_get` array back."""
        raise NotImplementedError

    def _rewind_windows(self, before: np.ndarray, after: np.ndarray) -> None:
        """Re-lay each row of every windowed layer from ``before`` to ``after`` tokens; every
        row is checked first, so a refused rewind changes nothing."""
        window, capacity = self.io.window_size, self.window_capacity
        names = self._windowed_names()
        spans = []
        for t_old, t_new in zip(before.tolist(), after.tolist(), strict=True):
            have = resident_rows(t_old, capacity, window)
            check_relayout(t_old - have, have, t_new, capacity, window)
            # rows already where the shorter layout wants them need no move
            still = resident_rows(t_new, capacity, window) == have - (t_old - t_new)
            spans.append((t_old, t_new, have, still))
        if all(still for *_, still in spans):
            return
        for name in names:
            array = self._window_get(name)
            for b, (t_old, t_new, have, still) in enumerate(spans):
                if not still:
                    relayout(array[b, :, :have], t_old - have, t_new, capacity, window, array[b])
            self._window_put(name, array)

    def _export_window(self, array: np.ndarray, positions: int) -> np.ndarray:
        """Batch 1: the resident positions before ``positions`` of a windowed past."""
        tokens = int(self._row_tokens()[0])
        window, capacity = self.io.window_size, self.window_capacity
        have = resident_rows(tokens, capacity, window)
        length = resident_rows(positions, capacity, window)
        out = np.zeros((array.shape[0], array.shape[1], capacity, array.shape[3]), array.dtype)
        for b in range(array.shape[0]):
            relayout(array[b, :, :have], tokens - have, positions, capacity, window, out[b])
        return out[:, :, :length].copy()

    def _load_window(self, array: np.ndarray, positions: int, out: np.ndarray) -> None:
        """Lay exported rows (positions ending at ``positions``) into ``out`` [batch, heads,
        capacity, head] for this cache's capacity."""
        window, capacity = self.io.window_size, self.window_capacity
        first = positions - array.shape[2]
        for b in range(array.shape[0]):
            relayout(array[b], first, positions, capacity, window, out[b])

    # --- beam search --------------------------------------------------------------------------
    def reorder(self, order: np.ndarray) -> None:
        """Batch row i takes the cache of row ``order[i]`` (beam search), in place: each row
        moves at most once, rows that keep their own beam are not touched, and only filled
        positions are copied (`genai._core.bookkeeping.move_rows`)."""
        order = np.ascontiguousarray(order, dtype=np.int32)
        for view, chunks, chunk_bytes in self._row_blocks():
            if view.shape[0] != len(order):
                raise InvalidArgumentError("reorder needs one index per batch row")
            move_rows(view, order, self._scratch_row(view.shape[1]), chunks, chunk_bytes)

    def _row_blocks(self) -> list[tuple[np.ndarray, int, int]]:
        """Every cache tensor as (uint8 [batch, bytes per row] view over its memory, pieces
        per row, bytes to move per piece)."""
        raise NotImplementedError

    def _scratch_row(self, width: int) -> np.ndarray:
        scratch = self.__dict__.get("_scratch")
        if scratch is None or scratch.shape[0] < width:
            scratch = self.__dict__["_scratch"] = np.empty(width, np.uint8)
        return scratch
