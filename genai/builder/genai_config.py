"""Sections of the ``genai_config.json`` the builder writes, shared by its model kinds."""

from __future__ import annotations

from typing import Any

__all__ = ["SPLIT_KV_INPUTS", "SPLIT_KV_OUTPUTS", "search_section"]

#: ``model.decoder.inputs`` entries of a decoder with one past key and value input per layer.
SPLIT_KV_INPUTS = {
    "past_key_names": "past_key_values.%d.key",
    "past_value_names": "past_key_values.%d.value",
}
#: ``model.decoder.outputs`` of such a decoder: logits, one present key and value per layer.
SPLIT_KV_OUTPUTS = {
    "logits": "logits",
    "present_key_names": "present.%d.key",
    "present_value_names": "present.%d.value",
}


def search_section(max_length: int, *, share_buffer: bool, top_k: int) -> dict[str, Any]:
    """The ``search`` section: greedy, one beam and sequence, neutral penalties (the reference
    builder's defaults), with ``max_length``, ``past_present_share_buffer`` and ``top_k``."""
    return {
        "diversity_penalty": 0.0,
        "do_sample": False,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": max_length,
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": share_buffer,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": top_k,
        "top_p": 1.0,
    }
