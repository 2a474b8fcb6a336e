"""A tiny QNN-style windowed decoder folder: the cache and the inputs are slid by the engine.

``model.decoder.sliding_window`` with ``slide_key_value_cache`` and ``slide_inputs`` (see
`genai.kv.windowed_cache`): the engine feeds the prompt ``window_size`` tokens at a time, then one
token per run, and keeps the KV cache at a fixed context. The graph, written with plain ONNX ops
so that ONNX Runtime's CPU provider runs it:

* ``input_ids`` / ``position_ids`` ``[batch, S]``, ``attention_mask`` ``[batch,
  context_length]`` over the concatenation [past, current] (``id_dtype``, int32 by default);
* ``past_key_values.{i}.key`` ``[kv_heads, batch, head_size, context_length - S]`` (keys
  transposed, sequence last), ``past_key_values.{i}.value`` ``[kv_heads, batch,
  context_length - S, head_size]``;
* ``present.{i}.key`` / ``present.{i}.value``: the S new positions in the same layouts;
* ``logits`` float32 ``[batch, S, vocab]``.

S is ``window_size`` while a prompt is fed and 1 while generating, so S and the past length are
symbolic dimensions; ``batch`` is 1 unless ``dynamic_batch``. With ``kv_dtype="uint8"`` (what
onnxruntime-genai's ``WindowedKeyValueCache`` requires) the cache is quantized
(``DequantizeLinear`` / ``QuantizeLinear`` with one scale and zero point, ``pad_value`` = the
zero point) and the current window attends to its own positions through the same round trip,
so a position reads the same key from the past as from the present; ``kv_dtype="float32"``
keeps plain floats (``pad_value`` 0). Llama-style weights (`genai.testing.models`: the same
seed gives the same weights), rotary by ``position_ids``.
"""

from __future__ import annotations

import json
import pathlib
from typing import Literal

import numpy as np
from onnx import TensorProto

from genai.builder.genai_config import SPLIT_KV_OUTPUTS
from genai.testing.models import (
    _POSITION_SPLIT_KV_INPUTS,
    IdDtype,
    _attention,
    _dim,
    _Dims,
    _Graph,
    _id_elem_type,
    _llama_weights,
    _rms_norm,
    _rotary_tables,
    _write_folder,
    plain_layer_tail,
    plain_logits,
    qkv_heads,
)

__all__ = ["KV_SCALE", "KV_ZERO_POINT", "write_windowed_decoder"]

#: Quantization of the fixture's uint8 KV cache: value = (byte - KV_ZERO_POINT) * KV_SCALE.
KV_SCALE = 0.05
KV_ZERO_POINT = 128


def _allowed(g: _Graph, input_ids: str, attention_mask: str) -> str:
    """Bool ``[batch, 1, 1, S, N]``: key j is visible to query i (causal and not padding), the
    current window's query i sitting at column N - S + i. As `genai.testing.models`'s, but
    without ``And`` (the QNN EP takes no ``And`` node): the two conditions multiply as floats."""
    seq = _dim(g, input_ids, 1)
    total = _dim(g, attention_mask, 1)
    key_pos = g.op("Range", g.const(0), total, g.const(1))
    query_pos = g.op("Range", g.op("Sub", total, seq), total, g.const(1))
    causal = g.op("LessOrEqual", key_pos, g.op("Unsqueeze", query_pos, g.const([1])))
    causal = g.op("Cast", causal, to=TensorProto.FLOAT)
    not_pad = g.op("Cast", attention_mask, to=TensorProto.FLOAT)
    not_pad = g.op("Unsqueeze", not_pad, g.const([1, 2, 3]))  # [batch, 1, 1, 1, N]
    both = g.op("Mul", causal, not_pad)
    return g.op("Greater", both, g.const(0.5, np.float32))


