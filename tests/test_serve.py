"""genai serve on a tiny GQA fixture model: the batch runner against a batch-1 Generator, the
scheduler, and the HTTP API through the official openai client (fast tests)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import threading
import time

import numpy as np
import pytest

import genai

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from genai.generation.search import SearchOptions  # noqa: E402
from genai.serve.app import ServeEngine  # noqa: E402
from genai.serve.batch_runner import (  # noqa: E402
    GeneratorBatchRunner,
    SlotBatchRunner,
    make_batch_runner,
)
from genai.serve.scheduler import (  # noqa: E402
    GenerationRequest,
    QueueFullError,
    Scheduler,
)
from genai.serve.server import BackgroundServer  # noqa: E402
from tests.serve_helpers import (  # noqa: E402
    EOS,
    alone_greedy,
    held_app,
    prompts_of,
    run_with,
    serve_command,
    staggered_greedy,
)


@pytest.fixture(scope="module")
def gqa_model(fixture_folders):
    return genai.Model(fixture_folders["gqa"])


# --- batch runner -------------------------------------------------------------------------------
def test_runner_kind(gqa_model, fixture_folders):
    assert isinstance(make_batch_runner(gqa_model, 4), SlotBatchRunner)
    optimum = genai.Model(fixture_folders["optimum"])
    assert isinstance(make_batch_runner(optimum, 4), GeneratorBatchRunner)


@pytest.mark.parametrize("chunk", [4, 256])
def test_slot_runner_rows_equal_batch1_generator(gqa_model, chunk):
    """Rows of different lengths decoded together (joining at different steps, prompts fed in
    chunks) give exactly the tokens of a batch-1 Generator."""
    rng = np.random.default_rng(1)
    prompts = prompts_of(rng, 6, gqa_model.io.vocab_size)
    new = 24
    expected = [alone_greedy(gqa_model, p, new) for p in prompts]
    runner = SlotBatchRunner(gqa_model, 8, initial_capacity=8, max_chunk=chunk)
    got: list[list[int]] = [[] for _ in prompts]
    pending = [0] * len(prompts)
    joined = 0
    for step in range(2 * len(prompts) + new):
        if step % 2 == 0 and joined < len(prompts):  # a newcomer joins every other step
            runner.reset(joined)
            prompt = prompts[joined]
            for start in range(0, len(prompt), chunk):
                logits = runner.prefill(joined, prompt[start : start + chunk])
            pending[joined] = int(np.argmax(logits))
            got[joined].append(pending[joined])
            joined += 1
        rows = max(joined, 2)  # an idle slot fills a one-row step
        advance = np.zeros(rows, bool)
        for s in range(joined):
            advance[s] = len(got[s]) < new and got[s][-1] != EOS
        if not advance.any():
            continue
        tokens = np.array([pending[s] if s < joined else 0 for s in range(rows)])
        logits = runner.decode(tokens, advance)
        for s in np.flatnonzero(advance):
            pending[s] = int(np.argmax(logits[s]))
            got[s].append(pending[s])
    assert got == expected


def test_slot_runner_release_moves_last_slot(gqa_model):
    rng = np.random.default_rng(2)
    prompts = prompts_of(rng, 3, gqa_model.io.vocab_size)
    runner = SlotBatchRunner(gqa_model, 4, initial_capacity=16)
    firsts = []
    for s, p in enumerate(prompts):
        runner.reset(s)
        firsts.append(int(np.argmax(runner.prefill(s, p))))
    assert runner.release(0, 3) == 2  # slot 2 moves into slot 0
    assert list(runner.lengths[:3]) == [len(prompts[2]), len(prompts[1]), 0]
    logits = runner.decode(np.array([firsts[2], firsts[1]]))
    expected = [alone_greedy(gqa_model, prompts[i], 2)[1] for i in (2, 1)]
    assert [int(np.argmax(row)) for row in logits] == expected


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_slot_memory_grows_with_use(tmp_path):
    """Slots share a capacity, but memory is committed only for the positions they hold: a
    capacity of 65,536 positions for 8 slots maps 256 MiB and commits a few pages."""
    from genai.testing.models import write_gqa_decoder

    model = genai.Model(str(write_gqa_decoder(tmp_path, context_length=65536)))
    runner = SlotBatchRunner(model, 8, initial_capacity=256)
    prompt = np.arange(3, 43, dtype=np.int32)
    before = _rss_bytes()
    runner.ensure(65536)
    for slot in range(4):
        runner.prefill(slot, prompt)
    for _ in range(8):
        runner.decode(np.full(4, 5))
    assert runner.kv_bytes == 8 * 65536 * 512  # mapped: 2 layers x K, V x 2 heads x 16 fp32
    assert _rss_bytes() - before < 32 << 20


def test_runners_sharing_one_model_on_threads_give_batch1_tokens(gqa_model):
    """Two runners over one model (one session), each driven from its own thread at the same
    time as in a SchedulerGroup: every sequence gets a batch-1 Generator's tokens."""
    rng = np.random.default_rng(5)
    prompts = prompts_of(rng, 6, gqa_model.io.vocab_size)
    new = 12
    expected = [alone_greedy(gqa_model, p, new) for p in prompts]
    halves = [prompts[:3], prompts[3:]]
    barrier = threading.Barrier(2)

    def drive(part):
        runner = SlotBatchRunner(gqa_model, 4, initial_capacity=8)
        barrier.wait()  # both start together
        got = [[int(np.argmax(runner.prefill(s, p)))] for s, p in enumerate(part)]
        for _ in range(new - 1):
            advance = np.array([g[-1] != EOS and len(g) < new for g in got])
            if not advance.any():
                break
            logits = runner.decode(np.array([g[-1] for g in got]), advance)
            for s in np.flatnonzero(advance):
                got[s].append(int(np.argmax(logits[s])))
        return got

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first, second = pool.map(drive, halves)
    assert first + second == expected


