"""Several schedulers over one model (`genai.serve.scheduler_group`): tokens equal a batch-1
Generator's, requests go to the least loaded scheduler, a scheduler with free slots takes
the others' surplus, and the queue limit and prefix cache are the group's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import genai

pytest.importorskip("fastapi")

from genai.generation.search import SearchOptions
from genai.serve.batch_runner import SlotBatchRunner
from genai.serve.scheduler import GenerationRequest, QueueFullError
from genai.serve.scheduler_group import SchedulerGroup
from tests.serve_helpers import EOS, alone_greedy, prompts_of, run_with, staggered_greedy


@pytest.fixture(scope="module")
def gqa_model(fixture_folders):
    return genai.Model(fixture_folders["gqa"])


def make_group(model, members=2, slots=4, **options):
    runners = [
        SlotBatchRunner(model, slots, initial_capacity=16, max_chunk=16) for _ in range(members)
    ]
    return SchedulerGroup(runners, genai.Tokenizer(model), [EOS], prefill_chunk=16, **options)


def greedy(prompt, new=16):
    return GenerationRequest(prompt, new, SearchOptions())


def test_group_gives_batch1_tokens(gqa_model):
    """Staggered requests over two schedulers (each stepping its own rows on its own
    thread): every request gets exactly its batch-1 Generator tokens, and both work."""
    rng = np.random.default_rng(11)
    prompts = prompts_of(rng, 10, gqa_model.io.vocab_size, low=12, high=40)
    expected = [[t for t in alone_greedy(gqa_model, p, 16) if t != EOS] for p in prompts]
    group = make_group(gqa_model, prefix_cache_bytes=0)
    got = staggered_greedy(group, prompts, 16)
    assert got == expected
    assert all(m.stats["decode_steps"] > 0 for m in group.members)
    stats = group.stats
    assert stats["prefill_tokens"] == sum(map(len, prompts))
    assert stats["decode_steps"] == sum(m.stats["decode_steps"] for m in group.members)
    assert group.generated_tokens == sum(map(len, expected))


def test_group_routes_to_the_least_loaded_and_steals_the_surplus(gqa_model):
    group = make_group(gqa_model, slots=2)  # not started: nothing is admitted
    prompt = np.array([5, 6, 7], np.int32)
    first, second = group.members

    async def main():
        for _ in range(4):
            group.submit([greedy(prompt)])
        assert [m.queue_depth for m in group.members] == [2, 2]  # alternating
        assert group._steal(second) is None  # both can still seat their own
        group.submit([greedy(prompt)])  # a tie: the first gets a third, one too many
        assert [m.queue_depth for m in group.members] == [3, 2]
        assert group._others_waiting(second) and not group._others_waiting(first)
        oldest = first._waiting[0]
        assert group._steal(second) is oldest
        assert [m.queue_depth for m in group.members] == [2, 2]
        # a full scheduler sends newcomers to one with a free slot
        first._active.extend([None, None])  # stand-ins: two held slots
        first._waiting.clear()
        second._waiting.popleft()
        group.submit([greedy(prompt)])
        assert [m.queue_depth for m in group.members] == [0, 2]
        first._active.clear()

    asyncio.run(main())


def test_group_queue_limit_counts_every_member(gqa_model):
    """max_queue bounds the requests waiting beyond every member's free slots (2 x 4 here):
    8 about to take a slot, 3 queued, and the next is refused."""
    group = make_group(gqa_model, max_queue=3)

    async def main():
        prompt = np.array([5, 6, 7], np.int32)
        for _ in range(8 + 3):
            group.submit([greedy(prompt)])
        with pytest.raises(QueueFullError, match="queue limit 3"):
            group.submit([greedy(prompt)])
        assert group.queue_depth == 11
        assert group.queued == 3

    asyncio.run(main())


def test_group_shares_one_prefix_cache(gqa_model):
    """A prompt prefix cached by one scheduler serves a request on the other, with the same
    tokens as without the cache."""
    rng = np.random.default_rng(12)
    common = rng.integers(3, gqa_model.io.vocab_size, size=30).astype(np.int32)
    tails = prompts_of(rng, 2, gqa_model.io.vocab_size, low=4, high=8)
    prompts = [np.concatenate([common, t]) for t in tails]
    expected = alone_greedy(gqa_model, prompts[1], 8)
    expected = expected[: expected.index(EOS)] if EOS in expected else expected
    group = make_group(gqa_model)
    assert all(m.prefix_cache is group.prefix_cache for m in group.members)
    _, second = group.members

    async def collect(handle):
        tokens = []
        async for event in handle:
            tokens.extend(event.tokens)
        return tokens

    async def main():
        # a long first request on member 0; once its prompt is in, the second one arrives
        # and goes to member 1 (member 0 holds a sequence)
        long = GenerationRequest(prompts[0], 200, SearchOptions())
        long.ignore_eos = True
        running = asyncio.ensure_future(collect(group.submit([long])))
        # the prompt's KV enters the cache just after its prefill is counted (same step)
        while not group.prefix_cache.covers(prompts[0], len(common)):
            await asyncio.sleep(0.001)
        handle = group.submit([greedy(prompts[1], 8)])
        assert second.queue_depth == 1
        tokens = await collect(handle)
        running.cancel()
        return tokens

    got = run_with(group, main)
    assert got == expected
    assert group.prefix_cache.hits >= 1
    assert second.stats["prefill_tokens"] < len(prompts[1])


def test_engine_with_two_lanes_runs_a_group_and_reports_its_load(gqa_model):
    """`ServeEngine(lanes=2)`: two schedulers with half the slots each; /metrics reads the
    queue depth and running sequences of the whole group."""
    from genai.serve.app import ServeEngine

    engine = ServeEngine(gqa_model, genai.Tokenizer(gqa_model), max_slots=5, lanes=2)
    group = engine.scheduler
    assert isinstance(group, SchedulerGroup)
    assert [m.runner.max_slots for m in group.members] == [2, 3]
    assert engine.runners == [m.runner for m in group.members]
    single = ServeEngine(gqa_model, genai.Tokenizer(gqa_model), max_slots=3, lanes=2)
    assert not isinstance(single.scheduler, SchedulerGroup)  # too few slots for two

    async def main():
        prompt = np.array([5, 6, 7], np.int32)
        for _ in range(3):
            group.submit([greedy(prompt)])
        return engine.metrics.render().decode()

    text = asyncio.run(main())  # not started: the requests wait
    assert "genai_queue_depth 3.0" in text
    assert "genai_running_requests 0.0" in text
