"""Model folders from the Hugging Face hub cache: a folder in the hub's documented layout (every
file a relative symlink into the repo's blobs/) loads and generates as onnxruntime-genai does,
and the folder-escape check still refuses names and links that leave the folder; hub names
resolve from caches written here (offline: a clear error), `genai list` / `genai rm`; and
`genai pull` downloads through huggingface_hub from a loopback stand-in of the hub's HTTP API
(`HF_ENDPOINT`), building GGUF and safetensors repos. Nothing here reaches the real hub."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import genai
from genai import hub
from genai.builder.testing import (
    ARCH_CONFIGS,
    random_weights,
    write_gguf_checkpoint,
    write_hf_checkpoint,
)
from genai.cli import main
from genai.hub import HubRef, looks_like_repo_id
from genai.testing.hub_cache import write_hub_snapshot
from tests.hub_standin import COMMIT, hub_standin
from tests.parity import assert_same_run, chat_reply, greedy

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

MESSAGES = '[{"role": "user", "content": "What is the capital of France?"}]'


@pytest.fixture(scope="module")
def hub_snapshot(smollm2_path, tmp_path_factory):
    """The real model written into a hub cache, in a subfolder as ONNX repos keep them."""
    cache = tmp_path_factory.mktemp("hub")
    return write_hub_snapshot(smollm2_path, cache, "org/m", subfolder="cpu/int4")


def test_hub_snapshot_is_all_symlinks_into_blobs(hub_snapshot):
    files = sorted(hub_snapshot.iterdir())
    assert files and all(f.is_symlink() for f in files)
    blobs = hub_snapshot.parents[3] / "blobs"
    assert all(f.resolve().parent == blobs for f in files)


@pytest.mark.slow
def test_hub_snapshot_generates_as_the_reference(hub_snapshot):
    ours, ref = genai.Model(hub_snapshot), og.Model(str(hub_snapshot))
    tokenizer = og.Tokenizer(ref)
    prompt = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))
    np.testing.assert_array_equal(
        genai.Tokenizer(ours).encode(
            genai.Tokenizer(ours).apply_chat_template(MESSAGES, add_generation_prompt=True)
        ),
        prompt,
    )
    max_length = len(prompt) + 24
    assert_same_run(greedy(genai, ours, prompt, max_length), greedy(og, ref, prompt, max_length))


def _config(folder, filename="model.onnx"):
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "model": {
            "type": "llama",
            "context_length": 64,
            "decoder": {"filename": filename, "num_hidden_layers": 1},
        }
    }
    (folder / "genai_config.json").write_text(json.dumps(doc))
    return folder


def test_hub_snapshot_link_outside_blobs_is_refused(tmp_path):
    source = _config(tmp_path / "src")
    (source / "model.onnx").write_bytes(b"")
    snapshot = write_hub_snapshot(source, tmp_path / "cache", "org/m")
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(b"")
    (snapshot / "model.onnx").unlink()
    (snapshot / "model.onnx").symlink_to(outside)
    with pytest.raises(genai.ConfigError, match="escapes the model folder"):
        genai.Config(snapshot)


@pytest.mark.parametrize("name", ["../model.onnx", "/etc/passwd", "sub/../../x.onnx"])
def test_hub_snapshot_names_leaving_the_folder_are_refused(tmp_path, name):
    source = _config(tmp_path / "src", name)
    snapshot = write_hub_snapshot(source, tmp_path / "cache", "org/m")
    with pytest.raises(genai.ConfigError, match="inside the model folder"):
        genai.Config(snapshot)


def test_hub_snapshot_error_messages_name_the_snapshot_not_the_blob(tmp_path):
    source = _config(tmp_path / "src", "missing.onnx")
    snapshot = write_hub_snapshot(source, tmp_path / "cache", "org/m")
    config = genai.Config(snapshot)
    assert config.file == snapshot.resolve() / "genai_config.json"
    with pytest.raises(FileNotFoundError, match="snapshots"):
        config.resolve_file("missing.onnx")


# --- names and resolution from a cache written here ------------------------------------------
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("org/m", HubRef("org/m")),
        ("org/m:cpu/int4", HubRef("org/m", None, "cpu/int4")),
        ("org/m@v1.0:cpu/", HubRef("org/m", "v1.0", "cpu")),
        ("Org-1/m.x_y@" + "a" * 40, HubRef("Org-1/m.x_y", "a" * 40)),
    ],
)
def test_hub_names_parse(spec, expected):
    assert HubRef.parse(spec) == expected
    assert looks_like_repo_id(spec)


@pytest.mark.parametrize(
    "spec", ["m", "./org/m", "/abs/m", "a/b/c", "org/m:../x", "org/m:a/../../b"]
)
def test_hub_names_refused(spec):
    with pytest.raises(genai.InvalidArgumentError):
        HubRef.parse(spec)


def _two_folder_repo(smollm2_path, cache):
    write_hub_snapshot(smollm2_path, cache, "org/two", subfolder="cpu/int4", commit="1" * 40)
    return write_hub_snapshot(smollm2_path, cache, "org/two", subfolder="cpu/fp32", commit="1" * 40)


def test_resolve_prefers_an_existing_local_folder(tmp_path, monkeypatch):
    local = _config(tmp_path / "org" / "m")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert Path(hub.resolve_model("org/m")).resolve() == local.resolve()


def test_resolve_from_the_cache(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    one = write_hub_snapshot(smollm2_path, tmp_path, "org/one", subfolder="cpu/int4")
    assert hub.resolve_model("org/one") == str(one)  # the repo's only model folder
    assert hub.resolve_model("org/one:cpu/int4") == str(one)
    assert hub.resolve_model("org/one@main:cpu/int4") == str(one)
    assert hub.resolve_model("org/one@" + "0" * 40) == str(one)
    _two_folder_repo(smollm2_path, tmp_path)
    with pytest.raises(genai.InvalidArgumentError, match=r"org/two:cpu/fp32\n  org/two:cpu/int4"):
        hub.resolve_model("org/two")
    assert hub.resolve_model("org/two:cpu/fp32").endswith("cpu/fp32")


def test_resolve_offline_names_the_cache_and_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        genai.DownloadError, match=r"not in the Hugging Face cache .*HF_HUB_OFFLINE"
    ):
        hub.resolve_model("org/absent")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(genai.DownloadError, match="downloads are off.*genai pull org/absent:x"):
        hub.resolve_model("org/absent:x", download=False)
    with pytest.raises(genai.DownloadError, match="HF_HUB_OFFLINE"):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        hub.pull("org/absent")


def test_list_and_remove(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("GENAI_CACHE_DIR", str(tmp_path / "genai"))
    _two_folder_repo(smollm2_path, tmp_path / "hub")
    size = sum(f.stat().st_size for f in smollm2_path.iterdir() if f.is_file())
    listed = {m.name: m for m in hub.cached_models()}
    assert set(listed) == {"org/two:cpu/fp32", "org/two:cpu/int4"}
    assert all(
        m.size == size and m.kind == "llama (onnx)" and m.where == "hub" for m in listed.values()
    )
    blobs = tmp_path / "hub" / "models--org--two" / "blobs"
    count = len(list(blobs.iterdir()))
    # The two folders link the same blobs: removing one keeps them for the other.
    assert hub.remove("org/two:cpu/fp32") == [listed["org/two:cpu/fp32"].path]
    assert len(list(blobs.iterdir())) == count
    assert [m.name for m in hub.cached_models()] == ["org/two:cpu/int4"]
    hub.remove("org/two:cpu/int4")
    assert list(blobs.iterdir()) == []
    hub.remove("org/two")
    assert not (tmp_path / "hub" / "models--org--two").exists()
    with pytest.raises(genai.InvalidArgumentError, match="genai list"):
        hub.remove("org/two")


def test_names_of_genais_cache_are_what_m_takes(smollm2_path, tmp_path, monkeypatch, capsys):
    """`genai list` says its NAME column is what -m takes: a folder of genai's cache (the
    default model's) by its name, not only by its path."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("GENAI_CACHE_DIR", str(tmp_path / "genai"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "genai" / "models" / "my-model"
    shutil.copytree(smollm2_path, folder)
    (name,) = [m.name for m in hub.cached_models()]
    assert name == "my-model"
    assert hub.resolve_model(name) == str(folder)
    (tmp_path / "my-model").mkdir()  # a folder of that name here wins, as any path does
    assert hub.resolve_model(name) == name
    shutil.rmtree(tmp_path / "my-model")
    with pytest.raises(genai.ModelFileNotFoundError, match="cached: my-model"):
        hub.resolve_model("other-model")  # neither a folder nor a cached name
    assert main(["generate", "-m", name, "--max-new-tokens", "3", "Hello"]) == 0
    assert capsys.readouterr().out.strip()


