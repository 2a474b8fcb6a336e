"""tokenizer.json built from GGUF-style vocab metadata reproduces the published tokenizers of
byte-level BPE families (Llama 3 and Qwen pre-tokenizers) in ../shared/tokenizers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genai.builder import BuildError
from genai.builder.tokenizer_gguf import tokenizer_json_from_gguf
from tests.conftest import TOKENIZERS

TEXT = (
    "Hello world! Zwölf Boxkämpfer 我能吞下玻璃 Съешь 12345 3.14  spaces\tand\n\nnewlines 🤖 "
    "don't I'LL  <|im_start|> x=1;  y  =  2\r\n"
)


class _Meta:
    """Stands in for a GGUFFile: ``get`` over a metadata dict."""

    def __init__(self, meta: dict) -> None:
        self.meta, self.path = meta, Path("fake.gguf")

    def get(self, key: str, default=None):
        return self.meta.get(key, default)


def _metadata_from(tokenizer_json: Path, pre: str) -> dict:
    doc = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    added = {a["id"]: a for a in doc["added_tokens"]}
    size = max(max(doc["model"]["vocab"].values()), max(added)) + 1
    tokens = [""] * size
    for token, i in doc["model"]["vocab"].items():
        tokens[i] = token
    for i, a in added.items():
        tokens[i] = a["content"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [
            (3 if added[i]["special"] else 4) if i in added else 1 for i in range(size)
        ],
        "tokenizer.ggml.merges": merges,
    }


@pytest.mark.parametrize(("name", "pre"), [("llama3.1", "llama-bpe"), ("qwen3", "qwen2")])
def test_byte_level_families_match_published_tokenizer(name, pre):
    from tokenizers import Tokenizer

    path = TOKENIZERS / name / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path} not found (../shared beside the checkout)")
    ours = Tokenizer.from_str(
        json.dumps(tokenizer_json_from_gguf(_Meta(_metadata_from(path, pre))))
    )
    theirs = Tokenizer.from_file(str(path))
    for text in (TEXT, TEXT * 3, TEXT.upper()):
        assert (
            ours.encode(text, add_special_tokens=False).ids
            == theirs.encode(text, add_special_tokens=False).ids
        )


def test_unknown_tokenizer_kinds_are_errors():
    base = {"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": ["a b"]}
    with pytest.raises(BuildError, match="tokenizer.ggml.model 'rwkv' is not supported"):
        tokenizer_json_from_gguf(_Meta({**base, "tokenizer.ggml.model": "rwkv"}))
    with pytest.raises(BuildError, match="tokenizer.ggml.pre 'falcon' is not supported"):
        tokenizer_json_from_gguf(
            _Meta({**base, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "falcon"})
        )
    with pytest.raises(BuildError, match="no tokenizer.ggml.tokens"):
        tokenizer_json_from_gguf(_Meta({"tokenizer.ggml.model": "gpt2"}))
