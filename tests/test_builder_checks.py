"""What the builder checks before it writes anything (config against the tensors' shapes,
layers past the config's, attention dims onnxruntime's GroupQueryAttention runs), and the
Hugging Face semantics it follows (Qwen2's max_window_layers, exact vs tanh GELU)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from genai.builder import BuildError, build
from genai.builder.sources import open_source
from genai.builder.testing import (
    ARCH_CONFIGS,
    numpy_forward,
    random_weights,
    write_gguf_checkpoint,
    write_hf_checkpoint,
)

pytest.importorskip("safetensors", reason="the safetensors package is a test dependency")

PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 320, 20)]


def _config(arch: str = "llama", **changes) -> dict:
    cfg = copy.deepcopy(ARCH_CONFIGS[arch])
    cfg.update(changes)
    return cfg


def _logits(folder: Path, ids: list[int]) -> np.ndarray:
    """Every position's logits of an ``all_logits`` folder, one run from an empty past."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(folder / "model.onnx"), opts)
    feeds = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, len(ids)), np.int64),
    }
    for inp in sess.get_inputs():
        if inp.name.startswith("past"):
            feeds[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), np.float32)
    return sess.run(["logits"], feeds)[0][0]


def _refused(source: Path, out: Path, message: str) -> None:
    """Building ``source`` raises a one-line BuildError matching ``message`` and writes
    nothing."""
    with pytest.raises(BuildError, match=message) as exc:
        build(source, out, precision="fp32")
    assert "\n" not in str(exc.value)
    assert not out.exists()


# -- attention dims onnxruntime's GroupQueryAttention runs -------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"num_attention_heads": 8, "num_key_value_heads": 2},
            "head_dim 8 is not a multiple of 16",
        ),
        (
            {"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2},
            "head_dim 12 is not a multiple of 16",
        ),
        ({"head_dim": 24}, "head_dim 24 is not a multiple of 16"),
        ({"partial_rotary_factor": 0.5}, r"rotary dimension 8 \(head_dim 16 x partial_rotary"),
        ({"head_dim": 32, "partial_rotary_factor": 0.75}, "rotary dimension 24 .* multiple of 16"),
    ],
)
def test_dims_groupqueryattention_cannot_run_are_refused(tmp_path, changes, message):
    cfg = _config(**changes)
    _refused(
        write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg)), tmp_path / "o", message
    )


def test_dims_groupqueryattention_runs_are_built(tmp_path):
    """The check is not stricter than onnxruntime: head_dim 48 (a multiple of 16, not a power
    of 2) with a rotary dimension of 32 builds and runs a prompt."""
    cfg = _config(head_dim=48, partial_rotary_factor=2 / 3)
    weights = random_weights(cfg)
    folder = build(write_hf_checkpoint(tmp_path / "hf", cfg, weights), tmp_path / "o",
                   precision="fp32", all_logits=True)  # fmt: skip
    assert open_source(tmp_path / "hf").spec.rotary_dim == 32
    logits = _logits(folder, PROMPT)
    assert logits.shape == (len(PROMPT), cfg["vocab_size"]) and np.isfinite(logits).all()


# -- the config against the tensors ------------------------------------------------------------


def _hf_with(tmp_path: Path, cfg_changes: dict, weights_edit=None, arch: str = "llama") -> Path:
    """A checkpoint with weights for the fixture config, then config.json edited."""
    cfg = _config(arch)
    weights = random_weights(cfg)
    if weights_edit:
        weights_edit(weights)
    folder = write_hf_checkpoint(tmp_path / "hf", cfg, weights)
    (folder / "config.json").write_text(json.dumps({**cfg, **cfg_changes}))
    return folder


@pytest.mark.parametrize(
    ("cfg_changes", "edit", "message"),
    [
        (  # 8 heads on 4-head weights: head_dim 8, k_proj 2 x 8 rows, stored 2 x 16
            {"num_attention_heads": 8},
            None,
            r"model\.layers\.0\.self_attn\.k_proj\.weight has shape \(32, 64\), but .*config\.json "
            r"implies \(16, 64\) \(2 kv heads x head_dim 8, hidden 64\)",
        ),
        (
            {"head_dim": 15},
            None,
            r"layers\.0\.self_attn\.q_proj\.weight has shape \(64, 64\), .* implies \(60, 64\)",
        ),
        (
            {},
            lambda w: w.update(
                {
                    "model.layers.1.mlp.down_proj.weight": np.ascontiguousarray(
                        w["model.layers.1.mlp.down_proj.weight"].T
                    )
                }
            ),
            r"model\.layers\.1\.mlp\.down_proj\.weight has shape \(128, 64\), but .* implies "
            r"\(64, 128\) \(hidden 64, intermediate 128\)",
        ),
        (
            {"intermediate_size": 96},
            None,
            r"layers\.0\.mlp\.gate_proj\.weight has shape \(128, 64\), .* implies \(96, 64\)",
        ),
        (
            {},
            lambda w: w.update({"model.norm.weight": np.ones(32, np.float32)}),
            r"model\.norm\.weight has shape \(32,\), .* implies \(64,\)",
        ),
    ],
)
def test_a_config_that_does_not_match_the_weights_is_refused(tmp_path, cfg_changes, edit, message):
    _refused(_hf_with(tmp_path, cfg_changes, edit), tmp_path / "o", message)


