"""Finding a model's folder in the caches alone, refusing an interrupted download."""

from __future__ import annotations

import json
from pathlib import Path

from genai.errors import (
    DownloadError,
    InvalidArgumentError,
    ModelFileNotFoundError,
)
from genai.hub.build import build_snapshot
from genai.hub.layout import (
    CONFIG_FILENAME,
    PULLING_DIRNAME,
    HubRef,
    built_dir,
    files_in,
    has_config,
    model_folders,
    named_files,
    partial_blobs,
    ref_commits,
    snapshot_folder,
    source_kind,
)


def cached_folder(ref: HubRef, cache: Path, progress: bool = True) -> Path | None:
    """The model folder for ``ref`` from the caches alone, or None when it is not there.
    A cached GGUF or safetensors snapshot that was not built yet is built here. Raises
    DownloadError for an incomplete snapshot (an interrupted download) and
    ModelFileNotFoundError for a snapshot that holds no model folder."""
    snapshot = snapshot_folder(ref, cache)
    built = built_dir(ref.repo_id)
    if snapshot is None:
        return built if not ref.subfolder and (built / CONFIG_FILENAME).is_file() else None
    base = snapshot / ref.subfolder if ref.subfolder else snapshot
    if not base.is_dir():
        return None
    if has_config(base):
        return ensure_complete(ref, base, snapshot)
    found = [p.relative_to(snapshot).as_posix() for p in model_folders(base)]
    if found:
        return ensure_complete(ref, snapshot / choose_folder(ref, found), snapshot)
    if (built / CONFIG_FILENAME).is_file():
        return built
    files = [f.relative_to(snapshot).as_posix() for f in base.rglob("*") if f.is_file()]
    ensure_complete(ref, base, snapshot)
    if source_kind(files) is None:
        raise ModelFileNotFoundError(
            f"{ref} is in the Hugging Face cache ({base}) but holds no {CONFIG_FILENAME}: not "
            "a model folder (a PyTorch or GGUF checkpoint needs `genai build` first)"
        )
    return build_snapshot(ref, snapshot, files, progress=progress)


def choose_folder(ref: HubRef, folders: list[str]) -> str:
    """The one model folder (relative to the repo) among ``folders``, or a clear error."""
    if len(folders) == 1:
        return folders[0]
    if not folders:
        raise DownloadError(f"{ref} holds no {CONFIG_FILENAME}")
    names = "\n  ".join(f"{ref.repo_id}:{f}" for f in folders)
    raise InvalidArgumentError(f"{ref} holds {len(folders)} model folders; name one:\n  {names}")


def ensure_complete(ref: HubRef, folder: Path, snapshot: Path) -> Path:
    """``folder``, once it is known not to be an interrupted download (else DownloadError)."""
    reason = incomplete_reason(folder, snapshot)
    if reason:
        raise DownloadError(
            f"{ref} is incomplete in the Hugging Face cache ({reason}): run `genai pull {ref}` "
            "again to finish the download"
        )
    return folder


def incomplete_reason(folder: Path, snapshot: Path) -> str:
    """Why the model folder ``folder`` of ``snapshot`` is an interrupted download, or "":
    a file `pull` was fetching is not there, a file its genai_config.json names is missing,
    a link dangles, or (a download by another tool) the repo holds ``blobs/*.incomplete``."""
    repo = snapshot.parent.parent
    prefix = folder.relative_to(snapshot).as_posix()
    prefix = "" if prefix == "." else prefix + "/"
    marker = repo / PULLING_DIRNAME / snapshot.name
    try:
        pulling = json.loads(marker.read_text())
    except (OSError, ValueError):
        pulling = None
    if isinstance(pulling, list):
        missing = [
            f
            for f in pulling
            if isinstance(f, str) and f.startswith(prefix) and not (snapshot / f).is_file()
        ]
        if missing:
            return f"{len(missing)} file(s) not downloaded, e.g. {missing[0]}"
    for link in files_in(folder):
        if link.is_symlink() and not link.exists():
            return f"{link.name} links to a missing blob"
    for name in named_files(folder):
        if not (folder / name).is_file():
            return f"{name}, which {CONFIG_FILENAME} names, is missing"
    # Another tool's interrupted download: the hub library writes the ref before the files.
    if pulling is None and partial_blobs(repo) and snapshot.name in ref_commits(repo):
        return "the repo holds blobs/*.incomplete"
    return ""
