"""Write Whisper model folders the way onnxruntime-genai's builder writes them for
``WhisperForConditionalGeneration``: ``encoder.onnx`` + ``decoder.onnx`` (weights in
``*.onnx.data``), ``genai_config.json`` (``model.type "whisper"``, ``model.encoder`` and
``model.decoder`` sections), ``audio_processor_config.json`` and the tokenizer files.

encoder.onnx
    input ``audio_features`` float32 ``[batch, num_mel_bins, 2 * max_source_positions]``;
    outputs ``hidden_states`` ``[batch, max_source_positions, d_model]`` and, for every
    decoder layer ``i``, ``present_key_cross_{i}`` / ``present_value_cross_{i}``
    ``[batch, heads, max_source_positions, head_size]`` (the cross-attention K/V, computed
    once). Conv1d(k3) -> GELU -> Conv1d(k3, stride 2) -> GELU -> + positions, pre-norm layers
    with ``Attention`` (com.microsoft, fused QKV), final LayerNorm.
decoder.onnx
    inputs ``input_ids`` int32 ``[batch, sequence]``, ``past_key_self_{i}`` /
    ``past_value_self_{i}`` ``[batch, heads, past, head_size]``, ``past_key_cross_{i}`` /
    ``past_value_cross_{i}``; outputs ``logits`` float32 ``[batch, sequence, vocab]`` and
    ``present_key_self_{i}`` / ``present_value_self_{i}``. Positions are sliced from the
    learned table at ``past`` (the past key's length); self-attention is causal
    ``MultiHeadAttention`` with past/present, cross-attention ``MultiHeadAttention`` over the
    encoder's K/V.

Precisions: ``fp32``; ``int8`` / ``int4``: ``MatMulNBits`` (block 32, accuracy_level 4) for
every linear layer but the encoder's fused QKV (the ``Attention`` op takes float weights),
as the reference does; with int4 the token embedding is read from the lm_head's quantized
weight (``GatherBlockQuantized``). Norms, convolutions, positions and biases stay fp32.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from genai.builder.errors import BuildError
from genai.builder.genai_config import graph_section, search_section
from genai.builder.onnx_writer import _GraphWriter
from genai.builder.quantize import BLOCK, quantize_int4, quantize_int8
from genai.builder.tokenizer_gguf import added_token_entry
from genai.builder.whisper_sources import (
    CT2WhisperSource,
    HFWhisperSource,
    WhisperSource,
    WhisperSpec,
    open_whisper_source,
)
from genai.runtime.onnx_graph import MS_DOMAIN

__all__ = [
    "WHISPER_PRECISIONS",
    "audio_processor_config",
    "build_whisper",
    "whisper_genai_config",
    "write_whisper_folder",
]

log = logging.getLogger(__name__)

WHISPER_PRECISIONS = ("fp32", "int8", "int4")
#: LayerNorm epsilon of the reference's Whisper graphs (float32 1e-5).
_EPS = float(np.float32(1e-5))
_N_FFT = 400
_HOP = 160

Progress = Callable[[int, int], None]

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "special_tokens_map.json",
    "normalizer.json",
)


class _Writer:
    """Emits one graph (encoder or decoder) into a :class:`_GraphWriter`."""

    def __init__(self, g: _GraphWriter, precision: str) -> None:
        self.g, self.precision = g, precision

    def w(self, name: str, array: np.ndarray) -> str:
        return self.g.weight(name, np.ascontiguousarray(array, dtype=np.float32))

    def matmul(self, x: str, weight: np.ndarray, name: str) -> str:
        """``x @ weight.T``; ``weight`` is ``[out, in]`` (quantized unless fp32)."""
        g = self.g
        n, k = weight.shape
        if self.precision in ("int4", "int8") and k >= BLOCK:
            bits = 4 if self.precision == "int4" else 8
            q, scales = (quantize_int4 if bits == 4 else quantize_int8)(weight)
            return g.matmul_nbits(
                x,
                g.weight(f"{name}.MatMul.weight_Q{bits}", q),
                g.weight(f"{name}.MatMul.weight_scales", scales.reshape(-1)),
                k,
                n,
                bits,
            )
        return g.op("MatMul", x, self.w(f"{name}.MatMul.weight", weight.T))

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None, name: str) -> str:
        y = self.matmul(x, weight, name)
        if bias is not None:
            y = self.g.op("Add", y, self.w(f"{name}.Add.bias", bias))
        return y

    def layer_norm(self, x: str, weight: np.ndarray, bias: np.ndarray, name: str) -> str:
        return self.g.op(
            "LayerNormalization",
            x,
            self.w(f"{name}.weight", weight),
            self.w(f"{name}.bias", bias),
            axis=-1,
            epsilon=_EPS,
            stash_type=1,
        )

    def skip_layer_norm(
        self,
        residual: str,
        skip: str,
        weight: np.ndarray,
        bias: np.ndarray,
        name: str,
        out: str | None = None,
    ) -> tuple[str, str]:
        """``LayerNorm(residual + skip)``; returns ``(normed, residual + skip)``."""
        normed, _, _, total = self.g.ops(
            "SkipLayerNormalization",
            [residual, skip, self.w(f"{name}.weight", weight), self.w(f"{name}.bias", bias)],
            [out, "", "", None],
            domain=MS_DOMAIN,
            epsilon=_EPS,
        )
        return normed, total

    def src_linear(
        self, x: str, src: WhisperSource, prefix: str, name: str, *, bias: bool = True
    ) -> str:
        """`linear` with the checkpoint's ``prefix.weight`` (and ``prefix.bias``)."""
        b = src.tensor(f"{prefix}.bias") if bias else None
        return self.linear(x, src.tensor(f"{prefix}.weight"), b, name)

    def src_skip_layer_norm(
        self,
        residual: str,
        skip: str,
        src: WhisperSource,
        prefix: str,
        name: str,
        out: str | None = None,
    ) -> tuple[str, str]:
        """`skip_layer_norm` with the checkpoint's ``prefix.weight`` and ``prefix.bias``."""
        weight, bias = src.tensor(f"{prefix}.weight"), src.tensor(f"{prefix}.bias")
        return self.skip_layer_norm(residual, skip, weight, bias, name, out)

    def input_norm(
        self, residual: str, pending: str | None, src: WhisperSource, prefix: str, name: str
    ) -> tuple[str, str]:
        """A layer's first norm: LayerNorm of the embeddings for the first layer, else the
        previous layer's MLP output (``pending``) added and normed; returns (normed, residual)."""
        if pending is None:
            weight, bias = src.tensor(f"{prefix}.weight"), src.tensor(f"{prefix}.bias")
            return self.layer_norm(residual, weight, bias, name), residual
        return self.src_skip_layer_norm(residual, pending, src, prefix, name)

    def feed_forward(
        self, residual: str, attn: str, src: WhisperSource, p: str, name: str
    ) -> tuple[str, str]:
        """The end of layer ``p``: ``attn`` added, ``final_layer_norm``, the GELU MLP; returns
        (residual, MLP output)."""
        normed, residual = self.src_skip_layer_norm(
            residual, attn, src, f"{p}.final_layer_norm", f"{name}.post_attention_layernorm"
        )
        return residual, self.mlp(normed, src, p, name)

    def mlp(self, x: str, src: WhisperSource, p: str, name: str) -> str:
        h = self.src_linear(x, src, f"{p}.fc1", f"{name}.mlp.fc1")
        h = self.g.op("Gelu", h, approximate="none")
        return self.src_linear(h, src, f"{p}.fc2", f"{name}.mlp.fc2")


