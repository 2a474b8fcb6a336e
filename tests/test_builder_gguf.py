"""GGUF reading and dequantization, checked against the gguf package's own NumPy code."""

from __future__ import annotations

import json

import numpy as np
import pytest

from genai.builder import BuildError, build
from genai.builder.gguf import DEQUANTIZERS, GGUFFile
from genai.builder.sources import HFSource, SafetensorsFile
from genai.builder.testing import ARCH_CONFIGS, random_weights, write_gguf_checkpoint

gguf = pytest.importorskip("gguf", reason="the gguf package is a test dependency")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402

# Byte offsets of the float16 fields in each block type (kept finite in random blocks).
_F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q4_K": [0, 2], "Q6_K": [208]}


def _random_raw(type_name: str, rows: int, rng: np.random.Generator) -> np.ndarray:
    qtype = QT[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if block == 1:
        values = rng.standard_normal((rows, 256)).astype(np.float32)
        if type_name == "F16":
            return values.astype(np.float16).view(np.uint8)
        if type_name == "BF16":
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    raw = rng.integers(0, 256, size=(rows * 8, size), dtype=np.uint8)
    for offset in _F16_FIELDS[type_name]:
        halfs = (rng.standard_normal(rows * 8) * 0.05).astype(np.float16)
        raw[:, offset : offset + 2] = halfs.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(DEQUANTIZERS))
def test_dequantizer_matches_gguf_package(type_name):
    rng = np.random.default_rng(sum(map(ord, type_name)))
    raw = _random_raw(type_name, 6, rng)
    expected = quants.dequantize(raw, QT[type_name]).astype(np.float32)
    got = DEQUANTIZERS[type_name](raw).reshape(expected.shape)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "F16", "BF16"])
def test_quantized_tensor_round_trip_through_file(tmp_path, type_name):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 64)).astype(np.float32)
    qtype = QT[type_name]
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", quants.quantize(weight, qtype), raw_dtype=qtype)
    w.add_tensor("plain", weight[:2])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile(path)
    assert f.architecture == "llama"
    assert f.tensors["w"].shape == (8, 64) and f.tensors["w"].type_name == type_name
    expected = quants.dequantize(quants.quantize(weight, qtype), qtype)
    np.testing.assert_array_equal(f.tensor("w"), expected)
    np.testing.assert_array_equal(f.tensor("plain"), weight[:2])


@pytest.fixture()
def llama_gguf(tmp_path):
    cfg = ARCH_CONFIGS["llama"]
    return write_gguf_checkpoint(tmp_path / "llama.gguf", cfg, random_weights(cfg))


def test_metadata_is_read(llama_gguf):
    f = GGUFFile(llama_gguf)
    assert f.arch_get("block_count") == 2
    assert f.arch_get("embedding_length") == 64
    assert f.get("tokenizer.ggml.model") == "gpt2"
    assert len(f.get("tokenizer.ggml.tokens")) == 320
    assert f.tensors["token_embd.weight"].shape == (320, 64)


def test_truncated_gguf(llama_gguf, tmp_path):
    data = llama_gguf.read_bytes()
    for cut in (10, 200, len(data) - 100):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(BuildError, match="truncated"):
            build(bad, tmp_path / "out", precision="fp32")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUX" + b"\0" * 64)
    with pytest.raises(BuildError, match="not a GGUF file or a Hugging Face"):
        build(bad, tmp_path / "out")
    with pytest.raises(BuildError, match="bad magic"):
        GGUFFile(bad)


def test_unknown_quant_type(tmp_path):
    cfg = ARCH_CONFIGS["llama"]
    path = write_gguf_checkpoint(tmp_path / "m.gguf", cfg, random_weights(cfg))
    # Re-write with one tensor as Q5_0 (valid size, not dequantizable here).
    f = GGUFFile(path)
    w = gguf.GGUFWriter(str(tmp_path / "q5k.gguf"), "llama")
    for key, value in f.metadata.items():
        if key.startswith("llama.") or key.startswith("tokenizer.ggml.model"):
            if isinstance(value, int):
                w.add_uint32(key, value)
            elif isinstance(value, float):
                w.add_float32(key, value)
            elif isinstance(value, str):
                w.add_string(key, value)
    for name in f.tensors:
        if name == "blk.1.ffn_down.weight":
            raw = np.zeros((64, 22 * 128 // 32), np.uint8)
            w.add_tensor(name, raw, raw_dtype=QT.Q5_0)
        else:
            w.add_tensor(name, f.tensor(name))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(BuildError, match=r"blk\.1\.ffn_down\.weight has ggml type Q5_0.*Q4_K"):
        build(tmp_path / "q5k.gguf", tmp_path / "out", precision="fp32")


def _write_minimal(path, arch, tensors):
    w = gguf.GGUFWriter(str(path), arch)
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_architecture_lists_supported(tmp_path):
    path = _write_minimal(tmp_path / "m.gguf", "mamba", {"x": np.zeros(4, np.float32)})
    with pytest.raises(BuildError, match=r"'mamba' is not supported; supported: gemma, .*llama"):
        build(path, tmp_path / "out")


def test_missing_tensors_are_listed(tmp_path):
    cfg = ARCH_CONFIGS["llama"]
    weights = random_weights(cfg)
    del weights["model.layers.1.mlp.down_proj.weight"]
    del weights["model.layers.0.self_attn.k_proj.weight"]
    path = write_gguf_checkpoint(tmp_path / "m.gguf", cfg, weights)
    with pytest.raises(
        BuildError, match=r"missing tensors: blk\.0\.attn_k\.weight, blk\.1\.ffn_down"
    ):
        build(path, tmp_path / "out", precision="fp32")


def test_hf_errors(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    with pytest.raises(BuildError, match=r"no config\.json"):
        HFSource(folder)
    (folder / "config.json").write_text(
        json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]})
    )
    with pytest.raises(BuildError, match=r"'mamba' is not supported; supported: .*qwen3"):
        HFSource(folder)
    (folder / "config.json").write_text(json.dumps(ARCH_CONFIGS["llama"]))
    with pytest.raises(BuildError, match="no \\*.safetensors"):
        HFSource(folder)
    (folder / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(BuildError, match="truncated safetensors"):
        SafetensorsFile(folder / "model.safetensors")
