"""Every architecture, from safetensors and from GGUF: ONNX logits against a NumPy forward pass
of the same weights, and greedy tokens of our engine against the reference engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import genai
from genai.builder import build
from genai.builder.quantize import dequantize_int4, quantize_int4
from genai.builder.testing import (
    ARCH_CONFIGS,
    bf16_round,
    numpy_forward,
    quantized_view,
    random_weights,
    write_gguf_checkpoint,
    write_hf_checkpoint,
)
from tests.parity import assert_same_run, greedy

pytest.importorskip("gguf", reason="the gguf package is a test dependency")
pytest.importorskip("safetensors", reason="the safetensors package is a test dependency")

ARCHS = sorted(ARCH_CONFIGS)
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 320, 20)]
PROMPT_IDS = np.array(PROMPT, np.int32)


class Checkpoints:
    """Writes each fixture checkpoint / built folder once per module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple, Path] = {}

    def source(self, arch: str, kind: str) -> Path:
        key = ("src", arch, kind)
        if key not in self._cache:
            cfg = ARCH_CONFIGS[arch]
            w = random_weights(cfg)
            base = self.root / arch
            if kind == "hf":
                path = write_hf_checkpoint(base / "hf", cfg, w)
            elif kind == "hf-bf16":
                path = write_hf_checkpoint(base / "hf-bf16", cfg, w, bf16=True)
            elif kind == "gguf":
                path = write_gguf_checkpoint(base / "f32.gguf", cfg, w)
            elif kind == "gguf-q8_0":
                path = write_gguf_checkpoint(base / "q8.gguf", cfg, w, quant="Q8_0")
            else:
                raise ValueError(kind)
            self._cache[key] = path
        return self._cache[key]

    def built(
        self, arch: str, kind: str, precision: str = "fp32", all_logits: bool = False
    ) -> Path:
        key = ("out", arch, kind, precision, all_logits)
        if key not in self._cache:
            out = self.root / arch / f"out-{kind}-{precision}-{int(all_logits)}"
            self._cache[key] = build(
                self.source(arch, kind), out, precision=precision, all_logits=all_logits
            )
        return self._cache[key]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("builder"))


def _session(folder: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(folder / "model.onnx"), opts)


