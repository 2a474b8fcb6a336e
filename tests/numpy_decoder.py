"""An independent NumPy forward pass of the fixture decoders (genai.testing.models): RMSNorm,
rotary (half-split), grouped-query attention, SwiGLU, tied to nothing in the engine. Tests feed
it the graph's initializers (or merged LoRA weights) and compare logits."""

from __future__ import annotations

from collections.abc import Container

import numpy as np

__all__ = ["decoder_logits"]


def _rms(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * weight


def _rotary(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    hd = x.shape[-1]
    angles = np.outer(positions, 10000.0 ** (-np.arange(0, hd, 2) / hd))
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def decoder_logits(
    w: dict[str, np.ndarray],
    tokens: list[int] | np.ndarray,
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    local_layers: Container[int] = (),
    window: int | None = None,
) -> np.ndarray:
    """Logits ``[len, vocab]`` of the fixture decoder with weights ``w`` (``layers.{i}.*``;
    q/k/v separate or packed as ``qkv_proj``). Layers in ``local_layers`` see keys j with
    ``i - j < window`` (sliding-window attention); the others every earlier key."""
    tokens = np.asarray(tokens)
    n = len(tokens)
    x = w["embed_tokens.weight"][tokens]
    hd = x.shape[1] // heads
    positions = np.arange(n)
    causal = positions[None, :] <= positions[:, None]
    local = causal & (positions[:, None] - positions[None, :] < (window or n + 1))
    for i in range(layers):
        p = f"layers.{i}"
        h = _rms(x, w[f"{p}.input_layernorm.weight"])
        if f"{p}.attn.qkv_proj.weight" in w:
            q_w, k_w, v_w = np.split(
                w[f"{p}.attn.qkv_proj.weight"], [heads * hd, (heads + kv_heads) * hd], axis=1
            )
        else:
            q_w, k_w, v_w = (w[f"{p}.attn.{t}_proj.weight"] for t in "qkv")
        q = _rotary((h @ q_w).reshape(n, heads, hd), positions)
        k = _rotary((h @ k_w).reshape(n, kv_heads, hd), positions)
        v = (h @ v_w).reshape(n, kv_heads, hd)
        allowed = local if i in local_layers else causal
        out = np.empty((n, heads, hd))
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = np.where(allowed, q[:, head] @ k[:, kv].T / np.sqrt(hd), -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, head] = (probs / probs.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(n, heads * hd) @ w[f"{p}.attn.o_proj.weight"]
        h = _rms(x, w[f"{p}.post_attention_layernorm.weight"])
        gate = h @ w[f"{p}.mlp.gate_proj.weight"]
        act = gate / (1.0 + np.exp(-gate)) * (h @ w[f"{p}.mlp.up_proj.weight"])
        x = x + act @ w[f"{p}.mlp.down_proj.weight"]
    return _rms(x, w["final_norm.weight"]) @ w["lm_head.weight"]
