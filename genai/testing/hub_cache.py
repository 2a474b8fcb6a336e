"""Write a model folder into a Hugging Face hub cache, in the layout the hub library documents
(``models--org--name/{blobs,refs,snapshots}``; every snapshot file a relative symlink to a blob),
so tests of hub-cache folders need no network."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from genai.hub import repo_folder_name


def write_hub_snapshot(
    source: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    repo_id: str,
    *,
    commit: str = "0" * 40,
    revision: str = "main",
    subfolder: str = "",
) -> Path:
    """Put every file of ``source`` into ``cache_dir`` as the hub library would have downloaded
    ``repo_id`` at ``commit`` (``refs/<revision>`` names it), under ``subfolder`` of the repo.
    Blobs are hard links to the source files where the file system allows, else copies.
    Returns the snapshot folder holding the files (``snapshots/<commit>/<subfolder>``)."""
    repo = Path(cache_dir) / repo_folder_name(repo_id)
    blobs = repo / "blobs"
    snapshot = repo / "snapshots" / commit
    target = snapshot / subfolder if subfolder else snapshot
    blobs.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    for file in sorted(Path(source).rglob("*")):
        if not file.is_file():
            continue
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = blobs / digest
        if not blob.exists():
            try:
                os.link(file, blob)
            except OSError:
                shutil.copyfile(file, blob)
        link = target / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    return target