def _run(sess, ids, past=None, mask=None):
    """One run with a growing KV cache (past may be None); returns (logits, presents)."""
    ids = np.asarray(ids, np.int64).reshape(1, -1)
    feeds = {"input_ids": ids}
    past_len = 0
    names = [i for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    for i in names:
        kv = past[i.name] if past else None
        if kv is None:
            kv = np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
            if "float16" in i.type:
                kv = kv.astype(np.float16)
        past_len = kv.shape[2]
        feeds[i.name] = kv
    feeds["attention_mask"] = (
        np.ones((1, past_len + ids.shape[1]), np.int64) if mask is None else mask
    )
    outs = sess.run(None, feeds)
    names_out = [o.name for o in sess.get_outputs()]
    presents = {
        n.replace("present", "past_key_values"): v
        for n, v in zip(names_out, outs, strict=True)
        if n.startswith("present")
    }
    return outs[names_out.index("logits")][0], presents


def _expected(arch: str, kind: str) -> np.ndarray:
    cfg = ARCH_CONFIGS[arch]
    w = random_weights(cfg)
    if kind == "hf-bf16":
        w = {k: bf16_round(v) for k, v in w.items()}
    elif kind == "gguf-q8_0":
        w = quantized_view(w, "Q8_0")
    return numpy_forward(cfg, w, PROMPT)


@pytest.mark.parametrize("kind", ["hf", "gguf"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_logits_match_numpy_forward(ckpt, arch, kind):
    expected = _expected(arch, kind)
    logits, _ = _run(_session(ckpt.built(arch, kind, all_logits=True)), PROMPT)
    assert logits.shape == (len(PROMPT), ARCH_CONFIGS[arch]["vocab_size"])
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["hf-bf16", "gguf-q8_0"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "phi3"])
def test_stored_precisions_match_numpy_forward(ckpt, arch, kind):
    expected = _expected(arch, kind)
    logits, _ = _run(_session(ckpt.built(arch, kind, all_logits=True)), PROMPT)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_last_position_logits_and_decode_steps(ckpt, arch):
    """The default graph outputs [1, 1, vocab]; decoding with the KV cache gives the same
    logits as the NumPy forward pass over the whole sequence."""
    cfg = ARCH_CONFIGS[arch]
    sess = _session(ckpt.built(arch, "gguf"))
    expected = numpy_forward(cfg, random_weights(cfg), PROMPT)
    logits, past = _run(sess, PROMPT[:12])
    assert logits.shape == (1, cfg["vocab_size"])
    np.testing.assert_allclose(logits[0], expected[11], atol=1e-4, rtol=0)
    for pos in range(12, len(PROMPT)):
        logits, past = _run(sess, PROMPT[pos : pos + 1], past)
        np.testing.assert_allclose(logits[0], expected[pos], atol=1e-4, rtol=0)


def test_right_padded_batch_picks_each_rows_last_token(ckpt):
    cfg = ARCH_CONFIGS["llama"]
    sess = _session(ckpt.built("llama", "hf"))
    expected = numpy_forward(cfg, random_weights(cfg), PROMPT[:7])
    ids = np.array([PROMPT[:10], [*PROMPT[:7], 2, 2, 2]], np.int64)
    mask = np.array([[1] * 10, [1] * 7 + [0] * 3], np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask}
    for i in sess.get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = np.zeros((2, i.shape[1], 0, i.shape[3]), np.float32)
    logits = sess.run(["logits"], feeds)[0]
    assert logits.shape == (2, 1, cfg["vocab_size"])
    np.testing.assert_allclose(logits[1, 0], expected[6], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_engines_agree_on_built_folder(ckpt, arch):
    og = pytest.importorskip("onnxruntime_genai")
    folder = ckpt.built(arch, "gguf")
    ours, ref = genai.Model(folder), og.Model(str(folder))
    mine = greedy(genai, ours, PROMPT_IDS, len(PROMPT) + 24)
    theirs = greedy(og, ref, PROMPT_IDS, len(PROMPT) + 24)
    assert_same_run(mine, theirs)
    assert len(mine.next_tokens) == 24


@pytest.mark.parametrize("precision", ["int4", "fp16"])
@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_int4_and_fp16_builds(ckpt, arch, precision):
    og = pytest.importorskip("onnxruntime_genai")
    folder = ckpt.built(arch, "hf", precision)
    fp32, _ = _run(_session(ckpt.built(arch, "hf", all_logits=True)), PROMPT)
    logits, _ = _run(_session(folder), PROMPT)
    scale = np.abs(fp32[-1]).max()
    tol = 0.25 if precision == "int4" else 0.02
    assert np.abs(logits[0] - fp32[-1]).max() < tol * scale
    mine = greedy(genai, genai.Model(folder), PROMPT_IDS, len(PROMPT) + 16)
    theirs = greedy(og, og.Model(str(folder)), PROMPT_IDS, len(PROMPT) + 16)
    assert_same_run(mine, theirs)


def test_int4_layout_matches_matmulnbits():
    """quantize_int4's packing is what MatMulNBits and GatherBlockQuantized decode."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    n, k = 48, 96
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed, scales = quantize_int4(w)
    deq = dequantize_int4(packed, scales, k)
    # within one step of its block's scale (the +8 side of [-8, 7] may clip)
    assert (np.abs(deq - w) <= np.repeat(np.abs(scales), 32, axis=1) * 1.0001).all()
    x = rng.standard_normal((3, k)).astype(np.float32)
    ids = np.array([[0, 5, 47]], np.int64)
    nodes = [
        helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft",
                         K=k, N=n, bits=4, block_size=32, accuracy_level=0),
        helper.make_node("GatherBlockQuantized", ["b2", "ids", "s2"], ["e"],
                         domain="com.microsoft", bits=4, block_size=32, gather_axis=0,
                         quantize_axis=1),
    ]  # fmt: skip
    inits = [
        numpy_helper.from_array(packed, "b"),
        numpy_helper.from_array(scales.reshape(-1), "s"),
        numpy_helper.from_array(packed.reshape(n, k // 2), "b2"),
        numpy_helper.from_array(scales, "s2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("e", TensorProto.FLOAT, None),
        ],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )
    y, e = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "ids": ids})
    np.testing.assert_allclose(y, x @ deq.T, atol=1e-4)
    np.testing.assert_allclose(e[0], deq[[0, 5, 47]], atol=1e-6)


def test_folder_files_and_tokenizer(ckpt):
    from tokenizers import Tokenizer

    hf_out = ckpt.built("llama", "hf")
    gguf_out = ckpt.built("llama", "gguf")
    for folder in (hf_out, gguf_out):
        assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json"} <= {
            p.name for p in folder.iterdir()
        }
        config = json.loads((folder / "genai_config.json").read_text())
        assert config["model"]["type"] == "llama"
        assert config["search"]["past_present_share_buffer"] is True
    assert (gguf_out / "chat_template.jinja").is_file()
    text = "the rain in spain stays mainly <|im_start|> on the plain\n\tÿ é 中文 😀"
    a = Tokenizer.from_file(str(hf_out / "tokenizer.json")).encode(text).ids
    b = Tokenizer.from_file(str(gguf_out / "tokenizer.json")).encode(text).ids
    assert a == b
    tok = genai.Tokenizer(genai.Model(gguf_out))
    prompt = tok.apply_chat_template(
        '[{"role": "user", "content": "hi"}]', add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.encode(text)) == text.replace("<|im_start|>", "")  # specials skipped


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text"])
def test_window_cache_build_keeps_tokens_and_shrinks_local_caches(ckpt, tmp_path, arch):
    """`build(window_cache=True)` gives the sliding-window layers window-sized caches (the
    GroupQueryAttention compacts them) and writes the config block that sizes them: greedy
    tokens past the window equal the plain build's, in our engine and in the reference."""
    og = pytest.importorskip("onnxruntime_genai")
    if not ARCH_CONFIGS[arch].get("sliding_window"):
        pytest.skip(f"{arch} fixture has no sliding window")
    plain = ckpt.built(arch, "hf")
    windowed = build(ckpt.source(arch, "hf"), tmp_path / "w", precision="fp32", window_cache=True)
    block = json.loads((windowed / "genai_config.json").read_text())["model"]["decoder"][
        "sliding_window"
    ]
    assert block["window_size"] == ARCH_CONFIGS[arch]["sliding_window"] and block["layers"]
    length = len(PROMPT) + 24  # well past the window
    want = greedy(genai, genai.Model(plain), PROMPT_IDS, length)
    mine = greedy(genai, genai.Model(windowed), PROMPT_IDS, length)
    theirs = greedy(og, og.Model(str(windowed)), PROMPT_IDS, length)
    assert_same_run(mine, want)
    assert_same_run(mine, theirs)
    model = genai.Model(windowed)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=length)
    gen = genai.Generator(model, params)
    gen.append_tokens(PROMPT_IDS)
    gen.generate_until_done()
    full = genai.Generator(genai.Model(plain), params)
    full.append_tokens(PROMPT_IDS)
    full.generate_until_done()
    # past window + slack (8 + 16 positions) the local layers stop growing
    assert gen.kv_cache_used_bytes < full.kv_cache_used_bytes
