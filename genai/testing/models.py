"""Tiny random-weight decoder model folders in the onnxruntime-genai layout.

Every writer builds an fp32 ONNX graph with ``onnx.helper`` from weights drawn deterministically
from ``seed`` and writes a complete folder (``model.onnx``, ``genai_config.json``,
``tokenizer.json``, ``tokenizer_config.json``) that both the reference engine
(``onnxruntime_genai``) and ours can load.

Three layouts are covered:

* :func:`write_gqa_decoder` -- what the reference's model builder emits for Llama-like models:
  ``GroupQueryAttention`` (com.microsoft) with rotary embedding inside the op, no
  ``position_ids`` input, ``seqlens_k = ReduceSum(attention_mask) - 1`` and
  ``total_sequence_length = Shape(attention_mask)[1]`` computed in the graph,
  ``SkipSimplifiedLayerNormalization`` between blocks.
* :func:`write_optimum_decoder` -- an HF/optimum-style export: plain ONNX ops only, a
  ``position_ids`` input, KV caches that grow by concatenation, causal mask combined with the
  padding mask inside the graph.
* :func:`write_gpt2_decoder` -- GPT-2 style: learned position embeddings, LayerNorm, GELU MLP,
  biases, and combined ``past_%d`` / ``present_%d`` KV tensors of shape
  ``[2, batch, heads, seq, head_size]``.

The GQA and optimum writers draw identical weights for identical arguments, and compute the same
function (up to float rounding), so their logits can be compared against each other.

The lm_head columns of the pad/bos/eos ids are zero, so those ids (logit exactly 0) practically
never win a greedy step: generation runs for the full ``max_length`` (to test EOS handling,
overlay another ``eos_token_id`` or use ``set_logits``). The lm_head also carries a penalty on
tokens already in context, so greedy sequences stay varied (typically 20-35 distinct tokens in 64
steps) instead of looping on one token.

Folders are written into ``out_dir / name``. The tokenizer is a SentencePiece-like BPE: ids 0, 1,
2 are the special tokens ``<pad>``, ``<s>``, ``</s>``; id 3 is ``<unk>``; then ``▁`` (space),
``a``-``z``, ``.,!?'`` and merges up to ``vocab_size``. Every merge joins the two pieces BPE splits
its result into, so each vocabulary entry encodes to itself, and the pre-tokenizer is an explicit
no-op (a ``Split`` on a string that never occurs), so the reference (onnxruntime-extensions) runs
plain BPE over the whole text as ``tokenizers`` does instead of its Llama regex pre-split with a
whole-word vocabulary lookup. Text made of those characters and the special tokens then encodes
and decodes identically in the reference and in ``tokenizers`` (`genai.Tokenizer`) at every
``vocab_size``. Any other character is outside the vocabulary: ``tokenizers`` encodes it to
``<unk>`` (3), the reference to one -1 per UTF-8 byte (its BPE ignores ``unk_token``), so test
prompts stay within the alphabet.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers import models as tokenizer_models

from genai.builder.genai_config import (
    SPLIT_KV_INPUTS,
    SPLIT_KV_OUTPUTS,
    graph_section,
    search_section,
)
from genai.runtime.onnx_graph import MS_DOMAIN, GraphBuilder

__all__ = [
    "add_logits_addend_input",
    "expose_hidden_states",
    "save_external_data",
    "write_gpt2_decoder",
    "write_gqa_decoder",
    "write_optimum_decoder",
]

IdDtype = Literal["int64", "int32"]

_MS_DOMAIN = MS_DOMAIN
_ROPE_THETA = 10000.0
_EPS = 1e-5
_MASKED = float(np.finfo(np.float32).min)
_LM_HEAD_SCALE = 4.0
_SELF_PENALTY = 4.0
_CONTEXT_PENALTY = 4.0

_ID_TYPES = {"int64": TensorProto.INT64, "int32": TensorProto.INT32}
_NP_ID_TYPES = {"int64": np.int64, "int32": np.int32}

# Tokenizer pieces: ids 0..2 special, 3 unknown, then a character alphabet, then merges.
_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
_SPACE = "\u2581"  # SentencePiece's word-boundary marker
_NO_SPLIT = "<!no-split!>"
_ALPHABET = (_SPACE, *"abcdefghijklmnopqrstuvwxyz", *".,!?'")
_MERGE_TARGETS = (
    "▁t", "he", "in", "er", "an", "▁a", "on", "re", "▁the", "at", "en", "nd", "ou", "▁s",
    "ed", "is", "or", "it", "▁w", "▁o", "ing", "es", "▁i", "ar", "▁b", "▁c", "ll", "▁h",
    "le", "▁f", "▁m", "▁p", "▁d", "st", "ve", "▁and", "▁to", "▁of", "ion", "▁in", "th",
)  # fmt: skip
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + '\n' + message['content'] + '</s>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant\n' }}{% endif %}"
)


# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Dims:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    context_length: int
    gqa: bool = False

    def __post_init__(self) -> None:
        if self.vocab_size < len(_SPECIAL_TOKENS) + len(_ALPHABET):
            raise ValueError(
                f"vocab_size must be >= {len(_SPECIAL_TOKENS) + len(_ALPHABET)} "
                f"(special tokens + alphabet), got {self.vocab_size}"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_size % 2:
            raise ValueError("head_size (hidden_size / num_heads) must be even")
        if self.gqa and self.head_size % 16:
            # onnxruntime's CPU GroupQueryAttention kernel rejects other head sizes.
            raise ValueError("GroupQueryAttention needs head_size (hidden / heads) % 16 == 0")
        if self.num_layers < 1 or self.context_length < 2:
            raise ValueError("need num_layers >= 1 and context_length >= 2")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def intermediate_size(self) -> int:
        return 2 * self.hidden_size


class _Graph(GraphBuilder):
    """The shared graph builder, named for the test writers."""

    def __init__(self, name: str) -> None:
        super().__init__(name, producer="genai.testing")


def _normal(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _norm_weight(rng: np.random.Generator, size: int) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)


def _lm_head(
    rng: np.random.Generator,
    dims: _Dims,
    embed: np.ndarray,
    value_out_maps: Sequence[np.ndarray],
    special_ids: Sequence[int],
) -> np.ndarray:
    """Random lm_head ``[hidden, vocab]`` plus a built-in dislike of recently seen tokens.

    A purely random head lets greedy decoding fall into a short loop (often one token repeated)
    after a few steps. Subtracting the token's own embedding (what the residual stream carries
    for the current token) and its embedding pushed through each layer's value/output
    projections (what attention copies from earlier tokens) lowers the logits of tokens already
    in context, so greedy sequences stay varied over 64+ steps. Columns of special ids are zero.
    """
    scale = 1.0 / np.sqrt(dims.hidden_size)
    weight = _normal(rng, (dims.hidden_size, dims.vocab_size), _LM_HEAD_SCALE * scale)
    penalty = _SELF_PENALTY * embed.T
    for value_out in value_out_maps:
        penalty = penalty + _CONTEXT_PENALTY * (embed @ value_out).T
    weight = (weight - scale * penalty).astype(np.float32)
    weight[:, sorted(set(special_ids))] = 0.0
    return weight


def _llama_weights(dims: _Dims, seed: int, special_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Llama-style weights, MatMul layout ``[in, out]``, shared by the GQA and optimum writers."""
    rng = np.random.default_rng(seed)
    d, hd = dims.hidden_size, dims.head_size
    std = 1.0 / np.sqrt(d)
    w: dict[str, np.ndarray] = {"embed": _normal(rng, (dims.vocab_size, d), 1.0)}
    for i in range(dims.num_layers):
        w[f"{i}.ln1"] = _norm_weight(rng, d)
        w[f"{i}.q"] = _normal(rng, (d, dims.num_heads * hd), std)
        w[f"{i}.k"] = _normal(rng, (d, dims.num_kv_heads * hd), std)
        w[f"{i}.v"] = _normal(rng, (d, dims.num_kv_heads * hd), std)
        w[f"{i}.o"] = _normal(rng, (dims.num_heads * hd, d), std)
        w[f"{i}.ln2"] = _norm_weight(rng, d)
        w[f"{i}.gate"] = _normal(rng, (d, dims.intermediate_size), std)
        w[f"{i}.up"] = _normal(rng, (d, dims.intermediate_size), std)
        w[f"{i}.down"] = _normal(rng, (dims.intermediate_size, d), 1.0 / np.sqrt(2 * d))
    w["final_norm"] = _norm_weight(rng, d)
    group = dims.num_heads // dims.num_kv_heads
    value_out_maps = []
    for i in range(dims.num_layers):
        # Each query head reads the value head of its group: expand v to all heads.
        v_all = np.repeat(w[f"{i}.v"].reshape(d, dims.num_kv_heads, 1, hd), group, axis=2)
        value_out_maps.append(v_all.reshape(d, dims.num_heads * hd) @ w[f"{i}.o"])
    w["lm_head"] = _lm_head(rng, dims, w["embed"], value_out_maps, special_ids)
    return w


