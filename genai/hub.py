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
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

from genai.errors import (
    DownloadError,
    GenaiError,
    InvalidArgumentError,
    MissingDependencyError,
    ModelFileNotFoundError,
)

__all__ = [
    "CacheError",
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
#: Folder of a hub repo's cache folder where `pull` lists, per commit, the files it is fetching
#: (until they are all there): a snapshot missing one of them is an interrupted download.
PULLING_DIRNAME = ".genai-pulling"
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
    Any other text with a path separator is returned as it is (the caller reports it).

    ``download``: ``None`` downloads unless ``HF_HUB_OFFLINE`` is set; ``False`` never.
    Raises ModelFileNotFoundError for a bare name that is neither a folder nor a cached model
    (or a cached repo without a model folder), DownloadError when the model is not cached (or
    only partly: an interrupted download) and may not or cannot be downloaded.
    """
    text = os.fspath(spec)
    if Path(text).exists():
        return text
    if text and "/" not in text and os.sep not in text and text not in (".", ".."):
        local = _genai_models_dir() / text
        if (local / CONFIG_FILENAME).is_file():
            return str(local)
        raise ModelFileNotFoundError(_unknown_name(text, cache_dir))
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


def _unknown_name(text: str, cache_dir: str | os.PathLike[str] | None) -> str:
    """The error for ``-m TEXT`` that is neither a folder nor a cached model's name."""
    names = [m.name for m in cached_models(cache_dir)]
    close = [n for n in names if text.lower() in n.lower()]
    if close:
        hint = "did you mean " + " or ".join(close[:5]) + "?"
    elif names:
        more = f", ... ({len(names) - 8} more)" if len(names) > 8 else ""
        hint = "cached: " + ", ".join(names[:8]) + more
    else:
        hint = "no model is cached (`genai pull` fetches one)"
    return (
        f"{text!r} is neither a model folder nor the name of a cached model; {hint} "
        "(`genai list` shows the names)"
    )


def _read_ref(file: Path) -> str | None:
    """The commit a ``refs/`` file names, or None when it is unreadable or no commit."""
    try:
        commit = file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if re.fullmatch(r"[0-9a-f]{40}", commit) else None


def _refs(repo: Path) -> dict[str, list[str]]:
    """Commit -> the revisions (``refs/`` names, sorted) that point to it; bad refs skipped."""
    found: dict[str, list[str]] = {}
    refs = repo / "refs"
    for file in sorted(refs.rglob("*")) if refs.is_dir() else ():
        if file.is_file() and not file.name.endswith(".tmp"):
            commit = _read_ref(file)
            if commit:
                found.setdefault(commit, []).append(file.relative_to(refs).as_posix())
    return found


def _snapshot(ref: HubRef, cache: Path) -> Path | None:
    """The cached snapshot folder of ``ref``'s revision (``refs/<rev>`` or a commit), if any."""
    repo = _repo_dir(ref.repo_id, cache)
    revision = ref.revision or "main"
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        commit: str | None = revision
    else:
        commit = _read_ref(repo / "refs" / revision)
    if commit is None:
        return None
    folder = repo / "snapshots" / commit
    return folder if folder.is_dir() else None


def _has_config(folder: Path) -> bool:
    """A genai_config.json there: a file, or a link (maybe dangling: an interrupted download)."""
    config = folder / CONFIG_FILENAME
    return config.is_file() or config.is_symlink()


def _model_folders(root: Path) -> list[Path]:
    """Folders under ``root`` (itself included) holding a genai_config.json, sorted."""
    found = [Path(top) for top, _, files in os.walk(root) if CONFIG_FILENAME in files]
    return sorted(folder for folder in found if _has_config(folder))


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
    A cached GGUF or safetensors snapshot that was not built yet is built here. Raises
    DownloadError for an incomplete snapshot (an interrupted download) and
    ModelFileNotFoundError for a snapshot that holds no model folder."""
    snapshot = _snapshot(ref, cache)
    built = built_dir(ref.repo_id)
    if snapshot is None:
        return built if not ref.subfolder and (built / CONFIG_FILENAME).is_file() else None
    base = snapshot / ref.subfolder if ref.subfolder else snapshot
    if not base.is_dir():
        return None
    if _has_config(base):
        return _complete(ref, base, snapshot)
    found = [p.relative_to(snapshot).as_posix() for p in _model_folders(base)]
    if found:
        return _complete(ref, snapshot / _choose(ref, found), snapshot)
    if (built / CONFIG_FILENAME).is_file():
        return built
    files = [f.relative_to(snapshot).as_posix() for f in base.rglob("*") if f.is_file()]
    _complete(ref, base, snapshot)
    if _source_kind(files) is None:
        raise ModelFileNotFoundError(
            f"{ref} is in the Hugging Face cache ({base}) but holds no {CONFIG_FILENAME}: not "
            "a model folder (a PyTorch or GGUF checkpoint needs `genai build` first)"
        )
    return _build(ref, snapshot, files, progress=progress)


def _complete(ref: HubRef, folder: Path, snapshot: Path) -> Path:
    """``folder``, once it is known not to be an interrupted download (else DownloadError)."""
    reason = _incomplete(folder, snapshot)
    if reason:
        raise DownloadError(
            f"{ref} is incomplete in the Hugging Face cache ({reason}): run `genai pull {ref}` "
            "again to finish the download"
        )
    return folder


def _incomplete(folder: Path, snapshot: Path) -> str:
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
    for link in _files_in(folder):
        if link.is_symlink() and not link.exists():
            return f"{link.name} links to a missing blob"
    for name in _named_files(folder):
        if not (folder / name).is_file():
            return f"{name}, which {CONFIG_FILENAME} names, is missing"
    # Another tool's interrupted download: the hub library writes the ref before the files.
    if pulling is None and _partial_blobs(repo) and snapshot.name in _refs(repo):
        return "the repo holds blobs/*.incomplete"
    return ""


def _partial_blobs(repo: Path) -> list[Path]:
    """``blobs/<etag>[.<id>].incomplete`` files of downloads that did not finish (those whose
    blob is there are left over from an interrupted download finished since)."""
    return [p for p in sorted((repo / "blobs").glob("*.incomplete")) if not _finished(p)]


def _finished(partial: Path) -> bool:
    """Whether the blob a ``blobs/*.incomplete`` file was downloading is there now."""
    return (partial.parent / partial.name.split(".")[0]).is_file()


def _files_in(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def _named_files(folder: Path) -> list[str]:
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
    (``precision``) into :func:`built_dir`. ``force`` downloads (and builds) again. Offline or
    when the hub cannot be reached, a complete cached copy is returned with a warning; without
    one: DownloadError (at once, no retries). InvalidArgumentError when the repo holds several
    candidates. A KeyboardInterrupt stops the wait at once; what was fetched stays in the cache
    and the next `pull` resumes it."""
    ref = model if isinstance(model, HubRef) else HubRef.parse(model)
    if revision:
        ref = HubRef(ref.repo_id, revision, ref.subfolder)
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    if is_offline():
        error = DownloadError(f"cannot download {ref}: HF_HUB_OFFLINE is set")
        return _cached_instead(ref, cache, "HF_HUB_OFFLINE is set", error, force, progress)
    hf = _hf()
    endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/") or None  # at call time
    api = hf.HfApi(endpoint=endpoint)
    try:  # one request, no retries: tells an unreachable hub at once
        info = api.model_info(ref.repo_id, revision=ref.revision or "main")
        files = (
            [s.rfilename for s in info.siblings]
            if info.siblings is not None
            else api.list_repo_files(ref.repo_id, revision=info.sha)
        )
    except Exception as exc:  # the hub library's HTTP errors; httpx or OS errors
        error = _hub_error(ref, exc, hf, endpoint or "https://huggingface.co")
        if _unreachable(exc):
            return _cached_instead(
                ref, cache, "the hub could not be reached", error, force, progress
            )
        raise error from exc
    commit = str(info.sha)
    if ref.subfolder:
        files = [f for f in files if f.startswith(ref.subfolder + "/")]
    if include:
        files = _matching(files, include)
    if not files:
        raise DownloadError(f"no file of {ref} matches {list(include) or ref.subfolder!r}")
    wanted, folder, kind = _plan(ref, files, bool(include))
    log.info("pulling %d files of %s (%s) at %s", len(wanted), ref, kind, commit)
    repo = _repo_dir(ref.repo_id, cache)
    _mark_pulling(repo, commit, wanted)
    if ref.revision != commit:
        _write_ref(repo, ref.revision or "main", commit)

    def download(cancel: threading.Event) -> Path:
        with _progress_bars(progress):
            return Path(
                hf.snapshot_download(
                    ref.repo_id,
                    revision=commit,
                    allow_patterns=wanted,
                    cache_dir=cache,
                    force_download=force,
                    endpoint=endpoint,
                    tqdm_class=_cancellable_bars(hf.utils.tqdm, cancel),
                )
            )

    try:
        snapshot = _interruptible(download)
    except Exception as exc:  # the hub library's HTTP and file errors
        raise DownloadError(f"downloading {ref} failed: {_one_line(exc)}") from exc
    _unmark_pulling(repo, snapshot)
    if kind == "onnx":
        return snapshot / folder if folder else snapshot
    built = built_dir(ref.repo_id)
    if not force and _built_from(built) == (snapshot.name, precision):
        return built
    return _build(ref, snapshot, wanted, progress=progress, precision=precision)


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _unreachable(exc: BaseException) -> bool:
    """A connection that could not be made (DNS, refused, timeout, proxy, offline mode) or the
    hub answering 5xx: worth falling back to the cache, not worth retrying."""
    names = {"ConnectError", "ConnectTimeout", "ConnectionError", "ProxyError"}
    names |= {"OfflineModeIsEnabled", "TimeoutException", "Timeout"}
    seen: BaseException | None = exc
    while seen is not None:
        if any(cls.__name__ in names for cls in type(seen).__mro__):
            return True
        status = getattr(getattr(seen, "response", None), "status_code", None)
        if isinstance(status, int) and status >= 500:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _hub_error(ref: HubRef, exc: Exception, hf: SimpleNamespace, endpoint: str) -> DownloadError:
    """One line for what the hub (or the way to it) answered about ``ref``."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    code = f" ({status})" if status else ""
    errors = hf.errors
    if _unreachable(exc) and not status:
        return DownloadError(
            f"could not reach the Hugging Face hub ({endpoint}) for {ref}: {_one_line(exc)}; "
            "check the connection (or HF_ENDPOINT), or work offline with HF_HUB_OFFLINE=1 and "
            "the cached models (`genai list`)"
        )
    if isinstance(exc, errors.GatedRepoError):
        return DownloadError(
            f"{ref.repo_id} is gated{code}: accept its terms on the hub, set HF_TOKEN"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        private = " or it is private (set HF_TOKEN)" if status == 401 else ""
        return DownloadError(f"no model {ref.repo_id} on the hub{code}{private}")
    if isinstance(exc, errors.RevisionNotFoundError):
        return DownloadError(f"{ref.repo_id} has no revision {ref.revision!r} on the hub{code}")
    return DownloadError(f"cannot get {ref} from the hub{code}: {_one_line(exc)}")


def _cached_instead(
    ref: HubRef, cache: Path, why: str, error: DownloadError, force: bool, progress: bool
) -> Path:
    """The complete cached folder of ``ref`` when the hub cannot be asked (with a warning),
    else ``error``."""
    if force:
        raise error
    try:
        folder = _cached_folder(ref, cache, progress)
    except DownloadError as exc:  # an interrupted download: needs the hub
        raise DownloadError(f"{error}; the cached copy is incomplete") from exc
    except ModelFileNotFoundError:
        folder = None
    if folder is None:
        raise error
    log.warning(
        "could not check the hub for a newer revision of %s (%s): using the cached %s",
        ref, why, folder,
    )  # fmt: skip
    return folder


class _Cancelled(BaseException):
    """Raised in the download's threads once the pull was interrupted."""


def _cancellable_bars(base: type, cancel: threading.Event) -> type:
    """The hub library's progress bar class, stopping the download at its next chunk once
    ``cancel`` is set (the partial file stays as ``blobs/*.incomplete``, to resume)."""

    class Bars(base):  # type: ignore[misc, valid-type]
        def update(self, n: float | None = 1) -> bool | None:
            if cancel.is_set():
                raise _Cancelled
            return super().update(n)

    return Bars


def _interruptible(call: object) -> Path:
    """``call(cancel)`` in a daemon thread, waited for so that a KeyboardInterrupt (Ctrl-C)
    stops the wait at once (and sets ``cancel``) instead of when the download ends."""
    box: dict[str, object] = {}
    cancel = threading.Event()

    def run() -> None:
        try:
            box["result"] = call(cancel)  # type: ignore[operator]
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="genai-pull", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.1)
    except KeyboardInterrupt:
        cancel.set()
        raise
    error = box.get("error")
    if isinstance(error, BaseException):
        raise error
    return box["result"]  # type: ignore[return-value]


def _mark_pulling(repo: Path, commit: str, files: Sequence[str]) -> None:
    """Record that ``files`` of ``commit`` are being fetched (see :func:`_incomplete`)."""
    marker = repo / PULLING_DIRNAME / commit
    try:
        before = json.loads(marker.read_text())
    except (OSError, ValueError):
        before = []
    listed = sorted({*(f for f in before if isinstance(f, str)), *files})
    _write_atomically(marker, json.dumps(listed, indent=0) + "\n")


def _unmark_pulling(repo: Path, snapshot: Path) -> None:
    """Drop the record of a pull of ``snapshot`` once every file it lists is there."""
    marker = repo / PULLING_DIRNAME / snapshot.name
    try:
        listed = json.loads(marker.read_text())
    except (OSError, ValueError):
        return
    if isinstance(listed, list) and all((snapshot / str(f)).is_file() for f in listed):
        marker.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            marker.parent.rmdir()
    for stale in (repo / "blobs").glob("*.incomplete"):  # left by an interrupted pull
        if _finished(stale):
            stale.unlink(missing_ok=True)


def _write_ref(repo: Path, revision: str, commit: str) -> None:
    """``refs/<revision>`` = ``commit``, as the hub library writes it (atomically)."""
    ref = repo / "refs" / revision
    if _read_ref(ref) != commit:
        _write_atomically(ref, commit)


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (its folders made) through a temporary file, so a reader
    never sees it half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


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


def cached_models(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """The model folders in the hub cache (ONNX repos; GGUF or safetensors sources not built
    yet) and in genai's cache (the default model, models built from hub repos). An
    interrupted download or an unreadable genai_config.json is listed with its ``problem``;
    unreadable entries of the caches are skipped."""
    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    found: list[CachedModel] = []
    for repo_id, repo in _hub_repos(cache):
        refs = _refs(repo)
        snapshots = repo / "snapshots"
        for snapshot in sorted(snapshots.glob("*")) if snapshots.is_dir() else ():
            if not snapshot.is_dir():
                continue
            name = _snapshot_name(repo_id, snapshot.name, refs)
            folders = _model_folders(snapshot)
            for folder in folders:
                sub = folder.relative_to(snapshot).as_posix()
                problem = _broken(folder) or _problem(folder, snapshot)
                found.append(CachedModel(
                    f"{name}:{sub}" if sub != "." else name, folder, _size(folder),
                    f"{_model_type(folder)} (onnx)", "hub", problem))  # fmt: skip
            files = [f.relative_to(snapshot).as_posix() for f in snapshot.rglob("*") if f.is_file()]
            kind = _source_kind(files)
            problem = "" if folders else _problem(snapshot, snapshot)
            if not folders and (kind or problem):  # a source, or a download cut short
                found.append(CachedModel(name, snapshot, _size(snapshot),
                                         f"{kind} source" if kind else "?", "hub",
                                         problem))  # fmt: skip
    models = _genai_models_dir()
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
    reason = _incomplete(folder, snapshot)
    return f"incomplete: {reason}" if reason else ""


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
    local = _genai_models_dir() / name
    if name and "/" not in name and os.sep not in name and name not in (".", ".."):
        if (local / CONFIG_FILENAME).is_file():
            return _Removal([local], [])
        return None
    if not looks_like_repo_id(name):
        return None
    ref = HubRef.parse(name)
    repo = _repo_dir(ref.repo_id, cache)
    built = built_dir(ref.repo_id)
    snapshots = repo / "snapshots"
    if ref.subfolder:
        chosen = _snapshot(ref, cache) if ref.revision else None
        folders = [
            s / ref.subfolder
            for s in (sorted(snapshots.glob("*")) if snapshots.is_dir() else ())
            if (not ref.revision or s == chosen) and (s / ref.subfolder).is_dir()
        ]
        return _Removal(folders, [], repo) if folders else None
    if ref.revision:
        snapshot = _snapshot(ref, cache)
        if snapshot is None:
            return None
        commit = snapshot.name
        refs = [repo / "refs" / r for r in _refs(repo).get(commit, [])]
        folders = [snapshot]
        record = _built_from(built)
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
