"""Helpers of the serving tests: the fixture models' EOS id, a batch-1 Generator's greedy
tokens (the reference every serving path is compared with) and random prompts."""

from __future__ import annotations

import asyncio

import numpy as np

import genai
from genai.generation.search import SearchOptions
from genai.serve.scheduler import GenerationRequest

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


def run_with(scheduler, main):
    """Start ``scheduler`` (a Scheduler or SchedulerGroup), run the coroutine ``main()`` to
    its end, shut the scheduler down; ``main``'s result."""
    scheduler.start()
    try:
        return asyncio.run(main())
    finally:
        scheduler.shutdown()


def staggered_greedy(scheduler, prompts, new_tokens, gap=0.004):
    """Greedy requests for ``prompts``, the i-th submitted ``i * gap`` s after the start (so
    later ones join running steps): each request's generated tokens."""

    async def one(i):
        await asyncio.sleep(gap * i)
        request = GenerationRequest(prompts[i], new_tokens, SearchOptions())
        tokens = []
        async for event in scheduler.submit([request]):
            tokens.extend(event.tokens)
        return tokens

    async def main():
        return await asyncio.gather(*(one(i) for i in range(len(prompts))))

    return run_with(scheduler, main)
