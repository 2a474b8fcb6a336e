"""Model folders from the Hugging Face hub, offline first.

A model is named ``REPO_ID[@REVISION][:SUBFOLDER]`` (``microsoft/Phi-3-mini-4k-instruct-onnx:
cpu_and_mobile/cpu-int4-rtn-block-32-acc-level-4``). :func:`resolve_model` turns such a name into
a model folder: an existing local path is used as it is; a repo is looked up in the hub cache
(the library's standard cache, ``$HF_HUB_CACHE``) and downloaded only when it is not there and
downloads are allowed (not with ``HF_HUB_OFFLINE=1``). :func:`pull` downloads with the
``huggingface_hub`` library (its cache layout and progress bars): an ONNX repo's model folder as
it is; a GGUF or safetensors repo is then built with ``genai build`` into the genai cache
(:func:`built_dir`). :func:`cached_models` lists what is cached and :func:`remove` deletes it.

``og.Model`` keeps the reference's API (a folder path, never a network call): pass it
``resolve_model(name)``, a ``str`` the reference reads as well.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

from genai.errors import DownloadError, InvalidArgumentError, MissingDependencyError

__all__ = [
    "CachedModel",
    "HubRef",
    "built_dir",
    "cached_models",
    "hub_cache_dir",
    "is_offline",
    "looks_like_repo_id",
    "pull",
    "remove",
    "repo_folder_name",
    "resolve_model",
]

log = logging.getLogger(__name__)

CONFIG_FILENAME = "genai_config.json"
#: Written into a folder built from a hub repo: which repo and commit it was built from.
SOURCE_FILENAME = "genai_hub_source.json"
#: The files of a safetensors (PyTorch) repo that `genai build` reads.
_SAFETENSORS_PATTERNS = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_SPEC = re.compile(
    rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<revision>[^:@\s]+))?(?::(?P<subfolder>[^:@\s]*))?$"
)


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


@dataclass(frozen=True)
class CachedModel:
    """A model folder in a cache: ``name`` is what ``-m`` takes, ``kind`` the model type
    and where it came from, ``where`` the cache (``hub`` or ``genai``)."""

    name: str
    path: Path
    size: int
    kind: str
    where: str


def looks_like_repo_id(spec: str) -> bool:
    """Whether ``spec`` has the shape of a hub model name (it may still be a local path)."""
    return _SPEC.match(spec.strip()) is not None


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set: the hub is never contacted."""
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def _hf() -> SimpleNamespace:
    """The parts of huggingface_hub used here (imported on first use)."""
    try:  # lazy: optional dependency, only for models from the hub
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub import errors as hf_errors
        from huggingface_hub import utils as hf_utils
    except ImportError as exc:
        raise MissingDependencyError(
            "models from the Hugging Face hub need huggingface_hub "
            "(pip install 'genai-runtime[hub]')"
        ) from exc
    return SimpleNamespace(
        HfApi=HfApi, snapshot_download=snapshot_download, errors=hf_errors, utils=hf_utils
    )


