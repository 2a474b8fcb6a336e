"""Where a build writes: a hidden sibling folder renamed into place when complete. A failed or
interrupted build leaves nothing behind and a previous folder as it was; the output folder is
checked (not the input, not a foreign non-empty folder) before anything is written."""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import signal
from pathlib import Path

import pytest

from genai.builder import BuildError, build, cli
from genai.builder.testing import (
    ARCH_CONFIGS,
    random_weights,
    write_gguf_checkpoint,
    write_hf_checkpoint,
)

pytest.importorskip("safetensors", reason="the safetensors package is a test dependency")


def _snapshot(folder: Path) -> dict[str, str]:
    """File name -> sha256 of every file in ``folder``."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _llama(root: Path, **changes) -> Path:
    cfg = copy.deepcopy(ARCH_CONFIGS["llama"])
    cfg.update(changes)
    return write_hf_checkpoint(root, cfg, random_weights(cfg))


class _Stages:
    """A ``stage`` factory that records the stages and raises ``error`` at a weights step."""

    def __init__(self, error: BaseException | None = None, at: int = 2) -> None:
        self.names: list[str] = []
        self.error, self.at = error, at

    def __call__(self, name: str, total: int):
        self.names.append(name)

        def update(done: int, total_now: int = total) -> None:
            if name == "weights" and done >= self.at and self.error is not None:
                raise self.error

        return update


@pytest.fixture()
def built(tmp_path) -> tuple[Path, Path, dict[str, str]]:
    """(the llama checkpoint, its int4 folder, the folder's snapshot)."""
    source = _llama(tmp_path / "hf")
    out = build(source, tmp_path / "out", precision="int4")
    return source, out, _snapshot(out)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(143), BuildError("disk")])
def test_interrupted_rebuild_leaves_the_previous_folder_as_it_was(tmp_path, built, error):
    """Ctrl-C (or any failure) halfway through the weights of a rebuild: the old folder is
    byte for byte what it was, and no half-written sibling is left beside it."""
    source, out, before = built
    stages = _Stages(error)
    with pytest.raises(type(error)):
        build(source, out, precision="fp32", stage=stages)
    assert "weights" in stages.names  # it was interrupted while writing weights
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out"]