def _write_encoder(
    src: WhisperSource, out: Path, precision: str, progress: Progress | None
) -> None:
    s = src.spec
    g = _GraphWriter(out / "encoder.onnx.data", TensorProto.FLOAT)
    g.name = "encoder"
    wr = _Writer(g, precision)
    d, heads, frames, src_len = s.d_model, s.encoder_heads, s.num_frames, s.max_source_positions
    hd = s.head_size("encoder")
    try:
        g.input("audio_features", TensorProto.FLOAT, ["batch_size", s.num_mel_bins, frames])
        g.output("hidden_states", TensorProto.FLOAT, ["batch_size", src_len, d])
        for kind in ("key", "value"):
            for i in range(s.decoder_layers):
                g.output(
                    f"present_{kind}_cross_{i}",
                    TensorProto.FLOAT,
                    ["batch_size", s.decoder_heads, src_len, s.head_size("decoder")],
                )

        x = "audio_features"
        for conv, stride in (("conv1", 1), ("conv2", 2)):
            x = g.op(
                "Conv",
                x,
                wr.w(f"encoder.{conv}.weight", src.tensor(f"encoder.{conv}.weight")),
                wr.w(f"encoder.{conv}.bias", src.tensor(f"encoder.{conv}.bias")),
                dilations=[1],
                group=1,
                kernel_shape=[3],
                pads=[1, 1],
                strides=[stride],
            )
            x = g.op("Gelu", x, approximate="none")
        x = g.op("Transpose", x, perm=[0, 2, 1])
        positions = src.tensor("encoder.embed_positions.weight")
        if positions.shape != (src_len, d):
            raise BuildError(f"encoder positions {positions.shape} != ({src_len}, {d})")
        residual = g.op("Add", x, wr.w("encoder.embed_positions.weight", positions))
        pending: str | None = None
        total = s.encoder_layers + s.decoder_layers
        for i in range(s.encoder_layers):
            p, name = f"encoder.layers.{i}", f"model.layers.{i}"
            normed, residual = wr.input_norm(
                residual, pending, src, f"{p}.self_attn_layer_norm", f"{name}.input_layernorm"
            )
            a = f"{p}.self_attn"
            qkv = np.concatenate([src.tensor(f"{a}.{n}_proj.weight") for n in "qkv"], axis=0)
            bias = np.concatenate(
                [
                    src.tensor(f"{a}.q_proj.bias"),
                    np.zeros(d, np.float32),
                    src.tensor(f"{a}.v_proj.bias"),
                ]
            )
            attn = g.ops(
                "Attention",
                [
                    normed,
                    wr.w(f"{name}.attn.qkv_proj.weight", qkv.T),
                    wr.w(f"{name}.attn.qkv_proj.bias", bias),
                    "",
                    "",
                    "",
                    "",
                ],
                1,
                domain=MS_DOMAIN,
                num_heads=heads,
                qkv_hidden_sizes=[d, d, d],
                scale=float(hd**-0.5),
                unidirectional=0,
                do_rotary=0,
                rotary_embedding_dim=0,
                mask_filter_value=-10000.0,
                past_present_share_buffer=0,
            )[0]
            attn = wr.src_linear(attn, src, f"{a}.out_proj", f"{name}.attn.o_proj")
            residual, pending = wr.feed_forward(residual, attn, src, p, name)
            if progress:
                progress(i + 1, total)
        assert pending is not None
        wr.src_skip_layer_norm(
            residual,
            pending,
            src,
            "encoder.layer_norm",
            f"model.layers.{s.encoder_layers}.final_norm_layernorm",
            out="hidden_states",
        )

        dec_heads, dec_hd = s.decoder_heads, s.head_size("decoder")
        shape = g.const([-1, src_len, dec_heads, dec_hd])
        for i in range(s.decoder_layers):
            a = f"decoder.layers.{i}.encoder_attn"
            for kind, proj in (("key", "k_proj"), ("value", "v_proj")):
                y = wr.src_linear(
                    "hidden_states",
                    src,
                    f"{a}.{proj}",
                    f"model.layers.{i}.attn.cross.{proj}",
                    bias=proj == "v_proj",
                )
                y = g.op("Reshape", y, shape)
                g.op("Transpose", y, perm=[0, 2, 1, 3], out=f"present_{kind}_cross_{i}")
            if progress:
                progress(s.encoder_layers + i + 1, total)
    finally:
        g.finish()
    onnx.save_model(g.model(), str(out / "encoder.onnx"))


