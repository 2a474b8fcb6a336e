"""Whisper checkpoints for the builder: Hugging Face folders (``WhisperForConditionalGeneration``:
``config.json`` + safetensors) and CTranslate2 folders (faster-whisper: ``model.bin`` +
``config.json`` + ``tokenizer.json``), read with NumPy only.

Every source hands out a :class:`WhisperSpec` and float32 weights under Hugging Face's names
without the ``model.`` prefix (``encoder.layers.0.self_attn.q_proj.weight``, ``[out, in]``
for linear layers). Biases HF's Whisper does not have (the attention ``k_proj``) are absent.

CTranslate2's ``model.bin`` (binary version 3 to 6): ``u32`` version, the spec's name and
``u32`` revision, ``u32`` count of variables, each ``name``, ``u8`` rank, ``u32`` dims,
``u8`` dtype (float32, int8, int16, int32, float16, bfloat16), ``u32`` byte count and the raw
little-endian data; then ``u32`` count of aliases (``name`` -> ``name``). Strings are a
``u16`` length (with the trailing NUL) and UTF-8 bytes. A quantized weight ``W`` comes with
``W_scale`` (one per output row): ``float = stored / scale``.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from genai.builder.errors import BuildError
from genai.builder.sources import SafetensorsFile, TensorSource

__all__ = [
    "CT2WhisperSource",
    "DictWhisperSource",
    "HFWhisperSource",
    "WhisperSource",
    "WhisperSpec",
    "is_whisper_input",
    "open_whisper_source",
    "spec_from_hf_whisper_config",
]


@dataclass
class WhisperSpec:
    """The sizes of one Whisper model, in the terms of HF's ``WhisperConfig``."""

    vocab_size: int
    d_model: int
    encoder_layers: int
    encoder_heads: int
    encoder_ffn: int
    decoder_layers: int
    decoder_heads: int
    decoder_ffn: int
    num_mel_bins: int = 80
    max_source_positions: int = 1500
    max_target_positions: int = 448
    bos_token_id: int = 50257
    eos_token_id: int = 50256
    pad_token_id: int = 50256
    decoder_start_token_id: int = 50257

    @property
    def num_frames(self) -> int:
        """Mel frames of one 30 s window (the encoder's fixed input length)."""
        return 2 * self.max_source_positions

    def head_size(self, part: str) -> int:
        heads = self.encoder_heads if part == "encoder" else self.decoder_heads
        if self.d_model % heads:
            raise BuildError(f"d_model {self.d_model} is not divisible by {heads} heads")
        return self.d_model // heads


def spec_from_hf_whisper_config(config: dict[str, Any], where: str) -> WhisperSpec:
    """A :class:`WhisperSpec` from a ``WhisperConfig`` dict (``config.json``)."""
    if config.get("model_type") != "whisper":
        raise BuildError(f"{where}: model_type {config.get('model_type')!r} is not 'whisper'")
    act = config.get("activation_function", "gelu")
    if act != "gelu":
        raise BuildError(f"{where}: activation_function {act!r} is not supported (only gelu)")
    if config.get("scale_embedding"):
        raise BuildError(f"{where}: scale_embedding=true is not supported")

    def need(key: str) -> int:
        if key not in config:
            raise BuildError(f"{where}: config.json lacks {key!r}")
        return int(config[key])

    def token(key: str, default: int) -> int:
        value = config.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        return default if value is None else int(value)

    eos = token("eos_token_id", 50256)
    return WhisperSpec(
        vocab_size=need("vocab_size"),
        d_model=need("d_model"),
        encoder_layers=need("encoder_layers"),
        encoder_heads=need("encoder_attention_heads"),
        encoder_ffn=need("encoder_ffn_dim"),
        decoder_layers=need("decoder_layers"),
        decoder_heads=need("decoder_attention_heads"),
        decoder_ffn=need("decoder_ffn_dim"),
        num_mel_bins=int(config.get("num_mel_bins", 80)),
        max_source_positions=int(config.get("max_source_positions", 1500)),
        max_target_positions=int(config.get("max_target_positions", 448)),
        bos_token_id=token("bos_token_id", eos),
        eos_token_id=eos,
        pad_token_id=token("pad_token_id", eos),
        decoder_start_token_id=token("decoder_start_token_id", eos + 1),
    )


