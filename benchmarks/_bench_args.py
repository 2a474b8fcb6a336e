"""What the benchmark scripts share: argparse types for counts, the model folder, decode ahead
turned off for per-step timings, and a one-line header of what a run measured.

The scripts run as ``python benchmarks/X.py``: Python puts this folder first on ``sys.path``, so
``import _bench_args`` works from any working directory, with or without ``PYTHONPATH=.``.
Nothing here imports genai or the reference at import time (``--help`` stays fast).

* `positive_int`, `non_negative_int`, `positive_float`: ``type=`` of count-like options; a bad
  value is argparse's usual one-line error naming the option (exit status 2);
* `model_folder`: ``-m`` as the CLI's ``-m`` takes it (a folder, or a cached model's name as
  ``genai list`` shows it; nothing is downloaded); without ``-m`` the reference-built SmolLM2 in
  ``../shared`` (``$GENAI_SHARED_DIR``, as for the tests) when present, else genai's default
  model (pulled on first use, as ``genai pull``); a missing folder ends the script with one
  line, not a traceback;
* `decode_ahead_off`: generators created inside it step in the caller's thread
  (``GENAI_DECODE_AHEAD=0``, read when a generator is created), so one ``generate_next_token``
  call is one model step: what per-step timings need;
* `header`: git commit, versions, threads, CPU model and load average on one line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
#: The reference-built SmolLM2 of the development machines (absent for a user); as in the
#: tests, ``GENAI_SHARED_DIR`` points at another shared folder (a missing one: as a user has).
SHARED = Path(os.environ.get("GENAI_SHARED_DIR") or ROOT.parent / "shared")
SHARED_MODEL = SHARED / "models" / "smollm2-135m-instruct-int4"
CONFIG = "genai_config.json"
#: The note the per-step scripts print (and put in their --help).
DECODE_AHEAD_NOTE = (
    "per-step timings run genai's generators with decode ahead off (GENAI_DECODE_AHEAD=0): "
    "with it on, generate_next_token mostly takes a token a native thread already made"
)


# -- argparse types ----------------------------------------------------------------------------
def _number(text: str, kind: type, low: float, strict: bool, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} expected, got {text!r}") from None
    if value < low or (strict and value == low) or value != value:  # (NaN)
        raise argparse.ArgumentTypeError(f"{what} expected, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An int >= 1 (argparse ``type=``)."""
    return _number(text, int, 1, False, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """An int >= 0 (argparse ``type=``)."""
    return _number(text, int, 0, False, "an integer >= 0")


def positive_float(text: str) -> float:
    """A float > 0 (argparse ``type=``; inf refused too)."""
    value = _number(text, float, 0.0, True, "a number > 0")
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"a number > 0 expected, got {text!r}")
    return value


# -- model folders -----------------------------------------------------------------------------
def fail(message: str) -> NoReturn:
    """End the script with one line naming it (exit status 1)."""
    raise SystemExit(f"{Path(sys.argv[0]).name}: {message}")


def require_model(folder: str | os.PathLike[str], what: str = "model folder") -> Path:
    """``folder`` as a Path when it holds a genai_config.json; else the script ends with one
    line naming it."""
    path = Path(folder)
    if not (path / CONFIG).is_file():
        why = "does not exist" if not path.exists() else f"has no {CONFIG}"
        hint = ""
        if what == "model folder":
            hint = ": pass -m with a model folder or a cached model's name (`genai list`)"
        fail(f"{what} {str(folder)!r} {why}{hint}")
    return path


def default_model() -> Path:
    """genai's default model folder, pulled and built on first use (as `genai pull`)."""
    _import_genai()
    from genai.builder.pull import default_model as pull_default
    from genai.errors import GenaiError

    try:
        return Path(pull_default())
    except GenaiError as exc:
        fail(str(exc))


def shared_or_default() -> Path:
    """The reference-built SmolLM2 in ../shared when present, else genai's default model."""
    if (SHARED_MODEL / CONFIG).is_file():
        return SHARED_MODEL
    return default_model()


def model_folder(spec: str | os.PathLike[str] | None, default=shared_or_default) -> Path:
    """``-m``'s folder: ``spec`` as the CLI's ``-m`` takes it (a folder, a cached model's name,
    a hub name in the hub cache; never downloaded); None: ``default()``. A folder that is not
    there ends the script with one line."""
    if spec is None:
        return require_model(default())
    _import_genai()
    from genai.errors import GenaiError
    from genai.hub import resolve_model

    try:
        folder = resolve_model(os.fspath(spec), download=False, progress=False)
    except GenaiError as exc:
        fail(str(exc))
    return require_model(folder)


MODEL_HELP = (
    "model folder or cached model name (default: ../shared's SmolLM2 when present, else "
    "genai's default model)"
)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """``-m/--model`` (None when not given: `model_folder` then picks the default)."""
    parser.add_argument("-m", "--model", default=None, help=MODEL_HELP)


def _import_genai() -> None:
    """Make ``import genai`` find this checkout's (as the scripts' own sys.path line does)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


# -- decode ahead ------------------------------------------------------------------------------
@contextlib.contextmanager
def decode_ahead_off() -> Iterator[None]:
    """Generators created inside step in the caller's thread (``GENAI_DECODE_AHEAD=0``; genai
    reads it when it creates a generator); the variable is restored afterwards."""
    saved = os.environ.get("GENAI_DECODE_AHEAD")
    os.environ["GENAI_DECODE_AHEAD"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("GENAI_DECODE_AHEAD", None)
        else:
            os.environ["GENAI_DECODE_AHEAD"] = saved


# -- the header --------------------------------------------------------------------------------
def _git_commit() -> str:
    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10
        )
        if out.returncode != 0:
            raise OSError(out.stderr.strip())
        return out.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _genai_version() -> str:
    _import_genai()  # this checkout's genai, as the scripts import it
    try:
        import genai
    except ImportError:
        return "absent"
    return genai.__version__


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown"


def header(threads: object = None) -> str:
    """Print (and return) one line: the checkout's commit (+dirty), the genai,
    onnxruntime-genai and onnxruntime versions, the threads asked for, the CPU model, the
    load average and the CPU count."""
    if isinstance(threads, list | tuple):
        threads = " ".join(map(str, threads))
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (OSError, AttributeError):  # (no load average on Windows)
        load = "unknown"
    line = (
        f"# {Path(sys.argv[0]).name}: commit {_git_commit()}, genai {_genai_version()}, "
        f"onnxruntime-genai {_version('onnxruntime-genai')}, "
        f"onnxruntime {_version('onnxruntime')}, threads {threads if threads else 'default'}, "
        f"CPU {_cpu_model()} x{os.cpu_count()}, load {load}"
    )
    print(line, flush=True)
    return line
