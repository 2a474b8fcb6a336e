"""Image parts of chat messages for a vision-language model served by ``genai serve``:
OpenAI's ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``.

`ImageInputs` (``ServeEngine.images``, made for a model whose multimodal processor takes
images) turns a chat request's messages into the chat template's messages, each image part
replaced by the model's image tag in order (`genai.multimodal.image_processor`), plus the
images' bytes; the processor then makes the request's inputs (pixel values, grids,
``input_ids`` with the image tokens), which the scheduler hands to the model's driver.

Taken: ``data:`` URLs with base64 PNG or JPEG; ``http(s)://`` URLs only when the server was
started with ``--allow-remote-images`` (fetched with a timeout, at most `MAX_IMAGE_BYTES`).
Answered with a 400 and OpenAI's error body: a remote URL otherwise, another scheme, bad
base64, an image over `MAX_IMAGE_BYTES` or over the decoder's size limits, more than
`MAX_IMAGES` images, an image in a message that is not the user's, an undecodable or
unsupported file, image parts sent to a model that takes none.
"""

from __future__ import annotations

import base64
import binascii
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from genai.compat.tensors import NamedTensors
from genai.errors import GenaiError, ModelError
from genai.multimodal.image_processor import ImageProcessor
from genai.multimodal.images import Images
from genai.serve.protocol import APIError

__all__ = ["MAX_IMAGES", "MAX_IMAGE_BYTES", "ImageInputs", "has_images", "refuse_images"]

#: The largest image file a request may carry (encoded bytes, after base64 decoding).
MAX_IMAGE_BYTES = 20 << 20
#: The most images one request may carry.
MAX_IMAGES = 16
#: Seconds a remote image may take to arrive (``--allow-remote-images``).
REMOTE_TIMEOUT_S = 10.0


def _is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def has_images(messages: Sequence[Any]) -> bool:
    """Whether any message of a chat request has an image part."""
    return any(
        isinstance(m.content, list) and any(_is_image_part(p) for p in m.content) for m in messages
    )


def refuse_images(model_name: str) -> APIError:
    """The 400 for image parts sent to a model that takes no images."""
    return APIError(
        f"model {model_name!r} takes no images (image_url content parts need a "
        "vision-language model: phi3v, qwen2_5_vl, qwen3_vl, fara, gemma3)",
        param="messages",
    )


class ImageInputs:
    """Image parts -> the model's inputs, for one served vision-language model."""

    def __init__(self, processor: Any, *, allow_remote: bool = False) -> None:
        #: The model's `genai.MultiModalProcessor` (its kind an `ImageProcessor`).
        self.processor = processor
        #: Fetch ``http(s)://`` image URLs (``genai serve --allow-remote-images``).
        self.allow_remote = allow_remote

    @classmethod
    def for_model(cls, model: Any, *, allow_remote: bool = False) -> ImageInputs | None:
        """The image inputs of ``model``, or None when it takes no images."""
        try:
            processor = model.create_multimodal_processor()
        except (ModelError, GenaiError):
            return None
        if not isinstance(processor.kind, ImageProcessor):
            return None
        return cls(processor, allow_remote=allow_remote)

    def render(self, messages: Sequence[Any]) -> tuple[list[dict[str, Any]], list[bytes]]:
        """The chat template's messages (image parts replaced by the model's tags, text parts
        joined) and the images' bytes, in order. Fetches remote images when allowed."""
        kind: ImageProcessor = self.processor.kind
        rendered: list[dict[str, Any]] = []
        blobs: list[bytes] = []
        for index, message in enumerate(messages):
            out = message.for_template() if not isinstance(message.content, list) else None
            if out is None:
                pieces = []
                for part in message.content:
                    if _is_image_part(part):
                        if message.role != "user":
                            raise APIError(
                                f"messages[{index}]: only user messages may carry images",
                                param="messages",
                            )
                        blobs.append(self._image_bytes(part, index))
                        if len(blobs) > MAX_IMAGES:
                            raise APIError(
                                f"at most {MAX_IMAGES} images per request", param="messages"
                            )
                        pieces.append(kind.image_tag(len(blobs)))
                    else:
                        pieces.append(part["text"])
                out = message.for_template(content="".join(pieces))
            rendered.append(out)
        return rendered, blobs

    def inputs(self, text: str, blobs: Sequence[bytes]) -> NamedTensors:
        """The model's inputs for the templated prompt ``text`` and its images' bytes (a 400
        for a bad image or a prompt whose tags and images disagree)."""
        try:
            images = Images.open_bytes(*blobs) if blobs else None
            return self.processor(text, images=images)
        except GenaiError as error:
            raise APIError(f"invalid image input: {error}", param="messages") from None

    def _image_bytes(self, part: dict[str, Any], index: int) -> bytes:
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        if not isinstance(url, str) or not url:
            raise APIError(
                f"messages[{index}]: an image_url part needs image_url.url (a data: URL)",
                param="messages",
            )
        if url.startswith("data:"):
            return _data_url_bytes(url, index)
        if url.startswith(("http://", "https://")):
            if not self.allow_remote:
                raise APIError(
                    f"messages[{index}]: remote image URLs are not fetched (send the image as "
                    "a data: URL, or start genai serve with --allow-remote-images)",
                    param="messages",
                )
            return _fetch(url, index)
        raise APIError(
            f"messages[{index}]: image URLs must be data: URLs (base64) or http(s)",
            param="messages",
        )


def _data_url_bytes(url: str, index: int) -> bytes:
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise APIError(
            f"messages[{index}]: a data: image URL must be base64 (data:image/png;base64,...)",
            param="messages",
        )
    if len(payload) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        raise _too_large(index)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(
            f"messages[{index}]: the image's base64 is invalid", param="messages"
        ) from None
    if not data:
        raise APIError(f"messages[{index}]: the image is empty", param="messages")
    return data


def _fetch(url: str, index: int) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "genai-serve"})
    try:
        with urllib.request.urlopen(request, timeout=REMOTE_TIMEOUT_S) as response:
            data = response.read(MAX_IMAGE_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise APIError(
            f"messages[{index}]: could not fetch the image ({error})", param="messages"
        ) from None
    if len(data) > MAX_IMAGE_BYTES:
        raise _too_large(index)
    return data


def _too_large(index: int) -> APIError:
    return APIError(
        f"messages[{index}]: the image is larger than {MAX_IMAGE_BYTES >> 20} MiB",
        param="messages",
    )
