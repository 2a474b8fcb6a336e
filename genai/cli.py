"""The ``genai`` command line (also ``python -m genai``).

genai generate -m MODEL_DIR "prompt" [--chat] [--max-length N] [--threads N] [-v]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from ._version import __version__

__all__ = ["main"]

DEFAULT_NEW_TOKENS = 256


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genai",
        description="Run generative ONNX models (onnxruntime-genai model folders).",
    )
    parser.add_argument("--version", action="version", version=f"genai {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    gen = commands.add_parser(
        "generate",
        help="generate text from a prompt, streaming it to stdout",
        description="Generate text from a prompt (greedy), streaming it as it is produced.",
    )
    gen.add_argument("prompt", help="the prompt text ('-' reads it from stdin)")
    gen.add_argument("-m", "--model", required=True, metavar="DIR", help="model folder")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--system", metavar="TEXT", help="system message (with --chat)")
    gen.add_argument(
        "--max-length",
        type=int,
        metavar="N",
        help=f"total tokens, prompt included (default: prompt + {DEFAULT_NEW_TOKENS}, "
        "at most the context length)",
    )
    gen.add_argument("--threads", type=int, metavar="N", help="ORT intra-op threads")
    gen.add_argument(
        "-v", "--verbose", action="store_true", help="print prefill ms and decode tok/s to stderr"
    )
    gen.set_defaults(handler=_generate)
    return parser


def _generate(args: argparse.Namespace) -> int:
    import genai

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    config = genai.Config(args.model)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError("--threads must be >= 1")
        config.overlay({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": args.threads}}}})  # fmt: skip
    started = time.perf_counter()
    model = genai.Model(config)
    tokenizer = genai.Tokenizer(model)
    if args.chat:
        messages = [{"role": "user", "content": prompt}]
        if args.system:
            messages.insert(0, {"role": "system", "content": args.system})
        prompt = tokenizer.apply_chat_template(json.dumps(messages), add_generation_prompt=True)
    ids = tokenizer.encode(prompt)
    if len(ids) == 0:
        raise ValueError("the prompt encodes to no tokens")
    context = config.context_length
    max_length = args.max_length or min(context, len(ids) + DEFAULT_NEW_TOKENS)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    generator = genai.Generator(model, params)
    stream = tokenizer.create_stream()
    loaded = time.perf_counter()
    generator.append_tokens(ids)
    prefilled = time.perf_counter()
    new_tokens = 0
    out = sys.stdout
    while not generator.is_done():
        generator.generate_next_token()
        new_tokens += 1
        out.write(stream.decode(int(generator.get_next_tokens()[0])))
        out.flush()
    finished = time.perf_counter()
    out.write("\n")
    if args.verbose:
        decode_s = finished - prefilled
        rate = new_tokens / decode_s if decode_s > 0 else float("inf")
        print(
            f"load {1000 * (loaded - started):.0f} ms, prompt {len(ids)} tokens, "
            f"prefill {1000 * (prefilled - loaded):.1f} ms, {new_tokens} new tokens, "
            f"decode {rate:.1f} tok/s",
            file=sys.stderr,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``genai`` console script; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
    except (FileNotFoundError, ValueError, NotImplementedError, RuntimeError) as exc:
        print(f"genai: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
