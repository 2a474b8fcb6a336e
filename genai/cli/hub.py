"""Models from the Hugging Face hub on the command line: ``genai pull REPO_ID`` (the pull
command's hub arguments, added by `genai.cli.pull`), ``genai list`` and ``genai rm``.
``-m REPO_ID[:SUBFOLDER]`` of the other commands goes through `genai.hub.resolve_model`."""

from __future__ import annotations

import argparse
import json
import os
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
    """Download ``args.repo_id`` and print the folder to pass to ``-m``. Ctrl-C ends the
    process at once (status 130): the download's threads are not waited for; what they
    fetched stays in the cache and `genai pull` again resumes it."""
    if args.keep_source:
        raise UsageError("--keep-source is for the default model (a hub repo is kept)")
    try:
        folder = hub.pull(
            args.repo_id,
            include=args.include,
            revision=args.revision,
            precision=args.precision or "int4",
            progress=not args.quiet,
            force=args.force,
        )
    except KeyboardInterrupt:
        print(f"\ngenai: pull interrupted: `genai pull {args.repo_id}` resumes it", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # not interpreter exit, which would wait for the download's threads
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
            {"name": m.name, "size": m.size, "kind": m.kind, "cache": m.where,
             "path": str(m.path), "problem": m.problem}
            for m in models
        ]  # fmt: skip
        print(json.dumps(rows, indent=1))
        return 0
    if not models:
        print(f"no cached models (hub cache: {hub.hub_cache_dir()})", file=sys.stderr)
        return 0
    width = max(len(m.name) for m in models)
    kinds = [m.kind + (f" [{m.problem.split(':')[0]}]" if m.problem else "") for m in models]
    kind_width = max(len(k) for k in kinds)
    print(f"{'NAME':<{width}}  {'SIZE':>8}  {'KIND':<{kind_width}}  CACHE  FOLDER")
    for m, kind in zip(models, kinds, strict=True):
        size = _human(m.size)
        print(f"{m.name:<{width}}  {size:>8}  {kind:<{kind_width}}  {m.where:<5}  {m.path}")
    for m in models:
        if m.problem.startswith("incomplete"):
            print(f"{m.name}: {m.problem}; `genai pull {m.name}` finishes it", file=sys.stderr)
        elif m.problem:
            print(f"{m.name}: {m.problem}", file=sys.stderr)
    return 0


@command("rm", "remove a cached model (a name `genai list` shows)")
def _fill_rm(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Remove a cached model: REPO_ID removes the repo from the hub cache (every revision) "
        "and the folder built from it; REPO_ID@REV only that snapshot; REPO_ID:SUBFOLDER only "
        "that model folder; a name of genai's cache (e.g. the default model's) that folder. "
        "Every name is checked first: when one matches nothing, nothing is removed."
    )
    parser.add_argument("name", nargs="+", help="as `genai list` shows it")
    parser.set_defaults(handler=_rm)


def _rm(args: argparse.Namespace) -> int:
    for path in hub.remove(args.name):
        print(f"removed {path}")
    return 0
