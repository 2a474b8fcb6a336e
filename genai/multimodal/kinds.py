"""The model kinds that take multimodal inputs: ``model.type`` -> the factory of the kind's
processor (`genai.multimodal.processor.KindProcessor`), called with the `genai.Model`.

Adding a kind is one entry here and its processor module (see `genai.multimodal`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from genai.multimodal.whisper import WhisperProcessor

__all__ = ["PROCESSORS"]

#: ``model.type`` -> factory(model) -> the kind's processor.
PROCESSORS: dict[str, Callable[[Any], Any]] = {
    "whisper": WhisperProcessor,
}