def _gpt2_weights(dims: _Dims, seed: int, special_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """GPT-2 style weights (MatMul layout, biases, learned positions, untied lm_head)."""
    rng = np.random.default_rng(seed)
    d = dims.hidden_size
    w: dict[str, np.ndarray] = {
        "wte": _normal(rng, (dims.vocab_size, d), 1.0),
        "wpe": _normal(rng, (dims.context_length, d), 0.5),
    }

    def layer_norm(prefix: str) -> None:
        w[f"{prefix}.weight"] = _norm_weight(rng, d)
        w[f"{prefix}.bias"] = _normal(rng, (d,), 0.05)

    def linear(prefix: str, n_in: int, n_out: int) -> None:
        w[f"{prefix}.weight"] = _normal(rng, (n_in, n_out), 1.0 / np.sqrt(n_in))
        w[f"{prefix}.bias"] = _normal(rng, (n_out,), 0.05)

    value_out_maps = []
    for i in range(dims.num_layers):
        layer_norm(f"h.{i}.ln_1")
        linear(f"h.{i}.attn.c_attn", d, 3 * d)
        linear(f"h.{i}.attn.c_proj", d, d)
        layer_norm(f"h.{i}.ln_2")
        linear(f"h.{i}.mlp.c_fc", d, 4 * d)
        linear(f"h.{i}.mlp.c_proj", 4 * d, d)
        value = w[f"h.{i}.attn.c_attn.weight"][:, 2 * d :]
        value_out_maps.append(value @ w[f"h.{i}.attn.c_proj.weight"])
    layer_norm("ln_f")
    w["lm_head"] = _lm_head(rng, dims, w["wte"], value_out_maps, special_ids)
    return w


def _rotary_tables(dims: _Dims) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches ``[context_length, head_size / 2]`` (non-interleaved rotary)."""
    inv_freq = _ROPE_THETA ** (-np.arange(0, dims.head_size, 2, dtype=np.float64) / dims.head_size)
    angles = np.outer(np.arange(dims.context_length, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rms_norm(g: _Graph, x: str, weight: str) -> str:
    """RMSNorm written with standard ops (x / sqrt(mean(x^2) + eps) * weight)."""
    mean_sq = g.op("ReduceMean", g.op("Mul", x, x), g.const([-1]), keepdims=1)
    rms = g.op("Sqrt", g.op("Add", mean_sq, g.const(_EPS, np.float32)))
    return g.op("Mul", g.op("Div", x, rms), weight)


def _skip_rms_norm(g: _Graph, residual: str, skip: str, weight: str) -> tuple[str, str]:
    """Builder-style fused residual add + RMSNorm; returns (normed, residual + skip)."""
    normed, _, _, total = g.ops(
        "SkipSimplifiedLayerNormalization",
        [residual, skip, weight],
        [None, "", "", None],
        domain=_MS_DOMAIN,
        epsilon=_EPS,
    )
    return normed, total


def _swiglu_mlp(g: _Graph, x: str, gate: str, up: str, down: str) -> str:
    gate_out = g.op("MatMul", x, gate)
    act = g.op("Mul", gate_out, g.op("Sigmoid", gate_out))
    return g.op("MatMul", g.op("Mul", act, g.op("MatMul", x, up)), down)


def gqa_mask_lengths(g: _Graph, mask: str, id_dtype: str) -> tuple[str, str]:
    """The builder's attention-mask subgraph for GroupQueryAttention (Shape/Gather form):
    (``seqlens_k`` = row sums - 1 as int32, ``total_sequence_length`` = the mask's width)."""
    one = g.const([1], _NP_ID_TYPES[id_dtype])
    seqlens_k = g.op("Sub", g.op("ReduceSum", mask, g.const([1]), keepdims=0), one)
    seqlens_k = g.op("Cast", seqlens_k, to=TensorProto.INT32)
    total_len = g.op("Gather", g.op("Shape", mask), g.const(1), axis=0)
    return seqlens_k, g.op("Cast", total_len, to=TensorProto.INT32)


def gqa_layer(
    g: _Graph,
    w: dict,
    dims: _Dims,
    i: int,
    hidden: str,
    residual: str,
    lengths: tuple[str, str, str, str],
    kv_names: tuple[str, str, str, str],
    **attention: object,
) -> tuple[str, str]:
    """Layer ``i`` after its input norm, builder-style: fused QKV MatMul, GroupQueryAttention
    (``lengths``: seqlens_k, total length, cos and sin caches; ``kv_names``: past key, past
    value, present key, present value; ``attention``: extra or overridden attributes),
    o_proj, fused residual add + RMSNorm, SwiGLU MLP. Returns (residual, MLP output)."""
    p = f"layers.{i}"
    qkv_w = np.concatenate([w[f"{i}.q"], w[f"{i}.k"], w[f"{i}.v"]], axis=1)
    qkv = g.op("MatMul", hidden, g.weight(f"{p}.attn.qkv_proj.weight", qkv_w))
    seqlens_k, total_len, cos_cache, sin_cache = lengths
    past_k, past_v, present_k, present_v = kv_names
    attributes: dict[str, object] = {
        "num_heads": dims.num_heads,
        "kv_num_heads": dims.num_kv_heads,
        "scale": float(1.0 / np.sqrt(dims.head_size)),
        "do_rotary": 1,
        "rotary_interleaved": 0,
        "local_window_size": -1,
        "softcap": 0.0,
        **attention,
    }
    attn, _, _ = g.ops(
        "GroupQueryAttention",
        [qkv, "", "", past_k, past_v, seqlens_k, total_len, cos_cache, sin_cache],
        [f"/{p}/attn/output_0", present_k, present_v],
        domain=_MS_DOMAIN,
        **attributes,
    )
    attn = g.op("MatMul", attn, g.weight(f"{p}.attn.o_proj.weight", w[f"{i}.o"]))
    ln2 = g.weight(f"{p}.post_attention_layernorm.weight", w[f"{i}.ln2"])
    hidden, residual = _skip_rms_norm(g, residual, attn, ln2)
    mlp_out = _swiglu_mlp(
        g,
        hidden,
        g.weight(f"{p}.mlp.gate_proj.weight", w[f"{i}.gate"]),
        g.weight(f"{p}.mlp.up_proj.weight", w[f"{i}.up"]),
        g.weight(f"{p}.mlp.down_proj.weight", w[f"{i}.down"]),
    )
    return residual, mlp_out


def plain_layer_tail(g: _Graph, residual: str, attn: str, w: dict, i: int) -> str:
    """Plain ops after a layer's attention: o_proj, residual add, RMSNorm, SwiGLU MLP,
    residual add; returns the new residual."""
    p = f"layers.{i}"
    attn = g.op("MatMul", attn, g.weight(f"{p}.attn.o_proj.weight", w[f"{i}.o"]))
    residual = g.op("Add", residual, attn)
    hidden = _rms_norm(g, residual, g.weight(f"{p}.post_attention_layernorm.weight", w[f"{i}.ln2"]))
    mlp_out = _swiglu_mlp(
        g,
        hidden,
        g.weight(f"{p}.mlp.gate_proj.weight", w[f"{i}.gate"]),
        g.weight(f"{p}.mlp.up_proj.weight", w[f"{i}.up"]),
        g.weight(f"{p}.mlp.down_proj.weight", w[f"{i}.down"]),
    )
    return g.op("Add", residual, mlp_out)


def qkv_heads(
    g: _Graph, w: dict, dims: _Dims, i: int, hidden: str, cos: str, sin: str
) -> tuple[str, str, str]:
    """Layer ``i``'s plain-op q/k/v projections of ``hidden``, split into heads, q and k
    rotated by ``cos``/``sin`` ``[b, 1, s, hd/2]``: (q ``[b, heads, s, hd]``, k, v
    ``[b, kv_heads, s, hd]``)."""
    p, hd = f"layers.{i}", dims.head_size
    q = g.op("MatMul", hidden, g.weight(f"{p}.attn.q_proj.weight", w[f"{i}.q"]))
    k = g.op("MatMul", hidden, g.weight(f"{p}.attn.k_proj.weight", w[f"{i}.k"]))
    v = g.op("MatMul", hidden, g.weight(f"{p}.attn.v_proj.weight", w[f"{i}.v"]))
    q = _rotary(g, _split_heads(g, q, dims.num_heads, hd), cos, sin)
    k = _rotary(g, _split_heads(g, k, dims.num_kv_heads, hd), cos, sin)
    return q, k, _split_heads(g, v, dims.num_kv_heads, hd)


def plain_layer(
    g: _Graph, w: dict, dims: _Dims, i: int, residual: str, cos: str, sin: str, allowed: str
) -> str:
    """Layer ``i`` in plain ops (optimum-style): input RMSNorm, `qkv_heads`, K/V appended to
    ``past_key_values.{i}.*`` as ``present.{i}.*``, masked attention (``allowed``: see
    `_attention_allowed`), `plain_layer_tail`; returns the new residual."""
    ln1 = g.weight(f"layers.{i}.input_layernorm.weight", w[f"{i}.ln1"])
    q, k, v = qkv_heads(g, w, dims, i, _rms_norm(g, residual, ln1), cos, sin)
    k = g.op("Concat", f"past_key_values.{i}.key", k, axis=2, out=f"present.{i}.key")
    v = g.op("Concat", f"past_key_values.{i}.value", v, axis=2, out=f"present.{i}.value")
    return plain_layer_tail(g, residual, _attention(g, q, k, v, allowed, dims), w, i)


def kv_names(i: int) -> tuple[str, str, str, str]:
    """Layer ``i``'s (past key, past value, present key, present value) tensor names."""
    return (
        f"past_key_values.{i}.key",
        f"past_key_values.{i}.value",
        f"present.{i}.key",
        f"present.{i}.value",
    )


def declare_kv(g: _Graph, dims: _Dims, layers: Sequence[int], *, logits: bool = False) -> None:
    """Declare the fp32 ``past_key_values.{i}.*`` inputs ``[batch, kv_heads, past, head_size]``
    and ``present.{i}.*`` outputs ``[batch, kv_heads, total, head_size]`` of ``layers``; with
    ``logits``, the ``logits`` output ``[batch, seq, vocab]`` goes before the presents."""
    kv_in = _kv_shape(dims, dims.num_kv_heads, "past_sequence_length")
    kv_out = _kv_shape(dims, dims.num_kv_heads, "total_sequence_length")
    for i in layers:
        g.input(f"past_key_values.{i}.key", TensorProto.FLOAT, kv_in)
        g.input(f"past_key_values.{i}.value", TensorProto.FLOAT, kv_in)
    if logits:
        g.output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", dims.vocab_size])
    for i in layers:
        g.output(f"present.{i}.key", TensorProto.FLOAT, kv_out)
        g.output(f"present.{i}.value", TensorProto.FLOAT, kv_out)


def gqa_layers(
    g: _Graph,
    w: dict,
    dims: _Dims,
    residual: str,
    lengths: tuple[str, str, str, str],
    attention: Sequence[dict[str, object]] | None = None,
) -> None:
    """All layers of the builder's GroupQueryAttention decoder from the embeddings
    (``residual``) to the ``logits`` output: input RMSNorm, `gqa_layer` per layer
    (``attention[i]``: its extra attributes), the fused final norm, the lm_head."""
    hidden = _rms_norm(g, residual, g.weight("layers.0.input_layernorm.weight", w["0.ln1"]))
    mlp_out = ""
    for i in range(dims.num_layers):
        if i > 0:
            ln1 = g.weight(f"layers.{i}.input_layernorm.weight", w[f"{i}.ln1"])
            hidden, residual = _skip_rms_norm(g, residual, mlp_out, ln1)
        extra = attention[i] if attention else {}
        residual, mlp_out = gqa_layer(
            g, w, dims, i, hidden, residual, lengths, kv_names(i), **extra
        )
    final_norm = g.weight("final_norm.weight", w["final_norm"])
    hidden, _ = _skip_rms_norm(g, residual, mlp_out, final_norm)
    g.op("MatMul", hidden, g.weight("lm_head.weight", w["lm_head"]), out="logits")


def plain_logits(g: _Graph, residual: str, w: dict) -> None:
    """Final RMSNorm and the lm_head MatMul into the ``logits`` output."""
    hidden = _rms_norm(g, residual, g.weight("final_norm.weight", w["final_norm"]))
    g.op("MatMul", hidden, g.weight("lm_head.weight", w["lm_head"]), out="logits")


def _dim(g: _Graph, tensor: str, axis: int) -> str:
    """``Shape(tensor)[axis]`` as an int64 scalar."""
    return g.op("Squeeze", g.op("Shape", tensor, start=axis, end=axis + 1), g.const([0]))


def _attention_allowed(g: _Graph, input_ids: str, attention_mask: str) -> str:
    """Bool ``[batch, 1, 1, seq, total]``: key j is visible to query i (causal AND not padding).

    Query i of the new tokens sits at cache index ``total - seq + i``.
    """
    seq = _dim(g, input_ids, 1)
    total = _dim(g, attention_mask, 1)
    key_pos = g.op("Range", g.const(0), total, g.const(1))
    query_pos = g.op("Range", g.op("Sub", total, seq), total, g.const(1))
    causal = g.op("LessOrEqual", key_pos, g.op("Unsqueeze", query_pos, g.const([1])))
    not_pad = g.op("Cast", attention_mask, to=TensorProto.BOOL)
    not_pad = g.op("Unsqueeze", not_pad, g.const([1, 2, 3]))  # [batch, 1, 1, 1, total]
    return g.op("And", causal, not_pad)


def _split_heads(g: _Graph, x: str, heads: int, head_size: int) -> str:
    """``[batch, seq, heads * head_size]`` -> ``[batch, heads, seq, head_size]``."""
    x = g.op("Reshape", x, g.const([0, 0, heads, head_size]))
    return g.op("Transpose", x, perm=[0, 2, 1, 3])


def _rotary(g: _Graph, x: str, cos: str, sin: str) -> str:
    """Non-interleaved rotary on ``[batch, heads, seq, head_size]``; cos/sin ``[b, 1, s, hd/2]``."""
    x1, x2 = g.ops("Split", [x], 2, axis=-1, num_outputs=2)
    first = g.op("Sub", g.op("Mul", x1, cos), g.op("Mul", x2, sin))
    second = g.op("Add", g.op("Mul", x2, cos), g.op("Mul", x1, sin))
    return g.op("Concat", first, second, axis=-1)


def _attention(g: _Graph, q: str, k: str, v: str, allowed: str, dims: _Dims) -> str:
    """Grouped scaled-dot-product attention with plain ops.

    q ``[b, heads, s, hd]``, k/v ``[b, kv_heads, t, hd]``, allowed ``[b, 1, 1, s, t]``;
    returns ``[b, s, heads * hd]``.
    """
    hd, kv = dims.head_size, dims.num_kv_heads
    group = dims.num_heads // kv
    q5 = g.op("Reshape", q, g.const([0, kv, group, -1, hd]))
    k5 = g.op("Unsqueeze", k, g.const([2]))
    v5 = g.op("Unsqueeze", v, g.const([2]))
    scores = g.op("MatMul", q5, g.op("Transpose", k5, perm=[0, 1, 2, 4, 3]))
    scores = g.op("Mul", scores, g.const(1.0 / np.sqrt(hd), np.float32))
    scores = g.op("Where", allowed, scores, g.const(_MASKED, np.float32))
    ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v5)  # [b, kv, group, s, hd]
    ctx = g.op("Reshape", ctx, g.const([0, dims.num_heads, -1, hd]))
    ctx = g.op("Transpose", ctx, perm=[0, 2, 1, 3])
    return g.op("Reshape", ctx, g.const([0, 0, dims.num_heads * hd]))


def _id_elem_type(id_dtype: str) -> int:
    if id_dtype not in _ID_TYPES:
        raise ValueError(f"id_dtype must be 'int64' or 'int32', got {id_dtype!r}")
    return _ID_TYPES[id_dtype]


def _kv_shape(dims: _Dims, heads: int, seq: str) -> list[int | str]:
    return ["batch_size", heads, seq, dims.head_size]


def _bpe_pieces(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """BPE of ``word``: repeatedly merge the adjacent pair of lowest rank, leftmost first."""
    pieces = list(word)
    while len(pieces) > 1:
        best: tuple[int, int] | None = None
        for i in range(len(pieces) - 1):
            rank = ranks.get((pieces[i], pieces[i + 1]))
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        pieces[i : i + 2] = [pieces[i] + pieces[i + 1]]
    return pieces


def _build_tokenizer_vocab(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab: dict[str, int] = {}
    for token in (*_SPECIAL_TOKENS, *_ALPHABET):
        vocab[token] = len(vocab)
    merges: list[tuple[str, str]] = []

    def candidates() -> Iterator[str]:
        yield from _MERGE_TARGETS
        for a in _ALPHABET[1:27]:
            yield _SPACE + a
        for a in _ALPHABET[1:27]:
            for b in _ALPHABET[1:27]:
                yield a + b
        # Then ever longer words, breadth first: each extends a word already in the vocabulary
        # by one letter, so it is always reachable by a merge and the supply never ends.
        frontier = [a + b for a in _ALPHABET[1:27] for b in _ALPHABET[1:27]]
        while True:
            grown = []
            for word in frontier:
                for letter in _ALPHABET[1:27]:
                    grown.append(word + letter)
                    yield word + letter
            frontier = grown

    ranks: dict[tuple[str, str], int] = {}
    for target in candidates():
        if len(vocab) >= vocab_size:
            break
        if target in vocab:
            continue
        # A target joins the vocabulary only through the merge of the two pieces the merges so
        # far split it into, so that BPE of its text gives it back whole. A merge of any other
        # split (say "▁i"+"n" where "i"+"n" ranks first) would leave it unreachable by BPE,
        # yet the reference still emits it: its BPE looks each pre-tokenized word up in the
        # vocabulary before merging, and the two engines would split that word differently.
        pieces = _bpe_pieces(target, ranks)
        if len(pieces) == 2:
            ranks[(pieces[0], pieces[1])] = len(merges)
            merges.append((pieces[0], pieces[1]))
            vocab[target] = len(vocab)
    return vocab, merges


def _write_tokenizer(
    folder: pathlib.Path,
    vocab_size: int,
    *,
    bos_token_id: int,
    eos_token_id: int,
    pad_token_id: int,
    context_length: int,
) -> None:
    """Write a Llama-style (SentencePiece-like BPE) tokenizer.json and tokenizer_config.json."""
    vocab, merges = _build_tokenizer_vocab(vocab_size)
    tokenizer = Tokenizer(tokenizer_models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    # No dummy-prefix space: with ``Prepend`` + ``Strip`` the reference's tokenizer and
    # ``tokenizers`` disagree on leading spaces; without them both encode and decode alike.
    tokenizer.normalizer = normalizers.Replace(" ", _SPACE)
    # A Split on a string that never occurs: no pre-tokenization, and the reference reads it as
    # such (without a pre_tokenizer it splits with Llama's regex and looks each piece up whole).
    tokenizer.pre_tokenizer = pre_tokenizers.Split(_NO_SPLIT, "isolated")
    tokenizer.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.Fuse()])
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in _SPECIAL_TOKENS[:3]])
    if tokenizer.get_vocab_size() != vocab_size:
        raise AssertionError("tokenizer vocabulary size mismatch")
    words = [t for t in vocab if t not in _SPECIAL_TOKENS]
    encoded = tokenizer.encode_batch([w.replace(_SPACE, " ") for w in words])
    if any(e.ids != [vocab[w]] for w, e in zip(words, encoded, strict=True)):
        raise AssertionError("a tokenizer vocabulary entry does not encode to itself")
    tokenizer.save(str(folder / "tokenizer.json"))

    id_to_token = {i: t for t, i in vocab.items()}
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": id_to_token[bos_token_id],
        "eos_token": id_to_token[eos_token_id],
        "pad_token": id_to_token[pad_token_id],
        "unk_token": "<unk>",
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "LlamaTokenizer",
        "chat_template": _CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def decoder_section(
    dims: _Dims, inputs: dict[str, str], outputs: dict[str, str], filename: str | None
) -> dict[str, object]:
    """The ``model.decoder`` section of `genai_config.json` for a graph of ``dims`` (no
    ``filename`` when None: a pipeline's stages name theirs)."""
    return graph_section(
        filename,
        head_size=dims.head_size,
        hidden_size=dims.hidden_size,
        num_heads=dims.num_heads,
        num_kv_heads=dims.num_kv_heads,
        num_layers=dims.num_layers,
        inputs=inputs,
        outputs=outputs,
    )


