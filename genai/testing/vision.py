"""Tiny random-weight vision-language model folders in onnxruntime-genai's multi-graph layout.

A vision-language folder holds three graphs that `genai_config.json` names:

* ``model.vision`` (pixel values -> ``image_features`` ``[num_image_tokens, hidden]``);
* ``model.embedding`` (``input_ids`` + ``image_features`` -> ``inputs_embeds``
  ``[batch, seq, hidden]``: text ids look up an embedding table, image placeholder ids take the
  image features in order);
* ``model.decoder`` (``inputs_embeds``, ``attention_mask`` [, ``position_ids``], KV ->
  ``logits`` and presents),

plus ``processor_config.json`` (the image pipeline the reference's processor runs) and the
tokenizer files. The writers follow the folders the reference's model builder writes (and the
reference's own test folders ``test/models/phi3-v`` and ``qwen2-5-vl``): the same config
sections, input/output names, dtypes and ranks; the graphs themselves are small random
functions of their inputs (a patch-pooling "ViT", one embedding table, a 1-2 layer Llama-style
decoder), so that both engines can load the folder and run it in milliseconds. (Phi-3 Vision
prompts are long all the same: its processor makes every image 17 crops, about 2500 tokens.)

* :func:`write_phi3v` -- ``model.type`` ``phi3v``: ``pixel_values`` ``[images, crops, 3, 336,
  336]`` + ``image_sizes`` ``[images, 2]``; placeholders are negative ids (``-k`` for image
  ``k``, as the reference's processor expands ``<|image_k|>``); a GroupQueryAttention decoder
  without ``position_ids`` (rotary inside the op), shared KV buffer.
* :func:`write_qwen2_5_vl` -- ``model.type`` ``qwen2_5_vl`` (``fara`` and ``qwen3_vl`` through
  ``model_type``): ``pixel_values`` ``[patches, 3 * 2 * p * p]`` + ``image_grid_thw``
  ``[images, 3]``; placeholders are ``image_token_id``; a plain-op decoder fed 3-D mRoPE
  ``position_ids`` ``[3, batch, seq]`` (temporal / height / width sections of the rotary
  frequencies), growing KV cache.
* :func:`write_gemma3` -- ``model.type`` ``gemma3``: ``pixel_values`` ``[images, 3, 896,
  896]`` -> 256 features an image; placeholders are ``image_token_id``
  (``<image_soft_token>``); the GroupQueryAttention decoder of `write_phi3v`.

The tokenizer is `genai.testing.models`' tiny BPE (lower-case letters and ``.,!?'``) plus the
model's chat markers and ``"\\n"`` as added tokens, so the prompts both engines tokenize alike
can carry the model's real markers. Its base vocabulary is 64 ids by default; any size
tokenizes alike in both engines (tests/test_tokenizer_parity_fixtures.py checks 64 and 160).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto
from tokenizers import AddedToken, Tokenizer

from genai.builder.genai_config import (
    SESSION_OPTIONS,
    SPLIT_KV_INPUTS,
    SPLIT_KV_OUTPUTS,
    search_section,
)
from genai.testing.models import (
    _attention_allowed,
    _Dims,
    _Graph,
    _llama_weights,
    _normal,
    _rotary_tables,
    _write_tokenizer,
    declare_kv,
    decoder_section,
    gqa_layers,
    gqa_mask_lengths,
    plain_layer,
    plain_logits,
)

__all__ = [
    "GEMMA3_MARKERS",
    "PHI3V_MARKERS",
    "QWEN_VL_MARKERS",
    "QWEN_VL_TYPES",
    "mrope_sections",
    "phi3v_image_tokens",
    "write_gemma3",
    "write_phi3v",
    "write_qwen2_5_vl",
]

#: The crop side of Phi-3 Vision's HD transform (pixels) and its tokens per crop side.
PHI3V_CROP = 336
_PHI3V_GRID = 12  # 336 / 28: each crop pools to a 12 x 12 grid = 144 tokens

#: Added tokens of the Phi-3 Vision fixture (ids follow the base vocabulary, in this order).
PHI3V_MARKERS = ("<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>", "\n")
#: Added tokens of the Qwen-VL fixtures (ids follow the base vocabulary, in this order).
QWEN_VL_MARKERS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "\n",
)

#: `genai_config.json` inputs of `_gqa_embeds_decoder` (Phi-3 V, Gemma 3).
_GQA_EMBEDS_INPUTS = {
    "inputs_embeds": "inputs_embeds",
    "attention_mask": "attention_mask",
    **SPLIT_KV_INPUTS,
}
_EMBEDDING_SECTION = {
    "filename": "dummy_embedding.onnx",
    "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
    "outputs": {"inputs_embeds": "inputs_embeds"},
}


# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------


def _tokenizer(
    folder: pathlib.Path,
    base_vocab: int,
    markers: Sequence[str],
    *,
    bos: str,
    eos: str,
    pad: str,
    context_length: int,
    chat_template: str,
) -> dict[str, int]:
    """The tiny BPE of `genai.testing.models` with ``markers`` appended as added tokens;
    returns marker -> id."""
    _write_tokenizer(
        folder, base_vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        context_length=context_length,
    )  # fmt: skip
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(m, special=m != "\n", normalized=False) for m in markers])
    tokenizer.save(str(folder / "tokenizer.json"))
    ids = {m: base_vocab + i for i, m in enumerate(markers)}
    if any(tokenizer.token_to_id(m) != i for m, i in ids.items()):
        raise AssertionError("added token ids are not consecutive after the base vocabulary")
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(bos_token=bos, eos_token=eos, pad_token=pad, chat_template=chat_template)
    config["added_tokens_decoder"] = {
        str(i): {
            "content": m,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": m != "\n",
        }
        for m, i in ids.items()
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    return ids


def _feature_scatter(g: _Graph, ids: str, is_image: str, features: str, hidden: int) -> str:
    """``[batch, seq, hidden]``: row ``k`` of ``features`` (in order over the flattened batch)
    at the ``k``-th position where ``is_image``; zeros elsewhere and past the last row."""
    flat = g.op("Reshape", g.op("Cast", is_image, to=TensorProto.INT64), g.const([-1]))
    index = g.op("Sub", g.op("CumSum", flat, g.const(0)), g.const(1))
    rows = g.op("Shape", features, start=0, end=1)
    # a zero row at the end: placeholders beyond the features (or none at all) read it
    index = g.op("Min", g.op("Max", index, g.const(0)), g.op("Squeeze", rows, g.const([0])))
    padded = g.op("Concat", features, g.const(np.zeros((1, hidden)), np.float32), axis=0)
    gathered = g.op("Gather", padded, index, axis=0)
    return g.op("Reshape", gathered, g.op("Concat", g.op("Shape", ids), g.const([hidden]), axis=0))


def _embedding_graph(embed: np.ndarray, *, negative_ids: bool, image_token_id: int | None) -> Any:
    """``input_ids`` int64 [batch, seq] + ``image_features`` fp32 [n, hidden] ->
    ``inputs_embeds``: text ids look up ``embed``; placeholders (negative ids, or
    ``image_token_id``) take the features in order."""
    hidden = embed.shape[1]
    g = _Graph("embedding")
    ids = g.input("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
    features = g.input("image_features", TensorProto.FLOAT, ["num_image_tokens", hidden])
    g.output("inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", hidden])
    if negative_ids:
        is_image = g.op("Less", ids, g.const(0))
    else:
        is_image = g.op("Equal", ids, g.const(image_token_id))
    text_ids = g.op("Where", is_image, g.const(0), ids)
    text = g.op("Gather", g.weight("embed_tokens.weight", embed), text_ids, axis=0)
    image = _feature_scatter(g, ids, is_image, features, hidden)
    g.op("Where", g.op("Unsqueeze", is_image, g.const([-1])), image, text, out="inputs_embeds")
    return g.model()


def _start_folder(
    folder: pathlib.Path,
    dims: _Dims,
    seed: int,
    base_vocab: int,
    markers: Sequence[str],
    *,
    bos: str,
    eos: str,
    pad: str,
    chat_template: str,
) -> tuple[dict[str, int], dict[str, np.ndarray], np.random.Generator]:
    """Make ``folder`` and write its tokenizer (see `_tokenizer`); returns (marker -> id, the
    decoder's weights with the special ids' lm_head columns zero, the vision graph's random
    generator)."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(
        folder, base_vocab, markers, bos=bos, eos=eos, pad=pad,
        context_length=dims.context_length, chat_template=chat_template,
    )  # fmt: skip
    w = _llama_weights(dims, seed, (0, 1, 2, *ids.values()))
    return ids, w, np.random.default_rng(seed + 1)


