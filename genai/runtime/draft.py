"""The draft model of draft-model speculative decoding: ``model.draft`` in ``genai_config.json``,
a decoder block like ``model.decoder`` (its own graph, session options, input and output
names) that proposes tokens the target verifies (`genai.generation.speculative`).

`load_draft` loads it as a `genai.Model` of its own (the folder's config with ``model.draft``
as the decoder) and checks it the way the reference does: a filename, its logits output, the
same vocabulary as the target.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from genai.errors import ConfigError, ModelError, UnsupportedFeatureError
from genai.runtime.config import Config, window_slides

__all__ = ["check_draft_config", "draft_config", "load_draft"]


def _draft_block(config: Config) -> dict[str, Any]:
    """``model.draft``; `ConfigError` when it names no graph file."""
    block = config.get("model.draft")
    if not isinstance(block, dict) or not block.get("filename"):
        raise ConfigError("model.draft.filename is not set in genai_config.json.")
    return block


def check_draft_config(config: Config) -> None:
    """Refuse, before any session loads and with the reference's messages, a ``model.draft``
    folder the reference refuses: no draft filename, a pipeline target or draft, a window the
    engine slides (its KV history cannot be rewound), LFM2-style ``layer_types`` (a rolling
    convolution state)."""
    blocks = (config.decoder, _draft_block(config))
    if any(block.get("pipeline") for block in blocks):
        raise UnsupportedFeatureError(
            "Speculative decoding does not support pipeline models in this release; target "
            "and draft must be plain decoder-only LLMs."
        )
    if any(window_slides(block.get("sliding_window")) for block in blocks):
        raise UnsupportedFeatureError(
            "Speculative decoding does not support physically sliding KV caches in this "
            "release; WindowedKeyValueCache cannot rewind after discarding KV history."
        )
    if any(block.get("layer_types") for block in blocks):
        raise UnsupportedFeatureError(
            "Speculative decoding does not support LFM2 (hybrid SSM/attention) models in this "
            "release; their rolling convolution state cannot be rewound."
        )


def draft_config(config: Config) -> Config:
    """``config`` with its ``model.draft`` block as the decoder (and no draft). Raises
    `ConfigError` when the block has no filename."""
    _draft_block(config)
    draft = copy.copy(config)
    data = copy.deepcopy(config._data)
    data["model"]["decoder"] = data["model"].pop("draft")
    draft._data = data
    draft.own_vocab_size = False  # the target's: load_draft compares the widths
    return draft


def load_draft(config: Config, target_vocab: int, model_class: Callable[[Config], Any]) -> Any:
    """The draft `genai.Model` of a target whose logits have ``target_vocab`` columns
    (``model_class``: `genai.Model`). Raises the reference's errors for a draft whose logits
    output is missing or whose vocabulary differs."""
    draft = draft_config(config)
    name = draft.decoder.get("outputs", {}).get("logits", "logits")
    try:
        model = model_class(draft)
    except ConfigError as exc:
        if "outputs.logits" in str(exc):
            message = f"Draft logits output '{name}' was not found in the ONNX model."
            raise ModelError(message) from exc
        raise
    shape = model.session.output_shapes.get(model.io.logits) or [None]
    vocab = shape[-1] if isinstance(shape[-1], int) and shape[-1] > 0 else model.io.vocab_size
    if vocab != target_vocab:
        raise ModelError(
            f"Target and draft logit dimensions don't match. Target vocab: {target_vocab}, "
            f"Draft vocab: {vocab}. Target and draft must share the same vocabulary."
        )
    return model
