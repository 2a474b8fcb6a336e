"""`Images`: image files decoded for a vision-language model's prompt (the reference's
``og.Images``).

``Images.open(*paths)`` and ``Images.open_bytes(*blobs)`` decode PNG and JPEG files into RGB
``uint8`` arrays ``[height, width, 3]``, as the reference's decoder hands them to its image
processors: an alpha channel is dropped (not composited), grey is repeated into three
channels, 16-bit samples keep their high byte, EXIF orientation is not applied. Other formats
(BMP, GIF, WebP, ...), CMYK JPEGs and truncated files are refused.

PNGs decode with Pillow (the ``vision`` extra), bit-identical to the reference's libpng.
JPEGs decode with IJG libjpeg 9e through ``jpeglib`` (also in the ``vision`` extra), the
libjpeg the reference bundles: bit-identical too. Without ``jpeglib`` they decode with
Pillow's libjpeg-turbo, whose chroma upsampling and rounding differ (colour JPEGs then differ
by up to a few levels; docs/differences.md).

Decompression bombs are refused from the header, before any pixel is decoded: a side longer
than `MAX_IMAGE_SIDE` or more than `MAX_IMAGE_PIXELS` pixels (the reference's limits) raises
`InvalidArgumentError`, so a tiny file claiming 20000x20000 costs no memory.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from genai.errors import ArgumentTypeError, InvalidArgumentError, MissingDependencyError

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIDE",
    "REFERENCE_LIBJPEG",
    "Images",
    "decode_image",
    "header_size",
    "pillow_image",
]

#: The longest side an image may have (the reference's decoder refuses longer ones).
MAX_IMAGE_SIDE = 16384
#: The most pixels an image may have (100 megapixels, the reference's limit).
MAX_IMAGE_PIXELS = 100_000_000

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"


def pillow_image() -> Any:
    """Pillow's ``PIL.Image`` module, or `MissingDependencyError` naming the extra."""
    try:
        from PIL import Image  # lazy: Pillow (the vision extra) loads only to decode images
    except ImportError:
        raise MissingDependencyError(
            "decoding images needs Pillow: pip install 'genai-runtime[vision]'"
        ) from None
    return Image


def _format_of(data: bytes) -> str:
    if data.startswith(_PNG_SIGNATURE):
        return "PNG"
    if data.startswith(_JPEG_SIGNATURE):
        return "JPEG"
    return ""


_JPEG_FRAMES = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def header_size(data: bytes, kind: str) -> tuple[int, int] | None:
    """(width, height) read from a PNG's IHDR or a JPEG's first frame header, without
    decoding; None when the header is not where it should be."""
    if kind == "PNG":
        if len(data) < 24 or data[12:16] != b"IHDR":
            return None
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            position += 2
            continue
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        if marker in _JPEG_FRAMES:
            if position + 9 > len(data):
                return None
            height = int.from_bytes(data[position + 5 : position + 7], "big")
            width = int.from_bytes(data[position + 7 : position + 9], "big")
            return width, height
        position += 2 + length
    return None


def _check_size(width: int, height: int, name: str) -> None:
    if width > MAX_IMAGE_SIDE or height > MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
        raise InvalidArgumentError(
            f"{name}: image is {width}x{height}; the limit is {MAX_IMAGE_SIDE} pixels a side "
            f"and {MAX_IMAGE_PIXELS:,} pixels in all"
        )


