"""Exceptions raised by genai: one base, `GenaiError`, for everything the library reports about
its input (a model folder, a config, an argument, a request) or its state. Each class also
subclasses the built-in that fits, so ``except ValueError`` keeps working for callers who
don't know ours and the reference's exception types are kept; anything else that escapes is
a bug, not a user error."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

__all__ = [
    "ArgumentTypeError",
    "ConfigError",
    "DownloadError",
    "GenaiError",
    "GenerationError",
    "InvalidArgumentError",
    "LengthLimitError",
    "MissingDependencyError",
    "ModelError",
    "ModelFileNotFoundError",
    "NonFiniteLogitsError",
    "ProviderUnavailableError",
    "SearchOptionError",
    "TensorNotFoundError",
    "UnsupportedFeatureError",
    "check_type",
    "check_writable_file",
]

_T = TypeVar("_T")


class GenaiError(Exception):
    """Base of every error genai raises on purpose; the CLI and the server answer these as
    user errors (one line, a 4xx) and let anything else surface as a bug."""


class ConfigError(GenaiError, ValueError):
    """A ``genai_config.json`` (or an overlay) is malformed or names something invalid."""


class SearchOptionError(GenaiError, ValueError, RuntimeError):
    """A search option has an unknown name, a wrong type, or a value out of range (also a
    RuntimeError, what the reference raises there: e.g. max_length above the context)."""


class InvalidArgumentError(GenaiError, ValueError):
    """An argument of a public call has a wrong value, shape or dtype."""


class LengthLimitError(InvalidArgumentError, RuntimeError):
    """Tokens that would not fit the sequence's ``max_length`` (also a RuntimeError, what the
    reference raises there)."""


class ArgumentTypeError(GenaiError, TypeError):
    """An argument of a public call has the wrong type."""


class ModelError(GenaiError, RuntimeError):
    """A model cannot be loaded or run as its folder describes (onnxruntime refused it, an
    output has the wrong shape, the model has no such token or processor)."""


class MissingDependencyError(GenaiError, RuntimeError):
    """An optional dependency (a package extra) that a command or feature needs is not
    installed; the message says what to install."""


class DownloadError(GenaiError, RuntimeError):
    """Fetching a package from the registry failed (``genai pull``)."""


class GenerationError(GenaiError, RuntimeError):
    """The generator was used out of order (e.g. generating before any tokens were appended)."""


class NonFiniteLogitsError(GenaiError, ValueError):
    """The logits a token is to be chosen from hold NaN (a model, an adapter or `set_logits`
    produced them): no token can be chosen."""


class ProviderUnavailableError(GenaiError, RuntimeError):
    """A requested execution provider cannot run here; the message says what is missing."""


class UnsupportedFeatureError(GenaiError, NotImplementedError):
    """The model or call asks for a feature genai does not run yet; the message names it and
    the plan (docs/differences.md)."""


class ModelFileNotFoundError(GenaiError, FileNotFoundError, RuntimeError):
    """A model folder, its ``genai_config.json`` or a file the config names is missing. A
    FileNotFoundError, and a RuntimeError as the reference raises ("Error opening ...")."""


class TensorNotFoundError(GenaiError, KeyError, RuntimeError):
    """A tensor name the model (`Generator.get_input` / `get_output`) or a `NamedTensors` does
    not have. A KeyError, and a RuntimeError as the reference raises."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def check_type(value: _T, expected: type | tuple[type, ...], what: str) -> _T:
    """``value`` when it is an ``expected`` instance (a bool is no int), else
    `ArgumentTypeError` naming the argument ``what`` (the reference's bindings raise a
    TypeError there)."""
    kinds = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
        return value
    names = " or ".join(dict.fromkeys(kind.__name__ for kind in kinds))  # (np.bool_: "bool")
    raise ArgumentTypeError(f"{what} must be {names}, not {type(value).__name__}")


def check_writable_file(path: str | os.PathLike[str], what: str) -> None:
    """Raise `InvalidArgumentError` starting with ``what`` (e.g. ``"--report r.json"``) unless
    a file can be written at ``path`` (its folder exists and takes it, or the file exists and
    can be overwritten): checked before long work whose result goes there. Leaves no file
    behind that was not there before, and an existing one untouched."""
    target = Path(path)
    if target.is_dir():
        raise InvalidArgumentError(f"{what}: is a folder, not a file to write")
    folder = target.parent
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist"
        raise InvalidArgumentError(f"{what}: folder {os.fspath(folder)!r} {state}")
    existed = target.exists()
    try:
        with open(target, "a"):  # "a": an existing file is not truncated by the check
            pass
    except OSError as exc:
        raise InvalidArgumentError(f"{what}: cannot write it: {exc.strerror}") from None
    if not existed:
        target.unlink(missing_ok=True)
