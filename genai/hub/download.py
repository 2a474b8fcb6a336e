"""`pull`: downloading a repo's files into the hub cache (resumable, Ctrl-C stops it at once),
falling back to the cached copy when the hub cannot be reached."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

from genai.errors import (
    DownloadError,
    InvalidArgumentError,
    MissingDependencyError,
    ModelFileNotFoundError,
)
from genai.hub.build import build_snapshot, built_from
from genai.hub.layout import (
    CONFIG_FILENAME,
    PULLING_DIRNAME,
    HubRef,
    blob_finished,
    built_dir,
    hub_cache_dir,
    is_offline,
    parent_folder,
    read_ref,
    repo_dir,
    source_kind,
    write_atomically,
)
from genai.hub.lookup import cached_folder, choose_folder

log = logging.getLogger(__name__)


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
    return [f for f in files if parent_folder(f) == folder]


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
    repo = repo_dir(ref.repo_id, cache)
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
    if not force and built_from(built) == (snapshot.name, precision):
        return built
    return build_snapshot(ref, snapshot, wanted, progress=progress, precision=precision)


def _plan(ref: HubRef, files: list[str], included: bool) -> tuple[list[str], str, str]:
    """(the files to download, the model folder relative to the repo, the repo's kind)."""
    configs = [f for f in files if PurePosixPath(f).name == CONFIG_FILENAME]
    if configs:
        folder = choose_folder(ref, sorted(parent_folder(f) for f in configs))
        return (files if included else _in_folder(files, folder)), folder, "onnx"
    kind = source_kind(files)
    if kind == "gguf":
        ggufs = [f for f in files if f.lower().endswith(".gguf")]
        if len(ggufs) > 1:
            names = "\n  ".join(ggufs)
            raise InvalidArgumentError(
                f"{ref} holds {len(ggufs)} GGUF files; pick one with --include:\n  {names}"
            )
        return ggufs, parent_folder(ggufs[0]), kind
    if kind == "safetensors":
        wanted = [f for f in files if _matching([PurePosixPath(f).name], _SAFETENSORS_PATTERNS)]
        config = next(f for f in wanted if PurePosixPath(f).name == "config.json")
        return wanted, parent_folder(config), kind
    raise DownloadError(
        f"{ref} holds no {CONFIG_FILENAME} (an ONNX model folder), GGUF file or safetensors "
        "checkpoint (config.json + *.safetensors)"
    )


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
        folder = cached_folder(ref, cache, progress)
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
    """Record that ``files`` of ``commit`` are being fetched (see :func:`incomplete_reason`)."""
    marker = repo / PULLING_DIRNAME / commit
    try:
        before = json.loads(marker.read_text())
    except (OSError, ValueError):
        before = []
    listed = sorted({*(f for f in before if isinstance(f, str)), *files})
    write_atomically(marker, json.dumps(listed, indent=0) + "\n")


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
        if blob_finished(stale):
            stale.unlink(missing_ok=True)


def _write_ref(repo: Path, revision: str, commit: str) -> None:
    """``refs/<revision>`` = ``commit``, as the hub library writes it (atomically)."""
    ref = repo / "refs" / revision
    if read_ref(ref) != commit:
        write_atomically(ref, commit)