def _write_decoder(
    src: WhisperSource, out: Path, precision: str, progress: Progress | None
) -> None:
    s = src.spec
    g = _GraphWriter(out / "decoder.onnx.data", TensorProto.FLOAT)
    wr = _Writer(g, precision)
    d, heads, hd, n = s.d_model, s.decoder_heads, s.head_size("decoder"), s.decoder_layers
    try:
        g.input("input_ids", TensorProto.INT32, ["batch_size", "sequence_length"])
        for kind in ("key", "value"):
            for i in range(n):
                g.input(
                    f"past_{kind}_self_{i}",
                    TensorProto.FLOAT,
                    ["batch_size", heads, "past_sequence_length", hd],
                )
        for kind in ("key", "value"):
            for i in range(n):
                g.input(
                    f"past_{kind}_cross_{i}",
                    TensorProto.FLOAT,
                    ["batch_size", heads, s.max_source_positions, hd],
                )
        g.output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", s.vocab_size])
        for kind in ("key", "value"):
            for i in range(n):
                g.output(
                    f"present_{kind}_self_{i}",
                    TensorProto.FLOAT,
                    ["batch_size", heads, "total_sequence_length", hd],
                )

        # positions [past, past + sequence) of the learned table
        seq = g.op("Gather", g.op("Shape", "input_ids"), g.const([1]), axis=0)
        start = g.op("Gather", g.op("Shape", "past_key_self_0"), g.const([2]), axis=0)
        end = g.op("Add", seq, start)
        positions = src.tensor("decoder.embed_positions.weight")
        if positions.shape != (s.max_target_positions, d):
            raise BuildError(
                f"decoder positions {positions.shape} != ({s.max_target_positions}, {d})"
            )
        pos = g.op(
            "Slice",
            wr.w("decoder.embed_positions.weight", positions),
            start,
            end,
            g.const([0]),
            g.const([1]),
        )

        embed = src.tensor("decoder.embed_tokens.weight")
        if embed.shape != (s.vocab_size, d):
            raise BuildError(f"token embedding {embed.shape} != ({s.vocab_size}, {d})")
        head = src.lm_head()
        tied = head is embed or np.array_equal(head, embed)
        head_q4: tuple[str, str] | None = None
        if precision == "int4" and tied and d % BLOCK == 0:
            packed, scales = quantize_int4(head)
            q4 = g.weight("lm_head.MatMul.weight_Q4", packed)
            sc = g.weight("lm_head.MatMul.weight_scales", scales.reshape(-1))
            head_q4 = (q4, sc)
            tokens = g.gather_int4(q4, sc, "input_ids", s.vocab_size, d)
        else:
            tokens = g.op("Gather", wr.w("decoder.embed_tokens.weight", embed), "input_ids", axis=0)
        del embed
        residual = g.op("Add", tokens, pos)

        pending: str | None = None
        for i in range(n):
            p, name = f"decoder.layers.{i}", f"model.layers.{i}"
            normed, residual = wr.input_norm(
                residual, pending, src, f"{p}.self_attn_layer_norm", f"{name}.self_attn_layernorm"
            )
            a = f"{p}.self_attn"
            q = wr.src_linear(normed, src, f"{a}.q_proj", f"{name}.attn.q_proj")
            k = wr.src_linear(normed, src, f"{a}.k_proj", f"{name}.attn.k_proj", bias=False)
            v = wr.src_linear(normed, src, f"{a}.v_proj", f"{name}.attn.v_proj")
            attn = g.ops(
                "MultiHeadAttention",
                [q, k, v, "", "", "", f"past_key_self_{i}", f"past_value_self_{i}"],
                [None, f"present_key_self_{i}", f"present_value_self_{i}"],
                domain=MS_DOMAIN,
                num_heads=heads,
                scale=float(hd**-0.5),
                unidirectional=1,
            )[0]
            attn = wr.src_linear(attn, src, f"{a}.out_proj", f"{name}.attn.o_proj")
            normed, residual = wr.src_skip_layer_norm(
                residual,
                attn,
                src,
                f"{p}.encoder_attn_layer_norm",
                f"{name}.cross_attn_layernorm",
            )
            c = f"{p}.encoder_attn"
            q = wr.src_linear(normed, src, f"{c}.q_proj", f"{name}.cross_attn.q_proj")
            cross = g.ops(
                "MultiHeadAttention",
                [q, f"past_key_cross_{i}", f"past_value_cross_{i}"],
                1,
                domain=MS_DOMAIN,
                num_heads=heads,
                scale=float(hd**-0.5),
                unidirectional=0,
            )[0]
            cross = wr.src_linear(cross, src, f"{c}.out_proj", f"{name}.cross_attn.o_proj")
            residual, pending = wr.feed_forward(residual, cross, src, p, name)
            if progress:
                progress(i + 1, n + 1)
        assert pending is not None
        normed, _ = wr.src_skip_layer_norm(
            residual, pending, src, "decoder.layer_norm", f"model.layers.{n}.final_norm_layernorm"
        )
        if head_q4 is not None:
            g.matmul_nbits(normed, *head_q4, d, s.vocab_size, out="logits")
        else:
            logits = wr.matmul(normed, head, "lm_head")
            g.op("Identity", logits, out="logits")
        if progress:
            progress(n + 1, n + 1)
    finally:
        g.finish()
    onnx.save_model(g.model(), str(out / "decoder.onnx"))


