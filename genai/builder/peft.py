"""Convert a PEFT LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``) into an
onnxruntime ``.onnx_adapter`` file for a model with LoRA inputs (see ``docs/adapters.md``).

PEFT stores, per adapted ``nn.Linear``, ``...q_proj.lora_A.weight`` ``[r, in]`` and
``...q_proj.lora_B.weight`` ``[out, r]`` (torch layout) and applies
``y += scale * x @ A.T @ B.T`` with ``scale = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
``use_rslora``). The ONNX graph computes ``y += (x @ A) @ B`` with inputs ``A`` ``[in, r]`` and
``B`` ``[r, out]``, so the converter transposes both and folds ``scale`` into ``B``.

Names: the ``base_model.model.`` prefix is dropped and module path components are renamed by
``module_map`` (default ``self_attn`` -> ``attn``, the onnxruntime-genai builder's naming)::

    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
        -> model.layers.0.attn.q_proj.lora_A.weight

Command line: ``genai adapter convert PEFT_DIR OUT.onnx_adapter [-m MODEL_DIR]`` (or
``python -m genai.builder.peft`` with the same arguments).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from genai.builder.errors import BuildError
from genai.builder.sources import SafetensorsFile
from genai.errors import GenaiError, check_writable_file
from genai.runtime.adapters import write_adapter_file
from genai.runtime.config import Config

__all__ = ["DEFAULT_MODULE_MAP", "convert_peft_adapter", "main"]

#: PEFT module path component -> ONNX input name component.
DEFAULT_MODULE_MAP: Mapping[str, str] = {"self_attn": "attn"}

_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<kind>[AB])(?:\.(?P<adapter>[\w-]+))?"
    r"\.weight$"
)
_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}
#: ONNX element types by NumPy's names (the rest: ONNX's own names, lower case).
_ONNX_TYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}


def convert_peft_adapter(
    peft_dir: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    module_map: Mapping[str, str] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    dtype: str = "float32",
) -> dict[str, np.ndarray]:
    """Convert the PEFT LoRA adapter in ``peft_dir`` into the ``.onnx_adapter`` file
    ``out_path``; returns the written ``{input name: array}``.

    ``module_map`` renames module path components (default `DEFAULT_MODULE_MAP`); ``dtype``
    (``"float32"`` or ``"float16"``) is the type of the written arrays. With ``model_dir`` (a
    model folder with LoRA inputs) every parameter is checked against the graph's inputs before
    anything is written. Raises FileNotFoundError for missing files and BuildError for an
    adapter this cannot convert (not LoRA, DoRA, embedding LoRA, LoRA biases, unknown keys).
    """
    peft_dir = Path(peft_dir)
    _refuse_input_as_output(peft_dir, Path(out_path))
    if dtype not in _DTYPES:
        raise BuildError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    config = _read_config(peft_dir)
    weights = _read_weights(peft_dir)
    mapping = DEFAULT_MODULE_MAP if module_map is None else module_map

    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, array in weights.items():
        match = _KEY.match(key)
        if match is None:
            what = (
                "embedding LoRA (lora_embedding_A/B)"
                if "lora_embedding" in key
                else "DoRA (lora_magnitude_vector)"
                if "lora_magnitude_vector" in key
                else "a LoRA bias"
                if ".lora_B" in key and key.endswith(".bias")
                else "not a lora_A / lora_B weight"
            )
            raise BuildError(f"{peft_dir}: cannot convert tensor {key!r}: {what}")
        if array.ndim != 2:
            raise BuildError(
                f"{peft_dir}: tensor {key!r} has shape {list(array.shape)}; LoRA weights of "
                "linear layers are 2-D (convolution LoRA is not supported)"
            )
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise BuildError(f"{peft_dir}: tensor {key!r} holds NaN or infinite values")
        pairs.setdefault(match["module"], {})[match["kind"]] = array

    params: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}  # written module name -> the PEFT module it came from
    for module, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise BuildError(f"{peft_dir}: module {module!r} has no {missing} weight")
        a, b = pair["A"].astype(np.float32), pair["B"].astype(np.float32)
        rank = a.shape[0]
        if b.shape[1] != rank:
            raise BuildError(
                f"{peft_dir}: module {module!r}: lora_A is {list(a.shape)} ([r, in]) but lora_B "
                f"is {list(b.shape)} ([out, r])"
            )
        scale = _scale(config, module, rank, peft_dir)
        # A component mapped to "" is dropped.
        name = ".".join(p for p in (mapping.get(q, q) for q in module.split(".")) if p)
        if name in sources:
            raise BuildError(
                f"{peft_dir}: modules {sources[name]!r} and {module!r} both map to {name!r} "
                "(check --module-map)"
            )
        sources[name] = module
        down = np.ascontiguousarray(a.T, dtype=_DTYPES[dtype])
        if not np.isfinite(down).all():
            raise BuildError(f"{peft_dir}: module {module!r}: lora_A overflows {dtype}")
        params[f"{name}.lora_A.weight"] = down
        scaled = np.ascontiguousarray((b * np.float32(scale)).T, dtype=_DTYPES[dtype])
        if not np.isfinite(scaled).all():
            raise BuildError(
                f"{peft_dir}: module {module!r}: lora_B scaled by {scale:g} overflows {dtype}"
            )
        params[f"{name}.lora_B.weight"] = scaled
    if not params:
        raise BuildError(f"{peft_dir}: the adapter has no LoRA weights")
    if model_dir is not None:
        _check_against_model(params, Path(model_dir), peft_dir)
    write_adapter_file(out_path, params)
    return params


def _refuse_input_as_output(peft_dir: Path, out_path: Path) -> None:
    """BuildError when ``out_path`` is one of the adapter's own files (it would be lost)."""
    target = out_path.resolve()
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        source = (peft_dir / name).resolve()
        if target == source:
            raise BuildError(
                f"OUT {out_path} is the adapter's own {name}: writing it would destroy the "
                "input; name another file"
            )