def _write_folder(
    out_dir: str | pathlib.Path,
    name: str,
    model: onnx.ModelProto,
    *,
    model_type: str,
    dims: _Dims,
    inputs: dict[str, str],
    outputs: dict[str, str],
    share_buffer: bool,
    bos_token_id: int,
    eos_token_id: int,
    pad_token_id: int,
) -> pathlib.Path:
    """Write model.onnx, genai_config.json and the tokenizer files into ``out_dir / name``."""
    for token_id in (bos_token_id, eos_token_id, pad_token_id):
        if not 0 <= token_id < dims.vocab_size:
            raise ValueError(f"special token id {token_id} outside the vocabulary")
    folder = pathlib.Path(out_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    config = {
        "model": {
            "bos_token_id": bos_token_id,
            "context_length": dims.context_length,
            "decoder": decoder_section(dims, inputs, outputs, "model.onnx"),
            "eos_token_id": eos_token_id,
            "pad_token_id": pad_token_id,
            "type": model_type,
            "vocab_size": dims.vocab_size,
        },
        "search": search_section(dims.context_length, share_buffer=share_buffer, top_k=50),
    }
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    _write_tokenizer(
        folder,
        dims.vocab_size,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        context_length=dims.context_length,
    )
    return folder


#: `genai_config.json` inputs of a graph fed ids, mask, position ids and split K/V pasts.
_POSITION_SPLIT_KV_INPUTS = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "position_ids": "position_ids",
    **SPLIT_KV_INPUTS,
}


