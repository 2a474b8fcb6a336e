"""The output folder of a build: checked before anything is written, written as a hidden
sibling and renamed into place only when complete.

:func:`check_output` refuses, before any work: an output that is a file, the input folder
itself, a folder that holds the input, and a non-empty folder that is not a model folder
(:func:`replaceable`). :func:`staged_folder` yields a new hidden folder beside the output (same
parent, so the renames stay on one filesystem); when the block ends without an exception it
takes the output's place (an existing folder is renamed aside, the new one renamed in, the old
one removed), otherwise (an error, Ctrl-C, ``SystemExit``) it is removed with any parent
folders it created, and a previous folder at the output is left as it was. A staging folder
that a killed build (SIGKILL, a crash) left is removed by the next build into the same output:
each build holds a lock on ``.NAME.building-X.lock`` while its folder exists (POSIX).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from genai.builder.errors import BuildError

__all__ = [
    "BUILT_FILES",
    "check_output",
    "replace_folder",
    "replaceable",
    "staged_folder",
    "work_folder",
]

log = logging.getLogger(__name__)

#: The names a build writes (decoders, Whisper, and what `genai pull` / the hub cache add):
#: a folder holding only these, even without its genai_config.json (what an interrupted build
#: of an older genai left), is replaced too.
BUILT_FILES = frozenset(
    {
        "genai_config.json",
        "model.onnx",
        "model.onnx.data",
        "encoder.onnx",
        "encoder.onnx.data",
        "decoder.onnx",
        "decoder.onnx.data",
        "audio_processor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "chat_template.json",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "normalizer.json",
        "genai_pull.json",
        "genai_hub_source.json",
    }
)


def replaceable(folder: Path) -> bool:
    """Whether a build may replace ``folder`` (an existing folder): it is empty, or a model
    folder (a ``genai_config.json`` and nothing but files), or holds only files a build
    writes."""
    entries = list(folder.iterdir())
    if not entries:
        return True
    if not all(entry.is_file() for entry in entries):
        return False
    names = {entry.name for entry in entries}
    return "genai_config.json" in names or names <= BUILT_FILES


def check_output(input_path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """The resolved output folder for a build of ``input_path`` into ``out``; a one-line
    :class:`BuildError` when the build must not write there."""
    source = Path(os.path.abspath(input_path)).resolve()
    if source.name == "config.json" and source.is_file():  # a Hugging Face folder's config
        source = source.parent
    target = Path(os.path.abspath(out)).resolve()
    if target.exists() and not target.is_dir():
        raise BuildError(f"output {out}: exists and is not a folder")
    if target == source:
        raise BuildError(
            f"output {out} is the input folder: the model would be written into the "
            "checkpoint; choose another output folder"
        )
    if target in source.parents:
        raise BuildError(
            f"output {out} holds the input {input_path}: replacing it would delete the "
            "input; choose another output folder"
        )
    if target.is_dir() and not replaceable(target):
        raise BuildError(
            f"output {out} is a non-empty folder that is not a model folder (no "
            "genai_config.json, or subfolders): not replacing it; remove it or choose "
            "another output folder"
        )
    return target


def _lock_path(work: Path) -> Path:
    return work.with_name(work.name + ".lock")


def _flock(fd: int) -> bool | None:
    """Lock ``fd`` exclusively without waiting: True; False when another process holds it;
    None when this system or filesystem has no such locks (then nothing is cleaned)."""
    try:
        import fcntl  # POSIX only
    except ImportError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # e.g. ENOLCK on a filesystem without locks
        return None
    return True


def _hold_existing(lock: Path) -> int | None:
    """A descriptor holding the existing file ``lock``, or None when another process holds
    it, it is gone (or was replaced meanwhile), or locks are not available."""
    try:
        fd = os.open(lock, os.O_RDWR)  # never made here: a lock file exists only locked
    except OSError:
        return None
    try:
        if _flock(fd) and os.fstat(fd).st_ino == os.stat(lock).st_ino:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _remove_stale(parent: Path, prefix: str) -> None:
    """Remove the folders ``parent/PREFIX*`` that no running process holds: what a process
    killed with SIGKILL (or a crash) left. `work_folder` makes ``PREFIXxxxx.lock`` already
    locked (a locked ``.lock.tmp`` linked to that name) before it makes ``PREFIXxxxx``, and
    keeps it locked until the folder is gone."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if not name.startswith(prefix):
            continue
        try:
            if name.endswith(".lock.tmp"):  # killed while making its lock
                lock = entry
                work = None
            elif name.endswith(".lock"):  # a lock whose folder is gone: killed after the rename
                lock = entry
                work = entry.with_name(name[: -len(".lock")])
                if work.exists():
                    continue  # seen as a folder
            elif entry.is_dir():
                work = entry
                lock = _lock_path(work)
                if not lock.exists():
                    continue  # made by an older genai, or where files cannot be locked
            else:
                continue
            fd = _hold_existing(lock)
            if fd is None:
                continue  # in use
            try:
                log.info("removing %s, left by a build or pull that did not finish", work or lock)
                if work is not None:
                    shutil.rmtree(work, ignore_errors=True)
                lock.unlink(missing_ok=True)
            finally:
                os.close(fd)
        except OSError:  # an entry this process may not touch: the next one
            continue


