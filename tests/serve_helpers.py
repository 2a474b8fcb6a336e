"""Helpers of the serving tests: the fixture models' EOS id, a batch-1 Generator's greedy
tokens (the reference every serving path is compared with) and random prompts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

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


@contextlib.contextmanager
def held_app(engine) -> Iterator[str]:
    """The app of ``engine`` served on loopback without starting its scheduler (requests wait
    where `submit` puts them); yields the base URL, and shuts the engine down afterwards."""
    import uvicorn  # lazy: uvicorn is the optional serve extra

    from genai.serve.app import create_app  # lazy: fastapi is the optional serve extra
    from genai.serve.server import free_port

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(engine, manage_engine=False),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        engine.shutdown()


@contextlib.contextmanager
def serve_command(folder, *options: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m genai serve -m FOLDER OPTIONS...` on a free loopback port, waited for until
    /health answers; yields (base URL, process) and stops it with SIGTERM afterwards (uvicorn
    drains, then exits 0 or by the signal)."""
    import httpx  # lazy: the serve test extra

    from genai.serve.server import free_port

    port = free_port()
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "genai", "serve", "-m", str(folder), "--port", str(port)]
    command += ["--log-level", "warning", *options]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/health", timeout=2)
                break
            except httpx.HTTPError:
                assert process.poll() is None, process.stderr.read()
                assert time.monotonic() < deadline, "genai serve did not start"
                time.sleep(0.1)
        yield url, process
    finally:
        if process.poll() is None:  # (a test may have stopped it itself)
            process.terminate()
            assert process.wait(30) in (0, -15)
