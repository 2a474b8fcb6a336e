"""The image pipeline a vision model's ``processor_config.json`` describes, run as the
reference runs it (onnxruntime-extensions' image processor).

A config lists ``processor.transforms``, each ``{"operation": {"type": ..., "attrs": {...}}}``,
applied in order to every image; each transform takes the previous one's outputs (the first
takes the decoded RGB ``uint8`` image, ``[height, width, 3]``). The last transform's outputs
are stacked over the images (`stack_outputs`). Resampling is Pillow's (the reference uses a
port of Pillow's resampling code); arithmetic is float32, as the reference's.

The model-specific transforms live beside their prompt handling: `Phi3ImageTransform` in
`genai.multimodal.vision_phi3`, `PatchImage` in `genai.multimodal.vision_qwen`; they register
themselves in `TRANSFORMS`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from genai.errors import ConfigError, InvalidArgumentError, UnsupportedFeatureError
from genai.multimodal.images import pillow_image

__all__ = ["TRANSFORMS", "ImagePipeline", "resample", "stack_outputs"]

#: A transform: the previous outputs -> its outputs (one array or several).
Transform = Callable[..., "np.ndarray | tuple[np.ndarray, ...]"]
#: transform type name -> factory taking the ``attrs`` dict and returning the transform.
TRANSFORMS: dict[str, Callable[[Mapping[str, Any]], Transform]] = {}

#: Pillow's resampling filters by the reference's interpolation names.
_INTERPOLATIONS = {"NEAREST": 0, "LINEAR": 2, "CUBIC": 3, "LANCZOS": 1}
BILINEAR = 2
BICUBIC = 3


def register(name: str) -> Callable[[Callable[[Mapping[str, Any]], Transform]], Any]:
    """Register a transform factory under the config's ``type`` name."""

    def decorate(factory: Callable[[Mapping[str, Any]], Transform]) -> Any:
        TRANSFORMS[name] = factory
        return factory

    return decorate


def resample(image: np.ndarray, width: int, height: int, method: int) -> np.ndarray:
    """Pillow's resampling of an image to ``width`` x ``height`` (the horizontal pass, then
    the vertical one): ``uint8`` ``[h, w, 3]``
    (RGB) or float32 ``[h, w]`` (one channel, Pillow's "F" mode). ``method`` is Pillow's
    filter number (0 nearest, 2 bilinear, 3 bicubic, 1 lanczos)."""
    if image.ndim == 3 and image.strides[2] < 0:  # channels reversed (ConvertRGB): resample
        # the original bytes, reverse the (smaller or equal) result: one copy, contiguous
        return np.ascontiguousarray(resample(image[:, :, ::-1], width, height, method)[:, :, ::-1])
    image_module = pillow_image()
    if image.dtype == np.uint8:
        picture = image_module.fromarray(np.ascontiguousarray(image), "RGB")
    else:
        picture = image_module.fromarray(np.ascontiguousarray(image, dtype=np.float32), "F")
    # Two passes, horizontal first, as the reference always runs them (Pillow would run the
    # vertical pass first where that is cheaper: the rounding between the passes differs).
    if picture.size[0] != width:
        picture = picture.resize((int(width), picture.size[1]), resample=method)
    if picture.size[1] != height:
        picture = picture.resize((picture.size[0], int(height)), resample=method)
    return np.asarray(picture)


def _attrs(attrs: Mapping[str, Any], allowed: Sequence[str], name: str) -> None:
    unknown = sorted(set(attrs) - set(allowed))
    if unknown:
        raise ConfigError(f"processor_config.json: {name}: unknown attribute {unknown[0]!r}")


def _expect_hwc(image: np.ndarray, name: str) -> None:
    if image.ndim != 3:
        raise InvalidArgumentError(f"[{name}]: expects an image [height, width, channels]")


# --- generic transforms ---------------------------------------------------------------------


@register("DecodeImage")
def _decode_image(attrs: Mapping[str, Any]) -> Transform:
    _attrs(attrs, ("color_space",), "DecodeImage")
    space = str(attrs.get("color_space", "RGB")).upper()
    if space not in ("RGB", "BGR"):
        raise ConfigError("processor_config.json: DecodeImage: color_space is RGB or BGR")

    def decode(image: np.ndarray) -> np.ndarray:  # images arrive decoded, as RGB
        return image[:, :, ::-1] if space == "BGR" else image

    return decode


@register("ConvertRGB")
def _convert_rgb(attrs: Mapping[str, Any]) -> Transform:
    _attrs(attrs, (), "ConvertRGB")

    def convert(image: np.ndarray) -> np.ndarray:  # swaps channels 0 and 2, as the reference
        if image.ndim != 3 or image.shape[2] != 3:
            raise InvalidArgumentError("[ConvertToRGB]: input is not (H, W, C)")
        return image[:, :, ::-1]

    return convert