def _hann_window(n: int = _N_FFT) -> list[float]:
    """The periodic Hann window the reference lists in its STFT step (float32 values)."""
    k = np.arange(n, dtype=np.float64)
    return [float(v) for v in (0.5 - 0.5 * np.cos(2 * np.pi * k / n)).astype(np.float32)]


def audio_processor_config(num_mel_bins: int) -> dict[str, Any]:
    """``audio_processor_config.json``: decode, STFT (n_fft 400, hop 160) and log-mel."""
    return {
        "feature_extraction": {
            "sequence": [
                {"operation": {"name": "audio_decoder", "type": "AudioDecoder"}},
                {
                    "operation": {
                        "name": "STFT",
                        "type": "STFTNorm",
                        "attrs": {
                            "n_fft": _N_FFT,
                            "frame_length": _N_FFT,
                            "hop_length": _HOP,
                            "_comment": _hann_window(),
                        },
                    }
                },
                {
                    "operation": {
                        "name": "log_mel_spectrogram",
                        "type": "LogMelSpectrum",
                        "attrs": {
                            "chunk_size": 30,
                            "hop_length": _HOP,
                            "n_fft": _N_FFT,
                            "n_mel": num_mel_bins,
                        },
                    }
                },
            ]
        }
    }


def whisper_genai_config(spec: WhisperSpec) -> dict[str, Any]:
    """The ``genai_config.json`` document of a Whisper folder (the reference's keys)."""

    def section(part: str) -> dict[str, Any]:
        heads = spec.encoder_heads if part == "encoder" else spec.decoder_heads
        return graph_section(
            f"{part}.onnx",
            head_size=spec.head_size(part),
            hidden_size=spec.d_model,
            num_heads=heads,
            num_kv_heads=heads,
            num_layers=spec.encoder_layers if part == "encoder" else spec.decoder_layers,
            inputs={},
            outputs={},
        )

    decoder, encoder = section("decoder"), section("encoder")
    decoder["inputs"] = {
        "input_ids": "input_ids",
        "past_key_names": "past_key_self_%d",
        "past_value_names": "past_value_self_%d",
        "cross_past_key_names": "past_key_cross_%d",
        "cross_past_value_names": "past_value_cross_%d",
    }
    decoder["outputs"] = {
        "logits": "logits",
        "present_key_names": "present_key_self_%d",
        "present_value_names": "present_value_self_%d",
    }
    encoder["inputs"] = {"audio_features": "audio_features"}
    encoder["outputs"] = {
        "encoder_hidden_states": "hidden_states",
        "cross_present_key_names": "present_key_cross_%d",
        "cross_present_value_names": "present_value_cross_%d",
    }
    return {
        "model": {
            "bos_token_id": spec.bos_token_id,
            "context_length": spec.max_target_positions,
            "decoder": decoder,
            "encoder": encoder,
            "eos_token_id": spec.eos_token_id,
            "pad_token_id": spec.pad_token_id,
            "type": "whisper",
            "vocab_size": spec.vocab_size,
        },
        "search": search_section(spec.max_target_positions, share_buffer=False, top_k=1),
    }


