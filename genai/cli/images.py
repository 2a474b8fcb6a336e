"""What ``genai generate --image`` and ``genai chat --image`` share: the option, the model's
multimodal processor, and prompts that get the model's image tags."""

from __future__ import annotations

import argparse
from typing import Any

import genai
from genai.errors import InvalidArgumentError, ModelError
from genai.multimodal.image_processor import ImageProcessor

__all__ = ["add_image_option", "image_processor", "load_images", "with_image_tags"]


def add_image_option(parser: argparse.ArgumentParser) -> None:
    """``--image FILE`` (repeatable): images for a vision-language model."""
    parser.add_argument(
        "--image",
        action="append",
        metavar="FILE",
        help="a PNG or JPEG image for a vision-language model (phi3v, Qwen-VL, Gemma 3); "
        "repeat for several. A prompt without the model's image tags gets them in front",
    )


def load_images(files: list[str] | None) -> genai.Images | None:
    """The ``--image`` files decoded (None without any)."""
    return genai.Images.open(*files) if files else None


def image_processor(model: Any) -> Any:
    """The model's multimodal processor, when it takes images; else a one-line error."""
    try:
        processor = model.create_multimodal_processor()
    except ModelError:
        processor = None
    if processor is None or not isinstance(processor.kind, ImageProcessor):
        raise InvalidArgumentError(
            f"--image needs a vision-language model (phi3v, qwen2_5_vl, qwen3_vl, fara, "
            f"gemma3); this model's type is {model.type!r}"
        )
    return processor


def with_image_tags(processor: Any, text: str, count: int) -> str:
    """``text`` with the model's tags for ``count`` images in front, unless it has tags."""
    kind: ImageProcessor = processor.kind
    return text if kind.has_image_tags(text) else kind.image_tags(count) + text
