"""`MultiModalProcessor`: the reference's ``og.MultiModalProcessor``, one class for every
model kind; the kind's own processor (`KindProcessor`, chosen by ``model.type`` in
`genai.multimodal.kinds.PROCESSORS`) makes the inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from genai.errors import ArgumentTypeError, ModelError
from genai.multimodal.audios import Audios
from genai.multimodal.kinds import PROCESSORS
from genai.text.tokenizer import Tokenizer, TokenizerStream

if TYPE_CHECKING:
    from collections.abc import Sequence

    from genai.compat.tensors import NamedTensors
    from genai.multimodal.images import Images
    from genai.runtime.model import Model

__all__ = ["KindProcessor", "MultiModalProcessor", "check_prompts"]


class KindProcessor(Protocol):
    """A model kind's processor, made by its factory in `genai.multimodal.kinds.PROCESSORS`
    from the `genai.Model`."""

    def __call__(
        self,
        tokenizer: Tokenizer,
        prompt: str | list[str] | None,
        *,
        images: Any = None,
        audios: Audios | None = None,
    ) -> NamedTensors:
        """The `NamedTensors` the kind's driver takes in `genai.Generator.set_inputs`, under
        the reference's nominal names (``input_ids``, ``audio_features``, ...)."""
        ...


def check_prompts(prompt: Any) -> list[str] | None:
    """``prompt`` as the reference's processor takes it (a str, a list of str, or None) as a
    list of prompts (None for None)."""
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        if not all(isinstance(p, str) for p in prompt):
            raise ArgumentTypeError(
                "One or more items in the list of provided prompts is not a string."
            )
        return list(prompt)
    raise ArgumentTypeError(
        "Unsupported type for prompts. Prompts must be a string or a list of strings."
    )


class MultiModalProcessor:
    """Turns prompts with images or audio into a model's inputs (``model
    .create_multimodal_processor()``; the reference's API)."""

    def __init__(self, model: Model) -> None:
        factory = PROCESSORS.get(model.type)
        if factory is None:
            raise ModelError(
                f"MultiModalProcessor cannot be created. {model.type} is not a registered "
                "multi-modal model type."
            )
        self.model = model
        #: The model's tokenizer (prompts, `decode`, `create_stream`).
        self.tokenizer = Tokenizer(model)
        #: The kind's processor (`KindProcessor`).
        self.kind: KindProcessor = factory(model)

    def __call__(
        self,
        prompt: str | list[str] | None = None,
        *,
        images: Images | None = None,
        audios: Audios | None = None,
    ) -> NamedTensors:
        """The model inputs of ``prompt`` (a str, or a list of str: one per batch row) with
        ``images`` (`genai.Images`) and / or ``audios`` (`genai.Audios`), as `NamedTensors`
        for `genai.Generator.set_inputs`."""
        if audios is not None and not isinstance(audios, Audios):
            raise ArgumentTypeError(
                f"audios must be og.Audios (Audios.open / Audios.open_bytes), not "
                f"{type(audios).__name__}"
            )
        check_prompts(prompt)
        return self.kind(self.tokenizer, prompt, images=images, audios=audios)

    def decode(self, tokens: Sequence[int] | np.ndarray) -> str:
        """The text of ``tokens`` (special tokens skipped), as `genai.Tokenizer.decode`."""
        return self.tokenizer.decode(tokens)

    def create_stream(self) -> TokenizerStream:
        """A stream decoding one token at a time (`genai.TokenizerStream`)."""
        return self.tokenizer.create_stream()

    def __repr__(self) -> str:
        return f"MultiModalProcessor(type={self.model.type!r})"
