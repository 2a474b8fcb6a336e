"""Write a decoder as an ONNX graph both engines run: GroupQueryAttention with the shared-buffer
KV cache and rotary inside the op, RMSNorm as (Skip)SimplifiedLayerNormalization, SwiGLU/GeGLU
MLPs, fp32 / fp16 / int4 (MatMulNBits, block 32) weights.

Graph inputs: ``input_ids`` and ``attention_mask`` (int64), ``past_key_values.{i}.key|value``
``[batch, kv_heads, past, head_dim]``; outputs ``logits`` (float32) and ``present.{i}.key|value``.
``seqlens_k = ReduceSum(attention_mask) - 1`` and ``total_sequence_length = Shape(mask)[1]``
are computed inside the graph (the layout the reference's builder uses).

By default ``logits`` is ``[batch, 1, vocab]``: only each row's last real token (the last
position whose mask is 1 among the new tokens) reaches the final norm and the lm_head; a second
output, ``new_token_logits`` ``[batch, n, vocab]``, holds the logits of every new token of a short
run on top of a past (n = the run's tokens when there is a past and at most
``VERIFY_TOKENS``, else 1, the same row as ``logits``): what speculative decoding verifies
proposed tokens with, one run for several tokens, while a prompt still costs one lm_head row.
With ``all_logits=True`` ``logits`` is ``[batch, sequence, vocab]``.

With ``prefill_int8=True`` (int4 only) the graph is one ``If`` on the run's new tokens per row
(``sequence_length > VERIFY_TOKENS``): a prompt (or an appended turn) of more than 17 tokens
takes the same decoder with the layers' linears as ``MatMulIntegerToFloat`` over int8 per-column
weights (7-bit range) and uint8 activations quantized per token, whose int8 GEMM is 2-3x faster
than ``MatMulNBits`` at 8+ rows on CPUs; every shorter run takes the int4 graph: decode steps,
batched or not, and speculative verification, so their tokens do not depend on batching or
speculation. The embedding and the lm_head stay int4. Both engines run such a folder
unchanged.

Weights go to ``model.onnx.data`` as they are produced (one layer in memory at a time).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from genai.builder.errors import BuildError
from genai.builder.quantize import BLOCK, quantize_int4, quantize_int8_columns
from genai.builder.sources import Source
from genai.builder.spec import ModelSpec
from genai.runtime.onnx_graph import MS_DOMAIN, GraphBuilder

__all__ = [
    "NEW_TOKEN_LOGITS",
    "PRECISIONS",
    "VERIFY_TOKENS",
    "check_attention",
    "check_rope",
    "check_source",
    "write_onnx",
]

#: The output with the logits of every new token of a short run on top of a past (see the
#: module docstring): speculative decoding verifies several proposed tokens in one run.
NEW_TOKEN_LOGITS = "new_token_logits"
#: The most new tokens a run gets ``new_token_logits`` rows for (16 proposals + the pending
#: token, the reference's largest max_draft_tokens + 1).
VERIFY_TOKENS = 17

PRECISIONS = ("fp32", "fp16", "int4")
_MS = MS_DOMAIN
_ALIGN = 4096
_INLINE_MAX = 1024

Progress = Callable[[int, int], None]


class _GraphWriter(GraphBuilder):
    """The shared graph builder, writing large weights to one external-data file."""

    def __init__(self, data_path: Path, float_type: int) -> None:
        super().__init__("decoder", producer="genai.builder")
        self.data_path = data_path
        self._data = open(data_path, "wb")  # noqa: SIM115 - closed in finish()
        self.float_type = float_type
        self.np_float = np.float16 if float_type == TensorProto.FLOAT16 else np.float32

    def finish(self) -> None:
        self._data.close()

    def matmul_nbits(
        self, x: str, q: str, scales: str, k: int, n: int, bits: int = 4, out: str | None = None
    ) -> str:
        """``x @ W.T`` for ``W`` ``[n, k]`` block-quantized to ``bits`` (``q`` and ``scales``:
        its initializers, as `quantize_int4` / `quantize_int8` make them)."""
        return self.op(
            "MatMulNBits",
            x,
            q,
            scales,
            out=out,
            domain=_MS,
            K=k,
            N=n,
            bits=bits,
            block_size=BLOCK,
            accuracy_level=4,
        )

    def gather_int4(self, q4: str, scales: str, ids: str, rows: int, cols: int) -> str:
        """Rows ``ids`` of a ``[rows, cols]`` table block-quantized to int4 (``q4`` and
        ``scales``: its `quantize_int4` initializers, shared with a tied lm_head)."""
        data = self.op("Reshape", q4, self.const([rows, cols // 2]))
        block_scales = self.op("Reshape", scales, self.const([rows, cols // BLOCK]))
        return self.op(
            "GatherBlockQuantized",
            data,
            ids,
            block_scales,
            domain=_MS,
            bits=4,
            block_size=BLOCK,
            gather_axis=0,
            quantize_axis=1,
        )

    def weight(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        if array.nbytes <= _INLINE_MAX:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        pos = self._data.tell()
        offset = -(-pos // _ALIGN) * _ALIGN
        if offset != pos:
            self._data.write(b"\0" * (offset - pos))
        self._data.write(array.tobytes())
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.data_path.name),
            ("offset", str(offset)),
            ("length", str(array.nbytes)),
        ):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
        return name

    def fconst(self, value: float) -> str:
        return self.const(value, self.np_float)


class _Decoder:
    """Emits the decoder for one spec/precision into a :class:`_GraphWriter`."""

    def __init__(
        self,
        g: _GraphWriter,
        spec: ModelSpec,
        precision: str,
        window_cache: bool = False,
        prefill_int8: bool = False,
    ) -> None:
        self.g, self.spec, self.precision = g, spec, precision
        self.window_cache = window_cache
        self.ft = g.float_type
        self.prefill_int8 = prefill_int8
        #: ids of the nodes only the decode-step (int4) / multi-token (int8) branch runs
        self.decode_only: set[int] = set()
        self.prefill_only: set[int] = set()

    # -- building blocks -------------------------------------------------------------------

    def linear(
        self,
        x: str,
        weight: np.ndarray,
        name: str,
        bias: np.ndarray | None = None,
    ) -> str:
        """``x @ weight.T (+ bias)``; ``weight`` is ``[out, in]``. With ``prefill_int8``, an
        int8 twin for the multi-token branch too (`per_token_matmul`)."""
        g = self.g
        n, k = weight.shape
        if self.precision == "int4" and k >= BLOCK:
            packed, scales = quantize_int4(weight)
            y = g.matmul_nbits(
                x,
                g.weight(f"{name}.weight_Q4", packed),
                g.weight(f"{name}.weight_scales", scales.reshape(-1)),
                k,
                n,
            )
            if self.prefill_int8:  # the same output from int8 weights, for prompts
                self.decode_only.add(id(g.nodes[-1]))
                first = len(g.nodes)
                q8, scales8 = quantize_int8_columns(weight)
                self.per_token_matmul(
                    x,
                    g.weight(f"{name}.weight_Q8", q8),
                    g.weight(f"{name}.weight_scales_Q8", scales8),
                    y,
                )
                self.prefill_only.update(id(node) for node in g.nodes[first:])
        else:
            wt = np.ascontiguousarray(weight.T.astype(g.np_float))
            y = g.op("MatMul", x, g.weight(f"{name}.weight", wt))
        if bias is not None:
            y = g.op("Add", y, g.weight(f"{name}.bias", bias.astype(g.np_float)))
        return y

    def per_token_matmul(self, x: str, q8: str, scales8: str, out: str) -> None:
        """``out = x @ (q8 * scales8)`` with ``x`` quantized to uint8 per token (row):
        ``xq = floor(x * 127 / max|x_row| + 128.5)`` (round half up, zero point 128),
        ``MatMulIntegerToFloat`` (MLAS's u8 x s8 GEMM with the weights' column scales applied
        to its int32 sums), then the row's scale ``max|x_row| / 127``. A scale per token, not
        per tensor (DynamicQuantizeMatMul, ~30 % faster): SmolLM2's down_proj inputs have
        outlier tokens that one scale for the whole prompt crushes (its greedy text turned to
        garbage); per token, every linear included, the prompt's logits are closer to fp32's
        than the int4 graph's (benchmarks/prefill.py, docs/benchmarks.md). Multiplying by the
        inverse scale and rounding in the uint8 cast (+ 128.5, truncated) saves a Div and a
        Round per quantization, the fused GEMM a Cast and a Mul per linear: 6-8 % of the
        linears' time at 128-512 tokens (docs/benchmarks.md)."""
        g = self.g
        top = g.op(
            "Max", g.op("ReduceMax", g.op("Abs", x), g.const([-1]), keepdims=1), g.fconst(1e-12)
        )
        shifted = g.op("Add", g.op("Mul", x, g.op("Div", g.fconst(127.0), top)), g.fconst(128.5))
        xq = g.op("Cast", shifted, to=TensorProto.UINT8)
        y = g.op(
            "MatMulIntegerToFloat",
            xq,
            q8,
            g.fconst(1.0),
            scales8,
            g.const(128, np.uint8),
            domain=_MS,
        )
        g.op("Mul", y, g.op("Div", top, g.fconst(127.0)), out=out)

    def norm_weight(self, array: np.ndarray, name: str) -> str:
        return self.g.weight(name, array.astype(self.g.np_float))

    def rms(self, x: str, weight: str) -> str:
        return self.g.op(
            "SimplifiedLayerNormalization", x, weight, axis=-1, epsilon=self.spec.rms_eps
        )

    def skip_rms(self, residual: str, skip: str, weight: str) -> tuple[str, str]:
        normed, _, _, total = self.g.ops(
            "SkipSimplifiedLayerNormalization",
            [residual, skip, weight],
            [None, "", "", None],
            domain=_MS,
            epsilon=self.spec.rms_eps,
        )
        return normed, total

    def head_norm(self, x: str, weight: np.ndarray, name: str) -> str:
        """Per-head RMSNorm on ``[b, s, heads * head_dim]``."""
        g, hd = self.g, self.spec.head_dim
        x4 = g.op("Reshape", x, g.const([0, 0, -1, hd]))
        y = self.rms(x4, self.norm_weight(weight, name))
        return g.op("Reshape", y, g.const([0, 0, -1]))

    def activation(self, x: str) -> str:
        g = self.g
        if self.spec.activation == "silu":
            return g.op("Mul", x, g.op("Sigmoid", x))
        if self.spec.activation == "gelu":  # HF "gelu": the exact (erf) GELU
            return g.op("Gelu", x)
        return g.op("Gelu", x, approximate="tanh")

    # -- the whole graph ---------------------------------------------------------------------

    def build(self, source: Source, all_logits: bool, progress: Progress | None) -> None:
        g, s = self.g, self.spec
        kv_shape_in = ["batch_size", s.num_kv_heads, "past_sequence_length", s.head_dim]
        kv_shape_out = ["batch_size", s.num_kv_heads, "total_sequence_length", s.head_dim]
        g.inputs.append(
            helper.make_tensor_value_info(
                "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
            )
        )
        g.inputs.append(
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]
            )
        )
        for i in range(s.num_layers):
            for kind in ("key", "value"):
                g.inputs.append(
                    helper.make_tensor_value_info(
                        f"past_key_values.{i}.{kind}", self.ft, kv_shape_in
                    )
                )
        logits_seq = "sequence_length" if all_logits else 1
        g.outputs.append(
            helper.make_tensor_value_info(
                "logits", TensorProto.FLOAT, ["batch_size", logits_seq, s.vocab_size]
            )
        )
        for i in range(s.num_layers):
            for kind in ("key", "value"):
                g.outputs.append(
                    helper.make_tensor_value_info(f"present.{i}.{kind}", self.ft, kv_shape_out)
                )

        # attention-mask bookkeeping, as the reference's graphs do it
        mask_sum = g.op("ReduceSum", "attention_mask", g.const([1]), keepdims=0)
        seqlens64 = g.op("Sub", mask_sum, g.const([1]))
        seqlens_k = g.op("Cast", seqlens64, to=TensorProto.INT32)
        total64 = g.op("Gather", g.op("Shape", "attention_mask"), g.const(1), axis=0)
        total_len = g.op("Cast", total64, to=TensorProto.INT32)
        local_rope = bool(s.rope_local_theta)
        uses = {bool(local_rope and sliding) for sliding in s.sliding_layers}
        caches: dict[bool, tuple[str, str]] = {}
        for local in sorted(uses):
            cos, sin = s.rotary_tables(local=local)
            suffix = "_local" if local else ""
            caches[local] = (
                g.weight(f"cos_cache{suffix}", cos.astype(g.np_float)),
                g.weight(f"sin_cache{suffix}", sin.astype(g.np_float)),
            )

        total_steps = s.num_layers + 2
        if progress:
            progress(0, total_steps)

        # embeddings (int4 + tied: share the lm_head's quantized weight)
        embed = source.tensor("embed")
        if embed.shape != (s.vocab_size, s.hidden_size):
            raise BuildError(
                f"embedding shape {embed.shape} != (vocab {s.vocab_size}, hidden {s.hidden_size})"
            )
        head_q4: tuple[str, str] | None = None
        quantized_embed = self.precision == "int4" and s.hidden_size % BLOCK == 0
        if quantized_embed:
            packed, scales = quantize_int4(embed)
            q4 = g.weight("embed_tokens.weight_Q4", packed)
            sc = g.weight("embed_tokens.weight_scales", scales.reshape(-1))
            if s.tie_embeddings:
                head_q4 = (q4, sc)
            hidden = g.gather_int4(q4, sc, "input_ids", s.vocab_size, s.hidden_size)
        else:
            table = g.weight("embed_tokens.weight", embed.astype(g.np_float))
            hidden = g.op("Gather", table, "input_ids", axis=0)
        if s.embed_scale is not None:
            hidden = g.op("Mul", hidden, g.fconst(s.embed_scale))
        lm_head_source = embed if s.tie_embeddings else None
        del embed
        if progress:
            progress(1, total_steps)

        residual = hidden
        pending: str | None = None  # the last sub-block output, not yet added to the residual
        for i in range(s.num_layers):
            w = {name.partition(".")[2]: source.tensor(name) for name in source.layer_names(i)}
            p = f"model.layers.{i}"
            ln1 = self.norm_weight(w["ln1"], f"{p}.input_layernorm.weight")
            if pending is None:
                normed = self.rms(residual, ln1)
            else:
                normed, residual = self.skip_rms(residual, pending, ln1)
            attn = self.attention(normed, w, i, p, seqlens_k, total_len, caches)
            if s.sandwich_norm:
                attn = self.rms(attn, self.norm_weight(w["post_attn_norm"], f"{p}.post_attn_norm"))
            ln2 = self.norm_weight(w["ln2"], f"{p}.pre_mlp_layernorm.weight")
            normed, residual = self.skip_rms(residual, attn, ln2)
            gate = self.linear(normed, w["gate"], f"{p}.mlp.gate_proj")
            up = self.linear(normed, w["up"], f"{p}.mlp.up_proj")
            mlp = self.linear(
                g.op("Mul", self.activation(gate), up), w["down"], f"{p}.mlp.down_proj"
            )
            if s.sandwich_norm:
                mlp = self.rms(mlp, self.norm_weight(w["post_ffn_norm"], f"{p}.post_ffn_norm"))
            pending = mlp
            del w
            if progress:
                progress(i + 2, total_steps)

        assert pending is not None
        final_norm = self.norm_weight(source.tensor("final_norm"), "model.norm.weight")
        if all_logits:
            normed, _ = self.skip_rms(residual, pending, final_norm)
        else:
            x = g.op("Add", residual, pending)
            seq64 = g.op("Gather", g.op("Shape", "input_ids"), g.const(1), axis=0)
            past64 = g.op("Sub", total64, seq64)
            index = g.op("Sub", seqlens64, past64)  # [batch]: last real token among the new
            index = g.op("Max", g.op("Min", index, g.op("Sub", seq64, g.const(1))), g.const(0))
            # the last `keep` of them: every new token of a short run on top of a past
            short = g.op(
                "And",
                g.op("Greater", past64, g.const(0)),
                g.op("LessOrEqual", seq64, g.const(VERIFY_TOKENS)),
            )
            keep = g.op("Where", short, seq64, g.const(1))
            offsets = g.op("Range", g.op("Sub", g.const(1), keep), g.const(1), g.const(1))
            index = g.op("Add", g.op("Unsqueeze", index, g.const([1])), offsets)
            index = g.op("Max", index, g.const(0))
            index = g.op("Unsqueeze", index, g.const([2]))
            index = g.op("Expand", index, g.const([1, 1, s.hidden_size]))
            x = g.op("GatherElements", x, index, axis=1)
            normed = self.rms(x, final_norm)
        if head_q4 is not None:
            logits = g.matmul_nbits(normed, *head_q4, s.hidden_size, s.vocab_size)
        else:
            head = lm_head_source if lm_head_source is not None else source.tensor("lm_head")
            logits = self.linear(normed, head, "lm_head")
            del head
        if s.final_softcap:
            cap = g.fconst(s.final_softcap)
            logits = g.op("Mul", g.op("Tanh", g.op("Div", logits, cap)), cap)
        if self.ft != TensorProto.FLOAT:
            logits = g.op("Cast", logits, to=TensorProto.FLOAT)
        if all_logits:
            g.op("Identity", logits, out="logits")
        else:  # [batch, keep, vocab]; its last row (each row's last real token) is `logits`
            g.op("Identity", logits, out=NEW_TOKEN_LOGITS)
            g.op("Slice", logits, g.const([-1]), g.const([2**62]), g.const([1]), out="logits")
            g.outputs.append(
                helper.make_tensor_value_info(
                    NEW_TOKEN_LOGITS, TensorProto.FLOAT, ["batch_size", "new_tokens", s.vocab_size]
                )
            )
        if progress:
            progress(total_steps, total_steps)

    def attention(
        self,
        x: str,
        w: dict[str, np.ndarray],
        i: int,
        p: str,
        seqlens_k: str,
        total_len: str,
        caches: dict[bool, tuple[str, str]],
    ) -> str:
        g, s = self.g, self.spec
        if s.qk_norm:
            q = self.linear(x, w["q"], f"{p}.attn.q_proj", w.get("q_bias"))
            k = self.linear(x, w["k"], f"{p}.attn.k_proj", w.get("k_bias"))
            v = self.linear(x, w["v"], f"{p}.attn.v_proj", w.get("v_bias"))
            q = self.head_norm(q, w["q_norm"], f"{p}.attn.q_norm.weight")
            k = self.head_norm(k, w["k_norm"], f"{p}.attn.k_norm.weight")
            qkv_inputs = [q, k, v]
        else:
            qkv = np.concatenate([w["q"], w["k"], w["v"]], axis=0)
            bias = None
            if s.qkv_bias:
                bias = np.concatenate([w["q_bias"], w["k_bias"], w["v_bias"]])
            qkv_inputs = [self.linear(x, qkv, f"{p}.attn.qkv_proj", bias), "", ""]
        sliding = s.sliding_layers[i]
        cos, sin = caches[bool(s.rope_local_theta and sliding)]
        window = -1
        if sliding and s.sliding_window:
            # Checked against HF's masking (tests): the same number, no off-by-one.
            window = s.sliding_window
        out = g.ops(
            "GroupQueryAttention",
            [
                *qkv_inputs,
                f"past_key_values.{i}.key",
                f"past_key_values.{i}.value",
                seqlens_k,
                total_len,
                cos,
                sin,
            ],
            [None, f"present.{i}.key", f"present.{i}.value"],
            domain=_MS,
            name=f"{p}/attn/GroupQueryAttention",
            num_heads=s.num_heads,
            kv_num_heads=s.num_kv_heads,
            scale=float(s.scale),
            do_rotary=1,
            rotary_interleaved=0,
            local_window_size=window,
            softcap=float(s.attn_softcap),
            # Window-sized caches the op compacts itself (the reference's CPU/CUDA export);
            # genai_config's sliding_window block sizes them.
            **({"sliding_window_cache": 1} if window > 0 and self.window_cache else {}),
        )[0]
        return self.linear(out, w["o"], f"{p}.attn.o_proj")


