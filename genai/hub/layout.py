"""The hub cache's layout and model names: ``ORG/NAME[@REV][:SUBFOLDER]``, where the caches
are, a repo's refs and snapshots, which files a model folder needs, what can be built."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from genai.errors import (
    GenaiError,
    InvalidArgumentError,
)

CONFIG_FILENAME = "genai_config.json"

#: Written into a folder built from a hub repo: which repo and commit it was built from.
SOURCE_FILENAME = "genai_hub_source.json"

#: Folder of a hub repo's cache folder where `pull` lists, per commit, the files it is fetching
#: (until they are all there): a snapshot missing one of them is an interrupted download.
PULLING_DIRNAME = ".genai-pulling"

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"

_SPEC = re.compile(
    rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<revision>[^:@\s]+))?(?::(?P<subfolder>[^:@\s]*))?$"
)


class CacheError(GenaiError, OSError):
    """A cached model could not be changed (e.g. a read-only cache); names the model and path."""


@dataclass(frozen=True)
class HubRef:
    """A model on the hub: ``repo_id``, an optional ``revision`` (branch, tag or commit) and
    the ``subfolder`` of the repo that holds the model folder."""

    repo_id: str
    revision: str | None = None
    subfolder: str = ""

    @classmethod
    def parse(cls, spec: str) -> HubRef:
        """``ORG/NAME[@REVISION][:SUBFOLDER]``; InvalidArgumentError for anything else."""
        match = _SPEC.match(spec.strip())
        if match is None:
            raise InvalidArgumentError(
                f"{spec!r} is not a Hugging Face model name (ORG/NAME[@REVISION][:SUBFOLDER])"
            )
        subfolder = (match["subfolder"] or "").strip("/")
        if subfolder and (".." in PurePosixPath(subfolder).parts or "\\" in subfolder):
            raise InvalidArgumentError(f"subfolder {subfolder!r} of {spec!r} leaves the repo")
        return cls(match["repo"], match["revision"], subfolder)

    def __str__(self) -> str:
        text = self.repo_id + (f"@{self.revision}" if self.revision else "")
        return text + (f":{self.subfolder}" if self.subfolder else "")


def looks_like_repo_id(spec: str) -> bool:
    """Whether ``spec`` has the shape of a hub model name (it may still be a local path)."""
    return _SPEC.match(spec.strip()) is not None


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set: the hub is never contacted."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hub_cache_dir() -> Path:
    """The hub library's cache folder, resolved as huggingface_hub does but from the environment
    at each call: ``$HF_HUB_CACHE``, else the legacy ``$HUGGINGFACE_HUB_CACHE``, else
    ``$HF_HOME/hub`` (``$HF_HOME`` defaults to ``$XDG_CACHE_HOME/huggingface``, that to
    ``~/.cache/huggingface``); ``~`` and ``$VAR`` expanded."""
    env = os.environ.get
    home = env("HF_HOME") or os.path.join(
        env("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    legacy = env("HUGGINGFACE_HUB_CACHE") or os.path.join(_expand(home), "hub")
    return Path(_expand(env("HF_HUB_CACHE") or legacy))


def _expand(path: str) -> str:
    return os.path.expandvars(os.path.expanduser(path))


def genai_models_dir() -> Path:
    from genai.builder.pull import cache_root  # lazy: the builder imports onnx

    return cache_root() / "models"


def built_dir(repo_id: str) -> Path:
    """Where a model built from a GGUF or safetensors repo is kept (genai's own cache)."""
    return genai_models_dir() / ("hub--" + repo_id.replace("/", "--"))


def repo_folder_name(repo_id: str) -> str:
    """``org/name`` -> ``models--org--name``, the hub cache's folder of a model repo."""
    return "models--" + repo_id.replace("/", "--")


def repo_dir(repo_id: str, cache_dir: Path) -> Path:
    return cache_dir / repo_folder_name(repo_id)


def read_ref(file: Path) -> str | None:
    """The commit a ``refs/`` file names, or None when it is unreadable or no commit."""
    try:
        commit = file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if re.fullmatch(r"[0-9a-f]{40}", commit) else None


def ref_commits(repo: Path) -> dict[str, list[str]]:
    """Commit -> the revisions (``refs/`` names, sorted) that point to it; bad refs skipped."""
    found: dict[str, list[str]] = {}
    refs = repo / "refs"
    for file in sorted(refs.rglob("*")) if refs.is_dir() else ():
        if file.is_file() and not file.name.endswith(".tmp"):
            commit = read_ref(file)
            if commit:
                found.setdefault(commit, []).append(file.relative_to(refs).as_posix())
    return found


def snapshot_folder(ref: HubRef, cache: Path) -> Path | None:
    """The cached snapshot folder of ``ref``'s revision (``refs/<rev>`` or a commit), if any."""
    repo = repo_dir(ref.repo_id, cache)
    revision = ref.revision or "main"
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        commit: str | None = revision
    else:
        commit = read_ref(repo / "refs" / revision)
    if commit is None:
        return None
    folder = repo / "snapshots" / commit
    return folder if folder.is_dir() else None


def has_config(folder: Path) -> bool:
    """A genai_config.json there: a file, or a link (maybe dangling: an interrupted download)."""
    config = folder / CONFIG_FILENAME
    return config.is_file() or config.is_symlink()


def model_folders(root: Path) -> list[Path]:
    """Folders under ``root`` (itself included) holding a genai_config.json, sorted."""
    found = [Path(top) for top, _, files in os.walk(root) if CONFIG_FILENAME in files]
    return sorted(folder for folder in found if has_config(folder))


def files_in(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def named_files(folder: Path) -> list[str]:
    """The files (inside the folder) that ``folder``'s genai_config.json names."""
    try:
        doc = json.loads((folder / CONFIG_FILENAME).read_text())
    except (OSError, ValueError):
        return []
    names: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if str(key).endswith("filename") and isinstance(value, str) and value:
                    names.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc)
    inside = [n for n in names if not PurePosixPath(n).is_absolute() and ".." not in n.split("/")]
    return sorted(set(inside))


def source_kind(files: Sequence[str]) -> str | None:
    """``"gguf"``, ``"safetensors"`` or None: what `genai build` could build these files from."""
    if any(f.lower().endswith(".gguf") for f in files):
        return "gguf"
    names = {PurePosixPath(f).name for f in files}
    if "config.json" in names and any(f.endswith(".safetensors") for f in files):
        return "safetensors"
    return None


def parent_folder(file: str) -> str:
    """The folder of a repo file ("" at the repo's root)."""
    parent = str(PurePosixPath(file).parent)
    return "" if parent == "." else parent


def partial_blobs(repo: Path) -> list[Path]:
    """``blobs/<etag>[.<id>].incomplete`` files of downloads that did not finish (those whose
    blob is there are left over from an interrupted download finished since)."""
    return [p for p in sorted((repo / "blobs").glob("*.incomplete")) if not blob_finished(p)]


def blob_finished(partial: Path) -> bool:
    """Whether the blob a ``blobs/*.incomplete`` file was downloading is there now."""
    return (partial.parent / partial.name.split(".")[0]).is_file()


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (its folders made) through a temporary file, so a reader
    never sees it half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
