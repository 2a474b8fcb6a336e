"""`EncoderDecoderDriver`: an encoder-decoder model (Whisper): the encoder runs once per input,
the decoder is run by the native loop as any single-graph decoder.

`set_inputs` takes a processor's output (`genai.multimodal.whisper.WhisperProcessor`):
``audio_features`` ``[batch, n_mel, frames]`` go through the encoder (`genai.runtime.encoder`)
once, and each decoder layer's cross-attention keys and values it returns are bound, repeated
for every beam, as the decoder's ``cross_past_key_names`` / ``cross_past_value_names`` inputs
for every later run; ``input_ids`` (the decoder prompt) are returned for the generator to
append. Everything else (the self-attention KV cache, sampling, beam search, rewinding) is
`NativeDriver`'s: beams of one batch entry share their audio, so a beam reorder leaves the
cross-attention KV as it is, and `rewind` keeps it (``rewind_to(0)`` and a new `set_inputs`
start over on new audio).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.errors import ArgumentTypeError, GenerationError, InvalidArgumentError
from genai.generation.drivers.native import NativeDriver

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.generation.drivers.base import LoopSettings
    from genai.generation.search import SearchOptions
    from genai.runtime.model import Model

__all__ = ["AUDIO_FEATURES", "INPUT_IDS", "EncoderDecoderDriver"]

#: The reference's nominal input names (``Config::Defaults``).
AUDIO_FEATURES = "audio_features"
INPUT_IDS = "input_ids"


def _array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__array__"):  # og.Tensor
        return np.asarray(value)
    raise ArgumentTypeError(f"input {name!r} must be a Tensor or a numpy.ndarray")


class EncoderDecoderDriver(NativeDriver):
    """Whisper-style encoder + decoder with cross-attention KV (see the module docstring and
    `genai.generation.drivers.base.Driver`)."""

    unsupported = MappingProxyType(
        {
            "snapshot": "prefix snapshots of an encoder-decoder model (the encoder's "
            "cross-attention KV is not part of a snapshot)",
        }
    )

    def __init__(
        self, model: Model, session: NativeSession, settings: LoopSettings, search: SearchOptions
    ) -> None:
        super().__init__(model, session, settings, search)
        assert model.encoder is not None
        self.encoder = model.encoder
        self.batch_size = search.batch_size
        self.num_beams = search.num_beams
        #: This generator's binding of the encoder's session.
        self.encoder_session = model.encoder.session.new_binding()
        #: The decoder's cross-attention inputs, bound (name -> [rows, heads, frames, head]).
        self.cross: dict[str, np.ndarray] = {}
        #: The features the encoder last ran on.
        self.features: np.ndarray | None = None

    # --- inputs ---------------------------------------------------------------------------------
    def set_inputs(self, inputs: Mapping[str, Any]) -> np.ndarray | None:
        """Run the encoder on ``inputs["audio_features"]`` and bind its cross-attention KV;
        returns ``input_ids`` repeated for every beam (int32 ``[rows, n]``), or None when the
        inputs have none. New audio needs an empty sequence (a new generator, or
        ``rewind_to(0)``)."""
        if not isinstance(inputs, Mapping):
            raise ArgumentTypeError(
                f"set_inputs takes og.NamedTensors (a processor's output), not "
                f"{type(inputs).__name__}"
            )
        encoder = self.encoder
        features = None
        ids = None
        for name in inputs:
            value = inputs[name]
            if name == INPUT_IDS:
                ids = _array(value, name)
            elif name in (AUDIO_FEATURES, encoder.features):
                features = _array(value, name)
            else:
                warnings.warn(
                    f"set_inputs: {self.model.type} takes no input {name!r}; ignored",
                    stacklevel=3,
                )
        if features is None and not self.cross:
            raise InvalidArgumentError(
                "audio_features must be provided via set_inputs (make them with "
                "model.create_multimodal_processor()(prompt, audios=og.Audios.open(...)))"
            )
        if features is not None:
            if self.loop.length:
                raise GenerationError(
                    "set_inputs with new audio needs an empty sequence: use a new generator "
                    "or rewind_to(0) first"
                )
            self._encode(features)
        if ids is None:
            return None
        return self._prompt_rows(ids)

    def _prompt_rows(self, ids: np.ndarray) -> np.ndarray:
        """``input_ids`` as the sequences' rows: [batch, n] (or 1-D for batch 1), each row
        repeated for its beams; ids checked against the vocabulary."""
        if ids.dtype.kind not in "iu":
            raise ArgumentTypeError(f"input_ids must be integers, got dtype {ids.dtype}")
        if ids.ndim == 1 and ids.size % self.batch_size == 0:
            ids = ids.reshape(self.batch_size, -1)
        if ids.ndim != 2 or ids.shape[0] != self.batch_size or ids.shape[1] == 0:
            raise InvalidArgumentError(
                f"input_ids of shape {list(ids.shape)} do not fit batch_size {self.batch_size} "
                "(one non-empty row per audio clip)"
            )
        vocab = self.io.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:
            bad = ids[(ids < 0) | (ids >= vocab)].flat[0]
            raise InvalidArgumentError(
                f"token id {int(bad)} is outside the vocabulary [0, {vocab})"
            )
        if self.num_beams > 1:
            if self.loop.length:
                raise GenerationError("appending after generating needs num_beams 1")
            ids = np.repeat(ids, self.num_beams, axis=0)
        return np.ascontiguousarray(ids, dtype=np.int32)

    def _encode(self, features: np.ndarray) -> None:
        """Run the encoder on ``features`` and bind the cross-attention KV it returns."""
        encoder = self.encoder
        if features.dtype.kind != "f":
            raise ArgumentTypeError(f"audio_features must be float, got dtype {features.dtype}")
        if features.ndim != 3:
            raise InvalidArgumentError(
                f"audio_features must have rank 3 [batch, mels, frames], got rank {features.ndim}"
            )
        shape = encoder.features_shape
        mels = shape[1] if len(shape) == 3 and isinstance(shape[1], int) else None
        if mels is not None and features.shape[1] != mels:
            raise InvalidArgumentError(
                f"audio_features have {features.shape[1]} mel bins; the encoder takes {mels}"
            )
        frames = encoder.frames
        if frames is not None and features.shape[2] != frames:
            raise InvalidArgumentError(
                f"Whisper uses num_frames = {frames}. The provided inputs have num_frames = "
                f"{features.shape[2]}"
            )
        if features.shape[0] != self.batch_size:
            raise InvalidArgumentError(
                f"audio_features hold {features.shape[0]} clips but batch_size is "
                f"{self.batch_size} (set_search_options(batch_size=...))"
            )
        features = np.ascontiguousarray(features, dtype=encoder.features_dtype)
        session = self.encoder_session
        session.bind_input(encoder.features, features)
        produced = (*encoder.cross_present_keys, *encoder.cross_present_values)
        for name in (*produced, encoder.hidden_states):
            if name in session.output_dtypes:
                session.bind_output_to_device(name)
        session.run()
        self.features = features
        self.cross = {}
        for present, past in zip(
            produced, (*encoder.cross_past_keys, *encoder.cross_past_values), strict=True
        ):
            value = session.get_output(present)
            if self.num_beams > 1:
                value = np.repeat(value, self.num_beams, axis=0)
            value = np.ascontiguousarray(value)
            self.session.bind_input(past, value)
            self.cross[past] = value

    def prepare_prompt(self, tokens: np.ndarray, length: int) -> np.ndarray:
        """The tokens as given, once the encoder has run (set_inputs with audio)."""
        if not self.cross:
            raise GenerationError(
                f"{self.model.type} needs its audio before any tokens: call "
                "generator.set_inputs(processor(prompt, audios=og.Audios.open(...)))"
            )
        return tokens

    # --- reading --------------------------------------------------------------------------------
    def read_output(self, name: str) -> np.ndarray:
        """The decoder's outputs, or the encoder's (hidden states, cross-attention KV)."""
        if name in self.encoder_session.output_dtypes:
            if self.features is None:
                raise GenerationError("the encoder has not run yet (set_inputs)")
            return self.encoder_session.get_output(name)
        return super().read_output(name)

    def read_input(self, name: str) -> np.ndarray:
        """The decoder's inputs (the cross-attention KV included), or the encoder's features."""
        if name in (self.encoder.features, AUDIO_FEATURES):
            if self.features is None:
                raise GenerationError("the encoder has not run yet (set_inputs)")
            return self.features.copy()
        if name in self.cross:
            return self.cross[name].copy()
        return super().read_input(name)
