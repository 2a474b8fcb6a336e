"""Architecture specs: what the graph writer needs to know about a decoder, from an HF
``config.json`` or from GGUF metadata.

:class:`ModelSpec` is the one description every source is turned into. Weights are handed to the
writer under canonical names (see :mod:`genai.builder.sources`) in the HF layout (``[out, in]``)
with norm offsets (Gemma's ``1 + w``) already applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from genai.builder.errors import BuildError

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelSpec", "spec_from_hf_config"]

#: HF ``model_type`` -> genai_config ``model.type``.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3_text",
}

#: HF ``architectures[0]`` names accepted for each model type.
_HF_CLASSES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
}

_GEMMA = ("gemma", "gemma2", "gemma3_text")

#: HF ``hidden_act`` names (transformers' ``ACT2FN``) -> the MLP activation the graph uses:
#: ``gelu`` / ``gelu_python`` are the exact (erf) GELU, the tanh approximations are one.
_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
}


def unsupported_architecture(name: str, where: str) -> BuildError:
    return BuildError(
        f"{where}: architecture {name!r} is not supported; supported: "
        f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))} (HF: {', '.join(sorted(_HF_CLASSES))})"
    )


@dataclass
class ModelSpec:
    """One decoder-only transformer, in the terms the ONNX writer uses."""

    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    context_length: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    #: Rope base of sliding-window layers when it differs (Gemma 3).
    rope_local_theta: float | None = None
    #: ``{"rope_type": "llama3" | "linear", ...}`` or None.
    rope_scaling: dict[str, Any] | None = None
    #: Per-frequency divisors (GGUF ``rope_freqs.weight``, Llama 3.1 style); overrides scaling.
    rope_freq_factors: np.ndarray | None = None
    rotary_dim: int | None = None
    tie_embeddings: bool = False
    #: "silu" (SwiGLU), "gelu" (GeGLU, exact erf GELU) or "gelu_tanh" (GeGLU, tanh GELU)
    activation: str = "silu"
    qkv_bias: bool = False
    qk_norm: bool = False
    sandwich_norm: bool = False  # post-attention and post-MLP norms (Gemma 2/3)
    embed_scale: float | None = None
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    sliding_window: int | None = None
    #: Per layer: True when the layer uses the sliding window.
    sliding_layers: tuple[bool, ...] = ()
    attn_scale: float | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHITECTURES:
            raise unsupported_architecture(self.arch, "spec")
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "context_length",
        ):
            if int(getattr(self, name)) < 1:
                raise BuildError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise BuildError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if not self.sliding_layers:
            self.sliding_layers = (self.sliding_window is not None,) * self.num_layers
        if len(self.sliding_layers) != self.num_layers:
            raise BuildError("sliding_layers must have one entry per layer")
        if self.sliding_window is None:
            self.sliding_layers = (False,) * self.num_layers
        if self.rotary_dim is None:
            self.rotary_dim = self.head_dim

    @property
    def genai_type(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.arch]

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def norm_offset(self) -> float:
        """What HF adds to stored RMSNorm weights (Gemma stores ``w``, applies ``1 + w``)."""
        return 1.0 if self.arch in _GEMMA else 0.0

    def inv_freq(self, local: bool = False) -> np.ndarray:
        """Rotary inverse frequencies ``[rotary_dim / 2]`` (float64), scaling applied."""
        theta = self.rope_local_theta if local and self.rope_local_theta else self.rope_theta
        dim = int(self.rotary_dim or self.head_dim)
        inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        if local:  # Gemma 3: local layers use the plain base, no scaling
            return inv
        if self.rope_freq_factors is not None:
            return inv / np.asarray(self.rope_freq_factors, dtype=np.float64)[: len(inv)]
        scaling = self.rope_scaling
        if not scaling:
            return inv
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            return inv
        if kind == "linear":
            return inv / float(scaling["factor"])
        if kind == "llama3":
            factor = float(scaling["factor"])
            low = float(scaling.get("low_freq_factor", 1.0))
            high = float(scaling.get("high_freq_factor", 4.0))
            old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
            wavelen = 2 * math.pi / inv
            low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
            scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
            smooth = (old_ctx / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            return np.where(medium, smoothed, scaled)
        raise BuildError(f"rope scaling {kind!r} is not supported (default, linear, llama3)")

    def rotary_tables(self, local: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """cos/sin caches ``[context_length, rotary_dim / 2]`` (float32)."""
        angles = np.outer(np.arange(self.context_length, dtype=np.float64), self.inv_freq(local))
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rope_params(cfg: dict[str, Any]) -> tuple[float, float | None, dict[str, Any] | None]:
    """(theta, local theta, scaling) from transformers 4 or 5 style configs."""
    params = cfg.get("rope_parameters")
    theta = cfg.get("rope_theta")
    local = cfg.get("rope_local_base_freq")
    scaling = cfg.get("rope_scaling")
    if isinstance(params, dict):
        if "full_attention" in params or "sliding_attention" in params:
            full = params.get("full_attention") or {}
            sliding = params.get("sliding_attention") or {}
            theta = full.get("rope_theta", theta)
            local = sliding.get("rope_theta", local)
            scaling = full if full.get("rope_type", "default") != "default" else scaling
        else:
            theta = params.get("rope_theta", theta)
            if params.get("rope_type", "default") != "default":
                scaling = params
    return float(theta if theta is not None else 10000.0), local, scaling or None


def spec_from_hf_config(cfg: dict[str, Any], where: str = "config.json") -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` dict; `BuildError` naming the
    key for a missing or malformed value."""
    if not isinstance(cfg, dict):
        raise BuildError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    try:
        return _spec_from_hf_config(cfg, where)
    except (TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, BuildError):
            raise
        raise BuildError(f"{where}: malformed value ({type(exc).__name__}: {exc})") from exc


