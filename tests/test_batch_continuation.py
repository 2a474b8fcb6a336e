"""Continuous decoding at batch > 1 (the reference refuses it): after generating, appending
tokens to every row continues each row exactly as a fresh batch-1 run of that row's tokens
(its prompt without padding, what it generated, what was appended)."""

from __future__ import annotations

import numpy as np
import pytest

import genai
from tests.parity import greedy

og = pytest.importorskip("onnxruntime_genai", reason="the reference engine is a test dependency")

BATCH = np.array([[5, 9, 12, 7, 20, 33, 41], [30, 31, 8, 0, 0, 0, 0]], np.int32)
APPENDED = np.array([[11, 13, 17], [19, 23, 29]], np.int32)


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "optimum", "gpt2"])
def test_each_row_continues_like_a_fresh_run(fixture_folders, case):
    folder = fixture_folders[case]
    model = genai.Model(folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=48, batch_size=2, kv_initial_capacity=8)
    generator = genai.Generator(model, params)
    generator.append_tokens(BATCH)
    for _ in range(5):
        generator.generate_next_token()
    generated = [generator.get_sequence(row)[BATCH.shape[1] :] for row in range(2)]
    generator.append_tokens(APPENDED)
    for _ in range(10):
        generator.generate_next_token()
    reference = og.Model(str(folder))
    for row in range(2):
        prompt = BATCH[row][: 3 if row else 7]  # without the right padding
        history = np.concatenate([prompt, generated[row], APPENDED[row]])
        fresh = greedy(og, reference, history, len(history) + 10)
        np.testing.assert_array_equal(
            generator.get_sequence(row)[-10:], fresh.sequences[0][len(history) :]
        )


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "optimum", "gpt2"])
def test_rewind_then_append_at_batch_2(fixture_folders, case):
    """rewind_to inside the generated part of a padded batch, then append: each row equals a
    fresh batch-1 run of its unpadded prompt, the generated tokens kept, and the new ones."""
    folder = fixture_folders[case]
    model = genai.Model(folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=48, batch_size=2)
    generator = genai.Generator(model, params)
    generator.append_tokens(BATCH)
    for _ in range(8):
        generator.generate_next_token()
    keep = BATCH.shape[1] + 3
    kept = [generator.get_sequence(row)[BATCH.shape[1] : keep] for row in range(2)]
    generator.rewind_to(keep)
    generator.append_tokens(APPENDED)
    for _ in range(10):
        generator.generate_next_token()
    reference = og.Model(str(folder))
    for row in range(2):
        prompt = BATCH[row][: 3 if row else 7]
        history = np.concatenate([prompt, kept[row], APPENDED[row]])
        fresh = greedy(og, reference, history, len(history) + 10)
        np.testing.assert_array_equal(
            generator.get_sequence(row)[-10:], fresh.sequences[0][len(history) :]
        )