def whisper_tokenizer_config(spec: WhisperSpec) -> dict[str, Any]:
    """A ``tokenizer_config.json`` for a folder whose checkpoint brings only tokenizer.json
    (CTranslate2): the fields transformers' ``WhisperTokenizer`` saves."""
    return {
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "model_max_length": spec.max_target_positions,
        "predict_timestamps": False,
        "language": None,
        "task": None,
        "tokenizer_class": "WhisperTokenizer",
    }


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=4) + "\n", encoding="utf-8")


def write_whisper_folder(
    source: WhisperSource,
    out_dir: str | os.PathLike[str],
    *,
    precision: str = "fp32",
    stage: Callable[[str, int], Progress] | None = None,
) -> Path:
    """Write the model (ONNX + configs) for ``source`` into ``out_dir``; tokenizer files are
    the caller's (see :func:`build_whisper`). Returns ``out_dir``."""
    if precision not in WHISPER_PRECISIONS:
        raise BuildError(
            f"Whisper precision must be one of {', '.join(WHISPER_PRECISIONS)}, got {precision!r}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source.check_complete()
    s = source.spec
    _write_encoder(
        source,
        out,
        precision,
        stage("encoder", s.encoder_layers + s.decoder_layers) if stage else None,
    )
    _write_decoder(
        source, out, precision, stage("decoder", s.decoder_layers + 1) if stage else None
    )
    _write_json(out / "genai_config.json", whisper_genai_config(s))
    _write_json(out / "audio_processor_config.json", audio_processor_config(s.num_mel_bins))
    return out


_TIMESTAMP = re.compile(r"<\|\d+\.\d\d\|>")


def _add_timestamp_tokens(tokenizer_json: Path, vocabulary_txt: Path) -> int:
    """Add the timestamp tokens (``<|0.00|>`` ...) that CTranslate2's ``vocabulary.txt`` lists
    past the ids of ``tokenizer.json`` as added tokens (non-special, as Hugging Face's Whisper
    tokenizers have them), so that timestamps encode and decode. Returns how many."""
    document = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    added = document.setdefault("added_tokens", [])
    known = {int(t["id"]) for t in added} | set(document.get("model", {}).get("vocab", {}).values())
    tokens = vocabulary_txt.read_text(encoding="utf-8").split("\n")
    new = [
        (i, token)
        for i, token in enumerate(tokens)
        if i not in known and _TIMESTAMP.fullmatch(token)
    ]
    added.extend(added_token_entry(i, token, special=False) for i, token in new)
    if new:
        tokenizer_json.write_text(
            json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
        )
    return len(new)


def _copy_tokenizer(source: WhisperSource, out: Path) -> None:
    if not (source.path / "tokenizer.json").is_file():
        raise BuildError(f"{source.path}: no tokenizer.json (save the Whisper tokenizer there)")
    for name in _TOKENIZER_FILES:
        if (source.path / name).is_file():
            shutil.copyfile(source.path / name, out / name)
    if isinstance(source, CT2WhisperSource) or not (out / "tokenizer_config.json").is_file():
        _write_json(out / "tokenizer_config.json", whisper_tokenizer_config(source.spec))
    vocabulary = source.path / "vocabulary.txt"
    if isinstance(source, CT2WhisperSource) and vocabulary.is_file():
        count = _add_timestamp_tokens(out / "tokenizer.json", vocabulary)
        if count:
            log.info("added %d timestamp tokens from vocabulary.txt to tokenizer.json", count)


def build_whisper(
    input_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    precision: str = "fp32",
    stage: Callable[[str, int], Progress] | None = None,
) -> Path:
    """Build a Whisper folder from a Hugging Face or CTranslate2 checkpoint folder."""
    source = open_whisper_source(input_path)
    kind = "CTranslate2" if isinstance(source, CT2WhisperSource) else "Hugging Face"
    assert isinstance(source, (CT2WhisperSource, HFWhisperSource))
    s = source.spec
    log.info(
        "building Whisper (%s, %d+%d layers, d_model %d, %s) into %s",
        kind,
        s.encoder_layers,
        s.decoder_layers,
        s.d_model,
        precision,
        out_dir,
    )
    if not (source.path / "tokenizer.json").is_file():  # before the weights are written
        raise BuildError(f"{source.path}: no tokenizer.json (save the Whisper tokenizer there)")
    out = write_whisper_folder(source, out_dir, precision=precision, stage=stage)
    _copy_tokenizer(source, out)
    return out