def hub_cache_dir() -> Path:
    """The hub library's cache folder (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``), read from the environment at each call."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _genai_models_dir() -> Path:
    from genai.builder.pull import cache_root  # lazy: the builder imports onnx

    return cache_root() / "models"


def built_dir(repo_id: str) -> Path:
    """Where a model built from a GGUF or safetensors repo is kept (genai's own cache)."""
    return _genai_models_dir() / ("hub--" + repo_id.replace("/", "--"))


def repo_folder_name(repo_id: str) -> str:
    """``org/name`` -> ``models--org--name``, the hub cache's folder of a model repo."""
    return "models--" + repo_id.replace("/", "--")


def _repo_dir(repo_id: str, cache_dir: Path) -> Path:
    return cache_dir / repo_folder_name(repo_id)


# --- resolution --------------------------------------------------------------------------------
def resolve_model(
    spec: str | os.PathLike[str],
    *,
    download: bool | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> str:
    """The model folder for ``spec``: an existing path as given; else a name of genai's
    cache as `cached_models` lists it (e.g. the default model's folder name); else a hub model
    name, taken from the hub cache, else downloaded (and built, for a GGUF or safetensors repo).

    ``download``: ``None`` downloads unless ``HF_HUB_OFFLINE`` is set; ``False`` never.
    Raises FileNotFoundError for a missing path that is no hub name, DownloadError when the
    model is not cached and may not or cannot be downloaded.
    """
    text = os.fspath(spec)
    if Path(text).exists():
        return text
    if text and "/" not in text and os.sep not in text and text not in (".", ".."):
        local = _genai_models_dir() / text
        if (local / CONFIG_FILENAME).is_file():
            return str(local)
    if not looks_like_repo_id(text):
        return text
    ref = HubRef.parse(text)
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    folder = _cached_folder(ref, cache, progress)
    if folder is not None:
        return str(folder)
    allowed = not is_offline() if download is None else download and not is_offline()
    if not allowed:
        why = "HF_HUB_OFFLINE is set" if is_offline() else "downloads are off"
        raise DownloadError(
            f"{ref} is not in the Hugging Face cache ({cache}) and {why}: run "
            f"`genai pull {ref}` while online, or pass a model folder"
        )
    return str(pull(ref, progress=progress, cache_dir=cache))


def _snapshot(ref: HubRef, cache: Path) -> Path | None:
    """The cached snapshot folder of ``ref``'s revision (``refs/<rev>`` or a commit), if any."""
    repo = _repo_dir(ref.repo_id, cache)
    revision = ref.revision or "main"
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        commit = revision
    else:
        ref_file = repo / "refs" / revision
        if not ref_file.is_file():
            return None
        commit = ref_file.read_text().strip()
    folder = repo / "snapshots" / commit
    return folder if folder.is_dir() else None


def _model_folders(root: Path) -> list[Path]:
    """Folders under ``root`` (itself included) holding a genai_config.json, sorted."""
    return sorted(p.parent for p in root.rglob(CONFIG_FILENAME) if p.is_file())


def _choose(ref: HubRef, folders: list[str]) -> str:
    """The one model folder (relative to the repo) among ``folders``, or a clear error."""
    if len(folders) == 1:
        return folders[0]
    if not folders:
        raise DownloadError(f"{ref} holds no {CONFIG_FILENAME}")
    names = "\n  ".join(f"{ref.repo_id}:{f}" for f in folders)
    raise InvalidArgumentError(f"{ref} holds {len(folders)} model folders; name one:\n  {names}")


def _cached_folder(ref: HubRef, cache: Path, progress: bool = True) -> Path | None:
    """The model folder for ``ref`` from the caches alone, or None when it is not there.
    A cached GGUF or safetensors snapshot that was not built yet is built here."""
    snapshot = _snapshot(ref, cache)
    built = built_dir(ref.repo_id)
    if snapshot is None:
        return built if not ref.subfolder and (built / CONFIG_FILENAME).is_file() else None
    base = snapshot / ref.subfolder if ref.subfolder else snapshot
    if not base.is_dir():
        return None
    if (base / CONFIG_FILENAME).is_file():
        return base
    found = [p.relative_to(snapshot).as_posix() for p in _model_folders(base)]
    if found:
        return snapshot / _choose(ref, found)
    if (built / CONFIG_FILENAME).is_file():
        return built
    files = [f.relative_to(snapshot).as_posix() for f in base.rglob("*") if f.is_file()]
    if _source_kind(files) is None:
        return None
    return _build(ref, snapshot, files, progress=progress)


def _source_kind(files: Sequence[str]) -> str | None:
    """``"gguf"``, ``"safetensors"`` or None: what `genai build` could build these files from."""
    if any(f.lower().endswith(".gguf") for f in files):
        return "gguf"
    names = {PurePosixPath(f).name for f in files}
    if "config.json" in names and any(f.endswith(".safetensors") for f in files):
        return "safetensors"
    return None


# --- download ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    utils = _hf().utils
    was_disabled = utils.are_progress_bars_disabled()
    if not enabled:
        utils.disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            utils.enable_progress_bars()


def _matching(files: Sequence[str], patterns: Sequence[str]) -> list[str]:
    return [f for f in files if any(fnmatch.fnmatch(f, p) for p in patterns)]


def _in_folder(files: Sequence[str], folder: str) -> list[str]:
    """The files directly in ``folder`` of the repo ("" is its root)."""
    return [f for f in files if _parent(f) == folder]


def _parent(file: str) -> str:
    """The folder of a repo file ("" at the repo's root)."""
    parent = str(PurePosixPath(file).parent)
    return "" if parent == "." else parent


def pull(
    model: str | HubRef,
    *,
    include: Sequence[str] = (),
    revision: str | None = None,
    precision: str = "int4",
    progress: bool = True,
    force: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Download ``model`` (``ORG/NAME[@REV][:SUBFOLDER]``) into the hub cache and return its
    model folder. ``include``: glob patterns of the repo's files to fetch (as
    ``hf download --include``). An ONNX repo must then hold one model folder (or name it by
    subfolder or ``include``); a GGUF or safetensors repo is built with ``genai build``
    (``precision``) into :func:`built_dir`. ``force`` downloads (and builds) again. Raises
    DownloadError offline or when the hub cannot be reached, InvalidArgumentError when the repo
    holds several candidates."""
    ref = model if isinstance(model, HubRef) else HubRef.parse(model)
    if revision:
        ref = HubRef(ref.repo_id, revision, ref.subfolder)
    if is_offline():
        raise DownloadError(f"cannot download {ref}: HF_HUB_OFFLINE is set")
    hf = _hf()
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    try:
        files = hf.HfApi().list_repo_files(ref.repo_id, revision=ref.revision)
    except (hf.errors.RepositoryNotFoundError, hf.errors.RevisionNotFoundError) as exc:
        raise DownloadError(f"{ref} is not on the hub: {exc}") from exc
    except Exception as exc:  # httpx or OS errors: no network, a proxy, the hub down
        raise DownloadError(f"cannot list the files of {ref} on the hub: {exc}") from exc
    if ref.subfolder:
        files = [f for f in files if f.startswith(ref.subfolder + "/")]
    if include:
        files = _matching(files, include)
    if not files:
        raise DownloadError(f"no file of {ref} matches {list(include) or ref.subfolder!r}")
    wanted, folder, kind = _plan(ref, files, bool(include))
    log.info("pulling %d files of %s (%s)", len(wanted), ref, kind)
    try:
        with _progress_bars(progress):
            snapshot = Path(
                hf.snapshot_download(
                    ref.repo_id,
                    revision=ref.revision,
                    allow_patterns=wanted,
                    cache_dir=cache,
                    force_download=force,
                )
            )
    except Exception as exc:  # the hub library's HTTP and file errors
        raise DownloadError(f"downloading {ref} failed: {exc}") from exc
    if kind == "onnx":
        return snapshot / folder if folder else snapshot
    built = built_dir(ref.repo_id)
    if not force and _built_from(built) == (snapshot.name, precision):
        return built
    return _build(ref, snapshot, wanted, progress=progress, precision=precision)


def _built_from(folder: Path) -> tuple[str, str] | None:
    """(commit, precision) a folder of :func:`built_dir` was built from, if it is one."""
    try:
        record = json.loads((folder / SOURCE_FILENAME).read_text())
        return str(record["commit"]), str(record["precision"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _plan(ref: HubRef, files: list[str], included: bool) -> tuple[list[str], str, str]:
    """(the files to download, the model folder relative to the repo, the repo's kind)."""
    configs = [f for f in files if PurePosixPath(f).name == CONFIG_FILENAME]
    if configs:
        folder = _choose(ref, sorted(_parent(f) for f in configs))
        return (files if included else _in_folder(files, folder)), folder, "onnx"
    kind = _source_kind(files)
    if kind == "gguf":
        ggufs = [f for f in files if f.lower().endswith(".gguf")]
        if len(ggufs) > 1:
            names = "\n  ".join(ggufs)
            raise InvalidArgumentError(
                f"{ref} holds {len(ggufs)} GGUF files; pick one with --include:\n  {names}"
            )
        return ggufs, _parent(ggufs[0]), kind
    if kind == "safetensors":
        wanted = [f for f in files if _matching([PurePosixPath(f).name], _SAFETENSORS_PATTERNS)]
        config = next(f for f in wanted if PurePosixPath(f).name == "config.json")
        return wanted, _parent(config), kind
    raise DownloadError(
        f"{ref} holds no {CONFIG_FILENAME} (an ONNX model folder), GGUF file or safetensors "
        "checkpoint (config.json + *.safetensors)"
    )


def _build(
    ref: HubRef, snapshot: Path, files: Sequence[str], *, progress: bool, precision: str = "int4"
) -> Path:
    """Build the GGUF file or safetensors checkpoint among ``files`` (relative to
    ``snapshot``) into :func:`built_dir`, recording where it came from."""
    from genai.builder.build import build  # lazy: the builder imports onnx
    from genai.builder.progress import StderrProgress  # lazy: the builder imports onnx

    kind = _source_kind(files)
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
        source_name = _parent(config)
    source = snapshot / source_name if source_name else snapshot
    target = built_dir(ref.repo_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    reporter = StderrProgress() if progress else None
    if reporter:
        reporter.message(f"genai: building {ref} ({kind}, {precision}) into {target}")
    work = Path(tempfile.mkdtemp(prefix=".pull-", dir=target.parent))
    try:
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
        if target.exists():
            shutil.rmtree(target)
        os.replace(built, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


# --- the caches --------------------------------------------------------------------------------
def _size(folder: Path) -> int:
    """Bytes of the files under ``folder``, each link target counted once."""
    seen: set[Path] = set()
    for file in folder.rglob("*"):
        if file.is_file():
            seen.add(file.resolve())
    return sum(f.stat().st_size for f in seen)


def _model_type(folder: Path) -> str:
    try:
        return str(json.loads((folder / CONFIG_FILENAME).read_text())["model"]["type"])
    except (OSError, ValueError, KeyError, TypeError):
        return "?"


def _hub_repos(cache: Path) -> Iterator[tuple[str, Path]]:
    if not cache.is_dir():
        return
    for repo in sorted(cache.glob("models--*")):
        parts = repo.name.split("--")
        if len(parts) == 3:
            yield f"{parts[1]}/{parts[2]}", repo


def cached_models(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """The model folders in the hub cache (ONNX repos; GGUF or safetensors sources not built
    yet) and in genai's cache (the default model, models built from hub repos)."""
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    found: list[CachedModel] = []
    for repo_id, repo in _hub_repos(cache):
        current = {p.read_text().strip() for p in (repo / "refs").glob("*") if p.is_file()}
        for snapshot in sorted((repo / "snapshots").glob("*")):
            name = repo_id if snapshot.name in current else f"{repo_id}@{snapshot.name}"
            folders = _model_folders(snapshot)
            for folder in folders:
                sub = folder.relative_to(snapshot).as_posix()
                found.append(CachedModel(
                    f"{name}:{sub}" if sub != "." else name, folder, _size(folder),
                    f"{_model_type(folder)} (onnx)", "hub"))  # fmt: skip
            files = [f.relative_to(snapshot).as_posix() for f in snapshot.rglob("*") if f.is_file()]
            kind = _source_kind(files)
            if not folders and kind:
                found.append(CachedModel(name, snapshot, _size(snapshot), f"{kind} source", "hub"))
    models = _genai_models_dir()
    for folder in sorted(models.glob("*")) if models.is_dir() else ():
        if not (folder / CONFIG_FILENAME).is_file():
            continue
        source = folder / SOURCE_FILENAME
        try:
            record = json.loads(source.read_text()) if source.is_file() else None
        except ValueError:
            record = None
        if record:
            name, kind = record["repo_id"], f"{_model_type(folder)} (built from {record['kind']})"
        else:
            name, kind = folder.name, f"{_model_type(folder)} (genai pull)"
        found.append(CachedModel(name, folder, _size(folder), kind, "genai"))
    return found


def remove(name: str, cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Delete a cached model by the name `cached_models` gives it: a whole hub repo
    (``ORG/NAME``: every revision, and the folder built from it), one model folder of a repo
    (``ORG/NAME:SUBFOLDER``: its files, and the blobs nothing else links to) or a folder of
    genai's cache. Returns what was deleted; InvalidArgumentError when nothing matches."""
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    removed: list[Path] = []
    local = _genai_models_dir() / name
    if "/" not in name and (local / CONFIG_FILENAME).is_file():
        shutil.rmtree(local)
        return [local]
    ref = HubRef.parse(name)
    repo = _repo_dir(ref.repo_id, cache)
    if ref.subfolder:
        chosen = _snapshot(ref, cache) if ref.revision else None
        for snapshot in (repo / "snapshots").glob("*"):
            if ref.revision and snapshot != chosen:
                continue
            folder = snapshot / ref.subfolder
            if folder.is_dir():
                shutil.rmtree(folder)
                removed.append(folder)
        if removed:
            _drop_orphan_blobs(repo)
    else:
        built = built_dir(ref.repo_id)
        for folder in (repo, built):
            if folder.is_dir():
                shutil.rmtree(folder)
                removed.append(folder)
    if not removed:
        raise InvalidArgumentError(f"no cached model {name!r} (`genai list` shows them)")
    return removed


def _drop_orphan_blobs(repo: Path) -> None:
    """Delete the blobs of ``repo`` that no snapshot links to any more."""
    used = {p.resolve() for p in (repo / "snapshots").rglob("*") if p.is_symlink()}
    for blob in (repo / "blobs").glob("*"):
        if blob.resolve() not in used:
            blob.unlink()