def decode_image(data: bytes, name: str = "image", path: str | None = None) -> np.ndarray:
    """Decode one PNG or JPEG file's bytes into an RGB ``uint8`` array ``[height, width, 3]``
    the way the reference's decoder does; ``name`` names the image in errors, ``path`` is the
    file ``data`` was read from, if any (a JPEG decoder reading files then reads it).

    Raises `InvalidArgumentError` for another format, a corrupt file, a CMYK JPEG or an image
    over the size limits (checked from the header, before decoding)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ArgumentTypeError(f"{name}: image data must be bytes, not {type(data).__name__}")
    data = bytes(data)
    kind = _format_of(data)
    if not kind:
        raise InvalidArgumentError(
            f"{name}: unsupported image format (only PNG and JPEG files are supported)"
        )
    size = header_size(data, kind)
    if size is not None:  # before Pillow: its own bomb check would speak of an "attack"
        _check_size(*size, name)
    image_module = pillow_image()
    stream = io.BytesIO(data)
    try:
        image = image_module.open(stream, formats=[kind])
    except image_module.DecompressionBombError as error:  # far over our limit too
        raise InvalidArgumentError(
            f"{name}: image too large ({error}); the limit is {MAX_IMAGE_SIDE} pixels a side "
            f"and {MAX_IMAGE_PIXELS:,} pixels in all"
        ) from None
    except Exception as error:  # Pillow raises OSError, SyntaxError, ValueError, ...
        detail = str(error).replace(f" {stream!r}", "")  # Pillow names its file object
        raise InvalidArgumentError(f"{name}: cannot read the {kind} header ({detail})") from None
    _check_size(*image.size, name)
    if image.mode in ("CMYK", "YCbCr;K") or (kind == "JPEG" and image.mode not in ("RGB", "L")):
        raise InvalidArgumentError(
            f"{name}: unsupported JPEG color space {image.mode} (only RGB and grayscale)"
        )
    if kind == "JPEG":
        if not _has_end_of_image(data):
            raise InvalidArgumentError(f"{name}: corrupt JPEG data (truncated: no end marker)")
        exact = _decode_jpeg_as_reference(data, name, path)
        if exact is not None:
            return exact
    try:
        image.load()
    except Exception as error:
        raise InvalidArgumentError(f"{name}: corrupt {kind} data ({error})") from None
    return _to_rgb(image)


def _has_end_of_image(data: bytes) -> bool:
    """Whether the end-of-image marker follows the last scan (entropy-coded data cannot
    hold it: a file without one was cut short)."""
    last_scan = data.rfind(b"\xff\xda")
    return last_scan != -1 and data.find(b"\xff\xd9", last_scan) != -1


#: The libjpeg the reference decodes with (onnxruntime-extensions bundles IJG libjpeg 9e).
REFERENCE_LIBJPEG = "9e"
_warned_inexact = False


def _jpeglib() -> Any:
    """The ``jpeglib`` package set to `REFERENCE_LIBJPEG`, or None when it is not installed
    (JPEGs then decode with Pillow's libjpeg-turbo: colours differ slightly)."""
    global _warned_inexact
    try:
        import jpeglib  # lazy: optional (the vision extra); loads a libjpeg build per version
    except ImportError:
        if not _warned_inexact:
            _warned_inexact = True
            logger.warning(
                "jpeglib is not installed: colour JPEGs decode with Pillow's libjpeg-turbo and "
                "differ slightly from the reference's (pip install 'genai-runtime[vision]')"
            )
        return None
    if str(jpeglib.version.get()) != REFERENCE_LIBJPEG:
        jpeglib.version.set(REFERENCE_LIBJPEG)
    return jpeglib


def _decode_jpeg_as_reference(data: bytes, name: str, path: str | None) -> np.ndarray | None:
    """RGB pixels of a JPEG decoded by IJG libjpeg 9e with RGB output, as the reference
    decodes (bit-identical); None without jpeglib."""
    jpeglib = _jpeglib()
    if jpeglib is None:
        return None
    if path is not None:
        pixels = _read_jpeg(jpeglib, path, name)
    else:
        with tempfile.TemporaryDirectory(prefix="genai-image-") as folder:
            path = os.path.join(folder, "image.jpg")  # jpeglib reads files only
            with open(path, "wb") as file:
                file.write(data)
            pixels = _read_jpeg(jpeglib, path, name)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise InvalidArgumentError(f"{name}: unexpected JPEG output {pixels.shape}")
    return np.ascontiguousarray(pixels)


def _read_jpeg(jpeglib: Any, path: str, name: str) -> np.ndarray:
    try:
        jpeg = jpeglib.read_spatial(path, out_color_space=jpeglib.Colorspace.JCS_RGB)
        return np.asarray(jpeg.spatial, dtype=np.uint8)
    except Exception as error:  # jpeglib raises OSError naming the file
        raise InvalidArgumentError(f"{name}: corrupt JPEG data ({error})") from None


def _to_rgb(image: Any) -> np.ndarray:
    """An RGB uint8 array of a decoded Pillow image, channel by channel as libpng / libjpeg
    give them to the reference (alpha dropped, grey repeated, 16-bit reduced to the high
    byte)."""
    mode = image.mode
    if mode == "RGB":
        return np.asarray(image, dtype=np.uint8)
    if mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit grey: keep the high byte
        grey = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if mode in ("L", "LA", "1"):
        grey = np.asarray(image.getchannel(0) if mode == "LA" else image.convert("L"))
        return np.repeat(np.asarray(grey, dtype=np.uint8)[:, :, None], 3, axis=2)
    if mode == "RGBA":
        return np.ascontiguousarray(np.asarray(image, dtype=np.uint8)[:, :, :3])
    # Palette images (with or without transparency) and anything else Pillow expands.
    if mode == "P" or mode == "PA":
        image = image.convert("RGBA")
        return np.ascontiguousarray(np.asarray(image, dtype=np.uint8)[:, :, :3])
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


class Images:
    """Decoded images for a multimodal processor (``processor(prompt, images=images)``).

    Make them with `Images.open` (file paths) or `Images.open_bytes` (encoded file contents);
    ``len(images)`` is their count and ``images[i]`` the ``i``-th one as an RGB ``uint8``
    array ``[height, width, 3]``."""

    __slots__ = ("_arrays", "_names")

    def __init__(self, arrays: list[np.ndarray], names: list[str]) -> None:
        self._arrays = arrays
        self._names = names

    @staticmethod
    def open(*image_paths: str | os.PathLike[str]) -> Images:
        """Read and decode image files (PNG, JPEG). A missing file raises FileNotFoundError
        naming it (an `InvalidArgumentError`); a corrupt or unsupported one
        `InvalidArgumentError`."""
        if not image_paths:
            raise InvalidArgumentError("No images provided")
        arrays, names = [], []
        for path in image_paths:
            if not isinstance(path, (str, os.PathLike)):
                raise ArgumentTypeError("Image paths must be strings.")
            name = os.fspath(path)
            if os.path.isdir(name):
                raise InvalidArgumentError(f"{name!r} is a directory, not an image file")
            if not os.path.isfile(name):
                raise _ImageNotFoundError(f"Image path does not exist: {name}")
            with open(name, "rb") as file:
                data = file.read()
            arrays.append(decode_image(data, name, name))
            names.append(name)
        return Images(arrays, names)

    @staticmethod
    def open_bytes(*image_datas: bytes) -> Images:
        """Decode images from the bytes of their files (PNG, JPEG)."""
        if not image_datas:
            raise InvalidArgumentError("No images provided")
        arrays, names = [], []
        for index, data in enumerate(image_datas):
            if not isinstance(data, bytes):
                raise ArgumentTypeError("Image data must be bytes.")
            name = f"image {index}"
            arrays.append(decode_image(data, name))
            names.append(name)
        return Images(arrays, names)

    def __len__(self) -> int:
        return len(self._arrays)

    def __getitem__(self, index: int) -> np.ndarray:
        view = self._arrays[index].view()
        view.flags.writeable = False
        return view

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    @property
    def names(self) -> list[str]:
        """Where each image came from (its path, or ``"image <i>"`` for bytes)."""
        return list(self._names)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{a.shape[1]}x{a.shape[0]}" for a in self._arrays)
        return f"Images([{sizes}])"


class _ImageNotFoundError(InvalidArgumentError, FileNotFoundError):
    """An image path that does not exist (a FileNotFoundError too)."""