def test_scheduler_overlapping_prefills_gives_batch1_tokens(gqa_model):
    """Requests arriving while others decode (prefills on a second thread beside decode
    steps, cut to the step's size): every request gets its batch-1 tokens."""
    rng = np.random.default_rng(6)
    prompts = prompts_of(rng, 10, gqa_model.io.vocab_size, low=12, high=40)
    expected = [[t for t in alone_greedy(gqa_model, p, 16) if t != EOS] for p in prompts]
    tokenizer = genai.Tokenizer(gqa_model)
    runner = SlotBatchRunner(gqa_model, 8, initial_capacity=16, max_chunk=16)
    scheduler = Scheduler(runner, tokenizer, [EOS], prefill_chunk=16, prefix_cache_bytes=0)
    got = staggered_greedy(scheduler, prompts, 16)
    assert got == expected
    stats = scheduler.stats
    assert stats["decode_steps"] > 0 and stats["prefill_tokens"] == sum(map(len, prompts))
    assert stats["model_seconds"] > 0


def test_overlap_chunks_follow_the_decode_step(gqa_model):
    """Beside a decode step of R rows, a small prefill backlog is fed in chunks of about
    max(4, R) tokens (never leaving a one-token chunk); a large one at least half at a
    time; without a decode step, whole prompts."""
    tokenizer = genai.Tokenizer(gqa_model)
    runner = SlotBatchRunner(gqa_model, 8, initial_capacity=16, max_chunk=64)
    scheduler = Scheduler(runner, tokenizer, [EOS], prefill_chunk=64, prefix_cache_bytes=0)
    loop = asyncio.new_event_loop()

    def plan(sizes, rows):
        scheduler._active.clear()
        for size in sizes:
            request = GenerationRequest(np.arange(3, 3 + size, dtype=np.int32), 4)
            scheduler.submit([request], loop=loop)
        while scheduler._waiting:
            scheduler._admit(scheduler._waiting.popleft())
        return [c for _, c in scheduler._plan_prefill(rows)]

    try:
        assert plan([13, 9, 5], 0) == [13, 9, 5]  # no decode step: whole prompts
        assert plan([6], 3) == [4]  # about the decode step's 3 rows, at least 4
        assert plan([13], 3) == [7]  # at least half the backlog
        assert plan([13], 7) == [7]
        assert plan([8], 7) == [6]  # 7 would leave one token
        assert plan([7], 7) == [7]
        counts = plan([30, 30, 30], 4)  # backlog 90: at least half now
        assert sum(counts) >= 45 and all(c >= 2 for c in counts)
    finally:
        loop.close()


