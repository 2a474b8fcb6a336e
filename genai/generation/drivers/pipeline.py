"""`PipelineDriver`: a decoder split over several graphs (``model.decoder.pipeline``).

A `genai.generation.pipeline.PipelineRunner` runs the pending tokens through the stages (one
binding per stage session) and writes the logits rows; the native loop, without a session,
chooses and commits. There is no single session to bind a caller's inputs or run options to,
and the KV cache is host arrays by past name, not a layout a snapshot restores into.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from genai.generation.drivers.base import LoopSettings, new_loop, require
from genai.generation.drivers.common import RunnerSessions
from genai.generation.pipeline import PipelineRunner

if TYPE_CHECKING:
    from genai.generation.search import SearchOptions
    from genai.runtime.model import Model

__all__ = ["PipelineDriver"]


class PipelineDriver(RunnerSessions):
    """A pipeline model fed by a `PipelineRunner` (see the module docstring and
    `genai.generation.drivers.base.Driver`)."""

    unsupported = MappingProxyType(
        {
            "snapshot": "snapshots of pipeline models (model.decoder.pipeline)",
            "model_inputs": (
                "set_model_input on a pipeline or windowed model (inputs fed by its runner)"
            ),
            "run_options": "run options on a pipeline model (one session per stage)",
        }
    )
    #: One binding per stage (`runner.bindings`), none a caller may use.
    session = None
    #: The runner keeps the cache (`runner.kv`).
    kv = None

    def __init__(self, model: Model, settings: LoopSettings, search: SearchOptions) -> None:
        self.model, self.settings = model, settings
        self.loop = loop = new_loop(model.io, None, settings, kv_pairs=[])
        self.runner = PipelineRunner(
            model,
            settings.rows,
            settings.max_length,
            search.past_present_share_buffer,
            settings.pad_id,
            loop.array("logits_rows"),
            padded=settings.padded,
        )

    def prepare_prompt(self, tokens: np.ndarray, length: int) -> np.ndarray:
        """The tokens as given."""
        return tokens

    def _feed(self, prompt: bool) -> None:
        runner = self.runner
        runner.feed(self.loop.array("sequences")[:, runner.computed : self.loop.length], prompt)

    def reorder(self, order: np.ndarray) -> None:
        """Beam search: KV, mask, positions and kept stage outputs follow ``order``."""
        self.runner.reorder(order)

    @property
    def kv_layout(self) -> str:
        """The runner's class (its host arrays by past name)."""
        return type(self.runner).__name__

    def snapshot_kv(self, length: int) -> list[np.ndarray]:
        """Refused (see the module docstring)."""
        require(self, "snapshot")
        return []

    def restore(self, tokens: np.ndarray, kv: list[np.ndarray]) -> None:
        """Refused (see the module docstring)."""
        require(self, "snapshot")
