"""Tiny random-weight checkpoints for the builder's tests, and a NumPy forward pass.

* :data:`ARCH_CONFIGS` -- one small Hugging Face ``config.json`` per supported architecture.
* :func:`random_weights` -- HF-named float32 weights for a config.
* :func:`write_hf_checkpoint` -- ``config.json`` + ``model.safetensors`` + tokenizer files
  (needs the ``safetensors`` package).
* :func:`write_gguf_checkpoint` -- the same weights as a GGUF file, converted the way
  llama.cpp's converter does it (tensor names, llama's q/k row permutation, Gemma's ``1 + w``
  norms, Phi-3's fused tensors, llama3 rope factors as ``rope_freqs.weight``); needs ``gguf``.
* :func:`numpy_forward` -- logits for every position, written from the HF modelling code's
  definitions (not from the builder's spec), so it checks the builder independently.

The tokenizer is a byte-level BPE: three ChatML specials, the 256 byte symbols, then merges.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

__all__ = [
    "ARCH_CONFIGS",
    "numpy_forward",
    "random_weights",
    "write_gguf_checkpoint",
    "write_hf_checkpoint",
]

_BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 320,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}

ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        **_BASE,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": True,
    },
    "llama3": {
        **_BASE,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": False,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "mistral": {
        **_BASE,
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "tie_word_embeddings": False,
        "sliding_window": 8,
    },
    "qwen2": {
        **_BASE,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    "qwen3": {
        **_BASE,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "tie_word_embeddings": True,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
    },
    "phi3": {
        **_BASE,
        "model_type": "phi3",
        "architectures": ["Phi3ForCausalLM"],
        "tie_word_embeddings": False,
        "sliding_window": 12,
        "num_key_value_heads": 4,
    },
    "gemma": {
        **_BASE,
        "model_type": "gemma",
        "architectures": ["GemmaForCausalLM"],
        "num_key_value_heads": 1,
        "head_dim": 16,
        "hidden_act": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
    },
    "gemma2": {
        **_BASE,
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    "gemma3_text": {
        **_BASE,
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
    },
}

_GEMMA = ("gemma", "gemma2", "gemma3_text")


def _head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def random_weights(cfg: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights for ``cfg`` (random, scaled to keep activations tame)."""
    rng = np.random.default_rng(seed)
    mt = cfg["model_type"]
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = _head_dim(cfg)
    hq, hk = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def mat(rows: int, cols: int, std: float | None = None) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * (std or 1.0 / math.sqrt(cols))).astype(
            np.float32
        )

    def norm(n: int) -> np.ndarray:
        base = 0.0 if mt in _GEMMA else 1.0
        return (base + 0.1 * rng.standard_normal(n)).astype(np.float32)

    emb_std = 1.0 / math.sqrt(d) if mt in _GEMMA else 1.0
    w = {"model.embed_tokens.weight": mat(v, d, emb_std), "model.norm.weight": norm(d)}
    if not cfg.get("tie_word_embeddings", mt in _GEMMA):
        w["lm_head.weight"] = mat(v, d, 2.0 / math.sqrt(d))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        q, k, val = mat(hq, d), mat(hk, d), mat(hk, d)
        o = mat(d, hq)
        gate, up, down = mat(f, d), mat(f, d), mat(d, f)
        if mt == "phi3":
            w[p + "self_attn.qkv_proj.weight"] = np.concatenate([q, k, val])
            w[p + "mlp.gate_up_proj.weight"] = np.concatenate([gate, up])
        else:
            w[p + "self_attn.q_proj.weight"] = q
            w[p + "self_attn.k_proj.weight"] = k
            w[p + "self_attn.v_proj.weight"] = val
            w[p + "mlp.gate_proj.weight"] = gate
            w[p + "mlp.up_proj.weight"] = up
        w[p + "self_attn.o_proj.weight"] = o
        w[p + "mlp.down_proj.weight"] = down
        if mt == "qwen2":
            for name, n in (("q", hq), ("k", hk), ("v", hk)):
                w[p + f"self_attn.{name}_proj.bias"] = (0.2 * rng.standard_normal(n)).astype(
                    np.float32
                )
        if mt in ("qwen3", "gemma3_text"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        if mt in ("gemma2", "gemma3_text"):
            w[p + "pre_feedforward_layernorm.weight"] = norm(d)
            w[p + "post_feedforward_layernorm.weight"] = norm(d)
    return w


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def add_merges(tokens: list[str], size: int) -> list[tuple[str, str]]:
    """Append the fixture BPE's merged tokens (``Ġ`` + a common letter, then pairs of common
    letters) to ``tokens`` until it holds ``size`` (or the merges run out); returns the
    merges."""
    merges: list[tuple[str, str]] = []
    letters = "etaoinshrdlu"
    pairs = [("Ġ", c) for c in letters] + [(a, b) for a in letters for b in letters]
    for a, b in pairs:
        if len(tokens) >= size:
            break
        tokens.append(a + b)
        merges.append((a, b))
    return merges


def byte_level_tokenizer(
    tokens: list[str], merges: list[tuple[str, str]], specials: Sequence[str]
) -> Tokenizer:
    """A byte-level BPE over ``tokens`` (ids in order) and ``merges``, with ``specials`` as
    special added tokens (their ids in ``tokens``, or after it)."""
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def tokenizer_vocab(vocab_size: int) -> tuple[list[str], list[tuple[str, str]]]:
    """(tokens by id, merges) of the fixture byte-level BPE."""
    tokens = [*SPECIALS, *byte_symbols()]
    merges = add_merges(tokens, vocab_size)
    if len(tokens) != vocab_size:
        raise ValueError(f"fixture vocab_size must be in [{len(SPECIALS) + 256}, {len(tokens)}]")
    return tokens, merges


def _write_tokenizer(folder: Path, vocab_size: int, context: int) -> None:
    tok = byte_level_tokenizer(*tokenizer_vocab(vocab_size), SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "bos_token": SPECIALS[1],
        "eos_token": SPECIALS[2],
        "pad_token": SPECIALS[2],
        "unk_token": SPECIALS[0],
        "model_max_length": context,
        "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def write_hf_checkpoint(
    folder: str | Path, cfg: dict[str, Any], weights: dict[str, np.ndarray], bf16: bool = False
) -> Path:
    """A Hugging Face folder: config.json, model.safetensors, tokenizer files."""
    from safetensors.numpy import save_file  # lazy: safetensors is a test-only dependency

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if bf16:  # store the upper halves: the safetensors header says BF16
        tensors = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in weights.items()}
        save_file(tensors, str(out / "model.safetensors"))
        _retag_bf16(out / "model.safetensors")
    else:
        save_file(
            {k: np.ascontiguousarray(v) for k, v in weights.items()}, str(out / "model.safetensors")
        )
    _write_tokenizer(out, cfg["vocab_size"], cfg["max_position_embeddings"])
    return out