def _split_by_run_length(g: _GraphWriter, decoder: _Decoder) -> None:
    """Turn ``g``'s nodes into ``If(sequence_length > VERIFY_TOKENS, prefill branch, decode
    branch)``: the
    decode branch without the int8 nodes, the prefill branch without the int4 ones they shadow.
    Each branch's values are renamed under its own prefix (ONNX names are unique across
    scopes); initializers and graph inputs stay in the outer graph, where both branches read
    them."""

    def branch(tag: str, skip: set[int]) -> onnx.GraphProto:
        nodes = [node for node in g.nodes if id(node) not in skip]
        rename = {out: f"{tag}/{out.lstrip('/')}" for node in nodes for out in node.output if out}
        copies = []
        for node in nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [rename.get(name, name) for name in copy.input]
            copy.output[:] = [rename.get(name, name) for name in copy.output]
            copy.name = f"{tag}/{copy.name.lstrip('/')}"
            copies.append(copy)
        outputs = []
        for value in g.outputs:
            renamed = onnx.ValueInfoProto()
            renamed.CopyFrom(value)
            renamed.name = rename[value.name]
            outputs.append(renamed)
        return helper.make_graph(copies, tag, [], outputs)

    prefill = branch("prefill", decoder.decode_only)
    decode = branch("decode", decoder.prefill_only)
    g.nodes = []
    seq = g.op("Gather", g.op("Shape", "input_ids"), g.const(1), axis=0)
    g.ops(
        "If",
        [g.op("Greater", seq, g.const(VERIFY_TOKENS))],
        [value.name for value in g.outputs],
        name="prefill_or_decode",
        then_branch=prefill,
        else_branch=decode,
    )


