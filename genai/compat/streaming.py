"""`StreamingProcessor`: the reference's streaming audio front end (``og.StreamingProcessor``).

In the reference it turns raw PCM audio, fed in chunks, into the log-mel features of a
streaming speech model (``model.type`` ``nemotron_speech``, or ``streaming_enc_dec_asr`` for
Moonshine), with optional voice-activity detection (options ``use_vad``, ``vad_threshold``,
``silence_duration_ms``, ``prefix_padding_ms``): `process` returns the features of each full
chunk (NamedTensors) or None while more audio is needed, `flush` pads the rest with silence.
genai does not run streaming speech models yet, so a processor cannot be made: for those two
model types the constructor names the missing feature, for any other it gives the
reference's error.
"""

from __future__ import annotations

from typing import Any

from genai.compat.unsupported import not_implemented
from genai.errors import ArgumentTypeError, ModelError

__all__ = ["STREAMING_MODEL_TYPES", "StreamingProcessor"]

#: ``model.type`` values the reference makes a StreamingProcessor for.
STREAMING_MODEL_TYPES = ("streaming_enc_dec_asr", "nemotron_speech")


class StreamingProcessor:
    """Streaming audio feature extraction for a streaming speech model (see the module
    docstring: no model genai runs has one yet)."""

    def __init__(self, model: Any) -> None:
        config = getattr(model, "config", None)
        if config is None or not hasattr(config, "get"):
            raise ArgumentTypeError(f"StreamingProcessor needs a Model, got {type(model).__name__}")
        kind = str(config.get("model.type") or "")
        if kind in STREAMING_MODEL_TYPES:
            raise not_implemented(f"StreamingProcessor for {kind!r} models", "speech")
        raise ModelError(
            f"CreateStreamingProcessor: unsupported model type '{kind}'. StreamingProcessor "
            "supports 'streaming_enc_dec_asr' (Moonshine) and 'nemotron_speech' (Nemotron)."
        )

    def process(self, audio_chunk: Any) -> Any:
        """Feed raw PCM audio (float32); the features of a full chunk, or None."""
        raise not_implemented("StreamingProcessor.process", "speech")

    def flush(self) -> Any:
        """The features of the buffered rest, padded with silence, or None."""
        raise not_implemented("StreamingProcessor.flush", "speech")

    def set_option(self, key: str, value: str) -> None:
        """Set ``use_vad``, ``vad_threshold``, ``silence_duration_ms`` or
        ``prefix_padding_ms``."""
        raise not_implemented("StreamingProcessor.set_option", "speech")

    def get_option(self, key: str) -> str:
        """An option's value."""
        raise not_implemented("StreamingProcessor.get_option", "speech")
