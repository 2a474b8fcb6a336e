"""genai's single-row GroupQueryAttention kernel (`genai._core.custom_ops.decode_attention_row`,
`decode_attention_kernels.h`) against onnxruntime's own kernel, the probe that lets the op use
it (`genai.runtime.decode_attention`), and a real model's decode through it."""

from __future__ import annotations

import numpy as np
import pytest

import genai
from genai._core import custom_ops
from genai.runtime import decode_attention
from genai.runtime.chunked_attention import chunk_attention

needs_kernel = pytest.mark.skipif(
    custom_ops.decode_attention_level() != 1,
    reason="genai's decode attention kernel is for AVX2 CPUs without AVX-512F",
)

CACHE = 2048


@needs_kernel
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
    pasts = (0, 1, 7, 8, 9, 63, 255, 256, 300, 1000, CACHE - 1)
    assert decode_attention.agrees(heads, kv_heads, dim, scale, rotary, 1, pasts, CACHE, seed=dim)


@needs_kernel
def test_a_changed_bit_is_found(monkeypatch):
    # the comparison sees a kernel one ulp off in one output value
    real = custom_ops.decode_attention_row

    def off(*args):
        out = real(*args)
        out[5] = np.nextafter(out[5], np.float32(np.inf))
        return out

    monkeypatch.setattr(custom_ops, "decode_attention_row", off)
    assert not decode_attention.agrees(9, 3, 64, 0.125, True, 1, (20,), 64)


@needs_kernel
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


@needs_kernel
def test_probe_refuses_fewer_heads_than_threads():
    # onnxruntime splits a long cache across threads when they outnumber the heads: other sums
    assert decode_attention.exact(9, 3, 0.125, True, 2)
    assert not decode_attention.exact(2, 1, 0.125, True, 4)


@needs_kernel
def test_rewrite_marks_nodes_only_with_threads(default_model_path):
    data = (default_model_path / "model.onnx").read_bytes()
    assert chunk_attention(data).count(b"genai_exact_decode") == 0
    marked = chunk_attention(data, threads=1)
    assert marked.count(b"genai_exact_decode") == marked.count(b"genai_chunk_rows") > 0


@needs_kernel
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


def test_node_attributes_read_as_int64():
    # onnx writes local_window_size -1 as a 10-byte varint; the rewrite must read -1 (no window)
    from onnx import helper

    from genai.runtime import onnx_wire as wire

    node = helper.make_node(
        "GroupQueryAttention", ["q"], ["o"], local_window_size=-1, num_heads=9, axes=[-1, 2]
    )
    parsed = wire.parse_node(node.SerializeToString())
    assert parsed.ints == {"local_window_size": -1, "num_heads": 9, "axes": [-1, 2]}