def test_a_fused_tensor_is_checked_as_its_parts_stacked(tmp_path):
    folder = _hf_with(tmp_path, {"num_key_value_heads": 2}, arch="phi3")  # stored: 4 kv heads
    _refused(
        folder,
        tmp_path / "o",
        r"self_attn\.qkv_proj\.weight has shape \(192, 64\), .* implies \(128, 64\) "
        r"\(4 heads x head_dim 16, hidden 64 \+ 2 kv heads x head_dim 16, hidden 64\)",
    )


def test_a_gguf_whose_head_count_disagrees_with_its_tensors_is_refused(tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    cfg = _config()
    add_head_count = gguf.GGUFWriter.add_head_count
    monkeypatch.setattr(gguf.GGUFWriter, "add_head_count", lambda self, n: add_head_count(self, 8))
    path = write_gguf_checkpoint(tmp_path / "m.gguf", cfg, random_weights(cfg))
    _refused(
        path,
        tmp_path / "o",
        r"blk\.0\.attn_q\.weight has shape \(64, 64\), but its GGUF metadata implies \(128, 64\)",
    )


def test_layers_past_num_hidden_layers_are_refused(tmp_path):
    """HF's from_pretrained would drop model.layers.1 with an unused-weights warning; a
    silently truncated model is refused instead."""
    _refused(
        _hf_with(tmp_path, {"num_hidden_layers": 1}),
        tmp_path / "o",
        r"tensors for 2 layers \(0-1\) but num_hidden_layers is 1; refusing to drop layer 1",
    )


def test_gguf_blocks_past_block_count_are_refused(tmp_path):
    pytest.importorskip("gguf")
    cfg = _config()
    weights = random_weights(cfg)  # 2 layers
    path = write_gguf_checkpoint(tmp_path / "m.gguf", {**cfg, "num_hidden_layers": 1}, weights)
    _refused(path, tmp_path / "o", r"but llama\.block_count is 1; refusing to drop layer 1")


# -- Hugging Face semantics --------------------------------------------------------------------


def test_qwen2_sliding_window_starts_at_max_window_layers(tmp_path):
    """transformers' Qwen2Config without layer_types: layers >= max_window_layers slide, the
    ones below attend fully (here layer 0 full, layer 1 windowed)."""
    cfg = _config("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    weights = random_weights(cfg)
    source = write_hf_checkpoint(tmp_path / "hf", cfg, weights)
    assert open_source(source).spec.sliding_layers == (False, True)
    logits = _logits(build(source, tmp_path / "o", precision="fp32", all_logits=True), PROMPT)
    hf = numpy_forward(
        {**cfg, "layer_types": ["full_attention", "sliding_attention"]}, weights, PROMPT
    )
    every = numpy_forward({**cfg, "layer_types": ["sliding_attention"] * 2}, weights, PROMPT)
    assert np.abs(hf - every).max() > 1e-2  # the prompt (20 tokens) is longer than the window
    np.testing.assert_allclose(logits, hf, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("changes", "sliding"),
    [
        ({"use_sliding_window": True, "sliding_window": 8}, (False, False)),  # default: 28
        ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}, (True, True)),
        (
            {"use_sliding_window": False, "sliding_window": 8, "max_window_layers": 0},
            (False, False),
        ),
    ],
)
def test_qwen2_sliding_layers(tmp_path, changes, sliding):
    cfg = _config("qwen2", **changes)
    assert (
        open_source(write_hf_checkpoint(tmp_path, cfg, random_weights(cfg))).spec.sliding_layers
        == sliding
    )


@pytest.mark.parametrize(
    ("act", "exact"),
    [("gelu", True), ("gelu_python", True), ("gelu_new", False), ("gelu_pytorch_tanh", False)],
)
def test_gelu_names_build_hfs_gelu(tmp_path, act, exact):
    """HF's "gelu" is the exact (erf) GELU, "gelu_new" / "gelu_pytorch_tanh" the tanh one: the
    graph's Gelu says which, and the logits match a NumPy forward pass with that GELU (not
    with the other: the two differ here by far more than the tolerance)."""
    cfg = _config(hidden_act=act)
    weights = random_weights(cfg)
    folder = build(write_hf_checkpoint(tmp_path / "hf", cfg, weights), tmp_path / "o",
                   precision="fp32", all_logits=True)  # fmt: skip
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    gelu = [n for n in model.graph.node if n.op_type == "Gelu"]
    assert len(gelu) == cfg["num_hidden_layers"]
    approximate = {a.name: a.s.decode() for a in gelu[0].attribute}.get("approximate", "none")
    assert approximate == ("none" if exact else "tanh")
    erf = numpy_forward({**cfg, "hidden_act": "gelu"}, weights, PROMPT)
    tanh = numpy_forward({**cfg, "hidden_act": "gelu_pytorch_tanh"}, weights, PROMPT)
    assert np.abs(erf - tanh).max() > 1e-3
    np.testing.assert_allclose(_logits(folder, PROMPT), erf if exact else tanh, atol=1e-4, rtol=0)


def test_unsupported_activation_is_refused(tmp_path):
    cfg = _config(hidden_act="gelu_10")
    _refused(
        write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg)),
        tmp_path / "o",
        r"activation 'gelu_10' is not supported \(gelu, gelu_accurate",
    )


# -- options ------------------------------------------------------------------------------------


def test_window_cache_without_sliding_window_layers_is_refused(tmp_path):
    cfg = _config()
    source = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    with pytest.raises(BuildError, match="--window-cache: this llama model has no sliding-window"):
        build(source, tmp_path / "o", precision="fp32", window_cache=True)
    assert not (tmp_path / "o").exists()