def _new_lock(lock: Path) -> tuple[int | None, bool]:
    """Make the lock file ``lock`` already locked (a locked temporary file linked to its
    name, so no other process ever sees it unlocked): (its descriptor, or None where files
    cannot be locked; False when ``lock`` exists: pick another name)."""
    temporary = lock.with_name(lock.name + ".tmp")
    try:
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None, False
    try:
        if not _flock(fd):
            os.close(fd)
            return None, True  # no locks here: no lock file either
        try:
            os.link(temporary, lock)
        except FileExistsError:
            os.close(fd)
            return None, False
        except OSError:  # no hard links on this filesystem: no lock file
            os.close(fd)
            return None, True
        return fd, True
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def work_folder(parent: Path, prefix: str) -> Iterator[Path]:
    """A new empty folder ``parent/PREFIX<random>`` for the block, removed after it (also on
    an error or Ctrl-C; a block may move it away). While it exists its lock file
    ``PREFIX<random>.lock`` is held (POSIX, local filesystems), so the folders of that prefix
    that nobody holds, left by a killed process, are removed first."""
    _remove_stale(parent, prefix)
    while True:
        work = parent / f"{prefix}{secrets.token_hex(4)}"
        lock = _lock_path(work)
        if lock.exists() or work.exists():
            continue
        fd, made = _new_lock(lock)
        if not made:
            continue
        try:
            work.mkdir()
        except FileExistsError:
            _release(lock, fd)
            continue
        except BaseException:
            _release(lock, fd)
            raise
        break
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _release(lock, fd)


def _release(lock: Path, fd: int | None) -> None:
    """Remove the lock file a `work_folder` holds (``fd``; None: there is none)."""
    if fd is not None:
        lock.unlink(missing_ok=True)
        os.close(fd)


def replace_folder(work: Path, target: Path) -> None:
    """Rename the complete folder ``work`` to ``target``, replacing a folder there."""
    if not target.exists():
        os.replace(work, target)
        return
    if not target.is_dir() or not replaceable(target):  # appeared while building
        raise BuildError(
            f"output {target} is not a model folder (it holds subfolders or other files): not "
            "replacing it"
        )
    with contextlib.suppress(OSError):
        shutil.copymode(target, work)
    old = target.with_name(f".{target.name}.old-{secrets.token_hex(4)}")
    os.replace(target, old)
    try:
        os.replace(work, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """Yield an empty hidden folder beside ``target`` to build into; on a clean exit it
    replaces ``target``, on any exception it is removed (with the parent folders made for it)
    and ``target`` is left untouched."""
    made = []
    parent = target.parent
    while not parent.exists():
        made.append(parent)
        parent = parent.parent
    stack = contextlib.ExitStack()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = stack.enter_context(work_folder(target.parent, f".{target.name}.building-"))
    except OSError as exc:  # named by the folder asked for, not the hidden one
        _remove_empty(made)
        raise BuildError(
            f"cannot create the output folder {target}: {exc.strerror or exc}"
        ) from None
    try:
        with stack:  # removes the folder unless it was renamed into place
            yield work
            replace_folder(work, target)
    except BaseException:
        _remove_empty(made)
        raise


def _remove_empty(made: list[Path]) -> None:
    """Remove the folders made for the output (deepest first), up to one that is not empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            break
