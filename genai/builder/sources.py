"""Checkpoint sources: a Hugging Face folder (``config.json`` + safetensors) or a GGUF file.

Both hand out the same thing: a :class:`~genai.builder.spec.ModelSpec` and float32 weights under
canonical names, HF layout (``[out, in]`` for linear layers), norm offsets applied:

=================  ===================================================================
``embed``          ``[vocab, hidden]``
``lm_head``        ``[vocab, hidden]`` (absent when tied to ``embed``)
``final_norm``     ``[hidden]``
``{i}.ln1``        norm before attention
``{i}.q|k|v``      ``[heads * head_dim, hidden]`` (rotary halves not interleaved, as in HF)
``{i}.q_bias``...  qkv biases (Qwen2)
``{i}.q_norm``     ``[head_dim]`` per-head q/k RMSNorm (Qwen3, Gemma 3)
``{i}.o``          ``[hidden, heads * head_dim]``
``{i}.ln2``        norm before the MLP
``{i}.post_attn_norm``, ``{i}.post_ffn_norm``   sandwich norms (Gemma 2/3)
``{i}.gate|up``    ``[intermediate, hidden]``; ``{i}.down`` ``[hidden, intermediate]``
=================  ===================================================================
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from genai.builder.errors import BuildError
from genai.builder.gguf import GGUFFile
from genai.builder.spec import ModelSpec, spec_from_hf_config, unsupported_architecture

__all__ = ["GGUFSource", "HFSource", "SafetensorsFile", "Source", "TensorSource", "open_source"]

_NORMS = ("ln1", "ln2", "post_attn_norm", "post_ffn_norm", "q_norm", "k_norm")


class TensorSource:
    """A checkpoint's tensors by name: ``has(name)``, ``tensor(name)`` (float32) and
    ``check_complete()`` over the ``needed()`` names; subclasses say how to load one."""

    path: Path
    #: Said before "tensors" when some are missing (e.g. "Whisper ").
    _kind = ""

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def _load(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def _missing(self, name: str) -> str:
        return f"missing {self._kind}tensor {name!r}"

    def _describe(self, name: str) -> str:
        return name

    def needed(self) -> list[str]:
        """Every tensor name the writer reads."""
        raise NotImplementedError

    def tensor(self, name: str) -> np.ndarray:
        if not self.has(name):
            raise BuildError(f"{self.path}: {self._missing(name)}")
        return np.asarray(self._load(name), dtype=np.float32)

    def check_complete(self) -> None:
        """Raise a :class:`BuildError` listing every needed tensor the checkpoint lacks."""
        missing = [n for n in self.needed() if not self.has(n)]
        if missing:
            shown = ", ".join(self._describe(n) for n in missing[:8])
            more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            raise BuildError(f"{self.path}: missing {self._kind}tensors: {shown}{more}")


class Source(TensorSource):
    """Base: ``spec``, ``tensor(canonical_name)``, ``has(canonical_name)``."""

    spec: ModelSpec

    def _missing(self, name: str) -> str:
        return f"missing tensor for {name!r} ({self._describe(name)})"

    def tensor(self, name: str) -> np.ndarray:
        array = super().tensor(name)
        base = name.split(".")[-1]
        if self._adds_norm_offset and (base in _NORMS or name == "final_norm"):
            array = array + np.float32(self.spec.norm_offset)
        return array

    _adds_norm_offset = False

    def layer_names(self, i: int) -> list[str]:
        """The canonical names layer ``i`` needs under ``spec``."""
        s = self.spec
        names = [f"{i}.{n}" for n in ("ln1", "q", "k", "v", "o", "ln2", "gate", "up", "down")]
        if s.qkv_bias:
            names += [f"{i}.q_bias", f"{i}.k_bias", f"{i}.v_bias"]
        if s.qk_norm:
            names += [f"{i}.q_norm", f"{i}.k_norm"]
        if s.sandwich_norm:
            names += [f"{i}.post_attn_norm", f"{i}.post_ffn_norm"]
        return names

    def needed(self) -> list[str]:
        """The canonical names the spec needs."""
        needed = ["embed", "final_norm"]
        if not self.spec.tie_embeddings:
            needed.append("lm_head")
        for i in range(self.spec.num_layers):
            needed += self.layer_names(i)
        return needed

    # -- checks against the spec, from the checkpoint's headers (no weights read) -------------

    #: What the spec's sizes come from, in messages ("config.json", "the GGUF metadata").
    _sizes_from = "the config"
    #: The checkpoint key that gives the layer count, in messages.
    _layers_key = "num_hidden_layers"

    def _stored(self, name: str) -> tuple[str, int | None]:
        """The checkpoint's tensor holding canonical ``name`` and, when that tensor is a fused
        one (q|k|v, gate|up), the part ``name`` is (0, 1, 2)."""
        raise NotImplementedError

    def _stored_shape(self, stored: str) -> tuple[int, ...]:
        """The shape of the checkpoint's tensor ``stored`` (from its header)."""
        raise NotImplementedError

    def _layer_indices(self) -> set[int]:
        """The layer numbers the checkpoint has tensors for."""
        raise NotImplementedError

    def expected_shape(self, name: str) -> tuple[tuple[int, ...], str]:
        """(the shape the spec implies for canonical ``name``, the sizes it comes from)."""
        s = self.spec
        key = name.partition(".")[2] if name[:1].isdigit() else name
        hidden = f"hidden {s.hidden_size}"
        q = (s.num_heads * s.head_dim, f"{s.num_heads} heads x head_dim {s.head_dim}")
        kv = (s.num_kv_heads * s.head_dim, f"{s.num_kv_heads} kv heads x head_dim {s.head_dim}")
        ffn = (s.intermediate_size, f"intermediate {s.intermediate_size}")
        table: dict[str, tuple[tuple[int, ...], str]] = {
            "embed": ((s.vocab_size, s.hidden_size), f"vocab {s.vocab_size}, {hidden}"),
            "lm_head": ((s.vocab_size, s.hidden_size), f"vocab {s.vocab_size}, {hidden}"),
            "q": ((q[0], s.hidden_size), f"{q[1]}, {hidden}"),
            "k": ((kv[0], s.hidden_size), f"{kv[1]}, {hidden}"),
            "v": ((kv[0], s.hidden_size), f"{kv[1]}, {hidden}"),
            "q_bias": ((q[0],), q[1]),
            "k_bias": ((kv[0],), kv[1]),
            "v_bias": ((kv[0],), kv[1]),
            "q_norm": ((s.head_dim,), f"head_dim {s.head_dim}"),
            "k_norm": ((s.head_dim,), f"head_dim {s.head_dim}"),
            "o": ((s.hidden_size, q[0]), f"{hidden}, {q[1]}"),
            "gate": ((ffn[0], s.hidden_size), f"{ffn[1]}, {hidden}"),
            "up": ((ffn[0], s.hidden_size), f"{ffn[1]}, {hidden}"),
            "down": ((s.hidden_size, ffn[0]), f"{hidden}, {ffn[1]}"),
        }
        return table.get(key, ((s.hidden_size,), hidden))  # the norms

    def check_shapes(self) -> None:
        """A one-line :class:`BuildError` naming the first tensor whose shape is not the one
        the spec implies (a fused tensor: its parts stacked), with both shapes."""
        parts: dict[str, list[tuple[int, str]]] = {}
        for name in self.needed():
            stored, part = self._stored(name)
            parts.setdefault(stored, []).append((-1 if part is None else part, name))
        for stored, members in parts.items():
            wanted = [self.expected_shape(name) for _, name in sorted(members)]
            shape, reason = wanted[0]
            if members[0][0] >= 0:  # fused: the parts stacked along the rows
                shape = (sum(w[0][0] for w in wanted), *shape[1:])
                reason = " + ".join(dict.fromkeys(w[1] for w in wanted))
            actual = tuple(int(d) for d in self._stored_shape(stored))
            if actual != shape:
                raise BuildError(
                    f"{self.path}: tensor {stored} has shape {actual}, but {self._sizes_from} "
                    f"implies {shape} ({reason}): the config does not match the weights"
                )

    def check_layer_count(self) -> None:
        """A :class:`BuildError` when the checkpoint has layers past the spec's last: they
        would be dropped without a word (transformers' ``from_pretrained`` drops them with a
        warning about unused weights); refused instead."""
        found = self._layer_indices()
        extra = sorted(i for i in found if i >= self.spec.num_layers)
        if extra:
            raise BuildError(
                f"{self.path}: the checkpoint has tensors for {len(found)} layers "
                f"(0-{max(found)}) but {self._layers_key} is {self.spec.num_layers}; refusing "
                f"to drop layer{'s' if len(extra) > 1 else ''} "
                f"{', '.join(map(str, extra[:8]))}{' ...' if len(extra) > 8 else ''} "
                f"(fix {self._layers_key}, or remove those layers' tensors)"
            )

    def check_types(self) -> None:
        """A :class:`BuildError` for a needed tensor stored in a type this builder cannot
        read (from the headers; the same error reading it would give, before any work)."""

    def check(self) -> None:
        """Every check that needs no weights: tensors present, their types and shapes, the
        layer count."""
        self.check_complete()
        self.check_types()
        self.check_shapes()
        self.check_layer_count()