class WhisperSource(TensorSource):
    """Base: ``spec``, ``path``, ``tensor(name)``, ``has(name)`` (HF names, no ``model.``)."""

    spec: WhisperSpec
    _kind = "Whisper "

    def lm_head(self) -> np.ndarray:
        """``proj_out.weight`` (``[vocab, d_model]``): the token embedding when tied."""
        if self.has("proj_out.weight"):
            return self.tensor("proj_out.weight")
        return self.tensor("decoder.embed_tokens.weight")

    def needed(self) -> list[str]:
        """Every tensor name the writer reads."""
        s = self.spec
        names = [
            f"encoder.{n}"
            for n in (
                "conv1.weight",
                "conv1.bias",
                "conv2.weight",
                "conv2.bias",
                "embed_positions.weight",
                "layer_norm.weight",
                "layer_norm.bias",
            )
        ]
        names += [
            "decoder.embed_tokens.weight",
            "decoder.embed_positions.weight",
            "decoder.layer_norm.weight",
            "decoder.layer_norm.bias",
        ]
        attn = [
            "q_proj.weight",
            "q_proj.bias",
            "k_proj.weight",
            "v_proj.weight",
            "v_proj.bias",
            "out_proj.weight",
            "out_proj.bias",
        ]
        common = [
            f"{n}.{w}"
            for n in ("self_attn_layer_norm", "final_layer_norm", "fc1", "fc2")
            for w in ("weight", "bias")
        ]
        for i in range(s.encoder_layers):
            p = f"encoder.layers.{i}"
            names += [f"{p}.self_attn.{a}" for a in attn] + [f"{p}.{c}" for c in common]
        for i in range(s.decoder_layers):
            p = f"decoder.layers.{i}"
            names += [f"{p}.self_attn.{a}" for a in attn] + [f"{p}.{c}" for c in common]
            names += [f"{p}.encoder_attn.{a}" for a in attn]
            names += [f"{p}.encoder_attn_layer_norm.weight", f"{p}.encoder_attn_layer_norm.bias"]
        return names


class DictWhisperSource(WhisperSource):
    """Weights already in memory (HF names without ``model.``): fixtures and tests."""

    def __init__(self, spec: WhisperSpec, weights: dict[str, np.ndarray], path: str = "<memory>"):
        self.spec, self.weights, self.path = spec, weights, Path(path)

    def has(self, name: str) -> bool:
        return name in self.weights

    def _load(self, name: str) -> np.ndarray:
        return self.weights[name]


# --------------------------------------------------------------------------------------------
# Hugging Face folder
# --------------------------------------------------------------------------------------------