def _graph(
    dims: _Dims, w: dict[str, np.ndarray], batch: int | str, quantized: bool, ids_type: int
) -> _Graph:
    n, kv, hd = dims.context_length, dims.num_kv_heads, dims.head_size
    seq, past = "sequence_length", "past_sequence_length"
    kv_type = TensorProto.UINT8 if quantized else TensorProto.FLOAT
    cos, sin = _rotary_tables(dims)
    g = _Graph("windowed_decoder")
    input_ids = g.input("input_ids", ids_type, [batch, seq])
    position_ids = g.input("position_ids", ids_type, [batch, seq])
    mask = g.input("attention_mask", ids_type, [batch, n])
    for i in range(dims.num_layers):
        g.input(f"past_key_values.{i}.key", kv_type, [kv, batch, hd, past])
        g.input(f"past_key_values.{i}.value", kv_type, [kv, batch, past, hd])
    g.output("logits", TensorProto.FLOAT, [batch, seq, dims.vocab_size])
    for i in range(dims.num_layers):
        g.output(f"present.{i}.key", kv_type, [kv, batch, hd, seq])
        g.output(f"present.{i}.value", kv_type, [kv, batch, seq, hd])

    def store(x: str) -> str:  # float -> cache dtype
        if not quantized:
            return x
        return g.op(
            "QuantizeLinear", x, g.const(KV_SCALE, np.float32), g.const(KV_ZERO_POINT, np.uint8)
        )

    def load(x: str) -> str:  # cache dtype -> float
        if not quantized:
            return x
        return g.op(
            "DequantizeLinear", x, g.const(KV_SCALE, np.float32), g.const(KV_ZERO_POINT, np.uint8)
        )

    allowed = _allowed(g, input_ids, mask)
    unsq = g.const([1])
    cos_pos = g.op("Unsqueeze", g.op("Gather", g.weight("cos_table", cos), position_ids), unsq)
    sin_pos = g.op("Unsqueeze", g.op("Gather", g.weight("sin_table", sin), position_ids), unsq)
    residual = g.op("Gather", g.weight("embed_tokens.weight", w["embed"]), input_ids, axis=0)
    for i in range(dims.num_layers):
        hidden = _rms_norm(
            g, residual, g.weight(f"layers.{i}.input_layernorm.weight", w[f"{i}.ln1"])
        )
        q, k, v = qkv_heads(g, w, dims, i, hidden, cos_pos, sin_pos)
        k, v = store(k), store(v)  # [b, kv, S, hd]
        # presents: keys [kv, b, hd, S], values [kv, b, S, hd]
        g.op("Transpose", k, perm=[1, 0, 3, 2], out=f"present.{i}.key")
        g.op("Transpose", v, perm=[1, 0, 2, 3], out=f"present.{i}.value")
        past_k = g.op("Transpose", load(f"past_key_values.{i}.key"), perm=[1, 0, 3, 2])
        past_v = g.op("Transpose", load(f"past_key_values.{i}.value"), perm=[1, 0, 2, 3])
        keys = g.op("Concat", past_k, load(k), axis=2)  # [b, kv, context, hd]
        values = g.op("Concat", past_v, load(v), axis=2)
        attn = _attention(g, q, keys, values, allowed, dims)
        residual = plain_layer_tail(g, residual, attn, w, i)
    plain_logits(g, residual, w)
    return g


def write_windowed_decoder(
    out_dir: str | pathlib.Path,
    *,
    window_size: int = 8,
    context_length: int = 128,
    alignment: str = "right",
    kv_dtype: Literal["uint8", "float32"] = "uint8",
    id_dtype: IdDtype = "int32",
    dynamic_batch: bool = False,
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    eos_token_id: int = 2,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    name: str = "windowed-decoder",
) -> pathlib.Path:
    """Write a QNN-style windowed decoder folder (see the module docstring) into
    ``out_dir / name``; returns the folder."""
    if kv_dtype not in ("uint8", "float32"):
        raise ValueError(f"kv_dtype must be 'uint8' or 'float32', got {kv_dtype!r}")
    dims = _Dims(vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, context_length)
    w = _llama_weights(dims, seed, (bos_token_id, eos_token_id, pad_token_id))
    quantized = kv_dtype == "uint8"
    batch = "batch_size" if dynamic_batch else 1
    graph = _graph(dims, w, batch, quantized, _id_elem_type(id_dtype)).model()
    folder = _write_folder(
        out_dir,
        name,
        graph,
        model_type="llama",
        dims=dims,
        inputs=_POSITION_SPLIT_KV_INPUTS,
        outputs=SPLIT_KV_OUTPUTS,
        share_buffer=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["sliding_window"] = {
        "window_size": window_size,
        "pad_value": KV_ZERO_POINT if quantized else 0,
        "alignment": alignment,
        "slide_key_value_cache": True,
        "slide_inputs": True,
    }
    path.write_text(json.dumps(config, indent=4) + "\n")
    return folder
