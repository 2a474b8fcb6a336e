"""Shared fixtures: the real model folder in ../shared and tiny models written per session."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct-int4"
TOKENIZERS = SHARED / "tokenizers"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M int4 folder (skips when ../shared is not beside the checkout)."""
    if not (SMOLLM2 / "genai_config.json").is_file():
        pytest.skip(f"real model folder not found at {SMOLLM2} (../shared is beside the checkout)")
    return SMOLLM2
