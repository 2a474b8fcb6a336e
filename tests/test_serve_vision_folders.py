"""Vision-language folders served: their decoders take ``inputs_embeds`` (the embedding graph
merges image features), so the scheduler must run them through their driver, not the slot
runner that binds ``input_ids`` to the decoder. Text requests give the reference's greedy
tokens on the same folder."""

from __future__ import annotations

import numpy as np
import pytest

import genai
from genai.serve.batch_runner import GeneratorBatchRunner, make_batch_runner
from genai.serve.scheduler import Scheduler
from genai.testing.vision import write_gemma3, write_phi3v
from tests.parity import greedy
from tests.serve_helpers import staggered_greedy

og = pytest.importorskip("onnxruntime_genai")

NEW_TOKENS = 6


@pytest.mark.parametrize("write", [write_phi3v, write_gemma3], ids=["phi3v", "gemma3"])
def test_text_requests_on_a_vision_folder_give_the_reference_tokens(tmp_path, write):
    folder = write(tmp_path / "model")
    model = genai.Model(str(folder))
    runner = make_batch_runner(model, 2)
    assert isinstance(runner, GeneratorBatchRunner)
    tokenizer = genai.Tokenizer(model)
    eos = [int(t) for t in np.atleast_1d(model.config.get("model.eos_token_id"))]
    prompts = [
        np.asarray(tokenizer.encode(text), np.int32)
        for text in ("describe the picture", "hello there")
    ]
    scheduler = Scheduler(runner, tokenizer, eos, prefix_cache_bytes=0)
    served = staggered_greedy(scheduler, prompts, NEW_TOKENS)
    reference = og.Model(str(folder))
    for prompt, tokens in zip(prompts, served, strict=True):
        run = greedy(og, reference, prompt, len(prompt) + NEW_TOKENS)
        expected = [int(t) for t in run.sequences[0][len(prompt) :]]
        assert tokens[: len(expected)] == expected
        assert len(tokens) == len(expected)


def test_a_server_taking_images_reads_bodies_up_to_32_mib(tmp_path):
    """A text model's server refuses bodies over 4 MiB (tests/test_serve_hardening.py); one
    that takes images reads up to 32 MiB by default, enough for a few photos as data URLs."""
    import httpx  # lazy: the serve extra's client

    from genai.serve.app import MEDIA_MAX_BODY_BYTES, ServeEngine
    from genai.serve.server import BackgroundServer

    model = genai.Model(str(write_phi3v(tmp_path / "model")))
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=2)
    assert engine.accepts_images
    padding = "x" * (6 << 20)  # over the text default, under the media one
    with BackgroundServer(engine) as server:
        read = httpx.post(
            server.url + "/v1/completions",
            json={"prompt": "hi", "max_tokens": 2, "user": padding},
            timeout=60,
        )
        assert read.status_code == 200, read.text
        over = httpx.post(
            server.url + "/v1/completions",
            content=b"{" + b" " * MEDIA_MAX_BODY_BYTES + b"}",
            headers={"content-type": "application/json"},
            timeout=60,
        )
        assert over.status_code == 413
        assert str(32 << 20) in over.json()["error"]["message"]
