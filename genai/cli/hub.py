"""Models from the Hugging Face hub on the command line: ``genai pull REPO_ID`` (the pull
command's hub arguments, added by `genai.cli.pull`), ``genai list`` and ``genai rm``.
``-m REPO_ID[:SUBFOLDER]`` of the other commands goes through `genai.hub.resolve_model`."""

from __future__ import annotations

import argparse
import json
import sys

from genai import hub
from genai.cli.common import UsageError
from genai.cli.registry import command

__all__ = ["add_hub_pull_arguments", "pull_from_hub"]


def add_hub_pull_arguments(pull: argparse.ArgumentParser) -> None:
    """``genai pull [REPO_ID] [--include PATTERN]... [--revision REV] [--precision P]``."""
    pull.add_argument(
        "repo_id",
        nargs="?",
        metavar="REPO_ID[:SUBFOLDER]",
        help="a Hugging Face model repo (e.g. microsoft/Phi-3-mini-4k-instruct-onnx) into the "
        "hub cache ($HF_HUB_CACHE); an ONNX model folder is used as it is, a GGUF or "
        "safetensors repo is built with `genai build`. Without it: the default model",
    )
    hub_options = pull.add_argument_group("with REPO_ID")
    hub_options.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="fetch only the repo's files matching this glob (repeatable; e.g. "
        "'cpu_and_mobile/cpu-int4-*/*')",
    )
    hub_options.add_argument("--revision", metavar="REV", help="branch, tag or commit")
    hub_options.add_argument(
        "--precision",
        choices=("int4", "fp16", "fp32"),
        help="weights of a model built from a GGUF or safetensors repo (default int4)",
    )


def pull_from_hub(args: argparse.Namespace) -> int:
    """Download ``args.repo_id`` and print the folder to pass to ``-m``."""
    if args.keep_source:
        raise UsageError("--keep-source is for the default model (a hub repo is kept)")
    folder = hub.pull(
        args.repo_id,
        include=args.include,
        revision=args.revision,
        precision=args.precision or "int4",
        progress=not args.quiet,
        force=args.force,
    )
    print(folder)
    sys.stdout.flush()
    return 0


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


@command("list", "list the cached model folders (hub cache and genai's cache)")
def _fill_list(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List the model folders in the Hugging Face hub cache ($HF_HUB_CACHE) and in genai's "
        "cache: the name to pass to -m, size, kind and folder."
    )
    parser.add_argument("--json", action="store_true", help="one JSON list")
    parser.set_defaults(handler=_list)


def _list(args: argparse.Namespace) -> int:
    models = hub.cached_models()
    if args.json:
        rows = [
            {"name": m.name, "size": m.size, "kind": m.kind, "cache": m.where, "path": str(m.path)}
            for m in models
        ]
        print(json.dumps(rows, indent=1))
        return 0
    if not models:
        print(f"no cached models (hub cache: {hub.hub_cache_dir()})", file=sys.stderr)
        return 0
    width = max(len(m.name) for m in models)
    kinds = max(len(m.kind) for m in models)
    print(f"{'NAME':<{width}}  {'SIZE':>8}  {'KIND':<{kinds}}  CACHE  FOLDER")
    for m in models:
        size = _human(m.size)
        print(f"{m.name:<{width}}  {size:>8}  {m.kind:<{kinds}}  {m.where:<5}  {m.path}")
    return 0


@command("rm", "remove a cached model (a name `genai list` shows)")
def _fill_rm(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Remove a cached model: REPO_ID removes the repo from the hub cache (every revision) "
        "and the folder built from it; REPO_ID:SUBFOLDER only that model folder; a name of "
        "genai's cache (e.g. the default model's) that folder."
    )
    parser.add_argument("name", nargs="+", help="as `genai list` shows it")
    parser.set_defaults(handler=_rm)


def _rm(args: argparse.Namespace) -> int:
    for name in args.name:
        for path in hub.remove(name):
            print(f"removed {path}")
    return 0