class HFWhisperSource(WhisperSource):
    """A ``WhisperForConditionalGeneration`` folder: ``config.json`` + ``*.safetensors``."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = Path(folder)
        config_path = self.path / "config.json"
        if not config_path.is_file():
            raise BuildError(f"{self.path}: no config.json")
        self.config = json.loads(config_path.read_text(encoding="utf-8"))
        self.spec = spec_from_hf_whisper_config(self.config, str(config_path))
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise BuildError(f"{self.path}: no *.safetensors weights")
        self._where = SafetensorsFile.index(files)

    def _hf(self, name: str) -> str:
        return name if name == "proj_out.weight" else f"model.{name}"

    def has(self, name: str) -> bool:
        return self._hf(name) in self._where

    def _load(self, name: str) -> np.ndarray:
        hf = self._hf(name)
        return self._where[hf].tensor(hf)


# --------------------------------------------------------------------------------------------
# CTranslate2 folder
# --------------------------------------------------------------------------------------------

_CT2_DTYPES = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),  # bfloat16: widened below
}


def read_ct2_model(path: str | os.PathLike[str]) -> tuple[str, dict[str, np.ndarray]]:
    """``(spec name, {variable: array})`` of a CTranslate2 ``model.bin`` (aliases resolved;
    arrays are memory-mapped views, bfloat16 widened to float32)."""
    path = Path(path)
    if path.stat().st_size < 12:
        raise BuildError(f"{path}: truncated CTranslate2 model file ({path.stat().st_size} bytes)")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    size = data.shape[0]
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > size:
            raise BuildError(f"{path}: truncated CTranslate2 model file")
        chunk = bytes(data[pos : pos + n])
        pos += n
        return chunk

    def u(fmt: str) -> int:
        return struct.unpack("<" + fmt, take(struct.calcsize(fmt)))[0]

    def string() -> str:
        raw = take(u("H"))
        return raw.rstrip(b"\0").decode("utf-8")

    version = u("I")
    if not 3 <= version <= 6:
        raise BuildError(f"{path}: CTranslate2 binary version {version} is not supported (3-6)")
    name = string()
    u("I")  # spec revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(u("I")):
        var = string()
        rank = u("B")
        shape = [u("I") for _ in range(rank)]
        type_id = u("B")
        if type_id not in _CT2_DTYPES:
            raise BuildError(f"{path}: variable {var} has unknown dtype id {type_id}")
        nbytes = u("I")
        dtype = _CT2_DTYPES[type_id]
        if pos + nbytes > size:
            raise BuildError(f"{path}: truncated CTranslate2 model file (variable {var})")
        array = data[pos : pos + nbytes].view(dtype).reshape(shape)
        pos += nbytes
        if type_id == 5:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        variables[var] = array
    if version >= 5 or pos < size:
        for _ in range(u("I")):
            alias, target = string(), string()
            if target not in variables:
                raise BuildError(f"{path}: alias {alias} names unknown variable {target}")
            variables[alias] = variables[target]
    return name, variables


def _scalar(variables: dict[str, np.ndarray], name: str, path: Path) -> int:
    if name not in variables:
        raise BuildError(f"{path}: model.bin lacks {name}")
    return int(np.asarray(variables[name]).reshape(-1)[0])


class CT2WhisperSource(WhisperSource):
    """A CTranslate2 Whisper folder (faster-whisper's conversions): ``model.bin`` (spec
    ``WhisperSpec``), ``config.json`` (suppressed ids, language ids) and ``tokenizer.json``."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = Path(folder)
        model = self.path / "model.bin"
        if not model.is_file():
            raise BuildError(f"{self.path}: no model.bin (not a CTranslate2 model folder)")
        spec_name, self.vars = read_ct2_model(model)
        if spec_name != "WhisperSpec":
            raise BuildError(f"{model}: a {spec_name} model, not a Whisper one")
        config_path = self.path / "config.json"
        self.config = (
            json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        )
        tokenizer = self.path / "tokenizer.json"
        if not tokenizer.is_file():
            raise BuildError(f"{self.path}: no tokenizer.json beside model.bin")
        self.special_ids = {
            t["content"]: int(t["id"])
            for t in json.loads(tokenizer.read_text(encoding="utf-8")).get("added_tokens", [])
        }
        self.spec = self._spec()

    def _spec(self) -> WhisperSpec:
        v, p = self.vars, self.path

        def shape(name: str) -> tuple[int, ...]:
            if name not in v:
                raise BuildError(f"{p}: model.bin lacks {name}")
            return tuple(v[name].shape)

        def count(prefix: str) -> int:
            n = 0
            while f"{prefix}/layer_{n}/ffn/linear_0/weight" in v:
                n += 1
            return n

        vocab, d_model = shape("decoder/embeddings/weight")
        eot = self.special_ids.get("<|endoftext|>")
        sot = self.special_ids.get("<|startoftranscript|>")
        if eot is None or sot is None:
            raise BuildError(f"{p}/tokenizer.json: no <|endoftext|> / <|startoftranscript|>")
        # HF's English-only configs (vocabulary 51864) start with <|startoftranscript|> as
        # bos; the multilingual ones use <|endoftext|>.
        bos = sot if vocab == 51864 else eot
        return WhisperSpec(
            vocab_size=vocab,
            d_model=d_model,
            encoder_layers=count("encoder"),
            encoder_heads=_scalar(v, "encoder/num_heads", p),
            encoder_ffn=shape("encoder/layer_0/ffn/linear_0/weight")[0],
            decoder_layers=count("decoder"),
            decoder_heads=_scalar(v, "decoder/num_heads", p),
            decoder_ffn=shape("decoder/layer_0/ffn/linear_0/weight")[0],
            num_mel_bins=shape("encoder/conv1/weight")[1],
            max_source_positions=shape("encoder/position_encodings/encodings")[0],
            max_target_positions=shape("decoder/position_encodings/encodings")[0],
            bos_token_id=bos,
            eos_token_id=eot,
            pad_token_id=eot,
            decoder_start_token_id=sot,
        )

    # HF name -> (CTranslate2 variable, part of a fused tensor or None, parts)
    def _locate(self, name: str) -> tuple[str, int | None, int] | None:
        parts = name.split(".")
        if parts[0] == "proj_out":
            return "decoder/projection/weight", None, 1
        side = parts[0]
        if parts[1] == "conv1" or parts[1] == "conv2":
            return f"encoder/{parts[1]}/{parts[2]}", None, 1
        if parts[1] == "embed_positions":
            return f"{side}/position_encodings/encodings", None, 1
        if parts[1] == "embed_tokens":
            return "decoder/embeddings/weight", None, 1
        if parts[1] == "layer_norm":
            return f"{side}/layer_norm/{_LN[parts[2]]}", None, 1
        if parts[1] != "layers":
            return None
        layer = f"{side}/layer_{parts[2]}"
        block, rest = parts[3], parts[4:]
        if block in ("fc1", "fc2"):
            return f"{layer}/ffn/linear_{int(block[-1]) - 1}/{rest[0]}", None, 1
        if block == "final_layer_norm":
            return f"{layer}/ffn/layer_norm/{_LN[rest[0]]}", None, 1
        if block == "self_attn_layer_norm":
            return f"{layer}/self_attention/layer_norm/{_LN[rest[0]]}", None, 1
        if block == "encoder_attn_layer_norm":
            return f"{layer}/attention/layer_norm/{_LN[rest[0]]}", None, 1
        proj, kind = rest
        if block == "self_attn":
            if proj == "out_proj":
                return f"{layer}/self_attention/linear_1/{kind}", None, 1
            return f"{layer}/self_attention/linear_0/{kind}", "qkv".index(proj[0]), 3
        if block == "encoder_attn":
            if proj == "out_proj":
                return f"{layer}/attention/linear_2/{kind}", None, 1
            if proj == "q_proj":
                return f"{layer}/attention/linear_0/{kind}", None, 1
            return f"{layer}/attention/linear_1/{kind}", "kv".index(proj[0]), 2
        return None

    def has(self, name: str) -> bool:
        if name.endswith("k_proj.bias"):
            return False  # HF's Whisper has none; CTranslate2 stores zeros in the fused bias
        where = self._locate(name)
        return where is not None and where[0] in self.vars

    def _load(self, name: str) -> np.ndarray:
        where = self._locate(name)
        assert where is not None
        var, part, parts = where
        array = self.vars[var]
        scale = self.vars.get(f"{var}_scale")
        if array.dtype.kind in "iu" and scale is not None:
            values = array.astype(np.float32)
            scale = np.asarray(scale, dtype=np.float32)
            if scale.ndim == 0 or scale.size == 1:
                values = values / scale.reshape(())
            else:
                values = values / scale.reshape(-1, *([1] * (values.ndim - 1)))
            array = values
        elif array.dtype.kind in "iu":
            raise BuildError(f"{self.path}: {var} is an integer tensor without {var}_scale")
        if part is not None:
            rows = array.shape[0] // parts
            array = array[part * rows : (part + 1) * rows]
        return array


_LN = {"weight": "gamma", "bias": "beta"}


# --------------------------------------------------------------------------------------------


def is_whisper_input(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a Whisper checkpoint folder (HF ``model_type: whisper``, or a
    CTranslate2 folder with a ``model.bin``)."""
    p = Path(path)
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if not p.is_dir():
        return False
    if (p / "model.bin").is_file():
        return True
    config = p / "config.json"
    if config.is_file():
        try:
            return json.loads(config.read_text(encoding="utf-8")).get("model_type") == "whisper"
        except (ValueError, AttributeError):
            return False
    return False


def open_whisper_source(path: str | os.PathLike[str]) -> WhisperSource:
    """The Whisper checkpoint at ``path`` (an HF folder or a CTranslate2 folder)."""
    p = Path(path)
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if (p / "model.bin").is_file():
        return CT2WhisperSource(p)
    return HFWhisperSource(p)