def test_failed_build_into_a_new_folder_leaves_nothing(tmp_path):
    source = _llama(tmp_path / "hf")
    with pytest.raises(KeyboardInterrupt):
        build(source, tmp_path / "a" / "b" / "out", stage=_Stages(KeyboardInterrupt()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # not even a/ or a/b/


def test_a_failing_rebuild_is_refused_before_anything_is_written(tmp_path, built):
    """A checkpoint without eos (or tokenizer.json, or with unsupported rope scaling): the
    error comes before any stage starts, the previous folder stays."""
    _, out, before = built
    cfg = copy.deepcopy(ARCH_CONFIGS["gemma2"])
    cfg.pop("eos_token_id")
    no_eos = write_hf_checkpoint(tmp_path / "gemma2", cfg, random_weights(cfg))
    no_tokenizer = _llama(tmp_path / "notok")
    (no_tokenizer / "tokenizer.json").unlink()
    yarn = _llama(tmp_path / "yarn", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    for source, message in (
        (no_eos, "no eos_token_id"),
        (no_tokenizer, "no tokenizer.json"),
        (yarn, "rope scaling 'yarn' is not supported"),
    ):
        stages = _Stages()
        with pytest.raises(BuildError, match=message):
            build(source, out, precision="fp32", stage=stages)
        assert stages.names == []
        assert _snapshot(out) == before
        with pytest.raises(BuildError, match=message):
            build(source, tmp_path / "fresh", precision="fp32")
        assert not (tmp_path / "fresh").exists()


def test_a_rebuild_replaces_a_model_folder(tmp_path, built):
    _, out, before = built
    cfg = ARCH_CONFIGS["qwen3"]
    qwen3 = write_hf_checkpoint(tmp_path / "qwen3", cfg, random_weights(cfg))
    (out / "notes.txt").write_text("mine")  # a model folder's extra file goes with it
    build(qwen3, out, precision="fp32")
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["type"] == "qwen3"
    assert "notes.txt" not in {p.name for p in out.iterdir()}
    assert _snapshot(out) != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out", "qwen3"]


def test_an_empty_folder_and_a_symlink_are_built_into(tmp_path):
    source = _llama(tmp_path / "hf")
    (tmp_path / "empty").mkdir()
    build(source, tmp_path / "empty", precision="fp32")
    assert (tmp_path / "empty" / "genai_config.json").is_file()
    (tmp_path / "link").symlink_to(tmp_path / "empty", target_is_directory=True)
    build(source, tmp_path / "link", precision="int4")
    assert (tmp_path / "link").is_symlink()  # the link stays; its folder is rebuilt
    assert (tmp_path / "empty" / "model.onnx").is_file()


def test_a_foreign_non_empty_folder_is_refused_by_name(tmp_path):
    source = _llama(tmp_path / "hf")
    mine = tmp_path / "documents"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    with pytest.raises(BuildError, match=r"output .*documents is a non-empty folder that is not"):
        build(source, mine, precision="fp32")
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]
    (mine / "thesis.tex").unlink()
    (mine / "genai_config.json").write_text("{}")
    (mine / "sub").mkdir()  # a model folder has no subfolders
    with pytest.raises(BuildError, match="not a model folder"):
        build(source, mine, precision="fp32")


def test_debris_of_an_older_interrupted_build_is_replaced(tmp_path):
    """A folder holding only files a build writes (here a lone model.onnx.data, what an
    interrupted build of an older genai left) is not foreign: it is rebuilt."""
    source = _llama(tmp_path / "hf")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.onnx.data").write_bytes(b"\0" * 100)
    build(source, tmp_path / "out", precision="fp32")
    assert (tmp_path / "out" / "genai_config.json").is_file()


def test_the_input_folder_is_refused_as_output(tmp_path):
    source = _llama(tmp_path / "hf")
    before = _snapshot(source)
    with pytest.raises(BuildError, match="is the input folder"):
        build(source, source, precision="fp32")
    with pytest.raises(BuildError, match="is the input folder"):
        build(source / "config.json", source / ".." / "hf", precision="fp32")
    assert _snapshot(source) == before


def test_a_folder_holding_the_input_is_refused(tmp_path):
    pytest.importorskip("gguf")
    source = _llama(tmp_path / "hf")
    out = build(source, tmp_path / "out", precision="fp32")
    cfg = ARCH_CONFIGS["llama"]
    gguf = write_gguf_checkpoint(out / "model.gguf", cfg, random_weights(cfg))
    with pytest.raises(BuildError, match="holds the input"):
        build(gguf, out, precision="fp32")
    assert gguf.is_file()


def test_the_command_refuses_the_input_folder_in_one_line(tmp_path, capsys):
    from genai.cli import main

    source = _llama(tmp_path / "hf")
    assert main(["build", str(source), "-o", str(source), "-q"]) == 1
    err = capsys.readouterr().err
    assert "is the input folder" in err and "Traceback" not in err
    assert sorted(p.name for p in source.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_sigterm_during_the_command_removes_the_half_built_folder(tmp_path, monkeypatch, built):
    """`timeout` / `kill` send SIGTERM: `genai build` exits 143 through the build's cleanup,
    the previous folder intact, nothing left beside it."""
    source, out, before = built

    class Progress:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def stage(self, name: str, total: int):
            def update(done: int, total_now: int = total) -> None:
                if name == "weights" and done == 2:
                    os.kill(os.getpid(), signal.SIGTERM)

            return update

        def message(self, text: str) -> None:
            pass

    monkeypatch.setattr(cli, "StderrProgress", Progress)
    parser = argparse.ArgumentParser(prog="genai")
    cli.add_build_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["build", str(source), "-o", str(out), "--precision", "fp32"])

    def not_handled(signum, frame):  # what runs if `genai build` did not take SIGTERM over
        raise AssertionError("SIGTERM reached the test's handler, not genai build's")

    previous = signal.signal(signal.SIGTERM, not_handled)
    try:
        with pytest.raises(SystemExit) as exc:
            args.handler(args)
        assert signal.getsignal(signal.SIGTERM) is not_handled  # restored after the build
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert exc.value.code == 143
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out"]


_KILLED_BUILD = """
import os, signal, sys
from genai.builder import build

def stage(name, total):
    def update(done, total_now=total):
        if name == "weights" and done >= 2:
            os.kill(os.getpid(), signal.SIGKILL)
    return update

build(sys.argv[1], sys.argv[2], precision="fp32", stage=stage)
"""


@pytest.mark.skipif(os.name != "posix", reason="staging folders are locked with flock (POSIX)")
def test_the_next_build_removes_what_a_killed_build_left(tmp_path, built):
    """A build killed with SIGKILL cannot clean up: its hidden staging folder stayed forever
    (a model's size each time). The next build into the same output removes it, and leaves a
    staging folder that a running build holds alone."""
    import fcntl
    import subprocess
    import sys

    source, out, before = built
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_BUILD, str(source), str(out)], capture_output=True
    )
    assert killed.returncode == -signal.SIGKILL
    debris = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.building-"))
    assert len(debris) == 2 and debris[1] == debris[0] + ".lock"  # the folder and its lock
    assert _snapshot(out) == before
    busy = tmp_path / ".out.building-0000beef"  # a build in progress elsewhere
    busy.mkdir()
    (busy / "model.onnx").write_bytes(b"half")
    with open(tmp_path / ".out.building-0000beef.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        build(source, out, precision="int4")
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            ".out.building-0000beef",
            ".out.building-0000beef.lock",
            "hf",
            "out",
        ]
    assert _snapshot(out) == before  # the same int4 build again


@pytest.mark.skipif(os.name != "posix", reason="work folders are locked with flock (POSIX)")
def test_work_folders_of_killed_pulls_are_removed_by_the_next(tmp_path):
    """`genai pull` downloads and builds in ``.pull-XXXX`` (the default model's wheel alone is
    ~100 MB): one a killed pull left is removed by the next pull; one in use, or one without
    a lock file (an older genai's), is left."""
    import fcntl

    from genai.builder.output import work_folder

    killed = tmp_path / ".pull-dead0001"
    killed.mkdir()
    (killed / "wheel.zip").write_bytes(b"x" * 100)
    (tmp_path / ".pull-dead0001.lock").write_text("")
    old = tmp_path / ".pull-0ld00001"
    old.mkdir()
    (tmp_path / ".pull-g0ne0001.lock").write_text("")  # killed after its folder moved away
    (tmp_path / ".pull-t3mp0001.lock.tmp").write_text("")  # killed while making its lock
    busy = tmp_path / ".pull-b05y0001"
    busy.mkdir()
    with open(tmp_path / ".pull-b05y0001.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(KeyboardInterrupt), work_folder(tmp_path, ".pull-") as work:
            assert work.is_dir() and work.name.startswith(".pull-")
            assert (tmp_path / (work.name + ".lock")).is_file()
            raise KeyboardInterrupt  # the folder goes anyway
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".pull-0ld00001",
        ".pull-b05y0001",
        ".pull-b05y0001.lock",
    ]