# --- downloads, through the hub library, from a loopback stand-in of the hub -----------------
def _genai(args, env, check=True):
    result = subprocess.run(
        [sys.executable, "-m", "genai", *args], env=env, capture_output=True, text=True, timeout=300
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def hub_env(tmp_path):
    """Environment of a `genai` process whose caches are under tmp_path."""
    env = dict(os.environ)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HOME"):
        env.pop(name, None)
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), GENAI_CACHE_DIR=str(tmp_path / "genai"))
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_XET="1")
    return env


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.slow
def test_pull_downloads_a_model_folder_into_the_hub_cache(smollm2_path, tmp_path, hub_env):
    repo = tmp_path / "repo"
    for sub in ("cpu/int4", "cpu/fp32"):
        shutil.copytree(smollm2_path, repo / sub)
    (repo / "README.md").write_text("# a model\n")
    with hub_standin({"org/m": repo}) as server:
        env = dict(hub_env, HF_ENDPOINT=server.url)
        refused = _genai(["pull", "org/m"], env, check=False)
        assert refused.returncode == 1
        assert "org/m:cpu/fp32" in refused.stderr and "org/m:cpu/int4" in refused.stderr
        assert not [r for r in server.requests if "/resolve/" in r]  # nothing downloaded
        out = _genai(["pull", "org/m", "--include", "cpu/int4/*", "-q"], env).stdout
    folder = Path(out.strip())
    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / COMMIT
    assert folder == snapshot / "cpu" / "int4"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        p.name for p in smollm2_path.iterdir()
    )
    for link in folder.iterdir():  # the hub library's layout: links to blobs by content
        assert link.is_symlink() and _sha(link) == _sha(smollm2_path / link.name)
    assert not (snapshot / "README.md").exists() and not (snapshot / "cpu" / "fp32").exists()
    assert [r for r in server.requests if "GET /org/m/resolve/" in r and "fp32" in r] == []
    # Offline, -m REPO_ID now comes from the cache and generates as the reference does there.
    offline = dict(hub_env, HF_HUB_OFFLINE="1")
    listed = json.loads(_genai(["list", "--json"], offline).stdout)
    assert [(m["name"], m["path"], m["cache"]) for m in listed] == [
        ("org/m:cpu/int4", str(folder), "hub")
    ]
    text = _genai(
        ["generate", "-m", "org/m", "--chat", QUESTION, "--max-new-tokens", "12"], offline
    )
    assert text.stdout.strip() == chat_reply(og, folder, QUESTION, 12).strip()


