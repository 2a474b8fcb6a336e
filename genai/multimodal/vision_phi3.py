"""Phi-3 Vision's image inputs (model type ``phi3v``), as the reference makes them.

The image side is the ``Phi3ImageTransform`` of its ``processor_config.json``: Phi-3's "HD"
transform resizes each image (bilinear) so that its longer side spans ``scale`` 336-pixel
crops (at most 16 crops in all), pads the shorter side with white to a multiple of 336,
normalises with CLIP's mean and std, and returns ``pixel_values`` ``[17, 3, 336, 336]``
(a bicubic 336x336 global view, the crops row by row, zero crops up to 16),
``image_sizes`` ``[2]`` (the padded height and width) and the image's token count.

The prompt side splits the prompt at ``<|image_N|>`` tags, tokenises the pieces and puts
``num_image_tokens[N-1]`` copies of ``-N`` in place of each tag.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from genai.compat.tensors import NamedTensors
from genai.errors import ConfigError, InvalidArgumentError
from genai.multimodal.image_processor import ImageProcessor
from genai.multimodal.image_transforms import (
    BICUBIC,
    BILINEAR,
    Transform,
    register,
    resample,
)

__all__ = [
    "HD_MAX_CROPS",
    "HD_TILE",
    "Phi3VisionProcessor",
    "expand_image_tags",
    "hd_transform",
    "num_image_tokens",
]

#: The most 336x336 crops of one image (the reference's transform fixes it at 16).
HD_MAX_CROPS = 16
#: The side of a crop and of the global view.
HD_TILE = 336
_CLIP_MEAN = np.asarray([0.48145466, 0.4578275, 0.40821073], np.float32)
_CLIP_STD = np.asarray([0.26862954, 0.26130258, 0.27577711], np.float32)

IMAGE_TAG = re.compile(r"<\|image_\d+\|>")


def _hd_size(width: int, height: int, max_crops: int) -> tuple[int, int]:
    """The resized (width, height) before padding: the longer side a multiple of 336."""
    ratio = width / height if width >= height else height / width
    scale = 1
    while scale * math.ceil(scale / ratio) <= max_crops:
        scale += 1
    scale -= 1
    new_w = scale * HD_TILE
    new_h = max(1, int(new_w / ratio))  # a sliver of an image keeps one row
    if width < height:
        new_w, new_h = new_h, new_w
    return new_w, new_h


def _pad_to_tiles(image: np.ndarray, axis: int) -> np.ndarray:
    """Pad ``axis`` (0: height, 1: width) with white to a multiple of 336, centred."""
    size = image.shape[axis]
    target = int(math.ceil(np.float32(size) / HD_TILE) * HD_TILE)
    if target == size:
        return image
    before = int((target - np.float32(size)) / 2)
    pad = [(0, 0)] * 3
    pad[axis] = (before, target - size - before)
    return np.pad(image, pad, constant_values=255)


def hd_transform(image: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One RGB ``uint8`` image ``[h, w, 3]`` -> (pixel_values ``[17, 3, 336, 336]`` float32,
    image_sizes ``[2]`` int64, num_img_tokens ``[1]`` int64)."""
    if image.ndim != 3:
        raise InvalidArgumentError("[hd_transform]: Only raw image formats")
    if image.shape[2] != 3:
        raise InvalidArgumentError(
            f"[phi3_hd_transform]: Expected 3-channel RGB input, got {image.shape[2]} channels"
        )
    height, width = image.shape[:2]
    new_w, new_h = _hd_size(width, height, HD_MAX_CROPS)
    resized = resample(image, new_w, new_h, BILINEAR)
    padded = _pad_to_tiles(resized, 1 if width < height else 0)
    h, w = padded.shape[:2]
    # channel first, then (x / 255 - mean) / std in float32 as the reference (in place)
    chw = np.ascontiguousarray(padded.transpose(2, 0, 1)).astype(np.float32)
    chw /= np.float32(255.0)
    chw -= _CLIP_MEAN[:, None, None]
    chw /= _CLIP_STD[:, None, None]

    pixel_values = np.zeros((HD_MAX_CROPS + 1, 3, HD_TILE, HD_TILE), np.float32)
    for channel in range(3):  # the global view: each channel resized bicubic (float)
        pixel_values[0, channel] = resample(chw[channel], HD_TILE, HD_TILE, BICUBIC)
    rows, cols = h // HD_TILE, w // HD_TILE
    crops = pixel_values[1 : 1 + rows * cols].reshape(rows, cols, 3, HD_TILE, HD_TILE)
    crops[...] = chw.reshape(3, rows, HD_TILE, cols, HD_TILE).transpose(1, 3, 0, 2, 4)

    image_sizes = np.asarray([h, w], np.int64)
    tokens = num_image_tokens(h, w)
    return pixel_values, image_sizes, np.asarray([tokens], np.int64)


