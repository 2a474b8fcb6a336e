"""`VisionDriver`: a vision-language model (``model.vision`` -> ``model.embedding`` ->
``model.decoder`` fed ``inputs_embeds``: Phi-3 Vision, Qwen2.5-VL, Fara, Qwen3-VL).

A `genai.generation.vision_runner.VisionRunner` runs the graphs on the pending tokens and
writes the logits rows; the native loop, without a session, chooses and commits (sampling,
guidance, stop strings and the rest of the search are the generator's, as for every driver).
`set_inputs` takes a processor's output (``input_ids`` with the image placeholders, pixel
values, image sizes or grids); the ids become the sequences' first tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.errors import UnsupportedFeatureError
from genai.generation.drivers.base import LoopSettings, new_loop, require
from genai.generation.drivers.common import RunnerSessions
from genai.generation.vision_runner import VisionRunner

if TYPE_CHECKING:
    from genai.generation.search import SearchOptions
    from genai.runtime.model import Model

__all__ = ["VisionDriver"]


class VisionDriver(RunnerSessions):
    """A vision-language model fed by a `VisionRunner` (see the module docstring and
    `genai.generation.drivers.base.Driver`)."""

    unsupported = MappingProxyType(
        {
            "reorder": "beam search on vision-language models (num_beams > 1)",
            "model_inputs": "set_model_input on a vision-language model (use set_inputs)",
            "run_options": "run options on a vision-language model (three sessions)",
        }
    )
    #: Three bindings (vision, embedding, decoder), none a caller may use.
    session = None

    def __init__(self, model: Model, settings: LoopSettings, search: SearchOptions) -> None:
        if search.num_beams > 1:
            raise UnsupportedFeatureError(self.unsupported["reorder"])
        self.model, self.settings = model, settings
        self.loop = loop = new_loop(model.io, None, settings, kv_pairs=[])
        self.runner = VisionRunner(
            model,
            settings.rows,
            settings.max_length,
            search,
            settings.pad_id,
            loop.array("logits_rows"),
        )
        #: The KV cache (`genai.kv`), bound to the decoder's binding.
        self.kv = self.runner.kv
        self._sequences = loop.array("sequences")

    def set_inputs(self, inputs: Mapping[str, Any]) -> np.ndarray:
        """Keep a processor's multimodal inputs for the next prompt run; returns the
        ``input_ids`` to append (int32 ``[rows, n]``, image placeholders included)."""
        return self.runner.set_inputs(inputs)

    def prepare_prompt(self, tokens: np.ndarray, length: int) -> np.ndarray:
        """The tokens as given."""
        return tokens

    def _feed(self, prompt: bool) -> None:
        runner = self.runner
        runner.feed(self._sequences[:, runner.computed : self.loop.length], prompt)

    def step(self) -> None:
        """One step: the runner runs the pending token if the logits are stale (the short
        path of `VisionRunner.feed` for one token), the loop chooses and commits."""
        loop = self.loop
        if not loop.logits_ready:
            runner = self.runner
            computed = runner.computed
            if runner.fast and not runner.pending and loop.length - computed == 1:
                runner.fast_step(self._sequences[:, computed : computed + 1])
                if self.settings.sampler is not None:
                    self.settings.sampler.forget_logits()  # rows rewritten outside the loop
                loop.set_logits_ready()
            else:
                self.run()
        loop.step()

    def reorder(self, order: np.ndarray) -> None:
        """Refused (see `unsupported`)."""
        require(self, "reorder")

    @property
    def kv_layout(self) -> str:
        """The KV cache class's name."""
        return type(self.kv).__name__

    def snapshot_kv(self, length: int) -> list[np.ndarray]:
        """Copies of the KV of the first ``length - 1`` tokens (and Qwen-VL's rope deltas)."""
        return self.runner.snapshot(length - 1)

    def restore(self, tokens: np.ndarray, kv: list[np.ndarray]) -> None:
        """Load ``kv`` and continue after ``tokens`` (the last one runs next)."""
        self.runner.restore(kv, tokens.shape[1])
        self.loop.restore(tokens)