def test_prefix_reuse_gives_same_tokens(gqa_model):
    """A prompt whose block-aligned prefix comes from the cache gives the same tokens."""
    rng = np.random.default_rng(3)
    shared = rng.integers(3, 64, size=40).astype(np.int32)
    prompts = [
        np.concatenate([shared, rng.integers(3, 64, size=k).astype(np.int32)]) for k in (5, 9)
    ]
    tokenizer = genai.Tokenizer(gqa_model)
    runner = SlotBatchRunner(gqa_model, 4, initial_capacity=16, max_chunk=16)
    scheduler = Scheduler(runner, tokenizer, [EOS], prefill_chunk=16)

    async def run(prompt):
        request = GenerationRequest(prompt, 12, SearchOptions())
        handle = scheduler.submit([request])
        tokens = []
        async for event in handle:
            tokens.extend(event.tokens)
        return tokens

    scheduler.start()
    try:
        first = asyncio.run(run(prompts[0]))
        second = asyncio.run(run(prompts[1]))
    finally:
        scheduler.shutdown()
    common = int(np.flatnonzero(prompts[0] != prompts[1][: len(prompts[0])])[0])
    assert common >= 40
    assert scheduler.prefix_cache.hits == 1
    assert scheduler.prefix_cache.reused_tokens == common
    for prompt, tokens in ((prompts[0], first), (prompts[1], second)):
        expected = alone_greedy(gqa_model, prompt, 12)
        assert tokens == [t for t in expected if t != EOS]


def test_scheduler_queue_full_and_cancel(gqa_model):
    tokenizer = genai.Tokenizer(gqa_model)
    runner = SlotBatchRunner(gqa_model, 2, initial_capacity=16)
    scheduler = Scheduler(runner, tokenizer, [EOS], max_queue=2)  # not started: nothing runs

    async def main():
        prompt = np.array([5, 6, 7], np.int32)
        # two go to the free slots, two wait beyond them: max_queue 2
        handles = [scheduler.submit([GenerationRequest(prompt, 4)]) for _ in range(4)]
        with pytest.raises(QueueFullError):
            scheduler.submit([GenerationRequest(prompt, 4)])
        handles[0].cancel()
        scheduler.start()
        reasons = []
        for handle in handles:
            async for event in handle:
                if event.finish_reason:
                    reasons.append(event.finish_reason)
        return reasons

    try:
        reasons = asyncio.run(main())
    finally:
        scheduler.shutdown()
    assert reasons[0] == "cancelled"
    assert all(r in ("length", "stop") for r in reasons[1:]) and len(reasons) == 4


# --- the HTTP API -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(gqa_model):
    engine = ServeEngine(gqa_model, genai.Tokenizer(gqa_model), max_slots=8, max_queue=64)
    with BackgroundServer(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def model_name(server):
    return server.engine.model_name


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name(server)]
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok"