def check_attention(spec: ModelSpec, where: str = "spec") -> None:
    """A one-line :class:`BuildError` when onnxruntime's ``GroupQueryAttention`` cannot run
    ``spec``'s attention. With rotary inside the op (cos/sin caches), onnxruntime's
    ``group_query_attention_helper.h`` needs head_size % 8 == 0, then head_size % 16 == 0,
    and cos_cache's width (rotary_dim / 2) <= head_size / 2 and a multiple of 8, i.e. a
    rotary dimension that is a multiple of 16 and at most head_size (checked on onnxruntime
    1.32: head sizes 8, 12, 24, 40 and rotary 8, 24 fail at the first token in both engines;
    16, 32, 48, 64 and rotary 16, 32, 48 run)."""
    hd = spec.head_dim
    rot = int(spec.rotary_dim if spec.rotary_dim is not None else hd)
    if hd % 16:
        raise BuildError(
            f"{where}: head_dim {hd} is not a multiple of 16, which onnxruntime's "
            "GroupQueryAttention (with rotary) needs"
        )
    if rot <= 0 or rot % 16 or rot > hd:
        raise BuildError(
            f"{where}: rotary dimension {rot} (head_dim {hd} x partial_rotary_factor) must be a "
            f"multiple of 16 and at most head_dim {hd} for onnxruntime's GroupQueryAttention"
        )


