"""``search.chunk_size``: the reference runs a generator's first batch-1 prompt longer than
``chunk_size`` in runs of ``chunk_size`` tokens (the first as the prompt, the others on top of
it). genai must do the same: the last run's logits output (its shape tells how the prompt
ran), the next-token logits and the greedy tokens equal the reference's with the same option;
GPT-2 (its own state in the reference) and a prompt after ``rewind_to(0)`` run whole.
"""

from __future__ import annotations

import numpy as np
import onnxruntime_genai as og
import pytest

import genai
from genai.testing.models import write_gqa_decoder

PROMPT = np.random.default_rng(1).integers(5, 60, (1, 23)).astype(np.int32)


def _run(
    module, model, ids: np.ndarray, chunk: int, steps: int = 6, again: bool = True
) -> dict[str, np.ndarray]:
    params = module.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + steps + 2, batch_size=ids.shape[0])
    if chunk:
        params.set_search_options(chunk_size=chunk)
    generator = module.Generator(model, params)
    generator.append_tokens(ids)
    out = {
        "prompt_logits": np.array(generator.get_output("logits")),
        "next_logits": np.array(generator.get_logits()),
    }
    for _ in range(steps):
        generator.generate_next_token()
    out["tokens"] = np.array([generator.get_sequence(i) for i in range(ids.shape[0])])
    if again:  # (a sliding-window cache cannot rewind to 0 once it has evicted)
        generator.rewind_to(0)
        generator.append_tokens(ids)
        out["again_logits"] = np.array(generator.get_output("logits"))
    return out


@pytest.mark.parametrize("key", ["gqa", "gqa-noshare", "optimum", "optimum-mha", "gpt2"])
@pytest.mark.parametrize("chunk", [5, 22, 23])
def test_chunked_prompt_matches_the_reference(fixture_folders, key: str, chunk: int) -> None:
    folder = fixture_folders[key]
    ours = _run(genai, genai.Model(folder), PROMPT, chunk)
    ref = _run(og, og.Model(str(folder)), PROMPT, chunk)
    # the shape says how the prompt ran: chunks of 5 leave a last run of 3 tokens, 22 of 1,
    # 23 (not longer than the prompt) one run; GPT-2 and the prompt after rewind_to(0) whole
    expected = 23 if key == "gpt2" or chunk >= 23 else 23 - (22 // chunk) * chunk
    assert ref["prompt_logits"].shape[1] == expected
    assert ours["prompt_logits"].shape == ref["prompt_logits"].shape
    np.testing.assert_allclose(ours["prompt_logits"], ref["prompt_logits"], atol=1e-5)
    np.testing.assert_allclose(ours["next_logits"], ref["next_logits"], atol=1e-5)
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    assert ref["again_logits"].shape[1] == 23
    assert ours["again_logits"].shape == ref["again_logits"].shape
    np.testing.assert_allclose(ours["again_logits"], ref["again_logits"], atol=1e-5)


def test_batch_prompt_runs_whole(fixture_folders) -> None:
    """The reference refuses a chunked batch-2 prompt ("batch_size must be 1 for continuous
    decoding"); genai runs it whole: the reference's unchunked run's logits and tokens."""
    folder = fixture_folders["gqa"]
    ids = np.random.default_rng(2).integers(5, 60, (2, 23)).astype(np.int32)
    with pytest.raises(Exception, match="batch_size must be 1"):
        _run(og, og.Model(str(folder)), ids, 5)
    ours = _run(genai, genai.Model(folder), ids, 5)
    ref = _run(og, og.Model(str(folder)), ids, 0)
    assert ours["prompt_logits"].shape == ref["prompt_logits"].shape == (2, 23, 64)
    np.testing.assert_allclose(ours["prompt_logits"], ref["prompt_logits"], atol=1e-5)
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])


def test_real_model_chunked_prompt_is_the_reference(reference_built_smollm2_path) -> None:
    """SmolLM2-135M int4 (all-position logits), a 600-token prompt in chunks of 256: the last
    run's 88 rows, the next-token logits and 12 greedy tokens are the reference's, bit for
    bit (same onnxruntime, same runs)."""
    folder = reference_built_smollm2_path
    ids = np.random.default_rng(0).integers(100, 40000, (1, 600)).astype(np.int32)
    ours = _run(genai, genai.Model(folder), ids, 256, steps=12)
    ref = _run(og, og.Model(str(folder)), ids, 256, steps=12)
    assert ours["prompt_logits"].shape == ref["prompt_logits"].shape == (1, 88, 49152)
    np.testing.assert_array_equal(ours["prompt_logits"], ref["prompt_logits"])
    np.testing.assert_array_equal(ours["next_logits"], ref["next_logits"])
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])


def test_non_positive_chunk_size_runs_whole(fixture_folders) -> None:
    """-1 is the reference's "no chunking" (its default); 0 too."""
    folder = fixture_folders["gqa"]
    ref = _run(og, og.Model(str(folder)), PROMPT, -1)
    for chunk in (-1, 0):
        ours = _run(genai, genai.Model(folder), PROMPT, chunk)
        assert ours["prompt_logits"].shape == ref["prompt_logits"].shape == (1, 23, 64)
        np.testing.assert_allclose(ours["prompt_logits"], ref["prompt_logits"], atol=1e-5)


@pytest.mark.parametrize("layout", [{}, {"cache_slack": 5}, {"window_cache": False}])
@pytest.mark.parametrize("chunk", [5, 13, 30])
def test_sliding_window_layers_chunk_as_the_reference(tmp_path, layout, chunk: int) -> None:
    """Local-window layers (window 8) beside global ones: chunks longer and shorter than the
    window keep the reference's logits and tokens."""
    folder = write_gqa_decoder(
        tmp_path, name="window", num_layers=3, sliding_window=8, local_layers=[0, 2], **layout
    )
    ids = (np.arange(40) * 7 % 50 + 4).astype(np.int32)[None]
    ours = _run(genai, genai.Model(folder), ids, chunk, steps=8, again=False)
    ref = _run(og, og.Model(str(folder)), ids, chunk, steps=8, again=False)
    assert ours["prompt_logits"].shape == ref["prompt_logits"].shape
    np.testing.assert_allclose(ours["prompt_logits"], ref["prompt_logits"], atol=1e-4)
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
