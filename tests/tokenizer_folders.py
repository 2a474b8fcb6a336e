"""Model folders the reference loads with each real tokenizer of ``../shared/tokenizers``: the
shared SmolLM2 graph (linked) with another tokenizer and that tokenizer's special ids."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct-int4"
TOKENIZERS = SHARED / "tokenizers"

# Special ids for the reference's genai_config.json, from each tokenizer's own files.
SPECIAL_IDS = {
    "gpt2": {
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "pad_token_id": 50256,
        "vocab_size": 50257,
    },
    "phi3": {
        "bos_token_id": 1,
        "eos_token_id": [32000, 32007],
        "pad_token_id": 32000,
        "vocab_size": 32064,
    },
    "qwen3": {
        "bos_token_id": 151643,
        "eos_token_id": [151645, 151643],
        "pad_token_id": 151643,
        "vocab_size": 151936,  # padded model vocabulary, larger than the tokenizer's 151669
    },
    "llama3.1": {
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "pad_token_id": 128001,
        "vocab_size": 128256,
    },
}
#: smollm2 (the shared model's own tokenizer) and the others.
NAMES = ["smollm2", *SPECIAL_IDS]


def shared_tokenizers_present() -> bool:
    """Whether ``../shared`` holds the tokenizers and the SmolLM2 model."""
    return (TOKENIZERS / "gpt2").is_dir() and SMOLLM2.is_dir()


def tokenizer_folder(root: Path, name: str) -> Path:
    """A folder under ``root`` the reference loads with tokenizer ``name`` (smollm2: the
    shared model's own folder)."""
    if name == "smollm2":
        return SMOLLM2
    folder = root / name
    folder.mkdir()
    for file in ("model.onnx", "model.onnx.data"):
        os.symlink(SMOLLM2 / file, folder / file)
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (TOKENIZERS / name / file).is_file():
            shutil.copy(TOKENIZERS / name / file, folder / file)
    config = json.loads((SMOLLM2 / "genai_config.json").read_text())
    config["model"].update(SPECIAL_IDS[name])
    (folder / "genai_config.json").write_text(json.dumps(config))
    return folder
