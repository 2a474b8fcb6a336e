"""Model folders with what the reference's 0.18 builder writes for real tokenizers (the
tool-call and reasoning delimiter keys when the tokenizer has those tokens), loaded by both
engines: the same chat prompt ids, the same delimiter ids and the same greedy tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.testing.models import write_gqa_decoder
from tests.conftest import TOKENIZERS
from tests.test_tokenizer import DELIMITER_TOKENS, SPECIAL_IDS

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

#: tokenizer folder in ../shared -> the builder's model.type for it.
CASES = {"qwen3": "qwen3", "llama3.1": "llama", "phi3": "phi3"}
PHI3_DELIMITERS = {"bot_token_id": "<|tool_call|>", "eot_token_id": "<|/tool_call|>"}


def _builder_folder(root: Path, tokenizer: str, model_type: str) -> Path:
    ids = SPECIAL_IDS[tokenizer]
    if not (TOKENIZERS / tokenizer / "tokenizer.json").is_file():
        pytest.skip(f"tokenizer folder not found at {TOKENIZERS / tokenizer} (../shared)")
    folder = write_gqa_decoder(
        root,
        vocab_size=ids["vocab_size"],
        hidden_size=32,
        num_heads=2,
        num_kv_heads=1,
        context_length=512,
        seed=7,
        name=tokenizer,
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (TOKENIZERS / tokenizer / name).is_file():
            shutil.copy(TOKENIZERS / tokenizer / name, folder / name)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"].update(type=model_type, **ids)
    # The 0.18 builder's way: each delimiter key written when the tokenizer has its token.
    added = {
        t["content"]: t["id"]
        for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    }
    tokens = PHI3_DELIMITERS if model_type == "phi3" else DELIMITER_TOKENS
    config["model"].update({k: added[t] for k, t in tokens.items() if t in added})
    (folder / "genai_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("tokenizer", sorted(CASES))
def test_builder_style_folder_runs_as_the_reference(tmp_path, tokenizer):
    folder = _builder_folder(tmp_path, tokenizer, CASES[tokenizer])
    keys = json.loads((folder / "genai_config.json").read_text())["model"]
    if tokenizer == "qwen3":
        assert {"bot_token_id", "eot_token_id", "bor_token_id", "eor_token_id"} <= set(keys)
    messages = json.dumps([{"role": "user", "content": "What is the weather in Paris?"}])
    runs = {}
    for engine in (og, genai):
        model = engine.Model(str(folder))
        tok = engine.Tokenizer(model)
        prompt = np.asarray(
            tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
        )
        # The ids the folder sets (the reference's hard-coded fallbacks for a type whose
        # tokenizer lacks the tokens, e.g. phi3 here, are a documented difference).
        delimiters = {name: getattr(tok, name) for name in DELIMITER_TOKENS if name in keys}
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + 12)
        gen = engine.Generator(model, params)
        gen.append_tokens(prompt.astype(np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        runs[engine.__name__] = (
            prompt.tolist(),
            delimiters,
            np.asarray(gen.get_sequence(0)).tolist(),
        )
    assert runs["genai"] == runs["onnxruntime_genai"]


@pytest.mark.parametrize("model_type", ["decoder", "internlm2", "hunyuandensev1", "gemma4_text"])
def test_every_llm_type_of_the_reference_loads(tmp_path, model_type):
    """The reference's LLM model types beyond the ones genai listed run a plain decoder graph
    with the reference's greedy tokens."""
    folder = write_gqa_decoder(tmp_path, name=model_type, seed=3)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["type"] = model_type
    (folder / "genai_config.json").write_text(json.dumps(config))
    prompt = np.array([3, 17, 9, 40, 5], np.int32)
    sequences = []
    for engine in (og, genai):
        model = engine.Model(str(folder))
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=16)
        gen = engine.Generator(model, params)
        gen.append_tokens(prompt)
        while not gen.is_done():
            gen.generate_next_token()
        sequences.append(np.asarray(gen.get_sequence(0)).tolist())
    assert sequences[0] == sequences[1] and len(sequences[0]) > len(prompt)
