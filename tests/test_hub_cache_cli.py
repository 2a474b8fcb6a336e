"""The model caches on the command line, on caches written here (no real model needed, nothing
downloaded from the internet): `genai rm` of one snapshot, several names, a read-only cache;
`genai list` and `-m` on interrupted downloads, bad cache entries, several revisions and
unknown names; `genai pull` against a loopback stand-in of the hub (404, an unreachable hub,
offline fallback, Ctrl-C) and the hub cache folder as huggingface_hub resolves it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import genai
from genai import hub
from genai.cli import main
from genai.testing.hub_cache import write_hub_snapshot
from tests.hub_standin import COMMIT, LFS_FROM, _Handler, _Server, hub_standin

C1, C2 = "1" * 40, "2" * 40


def _folder(path: Path, data: bytes = b"weights") -> Path:
    """A model folder as the caches see it (not loadable: nothing here runs it)."""
    path.mkdir(parents=True, exist_ok=True)
    doc = {"model": {"type": "llama", "decoder": {"filename": "model.onnx"}}}
    (path / "genai_config.json").write_text(json.dumps(doc))
    (path / "model.onnx").write_bytes(b"onnx")
    (path / "model.onnx.data").write_bytes(data)
    return path


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """Scratch hub and genai caches (never the real ones); returns the hub cache."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("GENAI_CACHE_DIR", str(tmp_path / "genai"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "hub"


def _names():
    return [m.name for m in hub.cached_models()]


def _two_revisions(tmp_path, cache):
    """org/old: refs/main -> C2 and refs/v1 -> C1 (different weights)."""
    old = write_hub_snapshot(_folder(tmp_path / "a", b"old"), cache, "org/old", commit=C1)
    (cache / "models--org--old" / "refs" / "main").rename(cache / "models--org--old/refs/v1")
    new = write_hub_snapshot(_folder(tmp_path / "b", b"new"), cache, "org/old", commit=C2)
    return old, new


# --- rm ----------------------------------------------------------------------------------------
def test_rm_of_one_snapshot_keeps_the_others(tmp_path, caches, capsys):
    old, new = _two_revisions(tmp_path, caches)
    built = hub.built_dir("org/old")
    _folder(built)
    (built / hub.SOURCE_FILENAME).write_text(json.dumps({"commit": C2, "precision": "int4"}))
    assert main(["rm", f"org/old@{C1}"]) == 0
    assert capsys.readouterr().out == f"removed {old}\n"
    assert not old.exists() and new.is_dir() and built.is_dir()  # not built from C1
    repo = caches / "models--org--old"
    assert sorted(p.name for p in (repo / "refs").iterdir()) == ["main"]  # refs/v1 named C1
    assert all(blob.resolve() in {f.resolve() for f in new.iterdir()} for blob in
               (repo / "blobs").iterdir())  # fmt: skip
    assert hub.resolve_model("org/old") == str(new)
    assert main(["rm", "org/old@main"]) == 0  # the last snapshot: the repo goes, and its build
    assert not repo.exists() and not built.exists()


# --- list, and what -m takes ---------------------------------------------------------------
def test_list_names_each_revision_by_what_m_takes(tmp_path, caches):
    old, new = _two_revisions(tmp_path, caches)
    write_hub_snapshot(_folder(tmp_path / "c", b"c"), caches, "org/old", commit="3" * 40)
    (caches / "models--org--old" / "refs" / "main").write_text(C2)  # no ref names "3" * 40
    listed = {m.name: str(m.path) for m in hub.cached_models()}
    assert listed == {
        "org/old@v1": str(old),
        "org/old": str(new),
        f"org/old@{'3' * 40}": str(caches / "models--org--old" / "snapshots" / ("3" * 40)),
    }
    for name, path in listed.items():
        assert hub.resolve_model(name) == path


def test_an_interrupted_download_is_not_a_model(tmp_path, caches, capsys):
    """A snapshot missing a file (named by genai_config.json, by genai pull's record, or a link
    into a missing blob; or a repo with blobs/*.incomplete) is listed as incomplete and -m
    refuses it, pointing at `genai pull`."""
    source = _folder(tmp_path / "src")
    named = write_hub_snapshot(source, caches, "org/named")
    (named / "model.onnx").unlink()
    recorded = write_hub_snapshot(source, caches, "org/recorded")
    (recorded / "model.onnx.data").unlink()
    marker = caches / "models--org--recorded" / hub.PULLING_DIRNAME / recorded.name
    marker.parent.mkdir()
    marker.write_text(json.dumps(["genai_config.json", "model.onnx", "model.onnx.data"]))
    dangling = write_hub_snapshot(source, caches, "org/dangling")
    (caches / "models--org--dangling" / "blobs" / (dangling / "model.onnx").resolve().name).unlink()
    other = write_hub_snapshot(source, caches, "org/other")
    (other / "model.onnx.data").unlink()
    (caches / "models--org--other" / "blobs" / "abc.1234.incomplete").write_bytes(b"x")
    write_hub_snapshot(source, caches, "org/fine")
    early = tmp_path / "early"  # cut short before genai_config.json came
    early.mkdir()
    (early / "tokenizer.json").write_text("{}")
    early_snapshot = write_hub_snapshot(early, caches, "org/early")
    (caches / "models--org--early" / hub.PULLING_DIRNAME).mkdir()
    (caches / "models--org--early" / hub.PULLING_DIRNAME / early_snapshot.name).write_text(
        json.dumps(["genai_config.json", "tokenizer.json"])
    )
    assert main(["list", "--json"]) == 0
    rows = {r["name"]: r["problem"] for r in json.loads(capsys.readouterr().out)}
    assert rows["org/fine"] == ""
    for name in ("org/named", "org/recorded", "org/dangling", "org/other", "org/early"):
        assert rows[name].startswith("incomplete: "), name
        with pytest.raises(genai.DownloadError, match=rf"incomplete.*`genai pull {name}` again"):
            hub.resolve_model(name)
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert "[incomplete]" in out and "`genai pull org/named` finishes it" in err
    marker.write_text(json.dumps(["genai_config.json", "model.onnx"]))  # all there: complete
    assert hub.resolve_model("org/recorded") == str(recorded)


