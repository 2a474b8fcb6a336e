"""``genai build`` and ``genai adapter``: the builder's commands (the builder, which imports
onnx, is imported only when one of them runs)."""

from __future__ import annotations

import argparse

from genai.cli.registry import command, command_parser

__all__: list[str] = []


@command("build", "build a model folder from a GGUF file or a Hugging Face folder")
def _fill_build(build: argparse.ArgumentParser) -> None:
    from genai.builder.cli import add_build_arguments  # lazy: the builder imports onnx

    add_build_arguments(build)


@command("adapter", "LoRA adapter tools (convert a PEFT adapter to .onnx_adapter)")
def _fill_adapter(adapter: argparse.ArgumentParser) -> None:
    # lazy: the builder imports onnx, needed only by this command
    from genai.builder.peft import CONVERT_DESCRIPTION, add_convert_arguments

    adapter.description = "LoRA adapter tools."
    adapter_commands = adapter.add_subparsers(dest="adapter_command", metavar="ACTION")
    adapter_commands.required = True
    convert = adapter_commands.add_parser(
        "convert",
        help="convert a PEFT LoRA adapter folder into an .onnx_adapter file",
        description=CONVERT_DESCRIPTION,
    )
    add_convert_arguments(convert)
    command_parser(convert)
    convert.set_defaults(handler=_adapter_convert)


def _adapter_convert(args: argparse.Namespace) -> int:
    from genai.builder.peft import run_convert  # lazy: the builder imports onnx

    return run_convert(args.command_parser, args)
