"""``genai pull``: fetch and build the default model."""

from __future__ import annotations

import argparse

from genai.cli.registry import command

__all__: list[str] = []


@command("pull", "fetch and build the default model (SmolLM2-135M-Instruct int4)")
def _fill_pull(pull: argparse.ArgumentParser) -> None:
    from genai.builder.cli import add_pull_arguments  # lazy: the builder imports onnx

    add_pull_arguments(pull)
