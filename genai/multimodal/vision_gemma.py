"""Gemma 3's image inputs (model type ``gemma3``), as the reference makes them.

The image side is its ``processor_config.json``: a fixed 896x896 bicubic resize (aspect
ratio not kept), rescale to [0, 1], normalise with mean and std 0.5, channel first:
``pixel_values`` ``[images, 3, 896, 896]``. The reference does no pan-and-scan: neither do
we.

The prompt side replaces each ``<start_of_image>`` with
``"\\n\\n<start_of_image>" + 256 * "<image_soft_token>" + "<end_of_image>\\n\\n"`` before
tokenising; ``token_type_ids`` marks the ``<image_soft_token>`` positions with 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from genai.compat.tensors import NamedTensors
from genai.errors import InvalidArgumentError
from genai.multimodal.image_processor import ImageProcessor

__all__ = ["IMAGE_SEQ_LENGTH", "Gemma3VisionProcessor", "expand_image_tokens"]

BOI_TOKEN = "<start_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
EOI_TOKEN = "<end_of_image>"
#: Soft tokens per image.
IMAGE_SEQ_LENGTH = 256


def expand_image_tokens(prompt: str, num_images: int) -> str:
    """The prompt with each ``<start_of_image>`` expanded to the image's soft tokens; an
    empty prompt gets one ``<start_of_image>`` per image. The reference's error when the
    counts differ."""
    text = prompt
    if not text and num_images:
        text = " ".join([BOI_TOKEN] * num_images)
    count = text.count(BOI_TOKEN)
    if count != num_images:
        raise InvalidArgumentError(
            f"Prompt contained {count} image tokens but received {num_images} images."
        )
    full = f"\n\n{BOI_TOKEN}{IMAGE_TOKEN * IMAGE_SEQ_LENGTH}{EOI_TOKEN}\n\n"
    return text.replace(BOI_TOKEN, full)


class Gemma3VisionProcessor(ImageProcessor):
    """Gemma 3: ``input_ids``; with images also ``token_type_ids`` (1 at image soft tokens),
    ``pixel_values`` ``[images, 3, 896, 896]`` and ``num_image_tokens`` ``[1]`` (256)."""

    def image_tag(self, number: int) -> str:
        return BOI_TOKEN

    def has_image_tags(self, prompt: str) -> bool:
        return BOI_TOKEN in prompt

    def process(self, tokenizer: Any, prompt: str, images: Any) -> NamedTensors:
        out = NamedTensors()
        if images is None:
            text = expand_image_tokens(prompt, 0)
            out["input_ids"] = np.asarray(tokenizer.encode(text), np.int32).reshape(1, -1)
            return out
        (pixel_values, *_) = self.pipeline(list(images))
        text = expand_image_tokens(prompt, pixel_values.shape[0])
        ids = np.asarray(tokenizer.encode(text), np.int32).reshape(1, -1)
        out["input_ids"] = ids
        image_token_id = tokenizer.to_token_id(IMAGE_TOKEN)
        out["token_type_ids"] = (ids == image_token_id).astype(np.int32)
        out["pixel_values"] = self.pixel_values(pixel_values)
        out["num_image_tokens"] = np.asarray([IMAGE_SEQ_LENGTH], np.int64)
        return out