def _retag_bf16(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n].replace(b'"U16"', b'"BF16"')
    header = header + b" " * (n - len(header)) if len(header) <= n else header
    new_n = len(header)
    path.write_bytes(new_n.to_bytes(8, "little") + header + raw[8 + n :])


def bf16_round(w: np.ndarray) -> np.ndarray:
    """``w`` truncated to bfloat16 (what a BF16 checkpoint of it holds), as float32."""
    return ((w.view(np.uint32) >> 16) << 16).view(np.float32)


# --------------------------------------------------------------------------------------------
# GGUF conversion (llama.cpp conventions)
# --------------------------------------------------------------------------------------------

_GGUF_ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}
_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    shape = w.shape
    return w.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_tensors(cfg: dict[str, Any], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF weights renamed/reshaped as llama.cpp's converter would store them."""
    mt = cfg["model_type"]
    sandwich = mt in ("gemma2", "gemma3_text")
    out: dict[str, np.ndarray] = {}
    for name, w in weights.items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            layer, key = name.removeprefix("model.layers.").split(".", 1)
            if key == "post_attention_layernorm.weight":
                gkey = "post_attention_norm.weight" if sandwich else "ffn_norm.weight"
            else:
                gkey = _GGUF_NAMES[key]
            gname = f"blk.{layer}.{gkey}"
            if _GGUF_ARCH[mt] == "llama" and key.startswith(
                ("self_attn.q_proj", "self_attn.k_proj")
            ):
                heads = (
                    cfg["num_attention_heads"] if "q_proj" in key else cfg["num_key_value_heads"]
                )
                w = _permute(w, heads)
        if mt in _GEMMA and name.endswith("norm.weight"):
            w = w + np.float32(1.0)
        out[gname] = np.ascontiguousarray(w, dtype=np.float32)
    return out


def write_gguf_checkpoint(
    path: str | Path,
    cfg: dict[str, Any],
    weights: dict[str, np.ndarray],
    quant: str | None = None,
) -> Path:
    """Write ``weights`` as a GGUF file; 2-D weights in ggml type ``quant`` when given
    (e.g. ``"Q8_0"``; F32 otherwise). Returns the path."""
    import gguf  # lazy: gguf is a test-only dependency

    path = Path(path)
    mt = cfg["model_type"]
    arch = _GGUF_ARCH[mt]
    hd = _head_dim(cfg)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if cfg.get("layer_types"):
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
    if cfg.get("attn_logit_softcapping"):
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    tensors = gguf_tensors(cfg, weights)
    if (cfg.get("rope_scaling") or {}).get("rope_type") == "llama3":
        base = _inv_freq(cfg, scaled=False)
        tensors["rope_freqs.weight"] = (base / _inv_freq(cfg)).astype(np.float32)
    tokens, merges = tokenizer_vocab(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["pad_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, array in tensors.items():
        if quant and array.ndim == 2:
            qtype = gguf.GGMLQuantizationType[quant]
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def quantized_view(weights: dict[str, np.ndarray], quant: str) -> dict[str, np.ndarray]:
    """``weights`` with every 2-D tensor passed through ggml ``quant`` and back (what a GGUF
    written with :func:`write_gguf_checkpoint` holds)."""
    import gguf  # lazy: gguf is a test-only dependency

    qtype = gguf.GGMLQuantizationType[quant]
    out = copy.copy(weights)
    for name, w in weights.items():
        if w.ndim == 2:
            out[name] = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).astype(
                np.float32
            )
    return out


# --------------------------------------------------------------------------------------------
# NumPy forward pass (HF semantics)
# --------------------------------------------------------------------------------------------


def _inv_freq(cfg: dict[str, Any], scaled: bool = True, local: bool = False) -> np.ndarray:
    hd = _head_dim(cfg)
    theta = cfg.get("rope_local_base_freq", 10000.0) if local else cfg["rope_theta"]
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    rs = cfg.get("rope_scaling")
    if not scaled or local or not rs:
        return inv
    if rs["rope_type"] == "linear":
        return inv / rs["factor"]
    # llama3: long wavelengths divided by factor, short kept, smooth blend in between
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(f)
        elif wavelen > old / lo:
            out.append(f / factor)
        else:
            s = (old / wavelen - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return np.array(out)


def _rms(x: np.ndarray, w: np.ndarray, eps: float, gemma: bool) -> np.ndarray:
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps)
    return y * ((1.0 + w) if gemma else w)


def _rope(x: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """x ``[heads, n, hd]``, HF rotate_half convention."""
    n = x.shape[1]
    ang = np.outer(np.arange(n), inv)
    cos = np.concatenate([np.cos(ang)] * 2, -1)
    sin = np.concatenate([np.sin(ang)] * 2, -1)
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


_erf = np.vectorize(math.erf, otypes=[np.float64])


def numpy_forward(
    cfg: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int]
) -> np.ndarray:
    """float64 logits ``[len(ids), vocab]`` for one unpadded sequence."""
    mt = cfg["model_type"]
    gemma = mt in _GEMMA
    sandwich = mt in ("gemma2", "gemma3_text")
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    eps = cfg["rms_norm_eps"]
    d, nh, nk = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = _head_dim(cfg)
    n = len(ids)
    x = W["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * math.sqrt(d)
    layer_types = cfg.get("layer_types")
    # Gemma's MLPs read hidden_activation (tanh GELU when unset), the others hidden_act
    if gemma:
        act_name = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
    else:
        act_name = cfg.get("hidden_act") or "silu"
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, W[p + "input_layernorm.weight"], eps, gemma)
        if mt == "phi3":
            q, k, v = np.split(
                h @ W[p + "self_attn.qkv_proj.weight"].T, [nh * hd, (nh + nk) * hd], -1
            )
        else:
            q = h @ W[p + "self_attn.q_proj.weight"].T
            k = h @ W[p + "self_attn.k_proj.weight"].T
            v = h @ W[p + "self_attn.v_proj.weight"].T
            if p + "self_attn.q_proj.bias" in W:
                q = q + W[p + "self_attn.q_proj.bias"]
                k = k + W[p + "self_attn.k_proj.bias"]
                v = v + W[p + "self_attn.v_proj.bias"]
        q = q.reshape(n, nh, hd).transpose(1, 0, 2)
        k = k.reshape(n, nk, hd).transpose(1, 0, 2)
        v = v.reshape(n, nk, hd).transpose(1, 0, 2)
        if p + "self_attn.q_norm.weight" in W:
            q = _rms(q, W[p + "self_attn.q_norm.weight"], eps, gemma)
            k = _rms(k, W[p + "self_attn.k_norm.weight"], eps, gemma)
        if layer_types:
            sliding = layer_types[i] == "sliding_attention"
        elif mt == "gemma2":
            sliding = i % 2 == 0
        elif mt in ("qwen2", "qwen3"):  # Qwen2Config: the window from max_window_layers on
            window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
            sliding = window is not None and i >= cfg.get("max_window_layers", 28)
        else:
            sliding = mt in ("mistral", "phi3") and bool(cfg.get("sliding_window"))
        inv = _inv_freq(cfg, local=sliding and mt == "gemma3_text")
        q, k = _rope(q, inv), _rope(k, inv)
        k = np.repeat(k, nh // nk, axis=0)
        v = np.repeat(v, nh // nk, axis=0)
        scale = cfg["query_pre_attn_scalar"] ** -0.5 if "query_pre_attn_scalar" in cfg else hd**-0.5
        s = q @ k.transpose(0, 2, 1) * scale
        if cfg.get("attn_logit_softcapping"):
            c = cfg["attn_logit_softcapping"]
            s = np.tanh(s / c) * c
        qi, kj = np.arange(n)[:, None], np.arange(n)[None, :]
        allowed = kj <= qi
        if sliding:
            allowed &= qi - kj < cfg["sliding_window"]
        s = np.where(allowed, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v  # [heads, n, hd]
        o = a.transpose(1, 0, 2).reshape(n, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        if sandwich:
            o = _rms(o, W[p + "post_attention_layernorm.weight"], eps, gemma)
            x = x + o
            h = _rms(x, W[p + "pre_feedforward_layernorm.weight"], eps, gemma)
        else:
            x = x + o
            h = _rms(x, W[p + "post_attention_layernorm.weight"], eps, gemma)
        if mt == "phi3":
            g, u = np.split(h @ W[p + "mlp.gate_up_proj.weight"].T, 2, -1)
        else:
            g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        if act_name in ("gelu", "gelu_python"):  # transformers' GELUActivation: erf
            act = 0.5 * g * (1 + _erf(g / math.sqrt(2)))
        elif act_name.startswith("gelu"):  # gelu_pytorch_tanh, gelu_new, ...
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
        else:
            act = g / (1 + np.exp(-g))
        m = (act * u) @ W[p + "mlp.down_proj.weight"].T
        if sandwich:
            m = _rms(m, W[p + "post_feedforward_layernorm.weight"], eps, gemma)
        x = x + m
    x = _rms(x, W["model.norm.weight"], eps, gemma)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    logits = x @ head.T
    if cfg.get("final_logit_softcapping"):
        c = cfg["final_logit_softcapping"]
        logits = np.tanh(logits / c) * c
    return logits
