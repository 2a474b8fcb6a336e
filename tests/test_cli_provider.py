"""``--provider`` / ``--provider-option`` of ``genai generate``, ``chat`` and ``serve``, and the
model name ``genai serve`` answers to when ``-m`` names a cached model."""

from __future__ import annotations

import shutil

import pytest

from genai.cli import main

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from tests.serve_helpers import serve_command  # noqa: E402


def test_generate_runs_on_the_provider_asked_for(fixture_folders, capsys) -> None:
    folder = str(fixture_folders["gqa"])
    args = ["generate", "-m", folder, "--max-new-tokens", "4", "hello"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args[:3], "--provider", "CPUExecutionProvider", *args[3:]]) == 0
    assert capsys.readouterr().out == plain  # the reference's EP name works too


@pytest.mark.parametrize(
    ("flags", "status", "message"),
    [
        (["--provider", "nope"], 1, "unknown execution provider 'nope'"),
        (["--provider", "cpu", "--provider-option", "bogus=1"], 1, "unknown option(s) bogus"),
        (["--provider-option", "a=1"], 2, "--provider-option needs --provider"),
        (["--provider", "cpu", "--provider-option", "novalue"], 2, "expects KEY=VALUE"),
        (["--provider", " "], 2, "--provider needs a provider name"),
    ],
    ids=["unknown", "bad-option", "option-alone", "not-key-value", "blank"],
)
def test_provider_flag_errors_are_one_line(fixture_folders, capsys, flags, status, message):
    for command in ("generate", "chat"):
        args = [command, "-m", str(fixture_folders["gqa"]), *flags]
        assert main([*args, "hello"] if command == "generate" else args) == status
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_ray_provider_options_from_the_command_line() -> None:
    from genai.serve.ray_serve import _pairs  # lazy: imports ray

    assert _pairs("device_id=1, enable_cuda_graph=0") == {
        "device_id": "1",
        "enable_cuda_graph": "0",
    }
    assert _pairs({"a": 1}) == {"a": "1"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        _pairs("device_id")


def test_serve_answers_to_the_cached_name_m_gave(fixture_folders, tmp_path, monkeypatch):
    """``-m ORG/NAME`` of a hub-cache model: /v1/models lists that name and requests naming
    it are served (the folder's name, a commit hash here, was listed and the name refused)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(fixture_folders["gqa"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("GENAI_CACHE_DIR", str(tmp_path / "genai"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with serve_command("org/tiny", "--provider", "cpu") as (url, _):
        models = httpx.get(url + "/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models] == ["org/tiny"]
        body = {"model": "org/tiny", "prompt": "hello", "max_tokens": 2}
        reply = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