def test_chat_completion(server, client):
    engine = server.engine
    messages = [{"role": "user", "content": "hello there"}]
    reply = client.chat.completions.create(
        model=model_name(server), messages=messages, max_tokens=12, temperature=0
    )
    choice = reply.choices[0]
    prompt = engine.tokenizer.encode(
        engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    )
    expected = alone_greedy(engine.model, prompt, 12)
    assert reply.usage.prompt_tokens == len(prompt)
    produced = [t for t in expected if t != EOS]
    assert reply.usage.completion_tokens == len(produced)
    assert choice.message.content == engine.tokenizer.decode(produced)
    assert choice.finish_reason == ("stop" if EOS in expected else "length")
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_repeated_prompt_reuses_cached_kv(server, client):
    kwargs = {
        "model": model_name(server),
        "messages": [{"role": "user", "content": "the same question, asked twice"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    first = client.chat.completions.create(**kwargs)
    second = client.chat.completions.create(**kwargs)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # all but the last two prompt tokens come from the cache (see the scheduler's docstring)
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 2
    assert second.choices[0].message.content == first.choices[0].message.content


def test_completion_and_token_prompt(server, client):
    engine = server.engine
    ids = engine.tokenizer.encode("abc def")
    expected = [t for t in alone_greedy(engine.model, ids, 10) if t != EOS]
    text = client.completions.create(
        model=model_name(server), prompt="abc def", max_tokens=10, temperature=0
    )
    tokens = client.completions.create(
        model=model_name(server), prompt=[int(t) for t in ids], max_tokens=10, temperature=0
    )
    assert text.choices[0].text == tokens.choices[0].text == engine.tokenizer.decode(expected)
    assert text.usage.completion_tokens == len(expected)


def test_streaming_equals_non_streaming(server, client):
    kwargs = {
        "model": model_name(server),
        "messages": [{"role": "user", "content": "stream me"}],
        "max_tokens": 20,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text == whole.choices[0].message.content
    assert finishes[-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[0].choices[0].delta.role == "assistant"


def test_completion_streaming_logprobs_count_tokens(server, client):
    stream = client.completions.create(
        model=model_name(server),
        prompt="count the tokens",
        max_tokens=15,
        temperature=0,
        logprobs=2,
        stream=True,
    )
    tokens = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs:
            tokens.extend(chunk.choices[0].logprobs.tokens)
            assert all(len(t) == 2 for t in chunk.choices[0].logprobs.top_logprobs)
    whole = client.completions.create(
        model=model_name(server), prompt="count the tokens", max_tokens=15, temperature=0
    )
    assert len(tokens) == whole.usage.completion_tokens


def test_chat_logprobs(server, client):
    reply = client.chat.completions.create(
        model=model_name(server),
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0
        assert len(item.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)


def test_stop_string(server, client):
    kwargs = {"model": model_name(server), "prompt": "stop test", "temperature": 0}
    full = client.completions.create(**kwargs, max_tokens=30).choices[0].text
    assert len(full) > 6
    stop = full[3:5]
    cut = client.completions.create(**kwargs, max_tokens=30, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(**kwargs, max_tokens=30, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.choices[0].text


def test_seed_reproducible_and_n(server, client):
    kwargs = {
        "model": model_name(server),
        "messages": [{"role": "user", "content": "random"}],
        "max_tokens": 16,
        "temperature": 1.0,
        "top_p": 0.95,
    }
    a = client.chat.completions.create(**kwargs, seed=1234)
    b = client.chat.completions.create(**kwargs, seed=1234)
    assert a.choices[0].message.content == b.choices[0].message.content
    several = client.chat.completions.create(**kwargs, seed=1234, n=3)
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert several.choices[0].message.content == a.choices[0].message.content
    texts = {c.message.content for c in several.choices}
    assert len(texts) > 1  # each choice has its own stream
    assert several.usage.completion_tokens >= 3


def test_seeds_beyond_int63_are_their_own(server, client):
    """Seeds cover int64 and uint64: 2**63 is not seed 0 (it was reduced modulo 2**63), a
    negative seed is a fixed seed (not the sampler's 'random' -1), and choice i of seed s
    draws what a request with seed s + i draws."""
    kwargs = {
        "model": model_name(server),
        "messages": [{"role": "user", "content": "random"}],
        "max_tokens": 24,
        "temperature": 1.0,
    }

    def text(seed: int, n: int = 1) -> list[str]:
        reply = client.chat.completions.create(**kwargs, seed=seed, n=n)
        return [c.message.content for c in reply.choices]

    assert text(2**63) != text(0)
    assert text(2**64 - 1) == text(2**64 - 1)
    assert text(-1) == text(-1)
    assert text(2**63, n=2)[1] == text(2**63 + 1)[0]


def test_penalties_and_logit_bias(server, client):
    kwargs = {"model": model_name(server), "prompt": "bias", "max_tokens": 8, "temperature": 0}
    plain = client.completions.create(**kwargs).choices[0].text
    engine = server.engine
    target = 7
    biased = client.completions.create(**kwargs, logit_bias={str(target): 100})
    assert biased.choices[0].text == engine.tokenizer.decode([target] * 8)
    penalised = client.completions.create(**kwargs, presence_penalty=2.0, frequency_penalty=2.0)
    assert isinstance(penalised.choices[0].text, str)
    assert plain  # the unbiased run produced text


def test_grammar_constraint_in_the_scheduler(gqa_model):
    """A regex constraint (the fixture vocabulary has no JSON punctuation; JSON schemas and
    tools are tested on SmolLM2 in test_serve_real.py) while another row runs unconstrained."""
    pytest.importorskip("llguidance")
    from genai.constraints.guidance import TokenConstraint

    tokenizer = genai.Tokenizer(gqa_model)
    runner = SlotBatchRunner(gqa_model, 4, initial_capacity=16)
    scheduler = Scheduler(runner, tokenizer, [EOS])

    def factory():
        return TokenConstraint.create(tokenizer, "regex", "(yes|no|maybe)")

    async def main():
        requests = [
            GenerationRequest(
                np.array([5, 6, 7, 8], np.int32),
                20,
                SearchOptions.from_openai(temperature=1.0, seed=s),
                constraint_factory=factory if s < 3 else None,
                index=s,
            )
            for s in range(4)
        ]
        texts = [""] * 4
        reasons = [""] * 4
        async for event in scheduler.submit(requests):
            texts[event.index] += event.text
            if event.finish_reason:
                reasons[event.index] = event.finish_reason
        return texts, reasons

    texts, reasons = run_with(scheduler, main)
    assert texts[:3] and all(t in ("yes", "no", "maybe") for t in texts[:3]), texts
    assert reasons[:3] == ["stop"] * 3
    assert reasons[3] in ("stop", "length")


def test_concurrent_greedy_requests_equal_alone(server):
    """8 simultaneous greedy requests each return exactly what the same request gives alone."""
    prompts = [f"request number {i} " * (1 + i % 3) for i in range(8)]
    url = server.url + "/v1/completions"

    def ask(prompt):
        body = {"model": model_name(server), "prompt": prompt, "max_tokens": 40, "temperature": 0}
        reply = httpx.post(url, json=body, timeout=60)
        reply.raise_for_status()
        data = reply.json()
        return data["choices"][0]["text"], data["usage"]["completion_tokens"]

    alone = [ask(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone


# --- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"999": 1}}, "logit_bias"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 7}}},
            },
            "response_format",
        ),
    ],
)
def test_malformed_requests_answer_400(server, body, param):
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}


def test_bad_json_unknown_model_and_path(server, client):
    reply = httpx.post(
        server.url + "/v1/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 400
    assert "not valid JSON" in reply.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
    assert httpx.get(server.url + "/v1/nothing").status_code == 404
    # still serving
    ok = client.completions.create(model=model_name(server), prompt="x", max_tokens=2)
    assert ok.usage.completion_tokens >= 1


def test_metrics_endpoint(server, client):
    client.completions.create(model=model_name(server), prompt="metrics", max_tokens=3)
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "genai_queue_depth",
        "genai_running_requests",
        "genai_generated_tokens_total",
        "genai_tokens_per_second",
        "genai_time_to_first_token_seconds_bucket",
        'genai_engine_seconds_total{phase="model"}',
        "genai_decode_steps_total",
        'genai_decode_rows_total{kind="advancing"}',
        "genai_prefill_tokens_total",
    ):
        assert name in text


def test_disconnect_mid_stream_frees_the_slot(server):
    engine = server.engine
    body = {
        "model": model_name(server),
        "prompt": "long",
        "max_tokens": 100,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    before = engine.scheduler.generated_tokens
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", server.url + "/v1/completions", json=body) as reply,
    ):
        lines = reply.iter_lines()
        next(line for line in lines if line.startswith("data:"))
    deadline = time.monotonic() + 10
    while engine.scheduler.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.scheduler.running == 0
    # the server keeps serving
    reply = httpx.post(
        server.url + "/v1/completions",
        json={"model": model_name(server), "prompt": "after", "max_tokens": 3},
        timeout=30,
    )
    assert reply.status_code == 200
    assert engine.scheduler.generated_tokens > before


# --- queue limits and timeouts with a held scheduler ---------------------------------------------
@pytest.fixture()
def held_server(gqa_model):
    """A server whose scheduler is not started yet: requests wait in the queue."""
    engine = ServeEngine(
        gqa_model, genai.Tokenizer(gqa_model), max_slots=2, max_queue=2, request_timeout=0.3
    )
    with held_app(engine) as url:
        yield engine, url


def test_full_queue_answers_429_and_timeouts_408(held_server):
    engine, url = held_server
    body = {"model": engine.model_name, "prompt": "queued", "max_tokens": 4}

    def post(stream=False):
        return httpx.post(url + "/v1/completions", json=dict(body, stream=stream), timeout=30)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # 2 slots are free (not started: nothing takes them) and 2 may wait beyond them
        waiting = [pool.submit(post) for _ in range(3)]
        streamed = pool.submit(post, True)
        deadline = time.monotonic() + 10
        while engine.scheduler.queue_depth < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        rejected = post()
        assert rejected.status_code == 429
        assert rejected.json()["error"]["type"] == "rate_limit_error"
        time.sleep(0.4)  # past the 0.3 s timeout while queued
        engine.start()
        replies = [f.result() for f in waiting]
    assert [r.status_code for r in replies] == [408] * 3
    assert replies[0].json()["error"]["code"] == "timeout"
    # a stream's headers are sent: its 408 comes as an event, with the same code
    (event,) = [line for line in streamed.result().text.splitlines() if line.startswith("data:")]
    error = json.loads(event.removeprefix("data: "))["error"]
    assert error["code"] == "timeout" and "ran past its timeout" in error["message"]
    engine.scheduler.request_timeout = 60
    assert post().status_code == 200


def test_api_key_guards_the_v1_endpoints(gqa_model):
    """With an API key, /v1 answers 401 (OpenAI's body, `invalid_api_key`) without the right
    bearer token and serves with it; /health and /metrics stay open."""
    engine = ServeEngine(gqa_model, genai.Tokenizer(gqa_model), max_slots=2)
    with BackgroundServer(engine, api_key="s3cret", allowed_origins=["http://app"]) as srv:
        wrong = openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as raised:
            wrong.completions.create(model="gqa", prompt="hi", max_tokens=2)
        assert raised.value.status_code == 401
        assert raised.value.body["code"] == "invalid_api_key"
        bare = httpx.get(srv.url + "/v1/models")
        assert bare.status_code == 401 and bare.json()["error"]["type"] == "invalid_request_error"
        right = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        reply = right.completions.create(model="gqa", prompt="hi", max_tokens=2)
        assert reply.usage.completion_tokens >= 1
        assert httpx.get(srv.url + "/health").status_code == 200
        assert httpx.get(srv.url + "/metrics").status_code == 200
        # a browser's CORS preflight from an allowed origin (no key: preflights carry none)
        preflight = httpx.options(
            srv.url + "/v1/chat/completions",
            headers={
                "Origin": "http://app",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://app"
        other = httpx.options(
            srv.url + "/v1/models",
            headers={"Origin": "http://evil", "Access-Control-Request-Method": "GET"},
        )
        assert "access-control-allow-origin" not in other.headers


def test_genai_serve_command(fixture_folders):
    """`genai serve` starts uvicorn on the given port and answers; SIGTERM stops it."""
    options = ("--max-slots", "4", "--api-key", "k3y")
    with serve_command(fixture_folders["gqa"], *options) as (url, _):
        assert httpx.get(url + "/health").json()["status"] == "ok"
        assert httpx.get(url + "/v1/models").status_code == 401
        auth = {"Authorization": "Bearer k3y"}
        models = httpx.get(url + "/v1/models", headers=auth).json()
        assert models["data"][0]["id"] == "gqa"


def test_fallback_runner_serves_other_layouts(fixture_folders):
    """A model without the shared-buffer GQA layout is served by the batch-1 fallback with
    the same tokens as a Generator."""
    model = genai.Model(fixture_folders["optimum"])
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=4)
    assert isinstance(engine.runner, GeneratorBatchRunner)
    prompts = ["first prompt", "second, longer prompt here", "third"]
    expected = []
    for prompt in prompts:
        ids = engine.tokenizer.encode(prompt)
        tokens = [t for t in alone_greedy(model, ids, 12) if t != EOS]
        expected.append(engine.tokenizer.decode(tokens))
    with BackgroundServer(engine) as srv:

        def ask(prompt):
            body = {"model": "", "prompt": prompt, "max_tokens": 12, "temperature": 0}
            return httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(ask, prompts))
    assert [r["choices"][0]["text"] for r in replies] == expected


def test_pipeline_model_is_served_through_generators(tmp_path):
    """A decoder split over several graphs (model.decoder.pipeline) takes the per-request
    Generator fallback and answers with a Generator's tokens."""
    from genai.testing.pipeline import write_pipeline_decoder

    model = genai.Model(str(write_pipeline_decoder(tmp_path, layer_groups=[[0], [1]])))
    assert model.pipeline is not None
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=4, lanes=1)
    assert isinstance(engine.runner, GeneratorBatchRunner)
    prompts = prompts_of(np.random.default_rng(13), 3, model.io.vocab_size, low=4, high=12)
    expected = [[t for t in alone_greedy(model, p, 10) if t != EOS] for p in prompts]
    with BackgroundServer(engine) as srv:

        def ask(prompt):
            body = {"prompt": [int(t) for t in prompt], "max_tokens": 10, "temperature": 0}
            body["logprobs"] = 0
            reply = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()
            return reply["choices"][0]["logprobs"]["tokens"]

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            got = list(pool.map(ask, prompts))
    tokenizer = engine.tokenizer
    assert got == [[tokenizer.decode([t]) for t in want] for want in expected]


def test_fallback_runner_reuses_its_generators(fixture_folders):
    """Nine requests one after another through 2 fallback slots: two generators are made
    (then rewound to 0 and reused) and every request gets a fresh Generator's tokens."""
    model = genai.Model(fixture_folders["optimum"])
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=2, lanes=1)
    assert isinstance(engine.runner, GeneratorBatchRunner)
    prompts = prompts_of(np.random.default_rng(14), 9, model.io.vocab_size, low=3, high=20)
    expected = [[t for t in alone_greedy(model, p, 8) if t != EOS] for p in prompts]

    async def main():
        out = []
        for prompt in prompts:  # one after another: slots are freed and refilled
            request = GenerationRequest(prompt, 8, SearchOptions())
            tokens = []
            async for event in engine.scheduler.submit([request]):
                tokens.extend(event.tokens)
            out.append(tokens)
        return out

    assert run_with(engine.scheduler, main) == expected
    assert engine.runner.generators_made <= 2


def test_a_request_that_fails_to_start_ends_alone(gqa_model):
    """A request whose setup fails ends with finish_reason "error"; its slot is freed and
    the request beside it completes."""
    tokenizer = genai.Tokenizer(gqa_model)
    runner = SlotBatchRunner(gqa_model, 2, initial_capacity=16)
    scheduler = Scheduler(runner, tokenizer, [EOS])

    def broken():
        raise ValueError("no grammar today")

    async def main():
        prompt = np.array([5, 6, 7, 8], np.int32)
        requests = [
            GenerationRequest(prompt, 5, constraint_factory=broken, index=0),
            GenerationRequest(prompt, 5, SearchOptions(), index=1),
        ]
        reasons = {}
        async for event in scheduler.submit(requests):
            if event.finish_reason:
                reasons[event.index] = (event.finish_reason, event.error)
        return reasons

    reasons = run_with(scheduler, main)
    assert reasons[0][0] == "error" and "no grammar today" in reasons[0][1]
    assert reasons[1][0] == "length"
    assert scheduler.running == 0


def test_runner_kind_follows_the_kv_cache(tmp_path, gqa_model, monkeypatch):
    """Slot rows are views of host buffers: a static cache the engine slides (QNN-style
    windows) takes the Generator fallback, and a cache kept inside the session is refused."""
    import genai.runtime.model as genai_model
    from genai.errors import ConfigError
    from genai.providers import CPUProvider, SessionKV
    from genai.testing.windowed import write_windowed_decoder

    windowed = genai.Model(write_windowed_decoder(tmp_path, kv_dtype="float32"))
    runner = make_batch_runner(windowed, 4)
    assert isinstance(runner, GeneratorBatchRunner)

    def stateful(name):
        provider = CPUProvider()
        provider.session_kv = SessionKV(rewind_option="kvcache_rewind")
        return provider

    monkeypatch.setattr(genai_model, "get_provider", stateful)
    with pytest.raises(ConfigError, match="enable_causallm"):
        make_batch_runner(genai.Model(gqa_model.path), 4)


def test_builder_default_folder_is_served(tmp_path):
    """A folder our builder writes with its defaults (logits of the last position only, as
    `genai pull` makes) is served with the reference engine's greedy tokens, prompts fed as one
    prefill and in chunks; /health counts no failure."""
    og = pytest.importorskip("onnxruntime_genai")
    from genai.builder import build
    from genai.builder.testing import ARCH_CONFIGS, random_weights, write_hf_checkpoint

    cfg = ARCH_CONFIGS["llama"]
    source = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    folder = build(source, tmp_path / "built")
    model = genai.Model(folder)
    assert model.session.output_shapes[model.io.logits][1] == 1  # last position only
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(3, cfg["vocab_size"], n)] for n in (1, 9, 23)]
    reference = og.Model(str(folder))
    expected = []
    for prompt in prompts:
        params = og.GeneratorParams(reference)
        params.set_search_options(max_length=len(prompt) + 6)
        gen = og.Generator(reference, params)
        gen.append_tokens(np.array(prompt, np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        expected.append([int(t) for t in gen.get_sequence(0)[len(prompt) :]])
    for chunk in (256, 4):
        engine = ServeEngine(model, genai.Tokenizer(model), max_slots=2, prefill_chunk=chunk)
        assert isinstance(engine.runner, SlotBatchRunner)
        with BackgroundServer(engine) as srv:
            for prompt, tokens in zip(prompts, expected, strict=True):
                body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
                reply = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
                assert reply.status_code == 200, reply.text
                assert reply.json()["choices"][0]["text"] == engine.tokenizer.decode(tokens)
            health = httpx.get(srv.url + "/health", timeout=10).json()
            assert health["status"] == "ok"
            assert health["failed_requests"] == 0


def test_failed_generations_show_in_health(gqa_model, monkeypatch):
    """A generation that fails in the model answers 500 and turns /health to 503 "failing"
    with the count and the error; the next success turns it back to "ok"."""
    engine = ServeEngine(gqa_model, genai.Tokenizer(gqa_model), max_slots=2, lanes=1)
    body = {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}
    with BackgroundServer(engine) as srv:
        assert httpx.get(srv.url + "/health").json()["failed_requests"] == 0
        real = engine.runner.prefill

        def broken(slot, tokens):
            raise RuntimeError("the model broke")

        monkeypatch.setattr(engine.runner, "prefill", broken)
        for stream in (False, True):
            reply = httpx.post(srv.url + "/v1/completions", json=dict(body, stream=stream))
            if stream:
                assert "the model broke" in reply.text
            else:
                assert reply.status_code == 500 and "the model broke" in reply.text
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 503
        state = health.json()
        assert state["status"] == "failing" and state["failed_requests"] == 2
        assert "the model broke" in state["last_error"]
        monkeypatch.setattr(engine.runner, "prefill", real)
        assert httpx.post(srv.url + "/v1/completions", json=body).status_code == 200
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["failed_requests"] == 2