def check_rope(spec: ModelSpec, where: str = "spec") -> None:
    """A :class:`BuildError` when the rotary tables cannot be made (unsupported or malformed
    rope scaling): before anything is written."""
    try:
        spec.inv_freq()
        if spec.rope_local_theta:
            spec.inv_freq(local=True)
    except BuildError as exc:
        raise BuildError(f"{where}: {exc}") from None
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise BuildError(
            f"{where}: malformed rope scaling {spec.rope_scaling!r} ({type(exc).__name__}: {exc})"
        ) from None


def check_source(source: Source) -> None:
    """Every check that reads no weights, before any is written: tensors present, their
    shapes against the spec, no layers past the spec's, attention dims onnxruntime runs, rope
    scaling supported."""
    source.check()
    check_attention(source.spec, str(source.path))
    check_rope(source.spec, str(source.path))


def write_onnx(
    source: Source,
    out_dir: str | os.PathLike[str],
    *,
    precision: str = "fp32",
    all_logits: bool = False,
    progress: Progress | None = None,
    filename: str = "model.onnx",
    window_cache: bool = False,
    prefill_int8: bool = False,
) -> Path:
    """Write ``out_dir/model.onnx`` (+ ``model.onnx.data``) for ``source``; returns its path.
    ``window_cache``: sliding-window layers keep window-sized caches (``sliding_window_cache``).
    ``prefill_int8`` (int4 only): prompts use int8 linears (see the module
    docstring)."""
    if precision not in PRECISIONS:
        raise BuildError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if prefill_int8 and precision != "int4":
        raise BuildError(f"prefill_int8 applies to int4 builds, not {precision}")
    out = Path(out_dir)
    check_source(source)
    out.mkdir(parents=True, exist_ok=True)
    float_type = TensorProto.FLOAT16 if precision == "fp16" else TensorProto.FLOAT
    g = _GraphWriter(out / f"{filename}.data", float_type)
    try:
        decoder = _Decoder(g, source.spec, precision, window_cache, prefill_int8)
        decoder.build(source, all_logits, progress)
        if decoder.prefill_only:
            _split_by_run_length(g, decoder)
    finally:
        g.finish()
    model = g.model()
    if decoder.prefill_only and not any(o.domain == _MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_MS, 1))  # used inside the branches
    onnx.save_model(model, str(out / filename))
    return out / filename
