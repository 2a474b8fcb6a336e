"""The encoder of an encoder-decoder model folder (``model.encoder``: Whisper), beside the
decoder that `genai.runtime.model.Model` loads.

The encoder runs once per input (`genai.generation.drivers.encoder_decoder`): audio features
in, each decoder layer's cross-attention keys and values out (``cross_present_key_names`` /
``cross_present_value_names``), which the decoder takes as ``cross_past_key_names`` /
``cross_past_value_names`` at every run. `load_encoder` makes its session for a `Model` and
checks those names against both graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.errors import ConfigError, UnsupportedFeatureError

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.runtime.config import Config

__all__ = ["ENCODER_DECODER_TYPES", "EncoderGraph", "load_encoder"]

#: Model types run as encoder (once) -> decoder with cross-attention KV (the reference's
#: ``WhisperModel``).
ENCODER_DECODER_TYPES = frozenset(["whisper"])

_FEATURE_DTYPES = {np.dtype(np.float32), np.dtype(np.float16)}


@dataclass(frozen=True)
class EncoderGraph:
    """An encoder-decoder model's encoder session and the names that connect it."""

    session: NativeSession
    #: The encoder's features input (``model.encoder.inputs.audio_features``).
    features: str
    features_dtype: np.dtype
    #: The features' declared shape (e.g. ``("batch_size", 80, 3000)``).
    features_shape: tuple[Any, ...]
    #: The encoder's hidden-states output (``model.encoder.outputs.encoder_hidden_states``).
    hidden_states: str
    #: Per decoder layer: the encoder's cross K / V outputs and the decoder's cross K / V inputs.
    cross_present_keys: tuple[str, ...]
    cross_present_values: tuple[str, ...]
    cross_past_keys: tuple[str, ...]
    cross_past_values: tuple[str, ...]

    @property
    def frames(self) -> int | None:
        """The feature frames the encoder takes (3000 for Whisper), None if not fixed."""
        last = self.features_shape[-1] if self.features_shape else None
        return last if isinstance(last, int) and last > 0 else None


def _names(template: str, count: int, what: str) -> tuple[str, ...]:
    if "%d" not in template:
        raise ConfigError(f"{what} {template!r} must contain %d (the layer index)")
    return tuple(template.replace("%d", str(i)) for i in range(count))


def load_encoder(
    config: Config,
    create_session: Callable[[dict[str, Any], str, str], NativeSession],
    decoder: NativeSession,
) -> EncoderGraph:
    """The encoder's session (``create_session(session_options, filename, what)``: the
    `Model`'s session factory) and its names, checked against it and the ``decoder``."""
    section = config.get("model.encoder")
    if not section:
        raise ConfigError(
            f"{config.file}: model.type {config.get('model.type')!r} needs model.encoder"
        )
    options = section.get("session_options") or config.get("model.decoder.session_options") or {}
    session = create_session(
        options, section.get("filename", "encoder.onnx"), "model.encoder.filename"
    )
    inputs = section.get("inputs") or {}
    outputs = section.get("outputs") or {}
    features = inputs.get("audio_features", "audio_features")
    if features not in session.input_dtypes:
        raise ConfigError(
            f"model.encoder.inputs.audio_features = {features!r} is not an input of the "
            f"encoder graph; inputs are: {', '.join(session.input_dtypes)}"
        )
    dtype = session.input_dtypes[features]
    if dtype is None or np.dtype(dtype) not in _FEATURE_DTYPES:
        raise UnsupportedFeatureError(
            f"encoder input {features!r} of type {dtype} is not supported"
        )
    layers = int(config.decoder.get("num_hidden_layers", 0))
    dec_inputs = config.decoder.get("inputs") or {}
    present_k = outputs.get("cross_present_key_names")
    present_v = outputs.get("cross_present_value_names")
    if not present_k or not present_v:
        raise UnsupportedFeatureError(
            f"{config.file}: an encoder without cross-attention KV outputs "
            "(model.encoder.outputs.cross_present_key_names) is not supported yet"
        )
    graph = EncoderGraph(
        session=session,
        features=features,
        features_dtype=np.dtype(dtype),
        features_shape=tuple(session.input_shapes[features] or ()),
        hidden_states=outputs.get("encoder_hidden_states", "encoder_hidden_states"),
        cross_present_keys=_names(
            present_k, layers, "model.encoder.outputs.cross_present_key_names"
        ),
        cross_present_values=_names(
            present_v, layers, "model.encoder.outputs.cross_present_value_names"
        ),
        cross_past_keys=_names(
            dec_inputs.get("cross_past_key_names", "past_key_cross_%d"),
            layers,
            "model.decoder.inputs.cross_past_key_names",
        ),
        cross_past_values=_names(
            dec_inputs.get("cross_past_value_names", "past_value_cross_%d"),
            layers,
            "model.decoder.inputs.cross_past_value_names",
        ),
    )
    for name in (*graph.cross_present_keys, *graph.cross_present_values):
        if name not in session.output_dtypes:
            raise ConfigError(
                f"cross-attention output {name!r} is not an output of the encoder graph"
            )
    for name in (*graph.cross_past_keys, *graph.cross_past_values):
        if name not in decoder.input_dtypes:
            raise ConfigError(
                f"cross-attention input {name!r} is not an input of the decoder graph"
            )
    return graph
