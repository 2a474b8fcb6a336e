"""`WindowedDriver`: a QNN-style windowed model (``sliding_window.slide_key_value_cache``).

A `genai.generation.windowed_runner.WindowedRunner` feeds the pending tokens (a first prompt a
window at a time, padded to whole windows) into a static cache slid after each run and writes
the logits rows; the native loop (bound to the same session, which it never runs) chooses and
commits. The cache drops the positions slid out, so it rewinds only to 0 and takes no
snapshots; beam search is refused when the generator is made
(`genai.kv.windowed_cache.SlidingWindowSpec.check_search`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from genai.errors import InvalidArgumentError
from genai.generation.drivers.base import LoopSettings, new_loop, require
from genai.generation.drivers.common import RunnerRuns, SessionInputs, bind_outputs
from genai.generation.windowed_runner import WindowedRunner

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.kv.windowed_cache import SlidingWindowSpec
    from genai.runtime.model import Model

__all__ = ["WindowedDriver"]


class WindowedDriver(RunnerRuns, SessionInputs):
    """A windowed model fed by a `WindowedRunner` on ``session`` (see the module
    docstring and `genai.generation.drivers.base.Driver`)."""

    unsupported = MappingProxyType(
        {
            "rewind": (
                "a windowed model (sliding_window.slide_key_value_cache) rewinds only to 0: "
                "its cache dropped the positions slid out"
            ),
            "reorder": "beam search on a windowed model (sliding_window.slide_key_value_cache)",
            "snapshot": "snapshots of windowed models (slide_key_value_cache)",
            "model_inputs": (
                "set_model_input on a pipeline or windowed model (inputs fed by its runner)"
            ),
        }
    )
    #: The runner keeps the cache (`runner.cache`).
    kv = None

    def __init__(
        self,
        model: Model,
        session: NativeSession,
        settings: LoopSettings,
        spec: SlidingWindowSpec,
    ) -> None:
        self.model, self.session, self.settings = model, session, settings
        self.loop = loop = new_loop(model.io, session, settings, kv_pairs=[])
        self.extra_outputs = bind_outputs(model, session, loop, settings.rows, shared_kv=False)
        self.runner = WindowedRunner(
            model.io, spec, session, settings.rows, loop.array("logits_rows")
        )
        self._init_inputs()

    def prepare_prompt(self, tokens: np.ndarray, length: int) -> np.ndarray:
        """A first prompt padded to whole windows (the pads stay in the sequences, as in the
        reference); later tokens as given."""
        if length:
            return tokens
        padded = self.runner.pad_prompt(tokens)
        max_length = self.settings.max_length
        if padded.shape[1] > max_length:
            raise InvalidArgumentError(
                f"{tokens.shape[1]} tokens padded to whole windows of "
                f"{self.runner.spec.window} ({padded.shape[1]}) exceed max_length {max_length}"
            )
        return padded

    def _feed(self, prompt: bool) -> None:
        runner = self.runner
        runner.feed(self.loop.array("sequences")[:, runner.computed : self.loop.length])

    def rewind(self, length: int, keep_last: bool = False) -> None:
        """Only to 0 (as the reference: its windowed cache and inputs cannot rewind)."""
        if length:
            require(self, "rewind")
        self.runner.reset()
        self.loop.rewind(length)

    def reorder(self, order: np.ndarray) -> None:
        """Refused (beam search is refused when the generator is made)."""
        require(self, "reorder")

    @property
    def kv_layout(self) -> str:
        """The runner's cache class."""
        return type(self.runner.cache).__name__

    def snapshot_kv(self, length: int) -> list[np.ndarray]:
        """Refused: the cache dropped the positions slid out."""
        require(self, "snapshot")
        return []

    def restore(self, tokens: np.ndarray, kv: list[np.ndarray]) -> None:
        """Refused: see `snapshot_kv`."""
        require(self, "snapshot")

    @property
    def kv_bytes(self) -> int:
        """Bytes of the static cache."""
        return self.runner.cache.nbytes

    @property
    def kv_used_bytes(self) -> int:
        """Bytes the resident positions occupy."""
        return self.runner.cache.used_bytes(self.runner.computed)
