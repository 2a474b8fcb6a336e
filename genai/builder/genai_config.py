"""Sections of the ``genai_config.json`` the builder writes, shared by its model kinds."""

from __future__ import annotations

from typing import Any

__all__ = ["search_section"]


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