def _size(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    """``cfg[key]``, a positive integer (``default`` when absent or null; required when the
    default is None)."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise BuildError(f"{where}: missing {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BuildError(f"{where}: {key!r} must be a positive integer, got {value!r}")
    return value


def _spec_from_hf_config(cfg: dict[str, Any], where: str) -> ModelSpec:
    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    if model_type not in SUPPORTED_ARCHITECTURES:
        for name in archs:
            if name in _HF_CLASSES:
                model_type = _HF_CLASSES[name]
                break
        else:
            raise unsupported_architecture(str(model_type or (archs or ["?"])[0]), where)
    if model_type == "gemma3" and "text_config" in cfg:
        raise BuildError(f"{where}: multimodal Gemma 3 checkpoints are not supported (text only)")

    hidden = _size(cfg, "hidden_size", where)
    heads = _size(cfg, "num_attention_heads", where)
    kv_heads = _size(cfg, "num_key_value_heads", where, heads)
    if heads % kv_heads:
        raise BuildError(
            f"{where}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads "
            f"({kv_heads})"
        )
    head_dim = _size(cfg, "head_dim", where, hidden // heads or None)
    layers = _size(cfg, "num_hidden_layers", where)
    theta, local_theta, scaling = _rope_params(cfg)
    rotary_dim = int(head_dim * float(cfg.get("partial_rotary_factor", 1.0)))
    gemma = model_type in _GEMMA
    sliding_window = cfg.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        sliding_window = None
    layer_types = cfg.get("layer_types")
    if layer_types:
        sliding = tuple(t == "sliding_attention" for t in layer_types)
    elif model_type == "gemma2":
        sliding = tuple(i % 2 == 0 for i in range(layers))
    elif model_type == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern", 6))
        sliding = tuple((i + 1) % pattern != 0 for i in range(layers))
    elif model_type in ("qwen2", "qwen3"):
        # transformers' Qwen2Config / Qwen3Config without layer_types: the window applies to
        # the layers from max_window_layers (default 28) on; the ones below attend fully.
        first = cfg.get("max_window_layers")
        first = 28 if first is None else int(first)
        sliding = tuple(sliding_window is not None and i >= first for i in range(layers))
    else:
        sliding = (sliding_window is not None,) * layers
    if model_type == "gemma":
        sliding_window = None
    if (
        model_type == "phi3"
        and scaling
        and scaling.get("type", scaling.get("rope_type"))
        in (
            "longrope",
            "su",
            "yarn",
        )
    ):
        raise BuildError(f"{where}: Phi-3 long-context rope scaling is not supported")
    query_scalar = (
        cfg.get("query_pre_attn_scalar") if model_type in ("gemma2", "gemma3_text") else None
    )
    if gemma:  # HF's Gemma MLPs read hidden_activation (tanh GELU when it is unset)
        act = str(cfg.get("hidden_activation") or "gelu_pytorch_tanh")
    else:
        act = str(cfg.get("hidden_act") or "silu")
    if act not in _ACTIVATIONS:
        raise BuildError(
            f"{where}: activation {act!r} is not supported ({', '.join(sorted(_ACTIVATIONS))})"
        )
    activation = _ACTIVATIONS[act]
    tie = cfg.get("tie_word_embeddings")
    return ModelSpec(
        arch=model_type,
        vocab_size=_size(cfg, "vocab_size", where),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=_size(cfg, "intermediate_size", where),
        context_length=_size(cfg, "max_position_embeddings", where, 4096),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6 if gemma else 1e-5)),
        rope_theta=theta,
        rope_local_theta=float(local_theta)
        if local_theta and model_type == "gemma3_text"
        else None,
        rope_scaling=scaling,
        rotary_dim=rotary_dim,
        tie_embeddings=bool(tie if tie is not None else gemma),
        activation=activation,
        qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type in ("qwen3", "gemma3_text"),
        sandwich_norm=model_type in ("gemma2", "gemma3_text"),
        embed_scale=math.sqrt(hidden) if gemma else None,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        sliding_window=int(sliding_window) if sliding_window else None,
        sliding_layers=sliding,
        attn_scale=float(query_scalar) ** -0.5 if query_scalar else None,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=cfg.get("eos_token_id"),
        pad_token_id=cfg.get("pad_token_id"),
    )
