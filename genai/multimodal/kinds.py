"""The model kinds that take multimodal inputs: ``model.type`` -> the factory of the kind's
processor (`genai.multimodal.processor.KindProcessor`), called with the `genai.Model`.

Adding a kind is one entry here and its processor module (see `genai.multimodal`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from genai.multimodal.vision_gemma import Gemma3VisionProcessor
from genai.multimodal.vision_phi3 import Phi3VisionProcessor
from genai.multimodal.vision_qwen import QwenVisionProcessor
from genai.multimodal.whisper import WhisperProcessor

__all__ = ["PROCESSORS"]

#: ``model.type`` -> factory(model) -> the kind's processor.
PROCESSORS: dict[str, Callable[[Any], Any]] = {
    "whisper": WhisperProcessor,
    "phi3v": Phi3VisionProcessor.from_model,
    "gemma3": Gemma3VisionProcessor.from_model,
    "fara": QwenVisionProcessor.from_model,
    "qwen2_5_vl": QwenVisionProcessor.from_model,
    "qwen3_vl": QwenVisionProcessor.from_model,
    "qwen3_5": QwenVisionProcessor.from_model,
    "qwen3_5_moe": QwenVisionProcessor.from_model,
}
