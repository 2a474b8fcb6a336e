"""Whisper's inputs (model type ``whisper``), as the reference's processor makes them.

``processor(prompt, audios=og.Audios.open(...))`` returns ``audio_features`` ``[clips, n_mel,
3000]`` (the log-mel features of `genai.multimodal.audio_features`, in the encoder input's
element type) and ``input_ids`` ``[rows, n]`` int32: the decoder prompt, e.g.
``"<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"``, tokenised with its special
tokens. A list of prompts gives one row each (right-padded as `genai.Tokenizer.encode_batch`);
one prompt with several clips is repeated for each clip (beyond the reference, which would
leave the rows to the caller).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from genai.compat.tensors import NamedTensors
from genai.errors import InvalidArgumentError
from genai.multimodal.audio_features import AudioPipeline

if TYPE_CHECKING:
    from genai.multimodal.audios import Audios
    from genai.runtime.model import Model
    from genai.text.tokenizer import Tokenizer

__all__ = ["AUDIO_FEATURES", "INPUT_IDS", "WhisperProcessor", "whisper_prompt"]

#: The nominal names of the processor's outputs (the reference's ``Config::Defaults``).
AUDIO_FEATURES = "audio_features"
INPUT_IDS = "input_ids"


def whisper_prompt(
    language: str | None = "en", task: str = "transcribe", timestamps: bool = False
) -> str:
    """Whisper's decoder prompt: ``<|startoftranscript|>``, the language (None: none, the
    model guesses), the task, and ``<|notimestamps|>`` unless ``timestamps``."""
    parts = ["<|startoftranscript|>"]
    if language:
        parts.append(f"<|{language}|>")
    parts.append(f"<|{task}|>")
    if not timestamps:
        parts.append("<|notimestamps|>")
    return "".join(parts)


class WhisperProcessor:
    """Whisper's `genai.multimodal.processor.KindProcessor`: audio features + decoder prompt."""

    def __init__(self, model: Model) -> None:
        config = model.config
        filename = config.get("model.speech.config_filename") or "audio_processor_config.json"
        path = config.resolve_file(filename, "model.speech.config_filename", must_exist=False)
        #: The feature pipeline of ``audio_processor_config.json``.
        self.pipeline = AudioPipeline.from_file(path)
        encoder = getattr(model, "encoder", None)
        #: The element type the encoder takes its features in (float32 or float16).
        self.dtype = (
            np.dtype(encoder.features_dtype) if encoder is not None else np.dtype(np.float32)
        )

    def __call__(
        self,
        tokenizer: Tokenizer,
        prompt: str | list[str] | None,
        *,
        images: Any = None,
        audios: Audios | None = None,
    ) -> NamedTensors:
        """``audio_features`` and ``input_ids`` for ``prompt`` and ``audios``."""
        if images is not None:
            raise InvalidArgumentError("Whisper takes audio, not images")
        if audios is None or not len(audios):
            raise InvalidArgumentError("No audios provided to process.")
        if prompt is None or (isinstance(prompt, str | list) and not prompt):  # "" too
            raise InvalidArgumentError(
                "No prompt or prompts provided to WhisperProcessor::Process."
            )
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if len(prompts) == 1 and len(audios) > 1:
            prompts = prompts * len(audios)
        if len(prompts) != len(audios):
            raise InvalidArgumentError(
                f"{len(prompts)} prompts for {len(audios)} audio clips: give one prompt, or "
                "one per clip"
            )
        named = NamedTensors()
        named[AUDIO_FEATURES] = self.pipeline.features(audios.clips).astype(self.dtype)
        named[INPUT_IDS] = np.ascontiguousarray(tokenizer.encode_batch(prompts), dtype=np.int32)
        return named