# --------------------------------------------------------------------------------------------
# Hugging Face folder
# --------------------------------------------------------------------------------------------

_ST_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "F64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}


class SafetensorsFile:
    """A memory-mapped ``.safetensors`` file (own parser: header length, JSON header, data)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise BuildError(f"{self.path}: truncated safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise BuildError(f"{self.path}: truncated safetensors file (header of {n} bytes)")
            try:
                header = json.loads(f.read(n))
            except ValueError as exc:
                raise BuildError(f"{self.path}: corrupt safetensors header: {exc}") from None
        header.pop("__metadata__", None)
        self._start = 8 + n
        self.entries: dict[str, dict[str, Any]] = header
        for name, entry in header.items():
            _, end = entry["data_offsets"]
            if self._start + end > size:
                raise BuildError(f"{self.path}: truncated safetensors file (tensor {name})")
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if size > self._start else None

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    @classmethod
    def index(cls, files: Sequence[Path]) -> dict[str, SafetensorsFile]:
        """Tensor name -> the file holding it, over the shards ``files`` (a later shard's
        tensor wins a name two hold)."""
        where: dict[str, SafetensorsFile] = {}
        for file in files:
            st = cls(file)
            for name in st.entries:
                where[name] = st
        return where

    def check_readable(self, name: str) -> None:
        """A :class:`BuildError` when tensor ``name``'s dtype cannot be read."""
        dtype = self.entries[name]["dtype"]
        if dtype not in _ST_DTYPES:
            raise BuildError(f"{self.path}: tensor {name} has unsupported dtype {dtype}")

    def tensor(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        dtype = entry["dtype"]
        self.check_readable(name)
        begin, end = entry["data_offsets"]
        assert self._map is not None
        raw = self._map[self._start + begin : self._start + end].view(_ST_DTYPES[dtype])
        if dtype == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.reshape(entry["shape"])


class HFSource(Source):
    """A Hugging Face model folder: ``config.json`` + ``*.safetensors`` (sharded or not)."""

    _adds_norm_offset = True

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = Path(folder)
        config_path = self.path / "config.json"
        if not config_path.is_file():
            raise BuildError(f"{self.path}: no config.json (a Hugging Face model folder needs one)")
        try:
            self.config = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BuildError(f"{config_path} is not valid JSON: {exc}") from exc
        self.spec = spec_from_hf_config(self.config, str(config_path))
        self._sizes_from = str(config_path)
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            if any(self.path.glob("*.bin")) or any(self.path.glob("*.pt")):
                raise BuildError(
                    f"{self.path}: only PyTorch .bin weights found; convert them to safetensors"
                )
            raise BuildError(f"{self.path}: no *.safetensors weights")
        self._where = SafetensorsFile.index(files)
        self._prefix = self._find_prefix()
        phi3 = self.spec.arch == "phi3"
        self._fused_qkv = phi3 and self._hf_name("0.qkv") in self._where
        self._fused_gate_up = phi3 and self._hf_name("0.gate_up") in self._where

    def _find_prefix(self) -> str:
        for prefix in ("model.", "language_model.model.", "model.language_model.", ""):
            if f"{prefix}embed_tokens.weight" in self._where:
                return prefix
        raise BuildError(f"{self.path}: no embed_tokens.weight in the safetensors files")

    _LAYER: ClassVar[dict[str, str]] = {
        "ln1": "input_layernorm.weight",
        "q": "self_attn.q_proj.weight",
        "k": "self_attn.k_proj.weight",
        "v": "self_attn.v_proj.weight",
        "q_bias": "self_attn.q_proj.bias",
        "k_bias": "self_attn.k_proj.bias",
        "v_bias": "self_attn.v_proj.bias",
        "q_norm": "self_attn.q_norm.weight",
        "k_norm": "self_attn.k_norm.weight",
        "o": "self_attn.o_proj.weight",
        "qkv": "self_attn.qkv_proj.weight",
        "gate": "mlp.gate_proj.weight",
        "up": "mlp.up_proj.weight",
        "down": "mlp.down_proj.weight",
        "gate_up": "mlp.gate_up_proj.weight",
        "post_attn_norm": "post_attention_layernorm.weight",
        "post_ffn_norm": "post_feedforward_layernorm.weight",
    }

    def _hf_name(self, name: str) -> str:
        if name == "embed":
            return f"{self._prefix}embed_tokens.weight"
        if name == "final_norm":
            return f"{self._prefix}norm.weight"
        if name == "lm_head":
            return "lm_head.weight"
        layer, _, key = name.partition(".")
        if key == "ln2":
            key_name = (
                "pre_feedforward_layernorm.weight"
                if self.spec.sandwich_norm
                else "post_attention_layernorm.weight"
            )
        else:
            key_name = self._LAYER[key]
        return f"{self._prefix}layers.{layer}.{key_name}"

    def _describe(self, name: str) -> str:
        return self._hf_name(self._fused_name(name)[0])

    def _stored(self, name: str) -> tuple[str, int | None]:
        fused, part = self._fused_name(name)
        return self._hf_name(fused), part

    def check_types(self) -> None:
        for stored in dict.fromkeys(self._stored(name)[0] for name in self.needed()):
            self._where[stored].check_readable(stored)

    def _stored_shape(self, stored: str) -> tuple[int, ...]:
        return tuple(self._where[stored].entries[stored]["shape"])

    def _layer_indices(self) -> set[int]:
        pattern = re.compile(re.escape(self._prefix) + r"layers\.(\d+)\.")
        return {int(m.group(1)) for name in self._where if (m := pattern.match(name))}

    def _fused_name(self, name: str) -> tuple[str, int | None]:
        layer, _, key = name.partition(".")
        if key in ("q", "k", "v") and getattr(self, "_fused_qkv", False):
            return f"{layer}.qkv", "qkv".index(key)
        if key in ("gate", "up") and getattr(self, "_fused_gate_up", False):
            return f"{layer}.gate_up", ("gate", "up").index(key)
        return name, None

    def has(self, name: str) -> bool:
        fused, _ = self._fused_name(name)
        if name == "lm_head" and self.spec.tie_embeddings:
            return False
        return self._hf_name(fused) in self._where

    def _load(self, name: str) -> np.ndarray:
        fused, part = self._fused_name(name)
        hf = self._hf_name(fused)
        array = self._where[hf].tensor(hf)
        if part is None:
            return array
        s = self.spec
        if fused.endswith(".qkv"):
            q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
            bounds = [0, q, q + kv, q + 2 * kv]
        else:
            f = s.intermediate_size
            bounds = [0, f, 2 * f]
        return array[bounds[part] : bounds[part + 1]]


# --------------------------------------------------------------------------------------------
# GGUF
# --------------------------------------------------------------------------------------------

#: GGUF ``general.architecture`` -> HF model_type.
_GGUF_ARCHS = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
}