# --------------------------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------------------------


def write_gqa_decoder(
    out_dir: str | pathlib.Path,
    *,
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    context_length: int = 128,
    seed: int = 0,
    id_dtype: IdDtype = "int64",
    share_buffer: bool = True,
    eos_token_id: int = 2,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    name: str = "gqa-decoder",
    sliding_window: int | None = None,
    local_layers: Sequence[int] | None = None,
    window_cache: bool = True,
    cache_slack: int | None = None,
    static_mask: bool = False,
) -> pathlib.Path:
    """Write a builder-style GroupQueryAttention decoder folder into ``out_dir / name``.

    Graph inputs: ``input_ids`` ``[batch, seq]`` and ``attention_mask`` ``[batch, total]`` (both
    ``id_dtype``), ``past_key_values.{i}.key|value`` fp32 ``[batch, kv_heads, past, head_size]``.
    Outputs: ``logits`` fp32 ``[batch, seq, vocab]``, ``present.{i}.key|value`` fp32
    ``[batch, kv_heads, total, head_size]``. Rotary runs inside GroupQueryAttention
    (``do_rotary=1``, cos/sin caches of ``context_length`` rows), so there is no ``position_ids``.
    ``search.past_present_share_buffer`` is ``share_buffer`` (GQA handles both layouts).
    Same arguments as :func:`write_optimum_decoder` give the same weights and function.

    ``sliding_window`` W (Gemma-2/3-style local attention): the layers in ``local_layers``
    (default: the even ones, as Gemma 2) attend to the last W positions only
    (``local_window_size=W``) and, with ``window_cache``, keep a window-sized KV cache that the
    op compacts itself (``sliding_window_cache=1``, as the reference's builder exports for the
    CPU); the other layers are global. The config gets the builder's
    ``model.decoder.sliding_window`` block (``window_size``, ``layers``, ``cache_slack`` when
    given). ``window_cache=False`` writes window-masked layers with full-length caches and no
    ``sliding_window`` block (what the builder emits for other execution providers).

    ``static_mask``: the attention-mask arithmetic the reference's builder emits for WebGPU
    graph capture (``enable_webgpu_graph``): Cast to int32, ReduceSum, then ``seqlens_k = sum
    - 1`` and ``total_sequence_length = ReduceMax(sum)``. The length comes from the mask's
    contents, not its shape (no Shape/Gather, which an EP leaves to the CPU), so the mask can
    be a static ``[batch, max_length]`` buffer of ones then zeros. Same function otherwise.
    """
    dims = _Dims(
        vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, context_length, gqa=True
    )
    local: tuple[int, ...] = ()
    if sliding_window is not None:
        if sliding_window <= 0:
            raise ValueError(f"sliding_window must be > 0, got {sliding_window}")
        local = tuple(range(0, num_layers, 2)) if local_layers is None else tuple(local_layers)
        if any(not 0 <= i < num_layers for i in local):
            raise ValueError(f"local_layers {list(local)} outside [0, {num_layers})")
    elif local_layers:
        raise ValueError("local_layers needs sliding_window")
    ids_type = _id_elem_type(id_dtype)
    w = _llama_weights(dims, seed, (bos_token_id, eos_token_id, pad_token_id))
    cos, sin = _rotary_tables(dims)
    g = _Graph("gqa_decoder")

    input_ids = g.input("input_ids", ids_type, ["batch_size", "sequence_length"])
    mask = g.input("attention_mask", ids_type, ["batch_size", "total_sequence_length"])
    declare_kv(g, dims, range(num_layers), logits=True)

    # Builder's "attn_mask_reformat" subgraph.
    if static_mask:
        mask32 = mask if id_dtype == "int32" else g.op("Cast", mask, to=TensorProto.INT32)
        lengths = g.op("ReduceSum", mask32, g.const([1]), keepdims=0)
        seqlens_k = g.op("Sub", lengths, g.const([1], np.int32))
        total_len = g.op("ReduceMax", lengths, keepdims=0)
    else:
        seqlens_k, total_len = gqa_mask_lengths(g, mask, id_dtype)
    cos_cache = g.weight("cos_cache", cos)
    sin_cache = g.weight("sin_cache", sin)

    residual = g.op("Gather", g.weight("embed_tokens.weight", w["embed"]), input_ids, axis=0)
    windows: list[dict[str, object]] = []
    for i in range(num_layers):
        window: dict[str, object] = {"local_window_size": sliding_window if i in local else -1}
        if i in local and window_cache:
            window["sliding_window_cache"] = 1
        windows.append(window)
    gqa_layers(g, w, dims, residual, (seqlens_k, total_len, cos_cache, sin_cache), windows)

    folder = _write_folder(
        out_dir,
        name,
        g.model(),
        model_type="llama",
        dims=dims,
        inputs={"input_ids": "input_ids", "attention_mask": "attention_mask", **SPLIT_KV_INPUTS},
        outputs=SPLIT_KV_OUTPUTS,
        share_buffer=share_buffer,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    if local and window_cache:
        path = folder / "genai_config.json"
        config = json.loads(path.read_text())
        block: dict[str, object] = {
            "window_size": sliding_window,
            "slide_key_value_cache": False,
            "slide_inputs": False,
            "layers": list(local),
        }
        if cache_slack is not None:
            block["cache_slack"] = cache_slack
        config["model"]["decoder"]["sliding_window"] = block
        path.write_text(json.dumps(config, indent=4) + "\n")
    return folder


def write_optimum_decoder(
    out_dir: str | pathlib.Path,
    *,
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    context_length: int = 128,
    seed: int = 0,
    id_dtype: IdDtype = "int64",
    eos_token_id: int = 2,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    name: str = "optimum-decoder",
) -> pathlib.Path:
    """Write an HF/optimum-style Llama decoder (plain ONNX ops) into ``out_dir / name``.

    Graph inputs: ``input_ids`` ``[batch, seq]``, ``attention_mask`` ``[batch, total]``,
    ``position_ids`` ``[batch, seq]`` (all ``id_dtype``), ``past_key_values.{i}.key|value`` fp32
    ``[batch, kv_heads, past, head_size]``. Outputs: ``logits`` ``[batch, seq, vocab]`` and
    ``present.{i}.key|value`` = past concatenated with the new K/V ``[batch, kv_heads, past + seq,
    head_size]``. Rotary uses cos/sin rows gathered by ``position_ids``; attention allows key ``j``
    for query ``i`` when ``j <= past + i`` and ``attention_mask[j] == 1``.
    ``past_present_share_buffer`` is false. Same arguments as :func:`write_gqa_decoder` give the
    same weights and function.
    """
    dims = _Dims(vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, context_length)
    ids_type = _id_elem_type(id_dtype)
    w = _llama_weights(dims, seed, (bos_token_id, eos_token_id, pad_token_id))
    cos, sin = _rotary_tables(dims)
    g = _Graph("optimum_decoder")

    input_ids = g.input("input_ids", ids_type, ["batch_size", "sequence_length"])
    mask = g.input("attention_mask", ids_type, ["batch_size", "total_sequence_length"])
    position_ids = g.input("position_ids", ids_type, ["batch_size", "sequence_length"])
    declare_kv(g, dims, range(num_layers), logits=True)

    allowed = _attention_allowed(g, input_ids, mask)
    unsq = g.const([1])
    cos_pos = g.op("Unsqueeze", g.op("Gather", g.weight("cos_table", cos), position_ids), unsq)
    sin_pos = g.op("Unsqueeze", g.op("Gather", g.weight("sin_table", sin), position_ids), unsq)

    residual = g.op("Gather", g.weight("embed_tokens.weight", w["embed"]), input_ids, axis=0)
    for i in range(num_layers):
        residual = plain_layer(g, w, dims, i, residual, cos_pos, sin_pos, allowed)
    plain_logits(g, residual, w)

    return _write_folder(
        out_dir,
        name,
        g.model(),
        model_type="llama",
        dims=dims,
        inputs=_POSITION_SPLIT_KV_INPUTS,
        outputs=SPLIT_KV_OUTPUTS,
        share_buffer=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def write_gpt2_decoder(
    out_dir: str | pathlib.Path,
    *,
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    context_length: int = 128,
    seed: int = 0,
    id_dtype: IdDtype = "int64",
    eos_token_id: int = 2,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    name: str = "gpt2-decoder",
) -> pathlib.Path:
    """Write a GPT-2 style decoder with combined K/V caches into ``out_dir / name``.

    Graph inputs: ``input_ids``, ``attention_mask``, ``position_ids`` (``id_dtype``; ``[batch,
    seq]``, ``[batch, total]``, ``[batch, seq]``), ``past_{i}`` fp32 ``[2, batch, heads, past,
    head_size]`` (index 0 = key, 1 = value). Outputs: ``logits`` ``[batch, seq, vocab]``,
    ``present_{i}`` ``[2, batch, heads, past + seq, head_size]``. Learned position embeddings
    (``context_length`` rows) gathered by ``position_ids``, LayerNormalization, tanh-GELU MLP,
    biases everywhere, untied lm_head. genai_config: ``model.type`` "gpt2",
    ``past_names`` "past_%d", ``present_names`` "present_%d", no shared buffer.
    """
    dims = _Dims(vocab_size, hidden_size, num_layers, num_heads, num_heads, context_length)
    ids_type = _id_elem_type(id_dtype)
    d, hd = hidden_size, dims.head_size
    g = _Graph("gpt2_decoder")

    input_ids = g.input("input_ids", ids_type, ["batch_size", "sequence_length"])
    mask = g.input("attention_mask", ids_type, ["batch_size", "total_sequence_length"])
    position_ids = g.input("position_ids", ids_type, ["batch_size", "sequence_length"])
    for i in range(num_layers):
        g.input(
            f"past_{i}", TensorProto.FLOAT, [2, *_kv_shape(dims, num_heads, "past_sequence_length")]
        )
    g.output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab_size])
    for i in range(num_layers):
        g.output(
            f"present_{i}",
            TensorProto.FLOAT,
            [2, *_kv_shape(dims, num_heads, "total_sequence_length")],
        )

    w = _gpt2_weights(dims, seed, (bos_token_id, eos_token_id, pad_token_id))

    def param(name: str) -> str:
        return g.weight(name, w[name])

    def layer_norm(x: str, prefix: str) -> str:
        gamma, beta = param(f"{prefix}.weight"), param(f"{prefix}.bias")
        return g.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=_EPS)

    def linear(x: str, prefix: str) -> str:
        return g.op("Add", g.op("MatMul", x, param(f"{prefix}.weight")), param(f"{prefix}.bias"))

    allowed = _attention_allowed(g, input_ids, mask)
    hidden = g.op(
        "Add",
        g.op("Gather", param("wte"), input_ids, axis=0),
        g.op("Gather", param("wpe"), position_ids, axis=0),
    )
    for i in range(num_layers):
        p = f"h.{i}"
        x = layer_norm(hidden, f"{p}.ln_1")
        qkv = linear(x, f"{p}.attn.c_attn")
        q, k, v = (
            _split_heads(g, t, num_heads, hd)
            for t in g.ops("Split", [qkv, g.const([d, d, d])], 3, axis=-1)
        )
        past_k = g.op("Gather", f"past_{i}", g.const(0), axis=0)
        past_v = g.op("Gather", f"past_{i}", g.const(1), axis=0)
        k = g.op("Concat", past_k, k, axis=2)
        v = g.op("Concat", past_v, v, axis=2)
        unsq = g.const([0])
        g.op(
            "Concat",
            g.op("Unsqueeze", k, unsq),
            g.op("Unsqueeze", v, unsq),
            axis=0,
            out=f"present_{i}",
        )
        attn = linear(_attention(g, q, k, v, allowed, dims), f"{p}.attn.c_proj")
        hidden = g.op("Add", hidden, attn)
        x = layer_norm(hidden, f"{p}.ln_2")
        x = g.op("Gelu", linear(x, f"{p}.mlp.c_fc"), approximate="tanh")
        hidden = g.op("Add", hidden, linear(x, f"{p}.mlp.c_proj"))
    hidden = layer_norm(hidden, "ln_f")
    g.op("MatMul", hidden, param("lm_head"), out="logits")

    return _write_folder(
        out_dir,
        name,
        g.model(),
        model_type="gpt2",
        dims=dims,
        inputs={
            "input_ids": "input_ids",
            "attention_mask": "attention_mask",
            "position_ids": "position_ids",
            "past_names": "past_%d",
        },
        outputs={"logits": "logits", "present_names": "present_%d"},
        share_buffer=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


# --------------------------------------------------------------------------------------------
# Graph edits on a written folder (the reference's own test-model recipes)
# --------------------------------------------------------------------------------------------


def save_external_data(folder: str | pathlib.Path, location: str = "model.onnx.data") -> None:
    """Re-save ``folder/model.onnx`` with its weights in the external-data file ``location``
    beside it (the builder's layout: ``model.onnx`` + ``model.onnx.data``)."""
    path = pathlib.Path(folder) / "model.onnx"
    model = onnx.load(str(path))
    for stale in {
        e.value
        for t in model.graph.initializer
        for e in t.external_data
        if e.key == "location" and e.value != location
    }:
        (path.parent / stale).unlink(missing_ok=True)
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
        location=location, size_threshold=1024,
    )  # fmt: skip


