"""Type stubs for the compiled `genai._core.vision_loop` (source: vision_loop.pyx).

`EmbedDecoderLoop`: a `DecoderLoop` whose one-token steps run a vision-language model's
embedding graph and its decoder (fed ``inputs_embeds``) without the GIL.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from genai._core.decoder_loop import DecoderLoop
from genai._core.native_session import NativeSession

class EmbedDecoderLoop(DecoderLoop):
    """A `DecoderLoop` for a vision-language model; `attach` gives it the graphs."""

    step_ready: bool
    fallback: Callable[[bool], None] | None
    @property
    def kv_pending(self) -> bool: ...
    @property
    def binds_prompt_ids(self) -> bool: ...
    def attach(
        self,
        embedding: NativeSession,
        decoder: NativeSession,
        *,
        attention_mask: str,
        step_ids: npt.NDArray[Any],
        step_positions: npt.NDArray[Any] | None,
        step_logits: npt.NDArray[np.float32],
        kv_pairs: list[tuple[str, str]],
        grow_kv: Callable[[int, int], int] | None,
        kv_capacity: int,
        ones_mask: bool,
    ) -> None: ...
    def set_computed(self, computed: int) -> None: ...
    def mask_view(self) -> npt.NDArray[Any]: ...
    def set_mask(self, mask: npt.ArrayLike) -> None: ...
    def run(self, prompt: bool, chunk: int = 0) -> None: ...
    def step(self) -> None: ...
    def steps(self, count: int) -> int: ...
    def run_prompt(self, count: int, with_images: bool, feature_rows: int = -1) -> bool: ...
    def run_prompt_decoder(
        self, logits_index: int, last: npt.NDArray[np.int32], count: int
    ) -> bool: ...
    def chain_prompt(
        self,
        vision: NativeSession | None,
        features_out: int,
        features_in: int,
        embeds_out: int,
        embeds_in: int,
        logits_index: int,
        position_ids: str | None = None,
        mrope: Sequence[int] | None = None,
        ids: str | None = None,
    ) -> None: ...
    def bind_prompt_inputs(
        self, grid: npt.NDArray[Any] | None, error: npt.NDArray[np.int64]
    ) -> int: ...
    def hand_over_kv(self) -> None: ...

def check_feature_rows(shape: tuple[int, ...], expected: int) -> None:
    """Raise `InvalidArgumentError` unless image features of ``shape`` have ``expected`` rows
    (-1: any)."""

def prompt_ids(
    ids: npt.NDArray[Any],
) -> tuple[npt.NDArray[np.int32], int, int] | None:
    """``(ids as a C-contiguous int32 copy, smallest id, largest id)`` of a non-empty 2-D
    int64 or int32 id array; None for another dtype or an empty array."""

def mrope_rows(
    tokens: npt.NDArray[np.int64],
    grid: npt.NDArray[np.int64],
    image_token_id: int,
    video_token_id: int,
    vision_start_token_id: int,
    pad_token_id: int,
    merge: int,
    positions: npt.NDArray[np.int64],
    deltas: npt.NDArray[np.int64],
    error: npt.NDArray[np.int64],
) -> int: ...