QUESTION = "What is the capital of France?"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_pull_builds_a_gguf_or_safetensors_repo(kind, tmp_path, hub_env):
    pytest.importorskip("gguf" if kind == "gguf" else "safetensors")
    cfg = ARCH_CONFIGS["llama"]
    repo = tmp_path / "repo"
    if kind == "gguf":
        repo.mkdir()
        write_gguf_checkpoint(repo / "tiny-F32.gguf", cfg, random_weights(cfg, seed=3))
    else:
        write_hf_checkpoint(repo, cfg, random_weights(cfg, seed=3))
    (repo / "README.md").write_text("# weights\n")
    with hub_standin({"org/tiny": repo}) as server:
        env = dict(hub_env, HF_ENDPOINT=server.url)
        out = _genai(["pull", "org/tiny", "--precision", "fp32", "-q"], env).stdout
    folder = Path(out.strip())
    assert folder.parent == tmp_path / "genai" / "models"
    assert json.loads((folder / hub.SOURCE_FILENAME).read_text())["kind"] == kind
    assert not [r for r in server.requests if "README" in r]
    # The built folder runs on the reference, token for token as on genai.
    prompt = np.array([5, 17, 99, 42], dtype=np.int32)
    ours = greedy(genai, genai.Model(folder), prompt, 16)
    assert_same_run(ours, greedy(og, og.Model(str(folder)), prompt, 16))
    offline = dict(hub_env, HF_HUB_OFFLINE="1")
    names = [(m["name"], m["kind"]) for m in json.loads(_genai(["list", "--json"], offline).stdout)]
    assert names == [("org/tiny", f"{kind} source"), ("org/tiny", f"llama (built from {kind})")]
    removed = _genai(["rm", "org/tiny"], offline).stdout
    assert str(folder) in removed and not folder.exists()
    assert json.loads(_genai(["list", "--json"], offline).stdout) == []
