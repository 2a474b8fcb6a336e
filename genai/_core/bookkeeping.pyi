"""Type stubs for the compiled `genai._core.bookkeeping` (source: bookkeeping.pyx).

Per-step bookkeeping kernels of the generation loop; every kernel writes in place into
caller-owned, C-contiguous buffers. ``index_t`` arrays are int32 or int64 (the model's mask
and position dtype).
"""

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

_IndexArray: TypeAlias = npt.NDArray[np.int32] | npt.NDArray[np.int64]

#: Elements of work from which a kernel releases the GIL.
NOGIL_MIN_WORK: int
NO_PAD: int

def prefill_inputs(
    tokens: npt.NDArray[np.int32],
    pad_id: int,
    mask: _IndexArray,
    positions: _IndexArray,
    last_index: npt.NDArray[np.int32],
    last_pad: int | None = None,
) -> None: ...
def append_mask_column(mask: _IndexArray, batch: int, old_length: int) -> None: ...
def fill_mask_ones(mask: _IndexArray, start: int, stop: int) -> None: ...
def advance_positions(positions: _IndexArray, next_position: _IndexArray, count: int) -> None: ...
def argmax_rows(logits: npt.NDArray[np.float32], out: npt.NDArray[np.int32]) -> None: ...
def commit_tokens(
    sequences: npt.NDArray[np.int32],
    length: int,
    tokens: npt.NDArray[np.int32],
    eos_ids: npt.NDArray[np.int32],
    done: npt.NDArray[np.uint8],
    pad_id: int,
) -> bool: ...
def gather_rows(
    logits: npt.NDArray[np.float32], index: npt.NDArray[np.int32], out: npt.NDArray[np.float32]
) -> None: ...
def move_rows(
    rows: npt.NDArray[np.uint8],
    order: npt.NDArray[np.int32],
    scratch: npt.NDArray[np.uint8],
    chunks: int = 1,
    chunk_bytes: int = -1,
) -> int: ...
def reorder_rows(
    rows: npt.NDArray[np.uint8], order: npt.NDArray[np.int32], scratch: npt.NDArray[np.uint8]
) -> None: ...
