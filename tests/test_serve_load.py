"""A bounded load test (slow): 200 streamed requests from 16 concurrent clients against the
fixture model on loopback; every stream must complete with exactly the tokens the request
gives alone (no lost, duplicated or reordered tokens)."""

from __future__ import annotations

import concurrent.futures
import json
import time

import pytest

import genai

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from genai.serve.app import ServeEngine  # noqa: E402
from genai.serve.server import BackgroundServer  # noqa: E402

pytestmark = pytest.mark.slow

REQUESTS = 200
CLIENTS = 16
EOS = 2


def _expected(model, tokenizer, prompt, max_tokens):
    ids = tokenizer.encode(prompt)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_tokens)
    gen = genai.Generator(model, params)
    gen.append_tokens(ids)
    gen.generate_until_done()
    new = [int(t) for t in gen.get_sequence(0)[len(ids) :] if int(t) != EOS]
    return tokenizer.decode(new), len(new)


def test_200_requests_from_16_clients(fixture_folders):
    model = genai.Model(fixture_folders["gqa"])
    tokenizer = genai.Tokenizer(model)
    engine = ServeEngine(model, tokenizer, max_slots=8, max_queue=REQUESTS, lanes=2)
    cases = [(f"load test prompt {i} " * (1 + i % 4), 8 + (i * 7) % 33) for i in range(25)]
    expected = {case: _expected(model, tokenizer, *case) for case in cases}
    deadline = time.monotonic() + 120

    with BackgroundServer(engine) as server, httpx.Client(timeout=60) as http:

        def one(i):
            prompt, max_tokens = cases[i % len(cases)]
            body = {
                "model": engine.model_name,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "logprobs": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            text, tokens, usage = [], 0, None
            with http.stream("POST", server.url + "/v1/completions", json=body) as reply:
                assert reply.status_code == 200, reply.read()
                for line in reply.iter_lines():
                    assert time.monotonic() < deadline, "the load test ran past its deadline"
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    assert "error" not in chunk, chunk
                    if chunk.get("usage"):
                        usage = chunk["usage"]["completion_tokens"]
                    for choice in chunk["choices"]:
                        text.append(choice["text"])
                        if choice["logprobs"]:
                            tokens += len(choice["logprobs"]["tokens"])
            return (prompt, max_tokens), "".join(text), tokens, usage

        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(one, range(REQUESTS), timeout=150))
        health = httpx.get(server.url + "/health").json()
        metrics = httpx.get(server.url + "/metrics").text

    assert len(results) == REQUESTS
    for case, text, tokens, usage in results:
        want_text, want_tokens = expected[case]
        assert text == want_text
        assert tokens == usage == want_tokens
    assert health["running"] == 0 and health["waiting"] == 0
    assert engine.scheduler.generated_tokens == sum(r[3] for r in results)
    assert f"genai_time_to_first_token_seconds_count {float(REQUESTS)}" in metrics


def test_group_with_several_choices_and_disconnects(fixture_folders):
    """Two schedulers of 3 slots under 12 clients: requests with n=3 (more sequences than a
    scheduler has slots: the other one takes the surplus) and clients that disconnect after
    the first chunk. Every finished choice has its solo tokens, nothing stays running, and
    the server keeps answering."""
    model = genai.Model(fixture_folders["gqa"])
    tokenizer = genai.Tokenizer(model)
    engine = ServeEngine(model, tokenizer, max_slots=6, max_queue=200, lanes=2)
    cases = [(f"group prompt {i} " * (1 + i % 3), 6 + (i * 5) % 19) for i in range(12)]
    expected = {case: _expected(model, tokenizer, *case)[0] for case in cases}
    deadline = time.monotonic() + 120

    with BackgroundServer(engine) as server, httpx.Client(timeout=60) as http:

        def one(i):
            prompt, max_tokens = cases[i % len(cases)]
            body = {"model": engine.model_name, "prompt": prompt, "max_tokens": max_tokens}
            body["temperature"] = 0
            if i % 5 == 4:  # a client that goes away after the first chunk
                body["stream"] = True
                with http.stream("POST", server.url + "/v1/completions", json=body) as reply:
                    assert reply.status_code == 200
                    next(line for line in reply.iter_lines() if line.startswith("data: "))
                return None
            body["n"] = 3 if i % 2 else 1
            reply = http.post(server.url + "/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert time.monotonic() < deadline, "the load test ran past its deadline"
            return (prompt, max_tokens), [c["text"] for c in reply.json()["choices"]]

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(one, range(60), timeout=150))
        stop = time.monotonic() + 10
        while engine.scheduler.running and time.monotonic() < stop:
            time.sleep(0.01)
        health = httpx.get(server.url + "/health").json()
        after = http.post(
            server.url + "/v1/completions",
            json={"model": engine.model_name, "prompt": "after", "max_tokens": 3},
        )

    answered = [r for r in results if r is not None]
    assert len(answered) == 48
    assert sum(len(texts) for _, texts in answered) == 24 * 3 + 24
    for case, texts in answered:
        assert texts == [expected[case]] * len(texts)
    assert health["running"] == 0 and health["waiting"] == 0
    assert after.status_code == 200
    assert all(m.stats["decode_steps"] > 0 for m in engine.scheduler.members)
