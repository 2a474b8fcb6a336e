"""``build()``: a GGUF file, a Hugging Face folder or a Whisper checkpoint (Hugging Face or
CTranslate2 folder) -> an onnxruntime-genai model folder."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from genai.builder.errors import BuildError
from genai.builder.genai_config import (
    SPLIT_KV_INPUTS,
    SPLIT_KV_OUTPUTS,
    graph_section,
    search_section,
)
from genai.builder.onnx_writer import PRECISIONS, check_source, write_onnx
from genai.builder.output import check_output, staged_folder
from genai.builder.sources import GGUFSource, HFSource, Source, open_source
from genai.builder.spec import ModelSpec
from genai.builder.tokenizer_gguf import write_tokenizer_files
from genai.builder.whisper import build_whisper
from genai.builder.whisper_sources import is_whisper_input

log = logging.getLogger(__name__)

__all__ = ["build", "genai_config"]

#: ``stage(name, total) -> update(done, total)``: how build() reports progress.
StageFactory = Callable[[str, int], Callable[[int, int], None]]

_HF_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
)


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def genai_config(
    spec: ModelSpec, eos: list[int] | None = None, window_cache: bool = False
) -> dict[str, Any]:
    """The ``genai_config.json`` document for a model built from ``spec`` (with the
    ``sliding_window`` block when ``window_cache`` gave its local layers window caches)."""
    eos_ids = eos or _as_list(spec.eos_token_id)
    if not eos_ids:
        raise BuildError("the checkpoint names no eos_token_id")
    pad = spec.pad_token_id if spec.pad_token_id is not None else eos_ids[0]
    bos = spec.bos_token_id if spec.bos_token_id is not None else eos_ids[0]
    decoder_extra: dict[str, Any] = {}
    local = [i for i, sliding in enumerate(spec.sliding_layers) if sliding]
    if window_cache and spec.sliding_window and local:
        decoder_extra["sliding_window"] = {
            "window_size": int(spec.sliding_window),
            "slide_key_value_cache": False,
            "slide_inputs": False,
            "layers": local,
        }
    return {
        "model": {
            "bos_token_id": int(bos),
            "context_length": spec.context_length,
            "decoder": {
                **graph_section(
                    "model.onnx",
                    head_size=spec.head_dim,
                    hidden_size=spec.hidden_size,
                    num_heads=spec.num_heads,
                    num_kv_heads=spec.num_kv_heads,
                    num_layers=spec.num_layers,
                    inputs={
                        "input_ids": "input_ids",
                        "attention_mask": "attention_mask",
                        **SPLIT_KV_INPUTS,
                    },
                    outputs=dict(SPLIT_KV_OUTPUTS),
                ),
                **decoder_extra,
            },
            "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids,
            "pad_token_id": int(pad),
            "type": spec.genai_type,
            "vocab_size": spec.vocab_size,
        },
        "search": search_section(spec.context_length, share_buffer=True, top_k=50),
    }


def _hf_eos(source: HFSource) -> list[int]:
    gen = source.path / "generation_config.json"
    if gen.is_file():
        ids = _as_list(json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id"))
        if ids:
            return ids
    return _as_list(source.spec.eos_token_id)


def _check_tokenizer(source: Source) -> None:
    """An HF folder must have a tokenizer.json (checked before anything is written)."""
    if isinstance(source, HFSource) and not (source.path / "tokenizer.json").is_file():
        raise BuildError(
            f"{source.path}: no tokenizer.json (SentencePiece-only tokenizer.model folders are "
            "not supported; save the tokenizer with a fast tokenizer first)"
        )


def _write_tokenizer(source: Source, out: Path) -> None:
    if isinstance(source, GGUFSource):
        write_tokenizer_files(source.gguf, out, source.spec.context_length)
        return
    assert isinstance(source, HFSource)
    _check_tokenizer(source)
    for name in _HF_TOKENIZER_FILES:
        if (source.path / name).is_file():
            shutil.copyfile(source.path / name, out / name)


def build(
    input_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    precision: str = "int4",
    all_logits: bool = False,
    window_cache: bool = False,
    prefill_int8: bool = False,
    stage: StageFactory | None = None,
) -> Path:
    """Build the model folder ``out_dir`` from a GGUF file or a Hugging Face folder; a Whisper
    checkpoint (HF ``model_type: whisper`` or a CTranslate2 folder with ``model.bin``) becomes
    an encoder/decoder folder (:func:`genai.builder.whisper.build_whisper`).

    ``precision``: ``"int4"`` (MatMulNBits, block 32), ``"fp16"`` or ``"fp32"``; Whisper:
    ``"fp32"``, ``"int8"`` or ``"int4"``.
    ``all_logits``: keep logits for every position (default: the last real token only).
    ``window_cache``: sliding-window layers (Gemma-2/3) keep window-sized KV caches (their
    GroupQueryAttention compacts them; both engines then size those caches from the config's
    ``sliding_window`` block). Off by default: such graphs need the shared-buffer layout in the
    reference and cannot start from an empty past. A model without sliding-window layers
    refuses it.
    ``prefill_int8`` (int4 decoders): prompts (runs of 18+ tokens) use int8 linears, ~2x
    faster prefill on CPUs for ~2.2x the weight file (`genai.builder.onnx_writer`).
    ``stage``: optional progress reporter (see :data:`StageFactory`).

    The checks that read no weights (options, output folder, config against the tensors'
    shapes, attention dims onnxruntime runs, rope scaling, tokenizer, eos) come first. The
    folder is written beside ``out_dir`` (a hidden sibling) and renamed into place when
    complete: a failed or interrupted build leaves nothing behind and a previous folder at
    ``out_dir`` as it was. An existing ``out_dir`` is replaced when it is empty or a model
    folder (`genai.builder.output.replaceable`); any other non-empty folder, the input folder
    itself or a folder holding the input is refused.
    """
    started = time.perf_counter()
    target = check_output(input_path, out_dir)
    if is_whisper_input(input_path):
        if window_cache:
            raise BuildError("--window-cache applies to sliding-window decoders, not Whisper")
        if prefill_int8:
            raise BuildError("--prefill-int8 applies to int4 decoders, not Whisper")
        # Whisper's decoder always gives logits for every position (all_logits is moot).
        with staged_folder(target) as work:
            build_whisper(input_path, work, precision=precision, stage=stage)
        return Path(out_dir)
    if precision == "int8":
        raise BuildError("precision int8 builds Whisper models; decoders take int4, fp16 or fp32")
    if precision not in PRECISIONS:
        raise BuildError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if prefill_int8 and precision != "int4":
        raise BuildError(f"--prefill-int8 applies to int4 builds, not {precision}")
    source = open_source(input_path)
    spec = source.spec
    check_source(source)
    if window_cache and not (spec.sliding_window and any(spec.sliding_layers)):
        raise BuildError(
            f"{input_path}: --window-cache: this {spec.arch} model has no sliding-window "
            "layers (nothing to shrink)"
        )
    _check_tokenizer(source)
    eos = _hf_eos(source) if isinstance(source, HFSource) else None
    try:
        config = genai_config(spec, eos, window_cache)
    except BuildError as exc:
        raise BuildError(f"{source.path}: {exc}") from None
    log.info("building %s (%s, %d layers, %s) into %s", input_path, spec.arch,
             spec.num_layers, precision, out_dir)  # fmt: skip
    with staged_folder(target) as work:
        tok_update = stage("tokenizer", 1) if stage else None
        _write_tokenizer(source, work)
        (work / "genai_config.json").write_text(
            json.dumps(config, indent=4) + "\n", encoding="utf-8"
        )
        if tok_update:
            tok_update(1, 1)
        write_onnx(
            source,
            work,
            precision=precision,
            all_logits=all_logits,
            progress=stage("weights", spec.num_layers + 2) if stage else None,
            window_cache=window_cache,
            prefill_int8=prefill_int8,
        )
    log.info("built %s in %.1f s", out_dir, time.perf_counter() - started)
    return Path(out_dir)
