"""Helpers of the serving tests: the fixture models' EOS id, a batch-1 Generator's greedy
tokens (the reference every serving path is compared with) and random prompts."""

from __future__ import annotations

import numpy as np

import genai

EOS = 2


def alone_greedy(model, prompt, new_tokens):
    """Greedy tokens of a batch-1 Generator (EOS ends the list, included)."""
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens)
    gen = genai.Generator(model, params)
    gen.append_tokens(np.asarray(prompt, np.int32))
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def prompts_of(rng, count, vocab, low=3, high=40):
    return [
        rng.integers(3, vocab, size=int(rng.integers(low, high))).astype(np.int32)
        for _ in range(count)
    ]
