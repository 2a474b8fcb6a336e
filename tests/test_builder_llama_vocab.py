"""Tokenizers built from real GGUF vocabularies against llama.cpp's own reference vectors.

llama.cpp ships vocab-only GGUF files with inputs (``.inp``) and the token ids its tokenizer
produces for them (``.out``): an independent check of `tokenizer_json_from_gguf` for
SentencePiece-style (phi-3, llama-spm) and byte-level (llama-bpe, gpt-2, qwen2) vocabularies.
`.ci/run` fetches them once from PyPI (the llama-cpp-python sdist) into
``$GENAI_LLAMA_VOCAB_DIR``; tests never download.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from genai.builder.gguf import GGUFFile
from genai.builder.tokenizer_gguf import tokenizer_json_from_gguf

VOCAB_DIR = Path(
    os.environ.get("GENAI_LLAMA_VOCAB_DIR", Path.home() / ".cache" / "genai" / "llama-vocab")
)
VOCABS = ["phi-3", "llama-spm", "llama-bpe", "gpt-2", "qwen2"]
SEPARATOR = "\n__ggml_vocab_test__\n"


@pytest.mark.parametrize("name", VOCABS)
def test_tokenizer_from_gguf_matches_llama_cpp_vectors(name):
    gguf = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    if not (gguf.is_file() and gguf.with_name(gguf.name + ".out").is_file()):
        pytest.skip(f"llama.cpp vocab files not found in {VOCAB_DIR} (.ci/run fetches them)")
    tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json_from_gguf(GGUFFile(gguf))))
    inputs = gguf.with_name(gguf.name + ".inp").read_text(encoding="utf-8").split(SEPARATOR)
    outputs = gguf.with_name(gguf.name + ".out").read_text(encoding="utf-8").split("\n")
    checked = 0
    for text, expected in zip(inputs, outputs, strict=False):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == [int(t) for t in expected.split()], repr(text)
        checked += 1
    assert checked >= 40, f"only {checked} reference vectors read"