def _read_config(peft_dir: Path) -> dict:
    path = peft_dir / "adapter_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (is {peft_dir} a PEFT adapter folder?)")
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise BuildError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise BuildError(f"{path}: expected a JSON object, got {type(config).__name__}")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise BuildError(f"{path}: peft_type {peft_type!r} is not supported (only LORA)")
    if config.get("use_dora"):
        raise BuildError(f"{path}: DoRA adapters (use_dora) are not supported")
    _check_rank(path, "r", config.get("r"))
    _check_alpha(path, "lora_alpha", config.get("lora_alpha"))
    for key, check in (("rank_pattern", _check_rank), ("alpha_pattern", _check_alpha)):
        patterns = config.get(key)
        if patterns is None:
            continue
        if not isinstance(patterns, dict):
            raise BuildError(f"{path}: {key!r} must be an object, got {patterns!r}")
        for module, value in patterns.items():
            check(path, f"{key}[{module!r}]", value)
    return config


def _check_rank(path: Path, key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BuildError(f"{path}: {key} must be a positive integer, got {value!r}")


def _check_alpha(path: Path, key: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise BuildError(f"{path}: {key} must be a finite positive number, got {value!r}")


def _read_weights(peft_dir: Path) -> dict[str, np.ndarray]:
    path = peft_dir / "adapter_model.safetensors"
    if not path.is_file():
        if (peft_dir / "adapter_model.bin").is_file():
            raise BuildError(
                f"{peft_dir}: only adapter_model.bin (PyTorch pickle) found; save the adapter "
                "with safe_serialization=True to get adapter_model.safetensors"
            )
        raise FileNotFoundError(f"{path} does not exist")
    st = SafetensorsFile(path)
    return {name: np.array(st.tensor(name)) for name in st.entries}


def _scale(config: dict, module: str, rank: int, peft_dir: Path) -> float:
    """PEFT's ``scaling``: ``alpha / r`` (``alpha / sqrt(r)`` with rsLoRA), with the
    ``rank_pattern`` / ``alpha_pattern`` overrides matched against the module path."""

    def pattern_value(patterns: Mapping[str, float] | None, default: float) -> float:
        for key, value in (patterns or {}).items():
            if re.match(rf"(.*\.)?{key}$", module):
                return value
        return default

    r = pattern_value(config.get("rank_pattern"), config["r"])
    alpha = pattern_value(config.get("alpha_pattern"), config["lora_alpha"])
    if r != rank:
        raise BuildError(
            f"{peft_dir}: module {module!r} has rank {rank} in the weights but {r} in "
            "adapter_config.json"
        )
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def _check_against_model(params: Mapping[str, np.ndarray], model_dir: Path, peft_dir: Path) -> None:
    config = Config(model_dir)
    filename = config.decoder.get("filename", "model.onnx")
    graph = onnx.load(
        str(config.resolve_file(filename, "model.decoder.filename")), load_external_data=False
    ).graph
    shapes = {
        v.name: [
            d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim
        ]
        for v in graph.input
    }
    types = {v.name: v.type.tensor_type.elem_type for v in graph.input}
    lora = [n for n in shapes if re.search(r"lora_[AB]", n)]
    if not lora:
        raise BuildError(f"{model_dir}: the model has no LoRA inputs (...lora_A... / ...lora_B...)")
    for name, array in params.items():
        if name not in shapes:
            raise BuildError(
                f"{peft_dir}: converted parameter {name!r} is not an input of {model_dir} "
                f"(its LoRA inputs look like {lora[0]!r}; adjust module_map / --module-map)"
            )
        wanted = (
            _ONNX_TYPES.get(types[name])
            or onnx.helper.tensor_dtype_to_string(types[name]).removeprefix("TensorProto.").lower()
        )
        if types[name] and wanted != array.dtype.name:
            fix = f"use --dtype {wanted}" if wanted in _DTYPES else "adapter convert writes "
            fix += "" if wanted in _DTYPES else " or ".join(_DTYPES)
            raise BuildError(
                f"{model_dir}: its LoRA input {name!r} is {wanted}, the adapter would be "
                f"{array.dtype.name} ({fix})"
            )
        rank_axis = 1 if ".lora_A." in name else 0
        expected = shapes[name]
        fixed = expected[1 - rank_axis] if len(expected) == 2 else None
        if fixed is not None and array.shape[1 - rank_axis] != fixed:
            raise BuildError(
                f"{peft_dir}: converted parameter {name!r} has shape {list(array.shape)}, the "
                f"model's input is {expected} (None = the rank)"
            )


CONVERT_DESCRIPTION = (
    "Convert a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) into an "
    "onnxruntime .onnx_adapter file for genai.Adapters."
)


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    """The converter's arguments (``python -m genai.builder.peft`` and ``genai adapter
    convert`` share them)."""
    parser.add_argument("peft_dir", metavar="PEFT_DIR", help="the PEFT adapter folder")
    parser.add_argument("out_path", metavar="OUT", help="the .onnx_adapter file to write")
    parser.add_argument(
        "-m",
        "--model",
        metavar="MODEL_DIR",
        help="check the parameters against this model folder's LoRA inputs before writing",
    )
    parser.add_argument(
        "--dtype",
        choices=sorted(_DTYPES),
        default="float32",
        help="type of the written arrays; must match the model's LoRA inputs (default float32)",
    )
    parser.add_argument(
        "--module-map",
        metavar="FROM=TO",
        action="append",
        default=None,
        help="rename a module path component (repeatable; default: self_attn=attn)",
    )


def run_convert(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Convert as ``args`` (from `add_convert_arguments`) say; returns 0.

    A malformed ``--module-map`` is a usage error (``parser.error``: exit 2). What the
    conversion refuses raises (`GenaiError`, such as `BuildError`, or `OSError` for a file it
    cannot read or write): the caller reports it, ``genai adapter convert`` like every
    ``genai`` command (``genai: error: ...``, exit 1), `main` with its own prefix.
    """
    module_map = None
    if args.module_map is not None:
        module_map = {}
        for item in args.module_map:
            source, sep, target = item.partition("=")
            if not sep or not source:
                parser.error(f"--module-map expects FROM=TO, got {item!r}")
            module_map[source] = target
    # onnxruntime's error for a file it cannot open comes after the whole conversion
    check_writable_file(args.out_path, f"OUT {args.out_path}")
    params = convert_peft_adapter(
        args.peft_dir,
        args.out_path,
        module_map=module_map,
        model_dir=args.model,
        dtype=args.dtype,
    )
    print(f"wrote {len(params) // 2} LoRA pairs to {args.out_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genai.builder.peft PEFT_DIR OUT.onnx_adapter``: convert a PEFT adapter.
    Returns 0, 1 with a one-line error on stderr, 2 for a usage error, 130 on Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m genai.builder.peft", description=CONVERT_DESCRIPTION
    )
    add_convert_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_convert(parser, args)
    except KeyboardInterrupt:
        return 130
    except (GenaiError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
