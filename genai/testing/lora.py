"""Tiny decoder folders with LoRA branches, and random ``.onnx_adapter`` files for them.

:func:`write_lora_decoder` writes one of the fixture decoders of :mod:`genai.testing.models`
(``optimum`` or ``gqa`` layout, same weights for the same arguments) and then puts a LoRA branch
beside chosen weight MatMuls: ``y = x @ W`` becomes ``y = x @ W + (x @ A) @ B`` where ``A``
``[in, rank]`` and ``B`` ``[rank, out]`` are extra graph inputs with a dynamic rank dimension,
named after the weight the way onnxruntime-genai / Olive name adapter parameters::

    layers.0.attn.q_proj.weight  ->  model.layers.0.attn.q_proj.lora_A.weight  [hidden, rank_]
                                     model.layers.0.attn.q_proj.lora_B.weight  [rank_, out]

With rank 0 arrays bound (what `genai.Model` binds when no adapter is active) the branch adds
exact zeros, so the base function is unchanged. :func:`add_lora_branches` does the graph surgery
on any ModelProto whose projections are ``MatMul(x, initializer)``.

:func:`write_lora_adapter` draws random A/B arrays for some or all of a folder's LoRA inputs and
writes them with onnxruntime's ``AdapterFormat``; it returns the arrays so a test can compute the
merged weights ``W + A @ B`` itself.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import onnx
from onnx import helper

from genai.runtime.adapters import write_adapter_file
from genai.testing.models import write_gqa_decoder, write_optimum_decoder

__all__ = [
    "DEFAULT_TARGETS",
    "add_lora_branches",
    "copy_with_lora",
    "lora_input_shapes",
    "lora_parameter_names",
    "write_lora_adapter",
    "write_lora_decoder",
]

#: Projections that get a LoRA branch unless told otherwise: two attention projections and one
#: MLP projection (so both the attention and the MLP path are exercised).
DEFAULT_TARGETS: tuple[str, ...] = ("q_proj", "v_proj", "down_proj")

_WEIGHT_NAME = re.compile(r"^layers\.(\d+)\.(attn|mlp)\.(\w+)\.weight$")


def lora_parameter_names(weight: str) -> tuple[str, str]:
    """The ``(lora_A, lora_B)`` input names for the MatMul weight initializer ``weight``
    (``layers.0.attn.q_proj.weight`` -> ``model.layers.0.attn.q_proj.lora_A.weight``, ...;
    an int4 weight ``model.layers.0.attn.qkv_proj.weight_Q4`` ->
    ``model.layers.0.attn.qkv_proj.lora_A.weight``)."""
    stem = re.sub(r"\.weight(_Q\d+)?$", "", weight)
    stem = stem if stem.startswith("model.") else f"model.{stem}"
    return f"{stem}.lora_A.weight", f"{stem}.lora_B.weight"


def add_lora_branches(model: onnx.ModelProto, weights: Iterable[str]) -> list[str]:
    """Give every ``MatMul(x, W)`` (or ``MatMulNBits(x, W, ...)``) whose ``W`` is one of the
    initializers ``weights`` a LoRA branch, in place: ``y = MatMul(x, W) + MatMul(MatMul(x, A),
    B)``.

    ``A`` ``[in, rank]`` and ``B`` ``[rank, out]`` become graph inputs of ``W``'s element type
    (float32 for int4 weights; names from :func:`lora_parameter_names`; one rank dimension name
    per pair). Returns the new input names. Raises ValueError when a weight is not a 2-D
    initializer consumed by a MatMul, or a MatMulNBits's packed weight.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    packed: dict[str, tuple[int, int]] = {}  # MatMulNBits weight -> (K, N)
    for node in graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2:
            consumers.setdefault(node.input[1], []).append(node)
        elif node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            attrs = {a.name: a.i for a in node.attribute}
            consumers.setdefault(node.input[1], []).append(node)
            packed[node.input[1]] = (int(attrs["K"]), int(attrs["N"]))
    added: list[str] = []
    new_nodes: dict[int, list[onnx.NodeProto]] = {}
    for weight in weights:
        if weight not in inits or (len(inits[weight].dims) != 2 and weight not in packed):
            raise ValueError(f"{weight!r} is not a 2-D initializer of the graph")
        if weight not in consumers:
            raise ValueError(f"no MatMul takes {weight!r} as its weight")
        if weight in packed:
            (n_in, n_out), elem = packed[weight], onnx.TensorProto.FLOAT
        else:
            n_in, n_out = (int(d) for d in inits[weight].dims)
            elem = inits[weight].data_type
        name_a, name_b = lora_parameter_names(weight)
        rank = "lora_rank_" + weight[: -len(".weight")].replace(".", "_")
        graph.input.append(helper.make_tensor_value_info(name_a, elem, [n_in, rank]))
        graph.input.append(helper.make_tensor_value_info(name_b, elem, [rank, n_out]))
        added += [name_a, name_b]
        for k, node in enumerate(consumers[weight]):
            stem = f"/lora/{weight}/{k}"
            out = node.output[0]
            node.output[0] = f"{stem}/base"
            new_nodes[id(node)] = [
                helper.make_node("MatMul", [node.input[0], name_a], [f"{stem}/xa"], f"{stem}/A"),
                helper.make_node("MatMul", [f"{stem}/xa", name_b], [f"{stem}/delta"], f"{stem}/B"),
                helper.make_node("Add", [f"{stem}/base", f"{stem}/delta"], [out], f"{stem}/Add"),
            ]
    # Keep the node list topologically sorted: each branch right after its MatMul.
    nodes = []
    for node in graph.node:
        nodes.append(node)
        nodes.extend(new_nodes.get(id(node), []))
    del graph.node[:]
    graph.node.extend(nodes)
    return added