def num_image_tokens(height: int, width: int) -> int:
    """Image tokens of one padded image: ``(crops + 1) * 144 + 1 + (rows + 1) * 12``."""
    rows = height // HD_TILE
    return ((rows * width) // HD_TILE + 1) * 144 + 1 + (rows + 1) * 12


@register("Phi3ImageTransform")
def _phi3_image_transform(attrs: Mapping[str, Any]) -> Transform:
    # num_crops / num_img_tokens are in Phi-3 Vision's configs; the reference's transform
    # ignores them (16 crops, 144 tokens a crop): so do we.
    return hd_transform


def expand_image_tags(tokenizer: Any, prompt: str, num_img_tokens: np.ndarray | None) -> np.ndarray:
    """``input_ids`` ``[1, n]`` int32 of a Phi-3 Vision prompt: the text between
    ``<|image_N|>`` tags tokenised piece by piece, each tag replaced by
    ``num_img_tokens[N - 1]`` copies of ``-N``.

    The reference's errors: the number of distinct tags must equal the number of images, and
    every ``N`` must lie in ``1..len(images)``."""
    counts = [] if num_img_tokens is None else [int(n) for n in np.ravel(num_img_tokens)]
    num_images = len(counts)
    chunks = IMAGE_TAG.split(prompt)
    image_ids = [int(tag[8:-2]) for tag in IMAGE_TAG.findall(prompt)]
    if len(set(image_ids)) != num_images:
        raise InvalidArgumentError(
            "Number of unique image tags does not match the number of images."
        )
    pieces: list[np.ndarray] = []
    for index, chunk in enumerate(chunks):
        pieces.append(np.asarray(tokenizer.encode(chunk), np.int32))
        if index < len(image_ids):
            image_id = image_ids[index]
            if image_id < 1 or image_id > num_images:
                raise InvalidArgumentError(
                    "Encountered unexpected value of image_id in the prompt. Expected a value "
                    f"<= {num_images}. Actual value: {image_id}"
                )
            pieces.append(np.full(counts[image_id - 1], -image_id, np.int32))
    ids = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    return ids.reshape(1, -1)


class Phi3VisionProcessor(ImageProcessor):
    """Phi-3 Vision (``phi3v``): ``input_ids`` (image tags expanded to ``-N`` runs), and with
    images ``pixel_values`` ``[images, 17, 3, 336, 336]``, ``image_sizes`` ``[images, 2]``,
    ``num_image_tokens`` ``[images, 1]``."""

    def image_tag(self, number: int) -> str:
        return f"<|image_{number}|>\n"

    def has_image_tags(self, prompt: str) -> bool:
        return IMAGE_TAG.search(prompt) is not None

    def process(self, tokenizer: Any, prompt: str, images: Any) -> NamedTensors:
        out = NamedTensors()
        if images is None:
            out["input_ids"] = expand_image_tags(tokenizer, prompt, None)
            return out
        outputs = self.pipeline(list(images))
        if len(outputs) != 3:
            raise ConfigError(
                "processor_config.json: Phi-3 Vision's transforms must end with "
                "Phi3ImageTransform (pixel values, image sizes, token counts)"
            )
        pixel_values, image_sizes, num_tokens = outputs
        out["input_ids"] = expand_image_tags(tokenizer, prompt, num_tokens)
        out["pixel_values"] = self.pixel_values(pixel_values)
        out["image_sizes"] = image_sizes.astype(np.int64)
        out["num_image_tokens"] = num_tokens.astype(np.int64)
        return out
