"""``tokenizer.json`` (Hugging Face ``tokenizers`` format) from a GGUF file's vocabulary.

Supported ``tokenizer.ggml.model`` values:

* ``gpt2`` -- byte-level BPE (SmolLM2, Llama 3, Qwen2/3, ...): the GGUF tokens are already
  byte-level strings; merges come from ``tokenizer.ggml.merges``; the pre-tokenizer's split
  pattern is chosen by ``tokenizer.ggml.pre``.
* ``llama`` -- SentencePiece BPE with byte fallback (Llama 2, Mistral v0.1, Phi-3, Gemma): merges
  are derived from the vocabulary, ordered by the merged piece's score.

Token types 3 (control) become special added tokens, 4 (user-defined) non-special added tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from genai.builder.errors import BuildError
from genai.builder.gguf import GGUFFile

__all__ = ["added_token_entry", "tokenizer_json_from_gguf", "write_tokenizer_files"]

# Split patterns of well-known pre-tokenizers (as published in the models' tokenizer.json files).
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_PATTERNS = {
    "llama-bpe": _LLAMA3_PATTERN,
    "llama3": _LLAMA3_PATTERN,
    "smaug-bpe": _LLAMA3_PATTERN,
    "qwen2": _QWEN2_PATTERN,
}
#: pre types whose pre-tokenizer is plain GPT-2 byte-level splitting.
_GPT2_PRE = ("default", "gpt2", "smollm", "gpt-2", "")

_CONTROL, _USER_DEFINED, _BYTE, _UNKNOWN = 3, 4, 6, 2
_SPACE = "\u2581"


def added_token_entry(token_id: int, content: str, *, special: bool) -> dict[str, Any]:
    """One ``added_tokens`` entry of a ``tokenizer.json`` (matched as written: not
    normalized, no stripping, not whole-word only)."""
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    return [
        added_token_entry(i, token, special=kind == _CONTROL)
        for i, (token, kind) in enumerate(zip(tokens, types, strict=False))
        if kind in (_CONTROL, _USER_DEFINED)
    ]


def _byte_level(f: GGUFFile, tokens: list[str]) -> dict[str, Any]:
    merges_raw = f.get("tokenizer.ggml.merges")
    if not merges_raw:
        raise BuildError(f"{f.path}: a gpt2 (byte-level BPE) tokenizer needs tokenizer.ggml.merges")
    merges = [m.split(" ", 1) for m in merges_raw]
    pre = str(f.get("tokenizer.ggml.pre") or "default")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    if pre in _SPLIT_PATTERNS:
        pre_tokenizer: dict[str, Any] = {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": _SPLIT_PATTERNS[pre]},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {**byte_level, "use_regex": False},
            ],
        }
    elif pre in _GPT2_PRE:
        pre_tokenizer = {**byte_level, "use_regex": True}
    else:
        raise BuildError(
            f"{f.path}: tokenizer.ggml.pre {pre!r} is not supported; supported: "
            f"{', '.join(sorted({*_SPLIT_PATTERNS, *_GPT2_PRE} - {''}))}"
        )
    return {
        "normalizer": {"type": "NFC"} if pre == "qwen2" else None,
        "pre_tokenizer": pre_tokenizer,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre in ("llama-bpe", "llama3"),
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }


def _sentencepiece(f: GGUFFile, tokens: list[str], types: list[int]) -> dict[str, Any]:
    scores = f.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = f.get("tokenizer.ggml.unknown_token_id")
    candidates = []
    for token, i in vocab.items():
        if types[i] in (_CONTROL, _BYTE, _UNKNOWN) or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                candidates.append((-scores[i], vocab[left], vocab[right], left, right))
    candidates.sort()
    merges = [[left, right] for *_, left, right in candidates]
    prefix = bool(f.get("tokenizer.ggml.add_space_prefix", True))
    normalizers: list[dict[str, Any]] = []
    if prefix:
        normalizers.append({"type": "Prepend", "prepend": _SPACE})
    normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": _SPACE})
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": _SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": tokens[unk_id] if unk_id is not None else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def tokenizer_json_from_gguf(f: GGUFFile) -> dict[str, Any]:
    """The ``tokenizer.json`` document for the GGUF's vocabulary."""
    tokens = f.get("tokenizer.ggml.tokens")
    if not tokens:
        raise BuildError(f"{f.path}: no tokenizer.ggml.tokens (the GGUF carries no vocabulary)")
    types = list(f.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    kind = f.get("tokenizer.ggml.model")
    if kind == "gpt2":
        body = _byte_level(f, tokens)
    elif kind == "llama":
        body = _sentencepiece(f, tokens, types)
    else:
        raise BuildError(f"{f.path}: tokenizer.ggml.model {kind!r} is not supported (gpt2, llama)")
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": body["normalizer"],
        "pre_tokenizer": body["pre_tokenizer"],
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {},
        },
        "decoder": body["decoder"],
        "model": body["model"],
    }


def write_tokenizer_files(f: GGUFFile, out: Path, context_length: int) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja`` from a GGUF."""
    doc = tokenizer_json_from_gguf(f)
    (out / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    tokens = f.get("tokenizer.ggml.tokens")

    def token(key: str) -> str | None:
        i = f.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    config = {
        "add_bos_token": bool(f.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(f.get("tokenizer.ggml.add_eos_token", False)),
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding") or token("eos"),
        "unk_token": token("unknown"),
        "model_max_length": context_length,
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps({k: v for k, v in config.items() if v is not None}, indent=2) + "\n",
        encoding="utf-8",
    )
    template = f.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
