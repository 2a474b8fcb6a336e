"""genai's single-row GroupQueryAttention kernel (`genai._core.custom_ops.decode_attention_row`,
`decode_attention_kernels.h`) against onnxruntime's own kernel, the probe that lets the op use
it (`genai.runtime.decode_attention`), and a real model's decode through it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import genai
from genai._core import custom_ops
from genai.runtime import decode_attention
from genai.runtime.chunked_attention import chunk_attention

pytestmark = pytest.mark.skipif(
    custom_ops.decode_attention_level() != 1,
    reason="genai's decode attention kernel is for AVX2 CPUs without AVX-512F",
)

CACHE = 2048


def _session(heads, kv_heads, dim, scale, rotary, threads=1):
    inputs = ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total"]
    attrs = {"num_heads": heads, "kv_num_heads": kv_heads, "scale": scale}
    if rotary:
        inputs += ["cos", "sin"]
        attrs.update(do_rotary=1, rotary_interleaved=0)
    node = helper.make_node(
        "GroupQueryAttention", inputs, ["out", "pk", "pv"], domain="com.microsoft", **attrs
    )
    kv = [1, kv_heads, CACHE, dim]
    infos = [
        helper.make_tensor_value_info(
            "qkv", TensorProto.FLOAT, [1, 1, (heads + 2 * kv_heads) * dim]
        ),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT, kv),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT, kv),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    if rotary:
        infos += [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [CACHE, dim // 2])
            for n in ("cos", "sin")
        ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output]
    model = helper.make_model(
        helper.make_graph([node], "g", infos, outs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _rotary(dim):
    angles = (
        np.arange(CACHE, dtype=np.float32)[:, None]
        / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))[None]
    )
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize(
    "heads,kv_heads,dim,scale,rotary",
    [
        (9, 3, 64, 0.125, True),
        (4, 4, 32, 0.0, True),
        (6, 2, 40, 0.3, False),
        (8, 1, 128, 0.0, True),
    ],
)
def test_kernel_gives_onnxruntimes_bits(heads, kv_heads, dim, scale, rotary):
    session = _session(heads, kv_heads, dim, scale, rotary)
    cos, sin = _rotary(dim)
    rng = np.random.default_rng(heads * 100 + dim)
    for past in (0, 1, 7, 8, 9, 63, 255, 256, 300, 1000, CACHE - 1):
        qkv = (2 * rng.standard_normal((1, 1, (heads + 2 * kv_heads) * dim))).astype(np.float32)
        keys = rng.standard_normal((1, kv_heads, CACHE, dim)).astype(np.float32)
        values = rng.standard_normal((1, kv_heads, CACHE, dim)).astype(np.float32)
        feed = {
            "qkv": qkv,
            "past_key": keys,
            "past_value": values,
            "seqlens_k": np.array([past], np.int32),
            "total": np.array(past + 1, np.int32),
        }
        if rotary:
            feed.update(cos=cos, sin=sin)
        want, want_keys, want_values = session.run(None, feed)
        got_keys, got_values = keys[0].copy(), values[0].copy()
        used_scale = scale if scale else np.float32(1) / np.sqrt(np.float32(dim))
        got = custom_ops.decode_attention_row(
            qkv[0, 0], past, heads, kv_heads, used_scale,
            cos if rotary else None, sin if rotary else None, got_keys, got_values,
        )  # fmt: skip
        np.testing.assert_array_equal(got.view(np.uint32), want.reshape(-1).view(np.uint32))
        np.testing.assert_array_equal(got_keys[:, : past + 1], want_keys[0][:, : past + 1])
        np.testing.assert_array_equal(got_values[:, : past + 1], want_values[0][:, : past + 1])


def test_kernel_refuses_bad_shapes():
    keys = np.zeros((3, 16, 64), np.float32)
    with pytest.raises(ValueError, match="head_size values"):
        custom_ops.decode_attention_row(
            np.zeros(10, np.float32), 0, 9, 3, 0.125, None, None, keys, keys.copy()
        )
    with pytest.raises(ValueError, match="pos must be"):
        custom_ops.decode_attention_row(
            np.zeros(15 * 64, np.float32), 16, 9, 3, 0.125, None, None, keys, keys.copy()
        )


def test_probe_refuses_fewer_heads_than_threads():
    # onnxruntime splits a long cache across threads when they outnumber the heads: other sums
    assert decode_attention.exact(9, 3, 0.125, True, 2)
    assert not decode_attention.exact(2, 1, 0.125, True, 4)


def test_rewrite_marks_nodes_only_with_threads(default_model_path):
    data = (default_model_path / "model.onnx").read_bytes()
    assert chunk_attention(data).count(b"genai_exact_decode") == 0
    marked = chunk_attention(data, threads=1)
    assert marked.count(b"genai_exact_decode") == marked.count(b"genai_chunk_rows") > 0


def test_default_model_decodes_the_references_tokens_through_the_kernel(default_model_path):
    og = pytest.importorskip("onnxruntime_genai")
    prompt = np.arange(20, 60, dtype=np.int32)
    runs = {}
    before = custom_ops.exact_row_calls()
    for name, engine in (("genai", genai), ("reference", og)):
        model = engine.Model(str(default_model_path))
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + 48, do_sample=False)
        generator = engine.Generator(model, params)
        generator.append_tokens(prompt)
        while not generator.is_done():
            generator.generate_next_token()
        runs[name] = list(generator.get_sequence(0))
    assert custom_ops.exact_row_calls() > before  # the decode steps took genai's kernel
    assert runs["genai"] == runs["reference"]
