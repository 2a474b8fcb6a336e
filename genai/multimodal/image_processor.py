"""`ImageProcessor`: what the image processors of vision-language model kinds share.

A processor is made from the model's `Config` (``model.vision``: the processor config file,
patch and merge sizes) and turns one prompt with image tags plus `Images` into the
`NamedTensors` the model takes (``input_ids``, ``pixel_values``, and the kind's extras).
Each kind (`genai.multimodal.vision_phi3`, `vision_qwen`, `vision_gemma`) implements
`ImageProcessor.process`; `genai.multimodal.kinds.PROCESSORS` names them by model type
(``from_model``, the factory `genai.multimodal.MultiModalProcessor` calls).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from genai.compat.tensors import NamedTensors
from genai.errors import ArgumentTypeError, InvalidArgumentError, UnsupportedFeatureError
from genai.multimodal.image_transforms import ImagePipeline
from genai.multimodal.images import Images

__all__ = ["ImageProcessor", "check_prompt_and_images"]


class ImageProcessor(ABC):
    """The image side of a vision-language model's multimodal processor.

    ``config`` is the model's `Config` (anything with ``.path``, the model folder, and
    ``.get(dotted_key, default)``); ``pixel_values_dtype`` the element type the vision graph
    takes (float32 or float16; the reference casts the processor's float32 to it)."""

    def __init__(self, config: Any, pixel_values_dtype: Any = np.float32) -> None:
        self.config = config
        folder = Path(config.path)
        if folder.is_file():
            folder = folder.parent
        filename = config.get("model.vision.config_filename", "processor_config.json")
        self.pipeline = ImagePipeline.from_file(folder / filename)
        dtype = np.dtype(pixel_values_dtype) if str(pixel_values_dtype) != "bfloat16" else None
        if dtype not in (np.dtype(np.float32), np.dtype(np.float16)):
            raise UnsupportedFeatureError(
                f"pixel values of type {pixel_values_dtype} are not supported yet "
                "(float32 and float16 are)"
            )
        self.pixel_values_dtype = dtype

    @classmethod
    def from_model(cls, model: Any) -> ImageProcessor:
        """The processor of a loaded `genai.Model`: its config, and pixel values in the type
        its vision graph takes."""
        dtype: Any = np.float32
        graphs = getattr(model, "vision", None)
        if graphs is not None and graphs.vision is not None:
            name = graphs.vision_inputs.get("pixel_values", "pixel_values")
            found = graphs.vision.input_dtypes.get(name)
            dtype = found if found is not None else "bfloat16"
        return cls(model.config, dtype)

    def pixel_values(self, array: np.ndarray) -> np.ndarray:
        """The processor's float32 pixel values in the vision graph's element type."""
        return np.ascontiguousarray(array, dtype=self.pixel_values_dtype)

    @abstractmethod
    def image_tag(self, number: int) -> str:
        """The prompt text that marks image ``number`` (1 for the first)."""

    def image_tags(self, count: int) -> str:
        """The prompt text that marks ``count`` images, in order (for prompts written
        without tags, e.g. ``genai generate --image``)."""
        return "".join(self.image_tag(number) for number in range(1, count + 1))

    @abstractmethod
    def has_image_tags(self, prompt: str) -> bool:
        """Whether ``prompt`` already marks images its own way."""

    @abstractmethod
    def process(self, tokenizer: Any, prompt: str, images: Images | None) -> NamedTensors:
        """The model inputs of one prompt and its images (None: a text-only prompt)."""

    def __call__(
        self,
        tokenizer: Any,
        prompt: str | list[str] | None,
        *,
        images: Images | None = None,
        audios: Any = None,
    ) -> NamedTensors:
        """`genai.multimodal.KindProcessor`'s call: one prompt (a str, a list of one str, or
        None: as ``""``) with its images."""
        if audios is not None:
            raise InvalidArgumentError(f"{type(self).__name__} takes images, not audios")
        return self.process(tokenizer, check_prompt_and_images(prompt, images), images)


def check_prompt_and_images(prompt: Any, images: Any) -> str:
    """The one prompt an image processor takes (a str, a list of one str, or None: ``""``),
    after checking the argument types."""
    if isinstance(prompt, list):
        if len(prompt) != 1:
            what = "prompts with images" if images is not None else "prompts"
            raise UnsupportedFeatureError(
                f"a list of {len(prompt)} {what} is not supported by an image processor: "
                "process one prompt at a time (the reference's image processors read a single "
                "prompt)"
            )
        prompt = prompt[0]
    if prompt is not None and not isinstance(prompt, str):
        raise ArgumentTypeError(
            "Unsupported type for prompts. Prompts must be a string or a list of strings."
        )
    if images is not None and not isinstance(images, Images):
        raise ArgumentTypeError(
            f"images must be og.Images (Images.open / Images.open_bytes), not "
            f"{type(images).__name__}"
        )
    return prompt or ""
