"""What the caches hold (`cached_models`, for `genai list`) and removing it (`remove`, for
`genai rm`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from genai.errors import (
    InvalidArgumentError,
)
from genai.hub.build import built_from
from genai.hub.layout import (
    CONFIG_FILENAME,
    PULLING_DIRNAME,
    SOURCE_FILENAME,
    CacheError,
    HubRef,
    built_dir,
    genai_models_dir,
    hub_cache_dir,
    looks_like_repo_id,
    model_folders,
    ref_commits,
    repo_dir,
    snapshot_folder,
    source_kind,
)
from genai.hub.lookup import incomplete_reason


@dataclass(frozen=True)
class CachedModel:
    """A model folder in a cache: ``name`` is what ``-m`` takes, ``kind`` the model type
    and where it came from, ``where`` the cache (``hub`` or ``genai``)."""

    name: str
    path: Path
    size: int
    kind: str
    where: str
    #: "" for a usable folder; else ``incomplete: ...`` (an interrupted download: `genai pull
    #: NAME` finishes it) or ``broken: ...`` (e.g. a genai_config.json that is not JSON).
    problem: str = ""


def cached_models(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """The model folders in the hub cache (ONNX repos; GGUF or safetensors sources not built
    yet) and in genai's cache (the default model, models built from hub repos). An
    interrupted download or an unreadable genai_config.json is listed with its ``problem``;
    unreadable entries of the caches are skipped."""
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    found: list[CachedModel] = []
    for repo_id, repo in _hub_repos(cache):
        refs = ref_commits(repo)
        snapshots = repo / "snapshots"
        for snapshot in sorted(snapshots.glob("*")) if snapshots.is_dir() else ():
            if not snapshot.is_dir():
                continue
            name = _snapshot_name(repo_id, snapshot.name, refs)
            folders = model_folders(snapshot)
            for folder in folders:
                sub = folder.relative_to(snapshot).as_posix()
                problem = _broken(folder) or _problem(folder, snapshot)
                found.append(CachedModel(
                    f"{name}:{sub}" if sub != "." else name, folder, _size(folder),
                    f"{_model_type(folder)} (onnx)", "hub", problem))  # fmt: skip
            files = [f.relative_to(snapshot).as_posix() for f in snapshot.rglob("*") if f.is_file()]
            kind = source_kind(files)
            problem = "" if folders else _problem(snapshot, snapshot)
            if not folders and (kind or problem):  # a source, or a download cut short
                found.append(CachedModel(name, snapshot, _size(snapshot),
                                         f"{kind} source" if kind else "?", "hub",
                                         problem))  # fmt: skip
    models = genai_models_dir()
    for folder in sorted(models.glob("*")) if models.is_dir() else ():
        if not (folder / CONFIG_FILENAME).is_file():
            continue
        record = _source_record(folder)
        if record:
            name, kind = record["repo_id"], f"{_model_type(folder)} (built from {record['kind']})"
        else:
            name, kind = folder.name, f"{_model_type(folder)} (genai pull)"
        found.append(CachedModel(name, folder, _size(folder), kind, "genai", _broken(folder)))
    return found


def _problem(folder: Path, snapshot: Path) -> str:
    reason = incomplete_reason(folder, snapshot)
    return f"incomplete: {reason}" if reason else ""


def _size(folder: Path) -> int:
    """Bytes of the files under ``folder``, each link target counted once."""
    seen: set[Path] = set()
    for file in folder.rglob("*"):
        if file.is_file():
            seen.add(file.resolve())
    total = 0
    for file in seen:
        with contextlib.suppress(OSError):
            total += file.stat().st_size
    return total


def _model_type(folder: Path) -> str:
    try:
        return str(json.loads((folder / CONFIG_FILENAME).read_text())["model"]["type"])
    except (OSError, ValueError, KeyError, TypeError):
        return "?"


def _broken(folder: Path) -> str:
    """Why ``folder``'s genai_config.json cannot be read, or ""."""
    try:
        doc = json.loads((folder / CONFIG_FILENAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ""  # a dangling link: an interrupted download, not a broken folder
    except (OSError, ValueError) as exc:
        return f"broken: {CONFIG_FILENAME} is not valid JSON ({type(exc).__name__})"
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        return f"broken: {CONFIG_FILENAME} has no model section"
    return ""


def _hub_repos(cache: Path) -> Iterator[tuple[str, Path]]:
    if not cache.is_dir():
        return
    for repo in sorted(cache.glob("models--*")):
        parts = repo.name.split("--")
        if len(parts) == 3 and repo.is_dir():
            yield f"{parts[1]}/{parts[2]}", repo


def _snapshot_name(repo_id: str, commit: str, refs: dict[str, list[str]]) -> str:
    """What ``-m`` takes for this snapshot: ``ORG/NAME`` for refs/main's, ``ORG/NAME@REV``
    for another ref's, else ``ORG/NAME@COMMIT``."""
    revisions = refs.get(commit, [])
    if "main" in revisions:
        return repo_id
    return f"{repo_id}@{revisions[0] if revisions else commit}"


def _source_record(folder: Path) -> dict[str, str] | None:
    """The genai_hub_source.json of a built folder, when it is one and well formed."""
    try:
        record = json.loads((folder / SOURCE_FILENAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    repo_id, kind = record.get("repo_id"), record.get("kind")
    if not isinstance(repo_id, str) or not looks_like_repo_id(repo_id) or not isinstance(kind, str):
        return None
    return {"repo_id": repo_id, "kind": kind}


def remove(
    name: str | Sequence[str], cache_dir: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Delete cached models by the names `cached_models` gives them: a whole hub repo
    (``ORG/NAME``: every revision, and the folder built from it), one snapshot
    (``ORG/NAME@REV``: its files, the refs naming it, the blobs nothing else links to, the
    folder built from it), one model folder of a repo (``ORG/NAME[@REV]:SUBFOLDER``) or a
    folder of genai's cache. Several names: all are checked first, and nothing is deleted when
    one matches nothing (InvalidArgumentError naming them). Returns what was deleted;
    CacheError when the cache cannot be changed (e.g. read-only)."""
    names = [name] if isinstance(name, str) else list(name)
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    plans = [(n, _removal(n, cache)) for n in names]
    missing = [n for n, plan in plans if plan is None]
    if missing:
        what = ", ".join(repr(n) for n in missing)
        nothing = "; nothing removed" if len(names) > 1 else ""
        raise InvalidArgumentError(
            f"no cached model named {what} (`genai list` shows the names){nothing}"
        )
    removed: list[Path] = []
    for model, plan in plans:
        assert plan is not None
        try:
            removed += _apply(plan)
        except OSError as exc:
            where = exc.filename or "the cache"
            raise CacheError(f"cannot remove {model}: {exc.strerror or exc} ({where})") from exc
    return removed


@dataclass
class _Removal:
    """What removing one name deletes: ``folders`` (reported), ``extra`` files (refs, pull
    records), and the ``repo`` whose unused blobs go after (deleted whole once it has no
    snapshot left)."""

    folders: list[Path]
    extra: list[Path]
    repo: Path | None = None


def _removal(name: str, cache: Path) -> _Removal | None:
    """What removing ``name`` would delete, or None when it names no cached model."""
    local = genai_models_dir() / name
    if name and "/" not in name and os.sep not in name and name not in (".", ".."):
        if (local / CONFIG_FILENAME).is_file():
            return _Removal([local], [])
        return None
    if not looks_like_repo_id(name):
        return None
    ref = HubRef.parse(name)
    repo = repo_dir(ref.repo_id, cache)
    built = built_dir(ref.repo_id)
    snapshots = repo / "snapshots"
    if ref.subfolder:
        chosen = snapshot_folder(ref, cache) if ref.revision else None
        folders = [
            s / ref.subfolder
            for s in (sorted(snapshots.glob("*")) if snapshots.is_dir() else ())
            if (not ref.revision or s == chosen) and (s / ref.subfolder).is_dir()
        ]
        return _Removal(folders, [], repo) if folders else None
    if ref.revision:
        snapshot = snapshot_folder(ref, cache)
        if snapshot is None:
            return None
        commit = snapshot.name
        refs = [repo / "refs" / r for r in ref_commits(repo).get(commit, [])]
        folders = [snapshot]
        record = built_from(built)
        if record is not None and record[0] == commit:
            folders.append(built)
        return _Removal(folders, [*refs, repo / PULLING_DIRNAME / commit], repo)
    folders = [f for f in (repo, built) if f.is_dir()]
    return _Removal(folders, []) if folders else None


def _apply(plan: _Removal) -> list[Path]:
    for folder in plan.folders:
        if folder.is_dir():
            shutil.rmtree(folder)
    for file in plan.extra:
        file.unlink(missing_ok=True)
    repo = plan.repo
    if repo is not None and repo.is_dir():
        snapshots = repo / "snapshots"
        if snapshots.is_dir() and not any(snapshots.iterdir()):
            shutil.rmtree(repo)
        else:
            _drop_orphan_blobs(repo)
    return list(plan.folders)


def _drop_orphan_blobs(repo: Path) -> None:
    """Delete the blobs of ``repo`` that no snapshot links to any more."""
    used = {p.resolve() for p in (repo / "snapshots").rglob("*") if p.is_symlink()}
    for blob in (repo / "blobs").glob("*"):
        if blob.resolve() not in used:
            blob.unlink()
