"""The output folder of a build: checked before anything is written, written as a hidden
sibling and renamed into place only when complete.

:func:`check_output` refuses, before any work: an output that is a file, the input folder
itself, a folder that holds the input, and a non-empty folder that is not a model folder
(:func:`replaceable`). :func:`staged_folder` yields a new hidden folder beside the output (same
parent, so the renames stay on one filesystem); when the block ends without an exception it
takes the output's place (an existing folder is renamed aside, the new one renamed in, the old
one removed), otherwise (an error, Ctrl-C, ``SystemExit``) it is removed with any parent
folders it created, and a previous folder at the output is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from genai.builder.errors import BuildError

__all__ = ["BUILT_FILES", "check_output", "replaceable", "staged_folder"]

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


def _sibling(target: Path, tag: str) -> Path:
    """A new, empty hidden folder beside ``target`` (created with the default mode)."""
    while True:
        path = target.with_name(f".{target.name}.{tag}-{secrets.token_hex(4)}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path


def _install(work: Path, target: Path) -> None:
    """Rename the complete folder ``work`` to ``target``, replacing a folder there."""
    if not target.exists():
        os.replace(work, target)
        return
    if not target.is_dir() or not replaceable(target):  # appeared while building
        raise BuildError(
            f"output {target} appeared during the build and is not a model folder: not replacing it"
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
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = _sibling(target, "building")
    except OSError as exc:  # named by the folder asked for, not the hidden one
        _remove_empty(made)
        raise BuildError(
            f"cannot create the output folder {target}: {exc.strerror or exc}"
        ) from None
    try:
        yield work
        _install(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        _remove_empty(made)
        raise


def _remove_empty(made: list[Path]) -> None:
    """Remove the folders made for the output (deepest first), up to one that is not empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            break
