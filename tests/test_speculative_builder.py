"""genai's builder writes ``new_token_logits`` beside last-token ``logits``: every new token's
logits for a short run on top of a past (what speculative decoding verifies with), checked
against the NumPy forward pass of `genai.builder.testing`; and n-gram decoding on such a folder
gives the reference's plain greedy tokens."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import genai
from genai.builder.build import build
from genai.builder.testing import ARCH_CONFIGS, numpy_forward, random_weights, write_hf_checkpoint

pytest.importorskip("safetensors")

PROMPT = list(range(3, 23))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("built")
    cfg = ARCH_CONFIGS["llama"]
    source = write_hf_checkpoint(root / "hf", cfg, random_weights(cfg))
    return build(source, root / "out", precision="fp32"), cfg


def _run(session, ids, past, past_length):
    feeds = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, past_length + len(ids)), np.int64),
    }
    for item in session.get_inputs():
        if item.name.startswith("past"):
            empty = np.zeros((1, item.shape[1], 0, item.shape[3]), np.float32)
            feeds[item.name] = past[item.name] if past else empty
    names = [o.name for o in session.get_outputs()]
    outs = dict(zip(names, session.run(None, feeds), strict=True))
    presents = {
        n.replace("present", "past_key_values"): v for n, v in outs.items() if "present" in n
    }
    return outs["logits"], outs["new_token_logits"], presents


def test_new_token_logits_hold_every_new_token_of_a_short_run(built):
    folder, cfg = built
    session = ort.InferenceSession(str(folder / "model.onnx"))
    want = numpy_forward(cfg, random_weights(cfg), PROMPT)
    logits, new, past = _run(session, PROMPT[:7], None, 0)
    assert logits.shape[1] == new.shape[1] == 1  # a prompt: the last token only
    np.testing.assert_allclose(new[0, 0], want[6], atol=1e-4, rtol=0)
    logits, new, past = _run(session, PROMPT[7:12], past, 7)
    assert new.shape[1] == 5
    np.testing.assert_allclose(new[0], want[7:12], atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits[0, 0], want[11], atol=1e-4, rtol=0)
    logits, new, past = _run(session, PROMPT[12:13], past, 12)
    np.testing.assert_allclose(new[0, 0], want[12], atol=1e-4, rtol=0)


def test_ngram_decoding_on_a_built_folder_gives_the_references_plain_tokens(built):
    og = pytest.importorskip("onnxruntime_genai")
    folder, _ = built
    prompt = [5, 9, 12, 5, 9, 12, 5, 9]
    found = []
    for mod, spec in ((og, None), (genai, {"ngram_size": 2, "max_draft_tokens": 5})):
        model = mod.Model(str(folder))
        params = mod.GeneratorParams(model)
        params.set_search_options(max_length=48)
        if spec:
            params.set_speculative_options(**spec)
        gen = mod.Generator(model, params)
        gen.append_tokens(np.array([prompt], np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        found.append([int(t) for t in gen.get_sequence(0)])
        if spec:
            assert gen.get_speculative_stats()["rounds"] > 0
    assert found[1] == found[0]
