"""``genai serve --single-row-steps`` (``ServeEngine(single_row_steps=True)``): a lone decoding
sequence runs one-row decode steps, so its tokens are a batch-1 Generator's, bit for bit, on an
int4 folder too; by default a step runs at least two rows (an idle slot fills in)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra is a test dependency")
pytest.importorskip("httpx", reason="the serve extra is a test dependency")

import httpx

import genai
from genai.serve.app import ServeEngine
from tests.serve_helpers import alone_greedy, serve_command, staggered_greedy


def _lone(folder, new_tokens: int, **options) -> tuple[list[int], dict, list[int]]:
    model = genai.Model(folder)
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=4, lanes=1, **options)
    prompt = np.random.default_rng(4).integers(3, 60, 30).astype(np.int32)
    (tokens,) = staggered_greedy(engine.scheduler, [prompt], new_tokens)
    return tokens, dict(engine.scheduler.stats), alone_greedy(model, prompt, 30 + new_tokens)


@pytest.mark.parametrize("single", [False, True])
def test_rows_per_decode_step(fixture_folders, single: bool) -> None:
    tokens, stats, alone = _lone(fixture_folders["gqa"], 12, single_row_steps=single)
    assert stats["decode_steps"] > 0
    assert stats["decode_rows"] == stats["decode_steps"] * (1 if single else 2)
    assert tokens == alone[: len(tokens)]


def test_lone_stream_is_the_generators_on_int4(reference_built_smollm2_path) -> None:
    """On the real SmolLM2 int4 folder, whose one-row and several-row kernels round apart, a
    lone request served with one-row steps makes the Generator's tokens."""
    model = genai.Model(reference_built_smollm2_path)
    engine = ServeEngine(model, genai.Tokenizer(model), max_slots=4, lanes=1, single_row_steps=True)
    prompt = np.random.default_rng(5).integers(100, 40000, 40).astype(np.int32)
    (tokens,) = staggered_greedy(engine.scheduler, [prompt], 24)
    assert engine.scheduler.stats["decode_rows"] == engine.scheduler.stats["decode_steps"]
    assert tokens == alone_greedy(model, prompt, 40 + 24)[: len(tokens)]


def test_cli_flag(fixture_folders) -> None:
    body = {"prompt": [5, 6, 7, 8, 9], "max_tokens": 6, "temperature": 0}
    with serve_command(fixture_folders["gqa"], "--single-row-steps", "--lanes", "1") as (url, _):
        reply = httpx.post(url + "/v1/completions", json=body, timeout=60)
        metrics = httpx.get(url + "/metrics").text
    assert reply.status_code == 200
    values = {
        line.split()[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith(("genai_decode_steps_total", "genai_decode_rows_total"))
    }
    assert values["genai_decode_steps_total"] > 0
    assert values['genai_decode_rows_total{kind="filler"}'] == 0


def test_ray_replicas_take_the_flag() -> None:
    pytest.importorskip("ray.serve")
    from genai.serve.ray_serve import build_app

    app = build_app({"model": "/m", "single_row_steps": "true"})
    assert app._bound_deployment.init_args[1] == {"single_row_steps": True}
