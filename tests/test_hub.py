"""Model folders from the Hugging Face hub cache: a folder in the hub's documented layout (every
file a relative symlink into the repo's blobs/) loads and generates as onnxruntime-genai does,
and the folder-escape check still refuses names and links that leave the folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

import genai
from genai.testing.hub_cache import write_hub_snapshot
from tests.parity import assert_same_run, greedy

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