def write_lora_decoder(
    out_dir: str | os.PathLike[str],
    *,
    layout: Literal["optimum", "gqa"] = "optimum",
    targets: Sequence[str] = DEFAULT_TARGETS,
    name: str = "lora-decoder",
    **writer_kwargs: Any,
) -> pathlib.Path:
    """Write a fixture decoder (:func:`~genai.testing.models.write_optimum_decoder` or
    :func:`~genai.testing.models.write_gqa_decoder`, which take ``writer_kwargs``) whose
    projections named in ``targets`` have LoRA branches; returns the folder.

    ``targets`` are projection names of every layer: ``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj`` (the ``gqa`` layout packs the first
    three into ``qkv_proj``). The folder's base function (no adapter, rank 0) is exactly the plain
    writer's, rotary base 10000, RMSNorm epsilon 1e-5.
    """
    writer = {"optimum": write_optimum_decoder, "gqa": write_gqa_decoder}.get(layout)
    if writer is None:
        raise ValueError(f"layout must be 'optimum' or 'gqa', got {layout!r}")
    folder = writer(out_dir, name=name, **writer_kwargs)
    path = folder / "model.onnx"
    model = onnx.load(str(path))
    available = sorted(
        {m.group(3) for t in model.graph.initializer if (m := _WEIGHT_NAME.match(t.name))}
    )
    unknown = [t for t in targets if t not in available]
    if unknown or not targets:
        raise ValueError(
            f"targets {list(targets)} of the {layout} layout must be among {', '.join(available)}"
        )
    weights = [
        t.name
        for t in model.graph.initializer
        if (m := _WEIGHT_NAME.match(t.name)) and m.group(3) in targets
    ]
    add_lora_branches(model, weights)
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return folder


def copy_with_lora(
    folder: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    targets: Sequence[str] = ("qkv_proj", "o_proj", "down_proj"),
) -> pathlib.Path:
    """Copy the model folder ``folder`` (its ``model.onnx`` and every other file, weights
    included) to ``out_dir`` with a LoRA branch (:func:`add_lora_branches`) beside every
    ``MatMul`` / ``MatMulNBits`` whose weight's name contains one of ``targets``; returns
    ``out_dir``. For real folders such as the default model."""
    source, out = pathlib.Path(folder), pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "model.onnx":
            shutil.copyfile(path, out / path.name)
    model = onnx.load(str(source / "model.onnx"), load_external_data=False)
    weights = {
        node.input[1]
        for node in model.graph.node
        if node.op_type in ("MatMul", "MatMulNBits")
        and len(node.input) > 1
        and any(target in node.input[1] for target in targets)
    }
    if not weights:
        raise ValueError(f"no MatMul weight of {source} names one of {list(targets)}")
    add_lora_branches(model, sorted(weights))
    onnx.save_model(model, str(out / "model.onnx"))
    return out


def lora_input_shapes(model_dir: str | os.PathLike[str]) -> dict[str, tuple[int | str, ...]]:
    """``{name: declared shape}`` of the LoRA inputs (``...lora_A...`` / ``...lora_B...``) of
    ``model_dir/model.onnx``; the rank dimension is a string."""
    model = onnx.load(str(pathlib.Path(model_dir) / "model.onnx"), load_external_data=False)
    shapes = {}
    for value in model.graph.input:
        if re.search(r"lora_[AB]", value.name):
            dims = value.type.tensor_type.shape.dim
            shapes[value.name] = tuple(d.dim_param or d.dim_value for d in dims)
    return shapes


def write_lora_adapter(
    model_dir: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    rank: int = 4,
    seed: int = 0,
    modules: Sequence[str] | None = None,
    scale: float = 0.5,
    dtype: type | np.dtype = np.float32,
) -> dict[str, np.ndarray]:
    """Write a random ``.onnx_adapter`` for the LoRA inputs of ``model_dir`` to ``path``.

    ``modules`` restricts it to inputs whose name contains one of the strings (e.g.
    ``["q_proj"]``); the default covers every LoRA input. ``A`` entries have standard deviation
    ``1 / sqrt(in)``, ``B`` entries ``scale / sqrt(rank)``, so a branch adds about ``scale`` to
    a unit-size activation. Returns ``{name: array}`` as written (A ``[in, rank]``, B
    ``[rank, out]``).
    """
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for name, shape in lora_input_shapes(model_dir).items():
        if modules is not None and not any(m in name for m in modules):
            continue
        if ".lora_A." in name:
            n_in = int(shape[0])
            array = rng.standard_normal((n_in, rank)) / np.sqrt(n_in)
        else:
            array = rng.standard_normal((rank, int(shape[1]))) * (scale / np.sqrt(rank))
        params[name] = np.ascontiguousarray(array, dtype=dtype)
    if not params:
        raise ValueError(f"no LoRA input of {model_dir} matches modules={modules!r}")
    write_adapter_file(path, params)
    return params
