"""``genai pull``: fetch and build the default model, or a model from the Hugging Face hub."""

from __future__ import annotations

import argparse

from genai.cli.common import UsageError
from genai.cli.hub import add_hub_pull_arguments, pull_from_hub
from genai.cli.registry import command

__all__: list[str] = []


@command("pull", "fetch and build the default model, or fetch a Hugging Face hub model")
def _fill_pull(pull: argparse.ArgumentParser) -> None:
    from genai.builder.cli import add_pull_arguments  # lazy: the builder imports onnx

    add_pull_arguments(pull)
    add_hub_pull_arguments(pull)
    pull.description += (
        " With REPO_ID[:SUBFOLDER]: download that Hugging Face model repo into the hub cache "
        "(an ONNX model folder as it is; a GGUF or safetensors repo then built with genai build) "
        "and print the folder to pass to -m; HF_HUB_OFFLINE=1 forbids it."
    )
    default_handler = pull.get_default("handler")

    def handler(args: argparse.Namespace) -> int:
        if args.repo_id:
            return pull_from_hub(args)
        for flag, value in (("--include", args.include), ("--revision", args.revision)):
            if value:
                raise UsageError(f"{flag} needs REPO_ID (the default model is one build)")
        if args.precision is not None:
            raise UsageError("--precision needs REPO_ID (the default model is built int4)")
        return default_handler(args)

    pull.set_defaults(handler=handler)
