"""Qwen-VL's image inputs (model types ``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_5``,
``qwen3_5_moe``, ``fara``), as the reference makes them.

The image side is its ``processor_config.json``: smart resize (each side a multiple of
``patch_size * merge_size``), rescale, normalise, then ``PatchImage``: the image cut into
``patch_size`` squares, each repeated ``temporal_patch_size`` times, ordered so that the
``merge_size`` x ``merge_size`` neighbours the vision graph merges are consecutive rows:
``pixel_values`` ``[grid_h * grid_w, 3 * temporal * patch * patch]`` and ``image_grid_thw``
``[1, 3]`` (``t, h, w`` in patches).

The prompt side expands each ``<|vision_start|>...<|vision_end|>`` to
``<|vision_start|>`` + ``t * h * w / merge_size**2`` ``<|image_pad|>`` + ``<|vision_end|>``
before tokenising.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from genai.compat.tensors import NamedTensors
from genai.errors import ConfigError, InvalidArgumentError
from genai.multimodal.image_processor import ImageProcessor
from genai.multimodal.image_transforms import Transform, register

__all__ = ["QwenVisionProcessor", "expand_vision_tags", "patch_image"]

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
_VISION_START = re.compile(re.escape(VISION_START))


def patch_image(
    image: np.ndarray, patch_size: int = 14, temporal_patch_size: int = 2, merge_size: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """One normalised float32 image ``[h, w, c]`` -> (patches ``[grid_h * grid_w,
    c * temporal * patch * patch]``, ``image_grid_thw`` ``[1, 3]``), Qwen-VL's patch order."""
    if image.ndim != 3:
        raise InvalidArgumentError("[PatchImage]: input must be HWC float")
    if merge_size <= 0:
        raise InvalidArgumentError("[PatchImage]: merge_size must be > 0")
    height, width, channels = image.shape
    grid_t = 1  # one frame, repeated temporal_patch_size times
    grid_h, grid_w = height // patch_size, width // patch_size
    gh2, gw2 = grid_h // merge_size, grid_w // merge_size
    if gh2 * merge_size * patch_size != height or gw2 * merge_size * patch_size != width:
        raise InvalidArgumentError("Patch reshape mismatch")
    chw = np.ascontiguousarray(np.asarray(image, np.float32).transpose(2, 0, 1))
    frames = np.broadcast_to(chw, (temporal_patch_size, channels, height, width))
    blocks = frames.reshape(
        grid_t,
        temporal_patch_size,
        channels,
        gh2,
        merge_size,
        patch_size,
        gw2,
        merge_size,
        patch_size,
    ).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    patches = blocks.reshape(
        grid_t * grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size
    )
    grid = np.asarray([[grid_t, grid_h, grid_w]], np.int64)
    return np.ascontiguousarray(patches), grid