_GGUF_LAYER = {
    "ln1": "attn_norm.weight",
    "q": "attn_q.weight",
    "k": "attn_k.weight",
    "v": "attn_v.weight",
    "q_bias": "attn_q.bias",
    "k_bias": "attn_k.bias",
    "v_bias": "attn_v.bias",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "o": "attn_output.weight",
    "qkv": "attn_qkv.weight",
    "ln2": "ffn_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "post_ffn_norm": "post_ffw_norm.weight",
    "gate": "ffn_gate.weight",
    "up": "ffn_up.weight",
    "down": "ffn_down.weight",
}


def _spec_from_gguf(f: GGUFFile) -> ModelSpec:
    arch = f.architecture
    if arch not in _GGUF_ARCHS:
        raise unsupported_architecture(arch, str(f.path))
    model_type = _GGUF_ARCHS[arch]

    def need(key: str) -> Any:
        value = f.arch_get(key)
        if value is None:
            raise BuildError(f"{f.path}: missing GGUF metadata {arch}.{key}")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = f.arch_get("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise BuildError(f"{f.path}: per-layer head counts are not supported")
    head_dim = int(f.arch_get("attention.key_length") or hidden // heads)
    layers = int(need("block_count"))
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = f.arch_get("vocab_size") or (len(tokens) if tokens else None)
    if vocab is None:
        vocab = f.tensors["token_embd.weight"].shape[0] if "token_embd.weight" in f else None
    if vocab is None:
        raise BuildError(f"{f.path}: cannot tell the vocabulary size")
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": head_dim,
        "intermediate_size": int(need("feed_forward_length")),
        "max_position_embeddings": int(f.arch_get("context_length", 4096)),
        "rms_norm_eps": float(f.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(f.arch_get("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in f,
        "bos_token_id": f.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": f.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": f.get("tokenizer.ggml.padding_token_id"),
        "attention_bias": "blk.0.attn_q.bias" in f,
    }
    rot = f.arch_get("rope.dimension_count")
    if rot:
        cfg["partial_rotary_factor"] = int(rot) / head_dim
    scaling_type = f.arch_get("rope.scaling.type")
    if scaling_type and scaling_type != "none":
        if scaling_type != "linear":
            raise BuildError(f"{f.path}: rope scaling {scaling_type!r} is not supported")
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    if "rope_factors_long.weight" in f:
        raise BuildError(f"{f.path}: long-context rope factors are not supported")
    window = f.arch_get("attention.sliding_window")
    if window:
        cfg["sliding_window"] = int(window)
        if model_type in ("qwen2", "qwen3"):
            # GGUF has no max_window_layers: the window applies to every layer (as before)
            cfg["use_sliding_window"] = True
            cfg["max_window_layers"] = 0
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if f.arch_get(key):
            cfg[key] = float(f.arch_get(key))
    if model_type in ("gemma2", "gemma3_text"):
        big = (model_type == "gemma2" and layers == 46) or (
            model_type == "gemma3_text" and layers == 62
        )
        cfg["query_pre_attn_scalar"] = hidden / heads if big else head_dim
    if model_type == "gemma3_text":
        cfg["rope_local_base_freq"] = float(f.arch_get("rope.freq_base_swa", 10000.0))
        pattern = f.arch_get("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            cfg["layer_types"] = [
                "sliding_attention" if p else "full_attention" for p in pattern[:layers]
            ]
    if model_type == "gemma2" and window:
        cfg["layer_types"] = [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
        ]
    spec = spec_from_hf_config(cfg, str(f.path))
    if "rope_freqs.weight" in f:
        spec.rope_freq_factors = f.tensor("rope_freqs.weight")
    return spec


class GGUFSource(Source):
    """A GGUF file (llama.cpp naming; llama's q/k rows un-permuted back to the HF layout)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.gguf = GGUFFile(path)
        self.spec = _spec_from_gguf(self.gguf)
        self._sizes_from = "its GGUF metadata"
        self._layers_key = f"{self.gguf.architecture}.block_count"
        self._permuted = self.gguf.architecture == "llama"
        self._fused_qkv = "blk.0.attn_qkv.weight" in self.gguf
        self._fused_up = (
            self.spec.arch == "phi3"
            and "blk.0.ffn_gate.weight" not in self.gguf
            and "blk.0.ffn_up.weight" in self.gguf
        )

    def _gguf_name(self, name: str) -> tuple[str, int | None]:
        if name == "embed":
            return "token_embd.weight", None
        if name == "final_norm":
            return "output_norm.weight", None
        if name == "lm_head":
            return "output.weight", None
        layer, _, key = name.partition(".")
        part = None
        if key in ("q", "k", "v") and self._fused_qkv:
            key, part = "qkv", "qkv".index(key)
        elif key in ("gate", "up") and self._fused_up:
            key, part = "up", ("gate", "up").index(key)
        return f"blk.{layer}.{_GGUF_LAYER[key]}", part

    def _describe(self, name: str) -> str:
        return self._gguf_name(name)[0]

    def _stored(self, name: str) -> tuple[str, int | None]:
        return self._gguf_name(name)

    def check_types(self) -> None:
        for stored in dict.fromkeys(self._stored(name)[0] for name in self.needed()):
            self.gguf.check_readable(stored)

    def _stored_shape(self, stored: str) -> tuple[int, ...]:
        return self.gguf.tensors[stored].shape

    def _layer_indices(self) -> set[int]:
        pattern = re.compile(r"blk\.(\d+)\.")
        return {int(m.group(1)) for name in self.gguf if (m := pattern.match(name))}

    def has(self, name: str) -> bool:
        return self._gguf_name(name)[0] in self.gguf

    def _load(self, name: str) -> np.ndarray:
        gname, part = self._gguf_name(name)
        array = self.gguf.tensor(gname)
        s = self.spec
        if part is not None:
            if gname.endswith("attn_qkv.weight"):
                q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
                bounds = [0, q, q + kv, q + 2 * kv]
            else:
                f = s.intermediate_size
                bounds = [0, f, 2 * f]
            array = array[bounds[part] : bounds[part + 1]]
        key = name.partition(".")[2]
        if self._permuted and key in ("q", "k", "q_bias", "k_bias"):
            heads = s.num_heads if key.startswith("q") else s.num_kv_heads
            array = _unpermute(array, heads)
        return array


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row permutation (interleaved pairs -> HF's two halves)."""
    shape = w.shape
    return w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def open_source(path: str | os.PathLike[str]) -> Source:
    """A GGUF file or a Hugging Face folder, by what ``path`` is."""
    p = Path(path)
    if p.is_dir():
        return HFSource(p)
    if not p.exists():
        raise FileNotFoundError(f"input not found: {p}")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return GGUFSource(p)
    if p.name == "config.json":
        return HFSource(p.parent)
    raise BuildError(f"{p}: not a GGUF file or a Hugging Face model folder")
