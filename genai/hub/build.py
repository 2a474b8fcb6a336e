"""Building a cached GGUF or safetensors snapshot into genai's cache (`genai build`), with a
record of the repo and commit it came from."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from genai.errors import (
    InvalidArgumentError,
)
from genai.hub.layout import SOURCE_FILENAME, HubRef, built_dir, parent_folder, source_kind


def built_from(folder: Path) -> tuple[str, str] | None:
    """(commit, precision) a folder of :func:`built_dir` was built from, if it is one."""
    try:
        record = json.loads((folder / SOURCE_FILENAME).read_text())
        return str(record["commit"]), str(record["precision"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_snapshot(
    ref: HubRef, snapshot: Path, files: Sequence[str], *, progress: bool, precision: str = "int4"
) -> Path:
    """Build the GGUF file or safetensors checkpoint among ``files`` (relative to
    ``snapshot``) into :func:`built_dir`, recording where it came from."""
    from genai.builder.build import build  # lazy: the builder imports onnx
    from genai.builder.output import replace_folder, work_folder
    from genai.builder.progress import StderrProgress  # lazy: the builder imports onnx

    kind = source_kind(files)
    if kind == "gguf":
        ggufs = [f for f in files if f.lower().endswith(".gguf")]
        if len(ggufs) != 1:
            raise InvalidArgumentError(
                f"{ref}: {len(ggufs)} GGUF files in the cache; name one with "
                f"`genai pull {ref.repo_id} --include FILE`"
            )
        source_name = ggufs[0]
    else:
        config = next(f for f in files if PurePosixPath(f).name == "config.json")
        source_name = parent_folder(config)
    source = snapshot / source_name if source_name else snapshot
    target = built_dir(ref.repo_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    reporter = StderrProgress() if progress else None
    if reporter:
        reporter.message(f"genai: building {ref} ({kind}, {precision}) into {target}")
    with work_folder(target.parent, ".pull-") as work:  # (a killed pull's: removed by the next)
        built = build(source, work / "model", precision=precision,
                      stage=reporter.stage if reporter else None)  # fmt: skip
        record = {
            "repo_id": ref.repo_id,
            "revision": ref.revision,
            "commit": snapshot.name,
            "source": source_name,
            "kind": kind,
            "precision": precision,
        }
        (built / SOURCE_FILENAME).write_text(json.dumps(record, indent=1) + "\n")
        try:
            replace_folder(built, target)
        except OSError:  # another pull installed the same build at the same moment
            if built_from(target) != (snapshot.name, precision):
                raise
    return target