def _save_graphs(
    folder: pathlib.Path,
    vision: Any,
    w: dict[str, np.ndarray],
    image_token_id: int | None,
    decoder: Any,
) -> None:
    """The three graphs; placeholders are ``image_token_id``, or negative ids when None."""
    onnx.save_model(vision, str(folder / "dummy_vision.onnx"))
    embedding = _embedding_graph(
        w["embed"], negative_ids=image_token_id is None, image_token_id=image_token_id
    )
    onnx.save_model(embedding, str(folder / "dummy_embedding.onnx"))
    onnx.save_model(decoder, str(folder / "dummy_text.onnx"))


def _vision_section(*inputs: str) -> dict[str, Any]:
    """``model.vision`` of a vision graph taking ``inputs`` (named as themselves)."""
    return {
        "filename": "dummy_vision.onnx",
        "inputs": {name: name for name in inputs},
        "outputs": {"image_features": "image_features"},
    }


def _decoder_section(dims: _Dims, inputs: dict[str, str]) -> dict[str, Any]:
    return decoder_section(dims, inputs, dict(SPLIT_KV_OUTPUTS), "dummy_text.onnx")


def _write_configs(folder: pathlib.Path, config: dict[str, Any], processor: dict[str, Any]) -> None:
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    (folder / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")


def _operation(name: str, kind: str, attrs: dict[str, Any] | None = None, **extra: str) -> dict:
    """One transform of ``processor_config.json`` (``extra``: e.g. its ``domain``)."""
    operation: dict[str, Any] = {"name": name, **extra, "type": kind}
    if attrs is not None:
        operation["attrs"] = attrs
    return {"operation": operation}


def _pooled_tokens(
    g: _Graph, rng: np.random.Generator, pixels: str, kernel: int, cells: int, hidden: int
) -> str:
    """``[n, 3, H, W]`` pixels average-pooled by ``kernel`` to ``cells`` 3-channel cells ->
    ``[n, cells, hidden]`` tokens: projected, a learned position added, tanh, mixed."""
    pooled = g.op("AveragePool", pixels, kernel_shape=[kernel, kernel], strides=[kernel, kernel])
    patches = g.op("Transpose", g.op("Reshape", pooled, g.const([0, 3, cells])), perm=[0, 2, 1])
    proj = g.weight("patch_proj", _normal(rng, (3, hidden), 2.0))
    position = g.weight("patch_position", _normal(rng, (cells, hidden), 0.5))
    tokens = g.op("Add", g.op("MatMul", patches, proj), position)
    mix = g.weight("token_mix", _normal(rng, (hidden, hidden), 1.0 / np.sqrt(hidden)))
    return g.op("MatMul", g.op("Tanh", tokens), mix)


# --------------------------------------------------------------------------------------------
# Phi-3 Vision
# --------------------------------------------------------------------------------------------


def phi3v_image_tokens(height: int, width: int) -> int:
    """Image tokens Phi-3 Vision gives an HD-transformed image of ``height`` x ``width``
    (multiples of 336): 144 per crop and for the global view, a newline token per row of
    crop tokens, and one separator."""
    h, w = height // PHI3V_CROP, width // PHI3V_CROP
    return (h * w + 1) * 144 + 1 + (h + 1) * 12


def _phi3v_vision_graph(rng: np.random.Generator, hidden: int, max_crops: int) -> Any:
    """``pixel_values`` fp32 [images, crops, 3, 336, 336] + ``image_sizes`` int64 [images, 2]
    -> ``image_features`` [sum of `phi3v_image_tokens`, hidden]: each crop is pooled to a 12 x
    12 grid of 3-channel patches, projected and mixed per token; an image's tokens are its
    crops' tokens in order followed by learned separator tokens, cut to its token count
    (``max_crops``: the most HD crops an image may have, besides the global view)."""
    g = _Graph("phi3v_vision")
    grid = _PHI3V_GRID
    per_crop = grid * grid
    pixels = g.input(
        "pixel_values", TensorProto.FLOAT, ["num_images", "max_num_crops", 3, "height", "width"]
    )
    sizes = g.input("image_sizes", TensorProto.INT64, ["num_images", 2])
    g.output("image_features", TensorProto.FLOAT, ["num_image_tokens", hidden])
    flat = g.op("Reshape", pixels, g.const([-1, 3, PHI3V_CROP, PHI3V_CROP]))
    # [images * crops, 3, 12, 12] -> [images * crops, 144, hidden]: one token per grid cell
    tokens = _pooled_tokens(g, rng, flat, 28, per_crop, hidden)
    images = g.op("Shape", pixels, start=0, end=1)
    tokens = g.op("Reshape", tokens, g.op("Concat", images, g.const([-1, hidden]), axis=0))
    # enough separators for any layout of up to max_crops crops
    extra = 1 + (max_crops + 1) * grid
    separators = g.weight("separators", _normal(rng, (1, extra, hidden), 1.0))
    separators = g.op(
        "Expand", separators, g.op("Concat", images, g.const([extra, hidden]), axis=0)
    )
    tokens = g.op("Concat", tokens, separators, axis=1)  # [images, crops * 144 + extra, hidden]
    # per image: the first phi3v_image_tokens(h, w) rows
    crop_h = g.op("Div", g.op("Gather", sizes, g.const(0), axis=1), g.const(PHI3V_CROP))
    crop_w = g.op("Div", g.op("Gather", sizes, g.const(1), axis=1), g.const(PHI3V_CROP))
    count = g.op(
        "Add",
        g.op("Mul", g.op("Add", g.op("Mul", crop_h, crop_w), g.const(1)), g.const(144)),
        g.const(1),
    )
    count = g.op("Add", count, g.op("Mul", g.op("Add", crop_h, g.const(1)), g.const(12)))
    width = g.op("Shape", tokens, start=1, end=2)
    position_index = g.op("Range", g.const(0), g.op("Squeeze", width, g.const([0])), g.const(1))
    keep = g.op(
        "Less",
        g.op("Unsqueeze", position_index, g.const([0])),
        g.op("Unsqueeze", count, g.const([1])),
    )
    flat_tokens = g.op("Reshape", tokens, g.const([-1, hidden]))
    g.op(
        "Compress", flat_tokens, g.op("Reshape", keep, g.const([-1])), axis=0, out="image_features"
    )
    return g.model()


def _gqa_embeds_decoder(w: dict[str, np.ndarray], dims: _Dims) -> Any:
    """The builder's GroupQueryAttention decoder fed ``inputs_embeds`` instead of ids
    (``attention_mask`` int64, no ``position_ids``: rotary inside the op)."""
    g = _Graph("gqa_embeds_decoder")
    embeds = g.input(
        "inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", dims.hidden_size]
    )
    mask = g.input("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])
    declare_kv(g, dims, range(dims.num_layers), logits=True)
    seqlens_k, total_len = gqa_mask_lengths(g, mask, "int64")
    cos, sin = _rotary_tables(dims)
    lengths = (seqlens_k, total_len, g.weight("cos_cache", cos), g.weight("sin_cache", sin))
    gqa_layers(g, w, dims, embeds, lengths)
    return g.model()


_PHI3V_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


_EXT = "com.microsoft.extensions"


def _phi3v_processor(num_crops: int) -> dict[str, Any]:
    """The ``processor_config.json`` the builder writes for Phi-3 Vision (onnxruntime-extensions'
    image pipeline: decode, RGB, Phi-3's HD transform)."""
    return {
        "processor": {
            "name": "image_processing",
            "transforms": [
                _operation("decode_image", "DecodeImage", {"color_space": "BGR"}, domain=_EXT),
                _operation("convert_to_rgb", "ConvertRGB", domain=_EXT),
                _operation(
                    "phi3_image_transform",
                    "Phi3ImageTransform",
                    {"num_crops": num_crops, "num_img_tokens": 144},
                    domain=_EXT,
                ),
            ],
        }
    }


def write_phi3v(
    out_dir: str | pathlib.Path,
    *,
    name: str = "phi3v",
    base_vocab: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 4,
    context_length: int = 8192,
    num_crops: int = 16,
    seed: int = 0,
) -> pathlib.Path:
    """Write a tiny random Phi-3 Vision folder (``model.type`` ``phi3v``) into ``out_dir /
    name``; returns the folder.

    Files: ``dummy_vision.onnx``, ``dummy_embedding.onnx``, ``dummy_text.onnx``,
    ``genai_config.json``, ``processor_config.json`` (HD transform with ``num_crops``; the
    reference's 0.18 processor uses 16 whatever the file says: every image becomes up to 16
    crops of 336 x 336 plus the global view),
    ``tokenizer.json`` / ``tokenizer_config.json`` (tiny BPE + `PHI3V_MARKERS`; bos ``<s>``,
    eos ``<|end|>``, pad ``<|endoftext|>``). An image of the HD size h x w (336 multiples)
    takes `phi3v_image_tokens` placeholders; a prompt needs one ``<|image_k|>`` tag per image.
    The context is long because one image already takes about 2000-2500 tokens.
    """
    vocab = base_vocab + len(PHI3V_MARKERS)
    dims = _Dims(vocab, hidden_size, num_layers, num_heads, num_kv_heads, context_length, gqa=True)
    folder = pathlib.Path(out_dir) / name
    ids, w, rng = _start_folder(
        folder, dims, seed, base_vocab, PHI3V_MARKERS, bos="<s>", eos="<|end|>",
        pad="<|endoftext|>", chat_template=_PHI3V_TEMPLATE,
    )  # fmt: skip
    eos, pad = ids["<|end|>"], ids["<|endoftext|>"]
    vision = _phi3v_vision_graph(rng, hidden_size, num_crops)
    _save_graphs(folder, vision, w, None, _gqa_embeds_decoder(w, dims))
    config = {
        "model": {
            "bos_token_id": 1,
            "context_length": context_length,
            "decoder": _decoder_section(dims, dict(_GQA_EMBEDS_INPUTS)),
            "embedding": dict(_EMBEDDING_SECTION),
            "vision": _vision_section("pixel_values", "image_sizes"),
            "eos_token_id": eos,
            "pad_token_id": pad,
            "type": "phi3v",
            "vocab_size": vocab,
        },
        "search": search_section(context_length, share_buffer=True, top_k=1),
    }
    _write_configs(folder, config, _phi3v_processor(num_crops))
    return folder


# --------------------------------------------------------------------------------------------
# Qwen2.5-VL (and Fara, Qwen3-VL: the same folder layout)
# --------------------------------------------------------------------------------------------

#: ``model.type`` -> (patch_size, window_size) the builder writes for the Qwen-VL family.
QWEN_VL_TYPES = {"qwen2_5_vl": (14, 112), "fara": (14, 112), "qwen3_vl": (16, 64)}


def mrope_sections(head_size: int) -> tuple[int, int, int]:
    """How the fixture splits the ``head_size / 2`` rotary frequencies between the temporal,
    height and width position ids (Qwen2.5-VL's ``mrope_section`` [16, 24, 24] of 64, scaled
    to the head)."""
    half = head_size // 2
    t = max(1, half // 4)
    h = (half - t) // 2
    return t, h, half - t - h


def _qwen_vision_graph(rng: np.random.Generator, patch_dim: int, merge: int, hidden: int) -> Any:
    """``pixel_values`` fp32 [patches, patch_dim] + ``image_grid_thw`` int64 [images, 3] ->
    ``image_features`` [patches / merge^2, hidden]: each run of merge^2 patches (one merge
    window, as the processor orders them) is concatenated and projected (Qwen's patch merger,
    without the attention blocks). Per-patch, so one call on several images equals one call
    per image (the reference loops over images when their grids differ)."""
    g = _Graph("qwen_vl_vision")
    g.input("pixel_values", TensorProto.FLOAT, ["num_patches", patch_dim])
    g.input("image_grid_thw", TensorProto.INT64, ["num_images", 3])
    g.output("image_features", TensorProto.FLOAT, ["num_logical_patches", hidden])
    group = merge * merge * patch_dim
    merged = g.op("Reshape", "pixel_values", g.const([-1, group]))
    proj = g.weight("merger.proj", _normal(rng, (group, hidden), 2.0 / np.sqrt(group)))
    mix = g.weight("merger.mix", _normal(rng, (hidden, hidden), 1.0 / np.sqrt(hidden)))
    g.op("MatMul", g.op("Tanh", g.op("MatMul", merged, proj)), mix, out="image_features")
    return g.model()


def _mrope_decoder(w: dict[str, np.ndarray], dims: _Dims) -> Any:
    """A plain-op Llama decoder fed ``inputs_embeds``, ``attention_mask`` int64 and 3-D
    ``position_ids`` int64 ``[3, batch, seq]``: frequency ``j`` of the rotary turns by the
    temporal, height or width position as `mrope_sections` assigns it; KV grows by
    concatenation; attention: causal AND ``attention_mask``."""
    g = _Graph("mrope_decoder")
    hd = dims.head_size
    embeds = g.input(
        "inputs_embeds", TensorProto.FLOAT, ["batch_size", "sequence_length", dims.hidden_size]
    )
    mask = g.input("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])
    positions = g.input("position_ids", TensorProto.INT64, [3, "batch_size", "sequence_length"])
    declare_kv(g, dims, range(dims.num_layers), logits=True)

    inv_freq = (10000.0 ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)).astype(np.float32)
    select = np.zeros((3, 1, 1, hd // 2), np.float32)
    start = 0
    for axis, size in enumerate(mrope_sections(hd)):
        select[axis, ..., start : start + size] = 1.0
        start += size
    angles = g.op(
        "Mul",
        g.op("Unsqueeze", g.op("Cast", positions, to=TensorProto.FLOAT), g.const([-1])),
        g.weight("inv_freq", inv_freq),
    )  # [3, batch, seq, hd / 2]
    angles = g.op(
        "ReduceSum", g.op("Mul", angles, g.weight("mrope_select", select)), g.const([0]),
        keepdims=0,
    )  # fmt: skip
    unsq = g.const([1])
    cos = g.op("Unsqueeze", g.op("Cos", angles), unsq)
    sin = g.op("Unsqueeze", g.op("Sin", angles), unsq)
    allowed = _attention_allowed(g, embeds, mask)
    residual = embeds
    for i in range(dims.num_layers):
        residual = plain_layer(g, w, dims, i, residual, cos, sin, allowed)
    plain_logits(g, residual, w)
    return g.model()


_QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _qwen_processor(patch_size: int, merge: int) -> dict[str, Any]:
    """The ``processor_config.json`` the builder writes for Qwen2.5-VL: decode, RGB, smart
    resize, rescale, normalise (CLIP mean/std), patching."""
    return {
        "processor": {
            "name": "qwen2_5_image_processor",
            "transforms": [
                _operation("decode_image", "DecodeImage", {"color_space": "RGB"}),
                _operation("convert_to_rgb", "ConvertRGB"),
                {
                    "operation": {
                        "name": "resize",
                        "type": "Resize",
                        "attrs": {
                            "width": 540,
                            "height": 360,
                            "smart_resize": 1,
                            "min_pixels": 3136,
                            "max_pixels": 12845056,
                            "patch_size": patch_size,
                            "merge_size": merge,
                        },
                    }
                },
                _operation("rescale", "Rescale", {"rescale_factor": 0.00392156862745098}),
                {
                    "operation": {
                        "name": "normalize",
                        "type": "Normalize",
                        "attrs": {
                            "mean": [0.48145466, 0.4578275, 0.40821073],
                            "std": [0.26862954, 0.26130258, 0.27577711],
                            "qwen2_5_vl": 1,
                        },
                    }
                },
                {
                    "operation": {
                        "name": "patch_image",
                        "type": "PatchImage",
                        "attrs": {
                            "patch_size": patch_size,
                            "temporal_patch_size": 2,
                            "merge_size": merge,
                        },
                    }
                },
            ],
        }
    }


def write_qwen2_5_vl(
    out_dir: str | pathlib.Path,
    *,
    name: str | None = None,
    model_type: str = "qwen2_5_vl",
    base_vocab: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    context_length: int = 4096,
    seed: int = 0,
) -> pathlib.Path:
    """Write a tiny random Qwen2.5-VL folder (``model_type`` ``qwen2_5_vl``, or ``fara`` /
    ``qwen3_vl``: the same layout, Qwen3-VL with 16-pixel patches) into ``out_dir / name``
    (default: the type); returns the folder.

    Files: ``dummy_vision.onnx``, ``dummy_embedding.onnx``, ``dummy_text.onnx``,
    ``genai_config.json`` (``image_token_id`` ``<|image_pad|>``, ``vision_start_token_id``,
    ``video_token_id``; ``model.vision`` with ``spatial_merge_size`` 2, ``patch_size``,
    ``tokens_per_second``), ``processor_config.json`` and the tokenizer (tiny BPE +
    `QWEN_VL_MARKERS`; eos ``<|im_end|>`` and ``<|endoftext|>``, pad ``<|endoftext|>``). A
    prompt marks each image with ``<|vision_start|><|image_pad|><|vision_end|>``; the
    processor expands the pad to one token per merged patch.
    """
    if model_type not in QWEN_VL_TYPES:
        raise ValueError(f"model_type must be one of {sorted(QWEN_VL_TYPES)}, got {model_type!r}")
    patch_size, window_size = QWEN_VL_TYPES[model_type]
    merge = 2
    vocab = base_vocab + len(QWEN_VL_MARKERS)
    dims = _Dims(vocab, hidden_size, num_layers, num_heads, num_kv_heads, context_length)
    folder = pathlib.Path(out_dir) / (name or model_type)
    ids, w, rng = _start_folder(
        folder, dims, seed, base_vocab, QWEN_VL_MARKERS, bos="<|endoftext|>", eos="<|im_end|>",
        pad="<|endoftext|>", chat_template=_QWEN_TEMPLATE,
    )  # fmt: skip
    image_token = ids["<|image_pad|>"]
    patch_dim = 3 * 2 * patch_size * patch_size
    vision = _qwen_vision_graph(rng, patch_dim, merge, hidden_size)
    _save_graphs(folder, vision, w, image_token, _mrope_decoder(w, dims))
    inputs = {
        "inputs_embeds": "inputs_embeds",
        "attention_mask": "attention_mask",
        "position_ids": "position_ids",
        **SPLIT_KV_INPUTS,
    }
    config = {
        "model": {
            "bos_token_id": ids["<|endoftext|>"],
            "context_length": context_length,
            "decoder": _decoder_section(dims, inputs),
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "image_token_id": image_token,
            "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"],
            "type": model_type,
            "vocab_size": vocab,
            "embedding": {**_EMBEDDING_SECTION, "session_options": dict(SESSION_OPTIONS)},
            "vision": {
                "filename": "dummy_vision.onnx",
                "config_filename": "processor_config.json",
                "spatial_merge_size": merge,
                "tokens_per_second": 2.0,
                "patch_size": patch_size,
                "window_size": window_size,
                "inputs": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
                "outputs": {"image_features": "image_features"},
                "session_options": dict(SESSION_OPTIONS),
            },
        },
        "search": search_section(context_length, share_buffer=False, top_k=1),
    }
    _write_configs(folder, config, _qwen_processor(patch_size, merge))
    return folder


# --------------------------------------------------------------------------------------------
# Gemma 3 (with vision)
# --------------------------------------------------------------------------------------------

#: Added tokens of the Gemma 3 fixture (ids follow the base vocabulary, in this order).
GEMMA3_MARKERS = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<image_soft_token>",
    "<end_of_image>",
    "\n",
)
#: Gemma 3's image side (pixels) and soft tokens per image (a 16 x 16 grid).
GEMMA3_IMAGE = 896
GEMMA3_IMAGE_TOKENS = 256


def _gemma3_vision_graph(rng: np.random.Generator, hidden: int) -> Any:
    """``pixel_values`` fp32 [images, 3, 896, 896] -> ``image_features`` [images * 256,
    hidden]: each image pooled to a 16 x 16 grid of 3-channel cells, projected, mixed."""
    g = _Graph("gemma3_vision")
    pixels = g.input(
        "pixel_values", TensorProto.FLOAT, ["num_images", 3, GEMMA3_IMAGE, GEMMA3_IMAGE]
    )
    g.output("image_features", TensorProto.FLOAT, ["num_image_tokens", hidden])
    tokens = _pooled_tokens(g, rng, pixels, GEMMA3_IMAGE // 16, GEMMA3_IMAGE_TOKENS, hidden)
    g.op("Reshape", tokens, g.const([-1, hidden]), out="image_features")
    return g.model()


#: Gemma 3's chat template, reduced: a message's content is text, or a list of parts (``image``
#: parts become ``<start_of_image>``, ``text`` parts their text), as the published template.
_GEMMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<start_of_turn>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def _gemma3_processor() -> dict[str, Any]:
    """A Gemma 3 ``processor_config.json`` (the published ONNX folders' pipeline): decode,
    RGB, 896 x 896 bicubic resize, rescale, normalise with mean and std 0.5, channels first."""
    return {
        "processor": {
            "name": "gemma_3_image_processing",
            "transforms": [
                _operation("decode_image", "DecodeImage", {"color_space": "RGB"}),
                _operation("convert_to_rgb", "ConvertRGB"),
                {
                    "operation": {
                        "name": "resize",
                        "type": "Resize",
                        "attrs": {
                            "interpolation": "CUBIC",
                            "width": GEMMA3_IMAGE,
                            "height": GEMMA3_IMAGE,
                            "keep_aspect_ratio": 0,
                        },
                    }
                },
                _operation("rescale", "Rescale", {"rescale_factor": 0.00392156862745098}),
                {
                    "operation": {
                        "name": "normalize",
                        "type": "Normalize",
                        "attrs": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
                    }
                },
                {
                    "operation": {
                        "name": "to_channel_first",
                        "type": "Permute3D",
                        "attrs": {"dims": [2, 0, 1]},
                    }
                },
            ],
        }
    }


def write_gemma3(
    out_dir: str | pathlib.Path,
    *,
    name: str = "gemma3",
    base_vocab: int = 64,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    context_length: int = 2048,
    seed: int = 0,
) -> pathlib.Path:
    """Write a tiny random Gemma 3 vision folder (``model.type`` ``gemma3``) into ``out_dir /
    name``; returns the folder.

    Files: ``dummy_vision.onnx`` (``pixel_values`` [images, 3, 896, 896] -> 256 features per
    image), ``dummy_embedding.onnx`` (``image_token_id`` ``<image_soft_token>``),
    ``dummy_text.onnx`` (GroupQueryAttention decoder fed ``inputs_embeds``, shared KV buffer),
    ``genai_config.json``, ``processor_config.json`` and the tokenizer (tiny BPE +
    `GEMMA3_MARKERS`; eos ``<end_of_turn>``). A prompt marks each image with
    ``<start_of_image>``, which the processor expands to 256 soft tokens.
    """
    vocab = base_vocab + len(GEMMA3_MARKERS)
    dims = _Dims(vocab, hidden_size, num_layers, num_heads, num_kv_heads, context_length, gqa=True)
    folder = pathlib.Path(out_dir) / name
    ids, w, rng = _start_folder(
        folder, dims, seed, base_vocab, GEMMA3_MARKERS, bos="<s>", eos="<end_of_turn>",
        pad="<pad>", chat_template=_GEMMA3_TEMPLATE,
    )  # fmt: skip
    image_token = ids["<image_soft_token>"]
    vision = _gemma3_vision_graph(rng, hidden_size)
    _save_graphs(folder, vision, w, image_token, _gqa_embeds_decoder(w, dims))
    config = {
        "model": {
            "bos_token_id": 1,
            "context_length": context_length,
            "decoder": _decoder_section(dims, dict(_GQA_EMBEDS_INPUTS)),
            "embedding": dict(_EMBEDDING_SECTION),
            "vision": _vision_section("pixel_values"),
            "eos_token_id": [ids["<end_of_turn>"], 2],
            "pad_token_id": 0,
            "image_token_id": image_token,
            "type": "gemma3",
            "vocab_size": vocab,
        },
        "search": search_section(context_length, share_buffer=True, top_k=1),
    }
    _write_configs(folder, config, _gemma3_processor())
    return folder
