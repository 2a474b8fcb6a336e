"""`VisionDriver`: a vision-language model (``model.vision`` -> ``model.embedding`` ->
``model.decoder`` fed ``inputs_embeds``: Phi-3 Vision, Qwen2.5-VL, Fara, Qwen3-VL).

The generator's loop is a `genai._core.vision_loop.EmbedDecoderLoop`: it runs one-token decode
steps itself without the GIL (embedding graph, then decoder), chooses and commits (sampling,
guidance, stop strings and the rest of the search are the generator's, as for every driver);
a `genai.generation.vision_runner.VisionRunner` makes every other run (prompts, images, the
first step after them) from Python, and binds the buffers the native steps use.
`set_inputs` takes a processor's output (``input_ids`` with the image placeholders, pixel
values, image sizes or grids); the ids become the sequences' first tokens.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from genai._core.vision_loop import EmbedDecoderLoop
from genai.errors import GenerationError, UnsupportedFeatureError
from genai.generation.drivers.base import LoopSettings, new_loop, require
from genai.generation.drivers.common import RunnerSessions
from genai.generation.vision_runner import VisionRunner

if TYPE_CHECKING:
    from genai.generation.search import SearchOptions
    from genai.runtime.model import Model

__all__ = ["VisionDriver"]


def _weak_fallback(driver: VisionDriver) -> Callable[[bool], None]:
    """``driver._run_python`` through a weak reference to ``driver``."""
    ref = weakref.ref(driver)

    def fallback(prompt: bool) -> None:
        owner = ref()
        if owner is None:
            raise GenerationError("the generator of this vision-language loop is gone")
        owner._run_python(prompt)

    return fallback


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
    #: `steps` runs many steps in one call (natively but for the runs that need Python).
    fused_steps = True

    def __init__(self, model: Model, settings: LoopSettings, search: SearchOptions) -> None:
        if search.num_beams > 1:
            raise UnsupportedFeatureError(self.unsupported["reorder"])
        self.model, self.settings = model, settings
        io = model.io
        # the loop's class runs the embedding graph too; the runner makes its other runs
        self.loop = loop = new_loop(io, None, settings, EmbedDecoderLoop, kv_pairs=[])
        self.runner = VisionRunner(
            model,
            settings.rows,
            settings.max_length,
            search,
            settings.pad_id,
            loop,
            padded=settings.padded,
        )
        # the runs the loop does not make natively; through a weak reference, so that the
        # loop holds no cycle back to the driver: a dropped generator frees its bindings and
        # their KV memory at once, not at the next garbage collection
        loop.fallback = _weak_fallback(self)
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

    def run(self, prompt: bool = False) -> None:
        """Run the pending tokens so the logits rows are current: the loop runs a one-token
        decode step natively, the runner every other run (`_run_python`); a first prompt's
        graphs run in one native call of the loop once the runner bound their inputs, the
        last thing before returning (Python right after the runs is slow: cold caches)."""
        if not prompt:
            self.loop.run(False)
            return
        runner, loop = self.runner, self.loop
        tokens = self._sequences[:, runner.computed : loop.length]
        images = runner.prepare_prompt(tokens)
        if images is None:
            runner.feed(tokens, True)
        elif loop.run_prompt(tokens.shape[1], images, runner.feature_rows):
            return  # (the loop counted the tokens and made its logits ready)
        else:
            runner.finish_prompt(tokens.shape[1])
        self._logits_written()

    def _run_python(self, prompt: bool) -> None:
        RunnerSessions.run(self, prompt)

    def step(self) -> None:
        """One step: the loop runs the pending token if the logits are stale (natively, or
        through the runner when it needs Python), chooses and commits."""
        self.loop.step()

    def steps(self, count: int) -> int:
        """Up to ``count`` steps in one call, GIL-free but for the runs that need Python."""
        return self.loop.steps(count)

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
