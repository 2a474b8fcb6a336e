"""The extra graphs of a vision-language model folder: ``model.vision`` (pixel values ->
image features) and ``model.embedding`` (ids + image features -> ``inputs_embeds``), beside the
decoder that `genai.runtime.model.Model` loads (fed ``inputs_embeds`` instead of ids).

`load_vision_graphs` makes their sessions for a `Model`; `EmbeddedDecoderIO` lets the decoder's
I/O description (`genai.runtime.model.DecoderIO`) read the token ids' name and dtype from the
embedding graph, where they enter. The graphs run in `genai.generation.vision_runner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.errors import ConfigError, UnsupportedFeatureError

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.runtime.config import Config

__all__ = [
    "MROPE_TYPES",
    "NEGATIVE_ID_TYPES",
    "VISION_TYPES",
    "EmbeddedDecoderIO",
    "VisionGraphs",
    "load_vision_graphs",
    "refuse_unsupported_vision",
]

#: Model types run as vision graph -> embedding graph -> decoder fed ``inputs_embeds`` (the
#: reference's ``MultiModalLanguageModel`` for these types, without a ``decoder.pipeline``).
VISION_TYPES = frozenset(["phi3v", "gemma3", "qwen2_5_vl", "fara", "qwen3_vl"])
#: Types whose decoder takes 3-D mRoPE ``position_ids`` ``[3, batch, seq]`` (Qwen-VL family).
MROPE_TYPES = frozenset(["qwen2_5_vl", "fara", "qwen3_vl"])
#: Types whose processor marks image ``k``'s placeholders with the id ``-k`` (Phi-3 Vision).
NEGATIVE_ID_TYPES = frozenset(["phi3v"])


@dataclass(frozen=True)
class VisionGraphs:
    """A vision-language model's sessions beyond the decoder, and the names the config gives
    their inputs and outputs."""

    #: ``model.vision``'s session (None when the folder has no vision section).
    vision: NativeSession | None
    #: ``model.embedding``'s session.
    embedding: NativeSession
    #: vision input key (``pixel_values``, ``image_sizes``, ``image_grid_thw``...) -> graph name
    vision_inputs: dict[str, str]
    #: the vision graph's image-features output name
    vision_features: str
    #: the embedding graph's input ids, image-features input and inputs_embeds output names
    embedding_ids: str
    embedding_features: str
    embedding_output: str
    #: the decoder's inputs_embeds input name
    decoder_embeds: str


def _names(config: Config, section: str, kind: str) -> dict[str, str]:
    return dict(config.get(f"model.{section}.{kind}") or {})


def refuse_unsupported_vision(config: Config) -> None:
    """UnsupportedFeatureError for what a vision-language folder may ask and genai does not
    run yet: pipeline stages (``model.decoder.pipeline`` / ``model.vision.pipeline``, the
    reference's Qwen-VL models for NPUs), a LoRA adapter applied with images
    (``model.vision.adapter_filename``), a speech graph (``model.speech``)."""
    what = {
        "model.decoder.pipeline": "vision-language models split into pipeline stages",
        "model.vision.pipeline": "vision-language models split into pipeline stages",
        "model.vision.adapter_filename": "a LoRA adapter activated by images",
        "model.speech": "speech inputs of a vision-language model",
    }
    for key, feature in what.items():
        if config.get(key):
            raise UnsupportedFeatureError(
                f"{key} in {config.file}: {feature} ({config.get('model.type')!r}) is not "
                "supported yet"
            )


def load_vision_graphs(config: Config, create: Any, decoder: NativeSession) -> VisionGraphs:
    """The vision and embedding sessions of ``config``'s folder, each made by ``create``
    (``create(session_options, filename, what)``, the `Model`'s session factory) with its own
    ``session_options``, else the decoder's, as the reference; checked against the names the
    config gives (a missing name raises ConfigError naming the graph's real ones)."""
    decoder_options = config.get("model.decoder.session_options") or {}
    if config.get("model.embedding") is None:
        raise ConfigError(
            f"{config.file}: model.embedding is required for {config.get('model.type')!r}"
        )

    def session(section: str) -> NativeSession:
        options = config.get(f"model.{section}.session_options") or decoder_options
        filename = config.get(f"model.{section}.filename")
        if not filename:
            raise ConfigError(f"{config.file}: model.{section}.filename is required")
        return create(options, filename, f"model.{section}.filename")

    def check(graph: NativeSession, names: dict[str, str], what: str, inputs: bool) -> None:
        table = graph.input_dtypes if inputs else graph.output_dtypes
        for key, name in names.items():
            if name not in table:
                kind = "inputs" if inputs else "outputs"
                raise ConfigError(
                    f"model.{what}.{kind}.{key} = {name!r} is not an {kind[:-1]} of "
                    f"model.{what}'s graph; {kind} are: {', '.join(table)}"
                )

    vision = session("vision") if config.get("model.vision") is not None else None
    embedding = session("embedding")
    vision_inputs: dict[str, str] = {}
    vision_features = "image_features"
    if vision is not None:
        # names the config gives; inputs the graph has under their default names otherwise
        vision_inputs = {
            key: name
            for key, name in {
                "pixel_values": "pixel_values",
                "image_sizes": "image_sizes",
                "image_grid_thw": "image_grid_thw",
                "pixel_position_ids": "pixel_position_ids",
                "attention_mask": "image_attention_mask",
                **_names(config, "vision", "inputs"),
            }.items()
            if name in vision.input_dtypes or key in _names(config, "vision", "inputs")
        }
        check(vision, vision_inputs, "vision", True)
        vision_features = _names(config, "vision", "outputs").get("image_features", vision_features)
        check(vision, {"image_features": vision_features}, "vision", False)
    emb_in = {
        "input_ids": "input_ids",
        "image_features": "image_features",
        **_names(config, "embedding", "inputs"),
    }
    emb_out = {"inputs_embeds": "inputs_embeds", **_names(config, "embedding", "outputs")}
    check(embedding, {"input_ids": emb_in["input_ids"]}, "embedding", True)
    check(embedding, {"inputs_embeds": emb_out["inputs_embeds"]}, "embedding", False)
    if emb_in["image_features"] not in embedding.input_dtypes:
        raise ConfigError(
            f"model.embedding's graph has no image-features input {emb_in['image_features']!r}"
            f"; inputs are: {', '.join(embedding.input_dtypes)}"
        )
    embeds = _names(config, "decoder", "inputs").get("inputs_embeds", "inputs_embeds")
    check(decoder, {"inputs_embeds": embeds}, "decoder", True)
    return VisionGraphs(
        vision=vision,
        embedding=embedding,
        vision_inputs=vision_inputs,
        vision_features=vision_features,
        embedding_ids=emb_in["input_ids"],
        embedding_features=emb_in["image_features"],
        embedding_output=emb_out["inputs_embeds"],
        decoder_embeds=embeds,
    )


class EmbeddedDecoderIO:
    """The decoder's inputs and outputs, with the token ids of the embedding graph (where
    ids enter a vision-language model), as `genai.runtime.model` reads one session."""

    def __init__(self, decoder: NativeSession, graphs: VisionGraphs) -> None:
        self.input_dtypes: dict[str, np.dtype | None] = dict(decoder.input_dtypes)
        ids = graphs.embedding_ids
        self.input_dtypes.setdefault(ids, graphs.embedding.input_dtypes[ids])
        self.output_dtypes = decoder.output_dtypes
        self.output_shapes = decoder.output_shapes
