"""Sections of the ``genai_config.json`` the builder writes, shared by its model kinds."""

from __future__ import annotations

from typing import Any

__all__ = [
    "SESSION_OPTIONS",
    "SPLIT_KV_INPUTS",
    "SPLIT_KV_OUTPUTS",
    "graph_section",
    "search_section",
]

#: The ``session_options`` the reference's builder writes for each graph.
SESSION_OPTIONS = {"log_id": "onnxruntime-genai", "provider_options": []}

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


def graph_section(
    filename: str | None,
    *,
    head_size: int,
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    num_layers: int,
    inputs: dict[str, str],
    outputs: dict[str, str],
) -> dict[str, Any]:
    """A graph's section (``model.decoder``, ``model.encoder``) in the reference builder's key
    order; no ``filename`` when None (a pipeline's stages name theirs)."""
    return {
        "session_options": dict(SESSION_OPTIONS),
        **({} if filename is None else {"filename": filename}),
        "head_size": head_size,
        "hidden_size": hidden_size,
        "inputs": inputs,
        "outputs": outputs,
        "num_attention_heads": num_heads,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": num_kv_heads,
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