def _round_half_away(value: float) -> int:
    return math.floor(value + 0.5) if value >= 0 else -math.floor(-value + 0.5)


def smart_resize(
    height: int,
    width: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
    max_ratio: float = 200.0,
) -> tuple[int, int]:
    """The size Qwen-VL's smart resize picks: each side a multiple of ``factor``, the area
    within ``[min_pixels, max_pixels]``, the aspect ratio kept (the reference's arithmetic)."""
    if max(height, width) / min(height, width) > max_ratio:
        raise InvalidArgumentError(
            f"Absolute aspect ratio must be smaller than {max_ratio:f} (image is {width}x{height})"
        )
    h_bar = max(factor, _round_half_away(height / factor) * factor)
    w_bar = max(factor, _round_half_away(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = math.floor(int(height / beta) / factor) * factor
        w_bar = math.floor(int(width / beta) / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(int(height * beta) / factor) * factor
        w_bar = math.ceil(int(width * beta) / factor) * factor
    return h_bar, w_bar


@register("Resize")
def _resize(attrs: Mapping[str, Any]) -> Transform:
    allowed = (
        "height",
        "width",
        "keep_aspect_ratio",
        "interpolation",
        "smart_resize",
        "min_pixels",
        "max_pixels",
        "patch_size",
        "merge_size",
    )
    _attrs(attrs, allowed, "Resize")
    interpolation = str(attrs.get("interpolation", "CUBIC"))
    if interpolation not in _INTERPOLATIONS:
        raise ConfigError("processor_config.json: Resize: invalid interpolation method")
    method = _INTERPOLATIONS[interpolation]
    height, width = int(attrs.get("height", 256)), int(attrs.get("width", 256))
    smart = bool(int(attrs.get("smart_resize", 0)))
    factor = int(attrs.get("patch_size", 14)) * int(attrs.get("merge_size", 2))
    min_pixels = int(attrs.get("min_pixels", 3136))
    max_pixels = int(attrs.get("max_pixels", 12845056))
    # keep_aspect_ratio scales the target size by max(w / w, h / h) = 1 in the reference: a
    # no-op, accepted and ignored.

    def resize(image: np.ndarray) -> np.ndarray:
        _expect_hwc(image, "Resize")
        if smart:
            new_h, new_w = smart_resize(
                image.shape[0], image.shape[1], factor, min_pixels, max_pixels
            )
        else:
            new_h, new_w = height, width
        return resample(image, new_w, new_h, method)

    return resize


@register("Rescale")
def _rescale(attrs: Mapping[str, Any]) -> Transform:
    _attrs(attrs, ("rescale_factor",), "Rescale")
    scale = np.float32(attrs.get("rescale_factor", np.float32(1.0) / np.float32(255.0)))

    def rescale(image: np.ndarray) -> np.ndarray:
        _expect_hwc(image, "Rescale")
        out = image.astype(np.float32)
        out *= scale
        return out

    return rescale


@register("Normalize")
def _normalize(attrs: Mapping[str, Any]) -> Transform:
    _attrs(attrs, ("mean", "std", "qwen2_5_vl", "qwen3_vl"), "Normalize")
    mean = np.asarray(attrs.get("mean", [0.48145466, 0.4578275, 0.40821073])[:3], np.float32)
    std = np.asarray(attrs.get("std", [0.26862954, 0.26130258, 0.27577711])[:3], np.float32)
    swap = any(bool(int(attrs.get(key, 0))) for key in ("qwen2_5_vl", "qwen3_vl"))

    def normalize(image: np.ndarray) -> np.ndarray:
        _expect_hwc(image, "Normalize")
        if swap:  # Qwen-VL's configs decode RGB, ConvertRGB to BGR, and swap back here
            image = image[:, :, ::-1]
        height, width, channels = image.shape
        # rows of width * channels values: a long inner loop (a size-3 one is slow in NumPy)
        rows = np.ascontiguousarray(image, dtype=np.float32).reshape(height, width * channels)
        out = rows - np.tile(mean[:channels], width)
        out /= np.tile(std[:channels], width)
        return out.reshape(height, width, channels)

    return normalize


@register("CenterCrop")
def _center_crop(attrs: Mapping[str, Any]) -> Transform:
    _attrs(attrs, ("height", "width"), "CenterCrop")
    target_h, target_w = int(attrs.get("height", 224)), int(attrs.get("width", 224))

    def crop(image: np.ndarray) -> np.ndarray:
        _expect_hwc(image, "CenterCrop")
        h, w = image.shape[:2]
        if target_h > h or target_w > w:
            raise InvalidArgumentError("[CenterCrop]: target dimensions exceed input image size")
        top, left = (h - target_h) // 2, (w - target_w) // 2
        return image[top : top + target_h, left : left + target_w]

    return crop


@register("Permute3D")
def _permute(attrs: Mapping[str, Any]) -> Transform:
    _attrs(attrs, ("dims",), "Permute3D")
    dims = tuple(int(d) for d in attrs.get("dims", (1, 2, 0)))
    if sorted(dims) != [0, 1, 2]:
        raise ConfigError("processor_config.json: Permute3D: dims is a permutation of 0, 1, 2")

    def permute(image: np.ndarray) -> np.ndarray:
        if image.ndim != 3:
            raise InvalidArgumentError("[Permute]: Only 3D tensors are supported")
        return np.transpose(image, dims)

    return permute


# --- the pipeline ---------------------------------------------------------------------------


class ImagePipeline:
    """The transforms of a ``processor_config.json``, applied to decoded images."""

    def __init__(self, definition: Mapping[str, Any], source: str = "processor_config.json"):
        try:
            root = definition["processor"]
            steps = root["transforms"]
        except (KeyError, TypeError):
            raise ConfigError(f"{source}: needs processor.transforms") from None
        if not isinstance(steps, list) or not steps:
            raise ConfigError(f"{source}: processor.transforms must be a non-empty list")
        self.name = str(root.get("name", ""))
        self.types: list[str] = []
        self._transforms: list[Transform] = []
        for step in steps:
            operation = step.get("operation") if isinstance(step, Mapping) else None
            if not isinstance(operation, Mapping) or "type" not in operation:
                raise ConfigError(f"{source}: each transform needs operation.type")
            kind = str(operation["type"])
            factory = TRANSFORMS.get(kind)
            if factory is None:
                raise UnsupportedFeatureError(
                    f"{source}: image transform {kind!r} is not supported by genai yet "
                    f"(supported: {', '.join(sorted(TRANSFORMS))})"
                )
            attrs = operation.get("attrs") or {}
            if not isinstance(attrs, Mapping):
                raise ConfigError(f"{source}: {kind}: attrs must be an object")
            self.types.append(kind)
            self._transforms.append(factory(attrs))

    @classmethod
    def from_file(cls, path: str | Path) -> ImagePipeline:
        """Read a ``processor_config.json``."""
        path = Path(path)
        try:
            definition = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"processor config not found: {path}") from None
        except (OSError, ValueError) as error:
            raise ConfigError(f"{path}: not a JSON processor config ({error})") from None
        return cls(definition, str(path))

    def run(self, image: np.ndarray) -> tuple[np.ndarray, ...]:
        """The last transform's outputs for one decoded RGB image."""
        values: tuple[np.ndarray, ...] = (image,)
        for transform in self._transforms:
            out = transform(*values)
            values = out if isinstance(out, tuple) else (out,)
        return values

    def __call__(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Every image through the transforms, each output stacked over the images."""
        per_image = [self.run(image) for image in images]
        return stack_outputs(per_image)


def _greater_shape(lhs: tuple[int, ...], rhs: tuple[int, ...]) -> bool:
    if len(lhs) != len(rhs):
        return len(lhs) > len(rhs)
    return lhs > rhs


def _copy_or_pad(dest: np.ndarray, src: np.ndarray) -> None:
    """Copy ``src`` into the zero-filled ``dest`` of the same rank, row by row along the
    first axis, padding what ``src`` lacks (the reference's CopyOrPadTensor)."""
    if dest.ndim == 1:
        count = min(dest.shape[0], src.shape[0])
        dest[:count] = src[:count]
        return
    rows = min(dest.shape[0], src.shape[0])
    if dest.shape[1:] == src.shape[1:]:
        dest[:rows] = src[:rows]
        return
    for row in range(rows):
        _copy_or_pad(dest[row], src[row])


def stack_outputs(per_image: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """Stack each output over the images along a new first axis. Outputs of different shapes
    go into the lexicographically greatest shape, zero-padded, as the reference stacks
    them."""
    if not per_image:
        return []
    stacked = []
    for index in range(len(per_image[0])):
        arrays = [np.asarray(outputs[index]) for outputs in per_image]
        shape = arrays[0].shape
        same = all(a.shape == shape for a in arrays)
        if same:
            stacked.append(np.stack(arrays))
            continue
        for array in arrays:
            if array.ndim != len(shape):
                raise InvalidArgumentError(
                    "[StackTensors]: shapes of tensors to stack are not the same."
                )
            if _greater_shape(array.shape, shape):
                shape = array.shape
        out = np.zeros((len(arrays), *shape), dtype=arrays[0].dtype)
        for row, array in enumerate(arrays):
            _copy_or_pad(out[row], array)
        stacked.append(out)
    return stacked