@register("PatchImage")
def _patch_image(attrs: Mapping[str, Any]) -> Transform:
    unknown = sorted(set(attrs) - {"patch_size", "temporal_patch_size", "merge_size"})
    if unknown:
        raise ConfigError(f"processor_config.json: PatchImage: Invalid argument {unknown[0]}")
    patch = int(attrs.get("patch_size", 14))
    temporal = int(attrs.get("temporal_patch_size", 2))
    merge = int(attrs.get("merge_size", 2))

    def transform(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return patch_image(image, patch, temporal, merge)

    return transform


def expand_vision_tags(prompt: str, grid_thw: np.ndarray | None, merge_size: int) -> str:
    """The prompt with each ``<|vision_start|>`` (up to the next ``<|vision_end|>``) replaced
    by the image's run of ``<|image_pad|>`` between the two markers, as the reference does.

    The number of ``<|vision_start|>`` must equal the number of images (rows of
    ``grid_thw``); an empty prompt gets one ``<|vision_start|> <|vision_end|>`` per image."""
    grid = np.zeros((0, 3), np.int64) if grid_thw is None else np.asarray(grid_thw).reshape(-1, 3)
    num_images = grid.shape[0]
    text = prompt
    if not text:
        text = " ".join(f"{VISION_START} {VISION_END}" for _ in range(num_images))
    matches = list(_VISION_START.finditer(text))
    if len(matches) != num_images:
        raise InvalidArgumentError(
            f"Prompt contained {len(matches)} vision_start tokens but received {num_images} images."
        )
    if num_images == 0:
        return text
    pieces: list[str] = []
    last = 0
    for index, match in enumerate(matches):
        t, h, w = (int(v) for v in grid[index])
        pads = (t * h * w) // (merge_size * merge_size)
        # text since the previous image (the reference takes the rest of the prompt when a
        # previous image's <|vision_end|> lay past this <|vision_start|>)
        pieces.append(text[last : match.start()] if match.start() >= last else text[last:])
        pieces.append(VISION_START + IMAGE_PAD * pads + VISION_END)
        last = match.end()
        end = text.find(VISION_END, last)
        if end != -1:
            last = end + len(VISION_END)
    pieces.append(text[last:])
    return "".join(pieces)


class QwenVisionProcessor(ImageProcessor):
    """Qwen-VL kinds: ``input_ids`` (vision markers expanded to ``<|image_pad|>`` runs) and
    ``num_image_tokens`` ``[1]`` (all images together); with images ``pixel_values``
    ``[patches, patch_dim]`` (all images' patches, each image's rows zero-padded to the
    largest's as the reference stacks them) and ``image_grid_thw`` ``[images, 3]``."""

    def __init__(self, config: Any, pixel_values_dtype: Any = np.float32) -> None:
        super().__init__(config, pixel_values_dtype)
        self.merge_size = int(config.get("model.vision.spatial_merge_size", 2))
        self.patch_size = int(config.get("model.vision.patch_size", 14))
        if self.merge_size <= 0 or self.patch_size <= 0:
            raise ConfigError("model.vision: spatial_merge_size and patch_size must be > 0")

    def image_tag(self, number: int) -> str:
        return VISION_START + IMAGE_PAD + VISION_END

    def has_image_tags(self, prompt: str) -> bool:
        return VISION_START in prompt

    def process(self, tokenizer: Any, prompt: str, images: Any) -> NamedTensors:
        out = NamedTensors()
        if images is None or len(images) == 0:
            text = expand_vision_tags(prompt, None, self.merge_size)
            out["input_ids"] = np.asarray(tokenizer.encode(text), np.int32).reshape(1, -1)
            out["num_image_tokens"] = np.asarray([0], np.int64)
            return out
        outputs = self.pipeline(list(images))
        pixel_values = outputs[0]
        grid = outputs[1] if len(outputs) > 1 else None
        if pixel_values.ndim == 4 and pixel_values.shape[0] == 1:
            # a config without PatchImage: patch the one HWC image here, as the reference
            pixel_values, computed = self._patch_hwc(pixel_values[0])
            pixel_values = pixel_values.reshape(1, *pixel_values.shape)
            if grid is None:
                grid = computed
        else:
            pixel_values = pixel_values.reshape(-1, pixel_values.shape[-1])
        grid = None if grid is None else np.asarray(grid, np.int64).reshape(-1, 3)
        text = expand_vision_tags(prompt, grid, self.merge_size)
        out["input_ids"] = np.asarray(tokenizer.encode(text), np.int32).reshape(1, -1)
        out["pixel_values"] = self.pixel_values(pixel_values)
        if grid is not None:
            out["image_grid_thw"] = grid
        total = 0 if grid is None else int((grid.prod(axis=1) // self.merge_size**2).sum())
        out["num_image_tokens"] = np.asarray([total], np.int64)
        return out

    def _patch_hwc(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Patches of one HWC image, each repeated twice in time (no merge reordering)."""
        patch = self.patch_size
        height, width, channels = image.shape
        rows, cols = height // patch, width // patch
        if rows <= 0 or cols <= 0:
            raise InvalidArgumentError(f"image {width}x{height} is smaller than a {patch} patch")
        cropped = image[: rows * patch, : cols * patch].astype(np.float32)
        blocks = cropped.reshape(rows, patch, cols, patch, channels).transpose(0, 2, 4, 1, 3)
        blocks = blocks.reshape(rows * cols, 1, channels * patch * patch)
        patches = np.repeat(blocks, 2, axis=1).reshape(rows * cols, 2 * channels * patch * patch)
        return patches, np.asarray([[1, rows, cols]], np.int64)