def test_list_skips_or_flags_bad_cache_entries(tmp_path, caches, capsys):
    source = _folder(tmp_path / "src")
    for name, record in (("a", {"foo": 1}), ("b", [1]), ("c", "x")):
        folder = _folder(tmp_path / "genai" / "models" / f"hub--org--{name}")
        (folder / hub.SOURCE_FILENAME).write_text(json.dumps(record))
    bad_ref = write_hub_snapshot(source, caches, "org/badref")
    (caches / "models--org--badref" / "refs" / "main").write_bytes(b"\xff\xfe")
    bad_json = write_hub_snapshot(source, caches, "org/badjson")
    (bad_json / "genai_config.json").unlink()
    (bad_json / "genai_config.json").write_text("{oops")
    (caches / "models--org--file").write_text("not a repo")
    assert main(["list"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "org/badjson: broken: genai_config.json" in err
    listed = {m.name: m for m in hub.cached_models()}
    assert {"hub--org--a", "hub--org--b", "hub--org--c"} <= set(listed)
    assert listed[f"org/badref@{bad_ref.name}"].problem == ""
    assert listed["org/badjson"].problem.startswith("broken: ")
    with pytest.raises(genai.DownloadError, match="not in the Hugging Face cache"):
        hub.resolve_model("org/badref", download=False)  # the bad ref names nothing


def test_unknown_names_say_what_is_cached(tmp_path, caches, capsys):
    _folder(tmp_path / "genai" / "models" / "smollm2-135m-instruct-int4")
    write_hub_snapshot(_folder(tmp_path / "src"), caches, "org/m")
    with pytest.raises(genai.ModelFileNotFoundError, match="did you mean smollm2-135m-instruct"):
        hub.resolve_model("smollm2")
    with pytest.raises(genai.ModelFileNotFoundError, match="cached: org/m, smollm2.*genai list"):
        hub.resolve_model("nosuch")
    assert main(["generate", "-m", "nosuch", "Hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a model folder nor the name of a cached" in err
    assert main(["rm", "nosuch"]) == 1
    assert "no cached model named 'nosuch' (`genai list`" in capsys.readouterr().err
    noconfig = tmp_path / "noconfig"
    noconfig.mkdir()
    (noconfig / "tokenizer.json").write_text("{}")
    write_hub_snapshot(noconfig, caches, "org/noconfig")
    with pytest.raises(genai.ModelFileNotFoundError, match="is in the Hugging Face cache.*no "
                       "genai_config.json.*genai build"):  # fmt: skip
        hub.resolve_model("org/noconfig")


def test_rm_checks_every_name_first(tmp_path, caches, capsys):
    write_hub_snapshot(_folder(tmp_path / "a"), caches, "org/a")
    write_hub_snapshot(_folder(tmp_path / "c"), caches, "org/c")
    assert main(["rm", "org/a", "org/b", "org/c", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "'org/b', 'nosuch'" in err and "nothing removed" in err
    assert _names() == ["org/a", "org/c"]
    assert main(["rm", "org/a", "org/c"]) == 0 and _names() == []


def test_rm_on_a_read_only_cache_names_the_model_and_file(tmp_path, caches, monkeypatch, capsys):
    write_hub_snapshot(_folder(tmp_path / "a"), caches, "org/a")

    def read_only(path, *args, **kwargs):
        raise OSError(30, "Read-only file system", "tokenizer.json")

    monkeypatch.setattr(shutil, "rmtree", read_only)
    with pytest.raises(hub.CacheError, match=r"cannot remove org/a: Read-only file system"):
        hub.remove("org/a")
    assert main(["rm", "org/a"]) == 1
    err = capsys.readouterr().err
    assert err == "genai: error: cannot remove org/a: Read-only file system (tokenizer.json)\n"


# --- the hub cache folder ------------------------------------------------------------------
@pytest.mark.parametrize(
    "env",
    [
        {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy"},
        {"HF_HUB_CACHE": "$QA_ROOT/new", "HUGGINGFACE_HUB_CACHE": "{tmp}/legacy"},
        {"HF_HUB_CACHE": "~/hubcache"},
        {"HF_HOME": "$QA_ROOT/home"},
        {"XDG_CACHE_HOME": "{tmp}/xdg"},
    ],
)
def test_hub_cache_dir_is_huggingface_hubs(tmp_path, monkeypatch, env):
    """As huggingface_hub resolves it (asked in a fresh process), from the environment now."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("QA_ROOT", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home-dir"))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(tmp=tmp_path))
    ask = "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"
    library = subprocess.run(
        [sys.executable, "-c", ask],
        capture_output=True, text=True, check=True, env=dict(os.environ),
    ).stdout.strip()  # fmt: skip
    assert hub.hub_cache_dir() == Path(library)
    assert str(tmp_path) in library


# --- pull, from a loopback stand-in of the hub ---------------------------------------------
@pytest.fixture
def repo(tmp_path):
    """A one-folder ONNX repo whose weights are an LFS file, as on the hub."""
    return _folder(tmp_path / "repo", os.urandom(LFS_FROM * 20))


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_pull_of_a_missing_repo_is_one_line(caches, repo, monkeypatch, capsys):
    with hub_standin({"org/m": repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        assert main(["pull", "org/nosuch", "-q"]) == 1
    assert capsys.readouterr().err == "genai: error: no model org/nosuch on the hub (404)\n"


def test_an_unreachable_hub_fails_at_once_or_uses_the_cache(caches, repo, monkeypatch, caplog):
    """No retries for a connection that cannot be made; a complete cached copy is used
    instead (offline too), with a warning."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(
            genai.DownloadError, match=r"could not reach the Hugging Face hub.*HF_HUB_OFFLINE=1"
        ),
    ):
        hub.pull("org/m")
    assert "Retrying" not in caplog.text
    with hub_standin({"org/m": repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        folder = hub.pull("org/m", progress=False)
    assert folder == caches / "models--org--m" / "snapshots" / COMMIT
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="genai.hub"):
        assert hub.pull("org/m", progress=False) == folder
    assert "could not check the hub for a newer revision of org/m" in caplog.text
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="genai.hub"):
        assert hub.pull("org/m", progress=False) == folder
    assert "HF_HUB_OFFLINE is set" in caplog.text
    with pytest.raises(genai.DownloadError, match="HF_HUB_OFFLINE"):
        hub.pull("org/m", force=True)


class _Stalling(_Handler):
    """Sends the first bytes of the weights, then waits (once) until the test releases it."""

    def do_GET(self) -> None:
        if self.command == "GET" and self.path.endswith("model.onnx.data"):
            server = self.server
            if not server.started.is_set():
                real = self.wfile

                class Stall:
                    def write(self, data: bytes) -> None:
                        real.write(data[:4096])
                        real.flush()
                        server.started.set()
                        server.release.wait(300)  # a bound in case of a bug, not a timing

                    def __getattr__(self, name: str) -> object:
                        return getattr(real, name)

                self.wfile = Stall()  # type: ignore[assignment]
        with contextlib.suppress(OSError):  # the client went away
            super().do_GET()


def test_ctrl_c_stops_a_pull_at_once_and_the_next_one_finishes_it(
    tmp_path, caches, repo, monkeypatch
):
    server = _Server(("127.0.0.1", 0), _Stalling)
    server.repos, server.requests = {"org/m": repo}, []
    server.started, server.release = threading.Event(), threading.Event()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", url)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "genai", "pull", "org/m", "-q"],
            env=dict(os.environ, HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        assert server.started.wait(300), process.communicate()
        snapshot = caches / "models--org--m" / "snapshots" / COMMIT
        for _ in range(3000):  # until the small files are in (they are fetched alongside)
            if (snapshot / "genai_config.json").is_file() and (snapshot / "model.onnx").is_file():
                break
            threading.Event().wait(0.01)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)  # the server still holds the weights back
        assert process.returncode == 130, err
        assert "`genai pull org/m` resumes it" in err and "Traceback" not in err
        assert not server.release.is_set()
    finally:
        server.release.set()
    assert not (snapshot / "model.onnx.data").exists()
    (row,) = hub.cached_models()
    assert row.problem.startswith("incomplete: ") and "model.onnx.data" in row.problem
    with pytest.raises(genai.DownloadError, match="incomplete.*`genai pull org/m` again"):
        hub.resolve_model("org/m")
    try:
        assert hub.pull("org/m", progress=False) == snapshot
    finally:
        server.shutdown()
        server.server_close()
    assert (snapshot / "model.onnx.data").read_bytes() == (repo / "model.onnx.data").read_bytes()
    assert [m.problem for m in hub.cached_models()] == [""]
    assert hub.resolve_model("org/m") == str(snapshot)
    assert not list((caches / "models--org--m" / "blobs").glob("*.incomplete"))
