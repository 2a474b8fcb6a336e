"""A tiny decoder split into a multi-graph pipeline folder (``model.decoder.pipeline``).

:func:`write_pipeline_decoder` writes the function of :func:`~genai.testing.models.
write_gqa_decoder` (``attention="gqa"``) or :func:`~genai.testing.models.write_optimum_decoder`
(``attention="plain"``) called with the same arguments, cut into stages the way the reference's
QNN/NPU folders are:

* ``embeddings`` (``embeddings.onnx``): ``input_ids`` -> ``inputs_embeds``;
* one ``transformer_<k>`` stage per group of ``layer_groups`` (``transformer_<k>.onnx``), each
  owning its layers' past/present KV. The GQA layout takes ``attention_mask`` (rotary inside
  GroupQueryAttention), the plain one ``attention_mask`` and ``position_ids``. Between stages
  the residual stream travels as ``hidden_states.<layer>`` (plain) or ``residual.<layer>`` +
  ``mlp_out.<layer>`` (GQA: the next stage's SkipSimplifiedLayerNormalization adds them, as
  the single graph does), ``<layer>`` the last layer of the stage that wrote it;
* ``lm_head`` (``lm_head.onnx``): the last hidden state -> ``logits``.

``token_gen_stages=True`` writes each transformer stage twice, as QNN context/iterator pairs:
``transformer_<k>_prompt`` (``run_on_token_gen: false``) and ``transformer_<k>_token``
(``run_on_prompt: false``): the same function in two files. ``forward_embeddings=True`` names
the embeddings graph's output ``embeddings_out`` and maps it to ``inputs_embeds`` with the
stage's ``output_names_forwarder``.

The config's ``model.type`` is ``"decoder-pipeline"``: that type is what makes the reference run
the stages (with any other type it loads ``decoder.filename`` and ignores them).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto

from genai.builder.genai_config import SPLIT_KV_INPUTS, SPLIT_KV_OUTPUTS
from genai.testing.models import (
    IdDtype,
    _attention_allowed,
    _Dims,
    _Graph,
    _id_elem_type,
    _llama_weights,
    _rms_norm,
    _rotary_tables,
    _skip_rms_norm,
    _write_tokenizer,
    declare_kv,
    decoder_section,
    gqa_layer,
    gqa_mask_lengths,
    kv_names,
    plain_layer,
    plain_logits,
)

__all__ = ["PIPELINE_TYPE", "write_pipeline_decoder"]

#: The ``model.type`` of a multi-graph decoder.
PIPELINE_TYPE = "decoder-pipeline"

Attention = Literal["gqa", "plain"]


def _past(i: int, kind: str) -> str:
    return f"past_key_values.{i}.{kind}"


def _present(i: int, kind: str) -> str:
    return f"present.{i}.{kind}"


def _boundary(attention: Attention, layer: int) -> list[str]:
    """The tensors that carry the residual stream after ``layer`` (-1: the embeddings)."""
    if layer < 0:
        return ["inputs_embeds"]
    if attention == "gqa":
        return [f"residual.{layer}", f"mlp_out.{layer}"]
    return [f"hidden_states.{layer}"]


def _embeddings(
    w: dict[str, np.ndarray], dims: _Dims, ids_type: int, output: str
) -> onnx.ModelProto:
    g = _Graph("embeddings")
    input_ids = g.input("input_ids", ids_type, ["batch_size", "sequence_length"])
    g.op("Gather", g.weight("embed_tokens.weight", w["embed"]), input_ids, axis=0, out=output)
    g.output(output, TensorProto.FLOAT, ["batch_size", "sequence_length", dims.hidden_size])
    return g.model()


def _declare_kv(g: _Graph, dims: _Dims, layers: Sequence[int]) -> list[str]:
    declare_kv(g, dims, layers)
    return [name for i in layers for name in (_past(i, "key"), _past(i, "value"))]


def _gqa_transformer(
    w: dict[str, np.ndarray], dims: _Dims, layers: Sequence[int], ids_type: int, id_dtype: str
) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """A GroupQueryAttention stage over ``layers``: (graph, inputs, outputs)."""
    g = _Graph(f"transformer_{layers[0]}")
    hidden_shape = ["batch_size", "sequence_length", dims.hidden_size]
    first, last = layers[0], layers[-1]
    boundary_in = [g.input(n, TensorProto.FLOAT, hidden_shape) for n in _boundary("gqa", first - 1)]
    mask = g.input("attention_mask", ids_type, ["batch_size", "total_sequence_length"])
    past_names = _declare_kv(g, dims, layers)
    seqlens_k, total_len = gqa_mask_lengths(g, mask, id_dtype)
    cos, sin = _rotary_tables(dims)
    cos_cache, sin_cache = g.weight("cos_cache", cos), g.weight("sin_cache", sin)
    mlp_out = ""
    residual = boundary_in[0]
    for i in layers:
        p = f"layers.{i}"
        ln1 = g.weight(f"{p}.input_layernorm.weight", w[f"{i}.ln1"])
        if i == 0:
            hidden = _rms_norm(g, residual, ln1)
        elif i == first:
            hidden, residual = _skip_rms_norm(g, boundary_in[0], boundary_in[1], ln1)
        else:
            hidden, residual = _skip_rms_norm(g, residual, mlp_out, ln1)
        residual, mlp_out = gqa_layer(
            g,
            w,
            dims,
            i,
            hidden,
            residual,
            (seqlens_k, total_len, cos_cache, sin_cache),
            kv_names(i),
        )
    outs = _boundary("gqa", last)
    g.op("Identity", residual, out=outs[0])
    g.op("Identity", mlp_out, out=outs[1])
    for name in outs:
        g.output(name, TensorProto.FLOAT, hidden_shape)
    presents = [_present(i, kind) for i in layers for kind in ("key", "value")]
    return g.model(), [*boundary_in, mask, *past_names], [*outs, *presents]


def _plain_transformer(
    w: dict[str, np.ndarray], dims: _Dims, layers: Sequence[int], ids_type: int
) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """A plain-op stage (optimum-style attention, KV grown by Concat) over ``layers``."""
    g = _Graph(f"transformer_{layers[0]}")
    hidden_shape = ["batch_size", "sequence_length", dims.hidden_size]
    (residual,) = [
        g.input(n, TensorProto.FLOAT, hidden_shape) for n in _boundary("plain", layers[0] - 1)
    ]
    boundary_in = residual
    mask = g.input("attention_mask", ids_type, ["batch_size", "total_sequence_length"])
    positions = g.input("position_ids", ids_type, ["batch_size", "sequence_length"])
    past_names = _declare_kv(g, dims, layers)
    allowed = _attention_allowed(g, residual, mask)  # axis 1 of the hidden state: the new tokens
    cos, sin = _rotary_tables(dims)
    unsq = g.const([1])
    cos_pos = g.op("Unsqueeze", g.op("Gather", g.weight("cos_table", cos), positions), unsq)
    sin_pos = g.op("Unsqueeze", g.op("Gather", g.weight("sin_table", sin), positions), unsq)
    for i in layers:
        residual = plain_layer(g, w, dims, i, residual, cos_pos, sin_pos, allowed)
    (out,) = _boundary("plain", layers[-1])
    g.op("Identity", residual, out=out)
    g.output(out, TensorProto.FLOAT, hidden_shape)
    presents = [_present(i, kind) for i in layers for kind in ("key", "value")]
    return g.model(), [boundary_in, mask, positions, *past_names], [out, *presents]


def _lm_head(
    w: dict[str, np.ndarray], dims: _Dims, attention: Attention
) -> tuple[onnx.ModelProto, list[str]]:
    g = _Graph("lm_head")
    hidden_shape = ["batch_size", "sequence_length", dims.hidden_size]
    inputs = [
        g.input(n, TensorProto.FLOAT, hidden_shape)
        for n in _boundary(attention, dims.num_layers - 1)
    ]
    if attention == "gqa":
        final_norm = g.weight("final_norm.weight", w["final_norm"])
        hidden, _ = _skip_rms_norm(g, inputs[0], inputs[1], final_norm)
        g.op("MatMul", hidden, g.weight("lm_head.weight", w["lm_head"]), out="logits")
    else:
        plain_logits(g, inputs[0], w)
    g.output("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", dims.vocab_size])
    return g.model(), inputs


def write_pipeline_decoder(
    out_dir: str | pathlib.Path,
    *,
    attention: Attention = "gqa",
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    context_length: int = 128,
    seed: int = 0,
    id_dtype: IdDtype = "int64",
    share_buffer: bool | None = None,
    layer_groups: Sequence[Sequence[int]] | None = None,
    token_gen_stages: bool = False,
    forward_embeddings: bool = False,
    eos_token_id: int = 2,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    name: str = "pipeline-decoder",
) -> pathlib.Path:
    """Write a pipeline folder into ``out_dir / name`` (see the module docstring).

    ``layer_groups``: the layers of each transformer stage, contiguous and in order (default:
    one layer per stage). ``share_buffer``: ``search.past_present_share_buffer`` (default: True
    for GQA, which handles both layouts; the plain layout grows its KV by concatenation and
    needs False).
    """
    gqa = attention == "gqa"
    if attention not in ("gqa", "plain"):
        raise ValueError(f"attention must be 'gqa' or 'plain', got {attention!r}")
    if share_buffer is None:
        share_buffer = gqa
    if share_buffer and not gqa:
        raise ValueError("the plain layout grows its KV by concatenation: share_buffer=False")
    dims = _Dims(
        vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, context_length, gqa=gqa
    )
    groups = [list(g) for g in (layer_groups or [[i] for i in range(num_layers)])]
    if [i for g in groups for i in g] != list(range(num_layers)) or not all(groups):
        raise ValueError(f"layer_groups {groups} must cover layers 0..{num_layers - 1} in order")
    for token_id in (bos_token_id, eos_token_id, pad_token_id):
        if not 0 <= token_id < vocab_size:
            raise ValueError(f"special token id {token_id} outside the vocabulary")
    ids_type = _id_elem_type(id_dtype)
    w = _llama_weights(dims, seed, (bos_token_id, eos_token_id, pad_token_id))
    folder = pathlib.Path(out_dir) / name
    folder.mkdir(parents=True, exist_ok=True)

    stages: dict[str, dict[str, Any]] = {}
    embeds_out = "embeddings_out" if forward_embeddings else "inputs_embeds"
    onnx.save_model(_embeddings(w, dims, ids_type, embeds_out), str(folder / "embeddings.onnx"))
    stages["embeddings"] = {
        "filename": "embeddings.onnx",
        "inputs": ["input_ids"],
        "outputs": [embeds_out],
    }
    if forward_embeddings:
        stages["embeddings"]["output_names_forwarder"] = {embeds_out: "inputs_embeds"}
    for k, layers in enumerate(groups):
        if gqa:
            graph, inputs, outputs = _gqa_transformer(w, dims, layers, ids_type, id_dtype)
        else:
            graph, inputs, outputs = _plain_transformer(w, dims, layers, ids_type)
        variants = [("", {})]
        if token_gen_stages:
            variants = [
                ("_prompt", {"run_on_token_gen": False}),
                ("_token", {"run_on_prompt": False}),
            ]
        for suffix, flags in variants:
            filename = f"transformer_{k}{suffix}.onnx"
            onnx.save_model(graph, str(folder / filename))
            stages[f"transformer_{k}{suffix}"] = {
                "filename": filename,
                "inputs": inputs,
                "outputs": outputs,
                **flags,
            }
    head, head_inputs = _lm_head(w, dims, attention)
    onnx.save_model(head, str(folder / "lm_head.onnx"))
    stages["lm_head"] = {
        "filename": "lm_head.onnx",
        "inputs": head_inputs,
        "outputs": ["logits"],
        "session_options": {"log_id": "lm_head", "provider_options": []},
    }
    inputs_section = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        **SPLIT_KV_INPUTS,
    }
    if not gqa:
        inputs_section["position_ids"] = "position_ids"
    config = {
        "model": {
            "bos_token_id": bos_token_id,
            "context_length": context_length,
            "decoder": {
                **decoder_section(dims, inputs_section, dict(SPLIT_KV_OUTPUTS), None),
                "pipeline": [stages],
            },
            "eos_token_id": eos_token_id,
            "pad_token_id": pad_token_id,
            "type": PIPELINE_TYPE,
            "vocab_size": vocab_size,
        },
        "search": {
            "do_sample": False,
            "max_length": context_length,
            "num_beams": 1,
            "past_present_share_buffer": share_buffer,
            "top_k": 50,
            "top_p": 1.0,
        },
    }
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    _write_tokenizer(
        folder,
        vocab_size,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        context_length=context_length,
    )
    return folder