def _logits_producer(model: onnx.ModelProto, logits: str) -> onnx.NodeProto:
    for node in model.graph.node:
        if logits in node.output:
            return node
    raise ValueError(f"no node of the graph writes {logits!r}")


def add_logits_addend_input(
    folder: str | pathlib.Path,
    name: str,
    *,
    elem_type: int = TensorProto.FLOAT,
    shape: Sequence[int | str] = (),
    default: np.ndarray | None = None,
    logits: str = "logits",
    location: str = "model.data",
) -> None:
    """Add graph input ``name`` whose value (cast to float) is added to the logits, as the
    reference's tests build their extra-input and adapter models: the node writing
    ``logits`` now writes ``logits_0``, then ``logits = Cast(name) + logits_0``. ``default``:
    also an initializer of that name (an input the session may be fed, or not). Calling it
    twice with two names adds both (``logits = a + (b + logits_0)``). The model is saved with
    external data in ``location``."""
    path = pathlib.Path(folder) / "model.onnx"
    model = onnx.load(str(path))
    producer = _logits_producer(model, logits)
    inner = f"{logits}_before_{name}"
    producer.output[list(producer.output).index(logits)] = inner
    model.graph.input.append(onnx.helper.make_tensor_value_info(name, elem_type, list(shape)))
    if default is not None:
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(default), name))
    addend = name
    if elem_type != TensorProto.FLOAT:
        addend = f"{name}_as_float"
        model.graph.node.append(
            onnx.helper.make_node("Cast", [name], [addend], to=TensorProto.FLOAT)
        )
    model.graph.node.append(onnx.helper.make_node("Add", [addend, inner], [logits]))
    path.unlink()
    onnx.save_model(model, str(path), save_as_external_data=True, location=location)


def expose_hidden_states(
    folder: str | pathlib.Path, name: str = "hidden_states", *, logits: str = "logits"
) -> None:
    """Add graph output ``name``: the final hidden state the lm_head reads (``[batch, seq,
    hidden]`` fp32), as a builder export with ``include_hidden_states`` has. The config's
    ``model.decoder.outputs`` is left as it is."""
    path = pathlib.Path(folder) / "model.onnx"
    model = onnx.load(str(path))
    producer = _logits_producer(model, logits)
    hidden = producer.input[0]
    model.graph.node.append(onnx.helper.make_node("Identity", [hidden], [name]))
    model.graph.output.append(
        onnx.helper.make_tensor_value_info(
            name, TensorProto.FLOAT, ["batch_size", "sequence_length", "hidden_size"]
        )
    )
    onnx.save_model(model, str(path))
