"""genai serve --speculative: prompt-lookup proposals verified in one run per sequence inside the
continuous-batching scheduler. On fp32 fixture folders the served tokens equal a batch-1
Generator's (greedy) and plain serving's (greedy and seeded sampling); sampled tokens follow
the Markov chain's exact marginals (chi-square); a folder that cannot verify serves plainly."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

import numpy as np
import pytest

import genai

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
scipy_stats = pytest.importorskip("scipy.stats")

from genai.builder.build import build  # noqa: E402
from genai.builder.testing import (  # noqa: E402
    ARCH_CONFIGS,
    numpy_forward,
    random_weights,
    write_hf_checkpoint,
)
from genai.errors import InvalidArgumentError, ModelError  # noqa: E402
from genai.generation.search import SearchOptions  # noqa: E402
from genai.runtime.verify_rows import exact_rows  # noqa: E402
from genai.serve.app import ServeEngine  # noqa: E402
from genai.serve.batch_runner import (  # noqa: E402
    GeneratorBatchRunner,
    SlotBatchRunner,
    make_batch_runner,
)
from genai.serve.scheduler import GenerationRequest, Scheduler  # noqa: E402
from genai.serve.server import BackgroundServer  # noqa: E402
from genai.serve.speculative import SpeculativeServing  # noqa: E402
from genai.testing.models import write_gqa_decoder  # noqa: E402
from genai.testing.speculative import (  # noqa: E402
    markov_distribution,
    transition_table,
    write_table_decoder,
)
from tests.serve_helpers import alone_greedy, run_with, serve_command  # noqa: E402

#: Speculating however many sequences decode (the default, 1, is a speed policy; exactness must
#: hold with any number speculating at once).
NGRAM = SpeculativeServing(ngram_size=2, max_draft_tokens=4, max_streams=16)


class _Stream:
    def decode(self, token: int) -> str:
        return f"<{token}>"

    def flush(self) -> str:
        return ""


class _Tokens:
    """A tokenizer stand-in for scheduler-level tests (text is not looked at)."""

    def create_stream(self) -> _Stream:
        return _Stream()


@pytest.fixture(scope="module")
def gqa_model(fixture_folders):
    return genai.Model(fixture_folders["gqa"])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An fp32 folder of genai's builder: last-position ``logits`` plus ``new_token_logits``."""
    root = tmp_path_factory.mktemp("built")
    cfg = ARCH_CONFIGS["llama"]
    weights = random_weights(cfg)
    folder = build(write_hf_checkpoint(root / "hf", cfg, weights), root / "out", precision="fp32")
    return folder, cfg, weights


def _looping_prompts(vocab: int, count: int, seed: int) -> list[np.ndarray]:
    """Prompts that repeat a short phrase (prompt lookup proposes from them at once)."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(count):
        phrase = rng.integers(3, vocab, size=int(rng.integers(3, 7))).astype(np.int32)
        prompts.append(np.concatenate([phrase, phrase, phrase[:2]]))
    return prompts


def _serve(scheduler, requests_list):
    """Submit each list of `GenerationRequest` s at once; each list's tokens per choice."""

    async def one(requests):
        got: dict[int, list[int]] = {r.index: [] for r in requests}
        async for event in scheduler.submit(requests):
            got[event.index].extend(event.tokens)
        return [got[r.index] for r in requests]

    async def main():
        return await asyncio.gather(*(one(r) for r in requests_list))

    return run_with(scheduler, main)


# --- the runner's verify run ----------------------------------------------------------------------
def test_verify_rows_equal_the_numpy_forward_pass(built):
    """A builder folder's verify run returns every new token's logits (new_token_logits),
    those of a NumPy forward pass of the same weights."""
    folder, cfg, weights = built
    runner = make_batch_runner(genai.Model(str(folder)), 2)
    assert isinstance(runner, SlotBatchRunner) and runner.verify_tokens == 17
    tokens = list(range(3, 23))
    runner.prefill(1, np.asarray(tokens[:9], np.int32))
    rows = runner.verify(1, np.asarray(tokens[9:14], np.int32))
    want = numpy_forward(cfg, weights, tokens[:14])
    np.testing.assert_allclose(rows, want[9:14], atol=1e-4, rtol=0)
    assert runner.lengths[1] == 14
    runner.truncate(1, 11)  # keep two of them; the next run continues from there
    rows = runner.verify(1, np.asarray(tokens[11:13], np.int32))
    np.testing.assert_allclose(rows, want[11:13], atol=1e-4, rtol=0)


def test_generator_runner_verifies_through_its_generator(tmp_path):
    """The fallback runner verifies with its slot generator's driver: the table model's rows
    are the table's rows of the fed tokens, also after a truncate."""
    table = transition_table(10)
    model = genai.Model(str(write_table_decoder(tmp_path, table)))
    runner = make_batch_runner(model, 2)
    assert isinstance(runner, GeneratorBatchRunner) and runner.verify_tokens > 4
    runner.prefill(0, np.asarray([1, 2, 3], np.int32))
    np.testing.assert_array_equal(
        runner.verify(0, np.asarray([5, 7, 4], np.int32)), table[[5, 7, 4]]
    )
    runner.truncate(0, 4)
    np.testing.assert_array_equal(runner.verify(0, np.asarray([8, 1], np.int32)), table[[8, 1]])


# --- greedy exactness through the scheduler -------------------------------------------------------
@pytest.mark.parametrize("kind", ["gqa", "built"])
def test_greedy_tokens_equal_a_batch1_generator(kind, gqa_model, built):
    """Several concurrent greedy requests (3 slots for 6: some wait, join running steps) get
    a batch-1 Generator's tokens, with proposals accepted (and on gqa rejected too)."""
    model = gqa_model if kind == "gqa" else genai.Model(str(built[0]))
    eos = [int(e) for e in model.config.eos_token_ids]
    prompts = _looping_prompts(model.io.vocab_size, 6, seed=3)
    new = 30
    expected = [[t for t in alone_greedy(model, p, new) if t not in eos] for p in prompts]
    runner = make_batch_runner(model, 3, initial_capacity=16)
    scheduler = Scheduler(runner, _Tokens(), eos, speculative=NGRAM)
    got = _serve(scheduler, [[GenerationRequest(p, new, SearchOptions())] for p in prompts])
    assert [g[0] for g in got] == expected
    stats = scheduler.stats
    assert stats["speculative_target_runs"] > 0
    assert 0 < stats["speculative_accepted_tokens"] <= stats["speculative_proposed_tokens"]
    if kind == "gqa":  # the random builder model repeats one token: every proposal holds
        assert stats["speculative_accepted_tokens"] < stats["speculative_proposed_tokens"]


def test_int4_default_model_serves_plain_servings_tokens(default_model_path):
    """On the folder our builder writes by default (int4, int8 activations), speculative
    serving's greedy tokens are plain serving's: its verify runs compute attention one row per
    call with the graph's own linears, which give a row the numbers of a served step (two rows
    or more) where this CPU's int4 kernel gives a row the same bits in any run of two or more
    (`verify_rows.exact_rows(batched=True)`; AVX-512 and AVX2 alike)."""
    model = genai.Model(str(default_model_path))
    if not exact_rows(model.session, batched=True):
        pytest.skip("this CPU's int4 kernel gives a row other bits in runs of 2 and of 5")
    eos = [int(e) for e in model.config.eos_token_ids]
    prompts = _looping_prompts(model.io.vocab_size, 4, seed=5)
    new = 24

    def served(speculative):
        runner = make_batch_runner(model, 2, initial_capacity=16)
        scheduler = Scheduler(runner, _Tokens(), eos, speculative=speculative)
        got = _serve(scheduler, [[GenerationRequest(p, new, SearchOptions())] for p in prompts])
        return [g[0] for g in got], scheduler.stats

    plain, _ = served(None)
    got, stats = served(NGRAM)
    assert stats["speculative_target_runs"] > 0
    assert got == plain


def test_a_lone_stream_of_one_row_steps_serves_a_generators_tokens(default_model_path):
    """With one-row steps (``--single-row-steps``) a lone stream in the first slot decodes in
    one-row steps, so its verify runs must give their numbers (on AVX2 CPUs genai's
    ``StepRowsMatMulNBits``; `verify_rows.exact_rows(batched=False)`), not a served step's of
    two rows: its tokens are then a batch-1 Generator's on the default int4 model."""
    model = genai.Model(str(default_model_path))
    if not exact_rows(model.session):
        pytest.skip("this CPU's int4 kernels give verify rows no one-row steps' numbers")
    eos = [int(e) for e in model.config.eos_token_ids]
    new = 24
    for prompt in _looping_prompts(model.io.vocab_size, 4, seed=5):
        expected = [t for t in alone_greedy(model, prompt, new) if t not in eos]
        runner = make_batch_runner(model, 2, initial_capacity=16)
        scheduler = Scheduler(runner, _Tokens(), eos, speculative=NGRAM, min_decode_rows=1)
        got = _serve(scheduler, [[GenerationRequest(prompt, new, SearchOptions())]])[0][0]
        assert scheduler.stats["speculative_target_runs"] > 0
        assert got == expected


def test_draft_model_proposals(gqa_model, tmp_path):
    """``draft:DIR``: the target itself as its draft proposes what it chooses (every proposal
    accepted); another model of the vocabulary proposes worse, and the tokens stay a batch-1
    Generator's either way."""
    other = genai.Model(str(write_gqa_decoder(tmp_path, name="draft", seed=7, num_layers=1)))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 64, size=9).astype(np.int32) for _ in range(3)]
    expected = [[t for t in alone_greedy(gqa_model, p, 24) if t != 2] for p in prompts]
    for draft in (gqa_model, other):
        spec = SpeculativeServing(draft=draft, max_streams=16)
        runner = make_batch_runner(gqa_model, 3, initial_capacity=16)
        scheduler = Scheduler(runner, _Tokens(), [2], speculative=spec)
        got = _serve(scheduler, [[GenerationRequest(p, 24, SearchOptions())] for p in prompts])
        assert [g[0] for g in got] == expected
        stats = scheduler.stats
        assert stats["speculative_target_runs"] > 0
        if draft is gqa_model:
            assert stats["speculative_accepted_tokens"] == stats["speculative_proposed_tokens"]
        else:
            assert stats["speculative_accepted_tokens"] < stats["speculative_proposed_tokens"]


def test_a_draft_of_another_vocabulary_is_refused(gqa_model, fixture_folders):
    draft = genai.Model(fixture_folders["gqa-wide"])  # 96 tokens, the target 64
    with pytest.raises(ModelError, match="must share the same vocabulary"):
        Scheduler(
            make_batch_runner(gqa_model, 2),
            _Tokens(),
            [2],
            speculative=SpeculativeServing(draft=draft),
        )


def test_speculation_waits_for_a_lone_stream(gqa_model):
    """The default policy (max_streams 1): no verify run while two sequences decode (the plain
    step serves both in one run); once one is left it speculates; tokens stay a Generator's."""
    runner = make_batch_runner(gqa_model, 4, initial_capacity=16)
    scheduler = Scheduler(
        runner, _Tokens(), [2], speculative=SpeculativeServing(2, 4), overlap_prefill=False
    )

    class Handle:
        cancelled = False

    prompts = _looping_prompts(gqa_model.io.vocab_size, 2, seed=12)
    news = [6, 30]
    requests = [
        GenerationRequest(p, n, SearchOptions(), index=i)
        for i, (p, n) in enumerate(zip(prompts, news, strict=True))
    ]
    scheduler.enqueue(Handle(), requests)
    got: list[list[int]] = [[], []]
    while scheduler.has_work():
        decoding = [s for s in scheduler._active if not s.prefilling and s.finished is None]
        before = scheduler.stats["speculative_target_runs"]
        for _, event in scheduler.step():
            got[event.index].extend(event.tokens)
        if len(decoding) >= 2:
            assert scheduler.stats["speculative_target_runs"] == before
    assert scheduler.stats["speculative_target_runs"] > 0
    expected = [
        [t for t in alone_greedy(gqa_model, p, n) if t != 2]
        for p, n in zip(prompts, news, strict=True)
    ]
    assert got == expected


def test_seeded_sampling_draws_what_plain_serving_draws(gqa_model):
    """One draw per emitted token from the request's own stream: a seeded request (top-k,
    penalties, n=2) gets plain serving's tokens."""
    prompts = _looping_prompts(gqa_model.io.vocab_size, 3, seed=5)
    found = []
    for spec in (None, NGRAM):
        runner = make_batch_runner(gqa_model, 4, initial_capacity=16)
        scheduler = Scheduler(runner, _Tokens(), [2], speculative=spec)
        requests = [
            [
                GenerationRequest(
                    p,
                    24,
                    SearchOptions(
                        do_sample=True,
                        temperature=0.7,
                        top_k=4,
                        repetition_penalty=1.1,
                        random_seed=11 + i,
                    ),
                    index=c,
                )
                for c in range(2)
            ]
            for i, p in enumerate(prompts)
        ]
        found.append(_serve(scheduler, requests))
        if spec is not None:
            assert scheduler.stats["speculative_accepted_tokens"] > 0
    assert found[1] == found[0]


def test_sampling_keeps_the_target_distribution(tmp_path):
    """Chi-square through the scheduler: the first three sampled tokens after a prompt the
    lookup keeps proposing from follow the Markov chain's exact marginals."""
    rng = np.random.default_rng(0)
    table = rng.normal(0.0, 1.2, (8, 8)).astype(np.float32)
    table[:, 7] = -30.0  # EOS (id 7) practically never
    model = genai.Model(str(write_table_decoder(tmp_path, table)))
    prompt = np.asarray([1, 2, 3, 1, 2, 3, 1, 2], np.int32)
    draws = 1200
    runner = make_batch_runner(model, 8)
    scheduler = Scheduler(runner, _Tokens(), [7], speculative=NGRAM, max_queue=draws)
    requests = [
        [GenerationRequest(prompt, 3, SearchOptions(do_sample=True, random_seed=seed))]
        for seed in range(draws)
    ]
    got = _serve(scheduler, requests)
    counts = np.zeros((3, 8), np.int64)
    for (tokens,) in got:
        assert len(tokens) == 3
        for step, token in enumerate(tokens):
            counts[step, token] += 1
    stats = scheduler.stats
    assert 0 < stats["speculative_accepted_tokens"] < stats["speculative_proposed_tokens"]
    for step in range(3):
        want = markov_distribution(table, int(prompt[-1]), step + 1)
        keep = want > 1e-6
        result = scipy_stats.chisquare(counts[step, keep], want[keep] / want[keep].sum() * draws)
        assert result.pvalue > 1e-3, (step, counts[step], want)


def test_a_folder_that_cannot_verify_serves_plainly(tmp_path, caplog):
    """Last-position logits only: the scheduler logs why and serves plain steps."""
    table = transition_table(10)
    model = genai.Model(str(write_table_decoder(tmp_path, table, last_token_only=True)))
    runner = make_batch_runner(model, 2)
    with caplog.at_level(logging.WARNING, logger="genai.serve"):
        scheduler = Scheduler(runner, _Tokens(), [9], speculative=NGRAM)
    assert scheduler.speculative is None
    assert "serving without speculative decoding" in caplog.text
    prompt = np.asarray([1, 2, 3, 4, 1, 2], np.int32)
    got = _serve(scheduler, [[GenerationRequest(prompt, 6, SearchOptions())]])
    assert got == [[[3, 4, 5, 6, 7, 8]]]  # the table's chain
    assert scheduler.stats["speculative_target_runs"] == 0


def test_spec_parsing():
    assert SpeculativeServing.parse("ngram") == SpeculativeServing(3, 4, 1)
    assert SpeculativeServing.parse("ngram:2:8", 3) == SpeculativeServing(2, 8, 3)
    assert SpeculativeServing.parse("draft:/a:b").draft_dir == "/a:b"
    assert SpeculativeServing.parse("ngram", backoff=True) == SpeculativeServing(backoff=True)
    assert SpeculativeServing.parse("draft:/d", 2, True).backoff
    for bad in ("draft", "ngram:1", "ngram:3:0", "ngram:a", "ngram:2:3:4"):
        with pytest.raises(InvalidArgumentError):
            SpeculativeServing.parse(bad)


# --- the HTTP API ---------------------------------------------------------------------------------
def _ask(url: str, body: dict) -> dict:
    return httpx.post(url + "/v1/completions", json=body, timeout=60).json()


def _stream_text(client, body: dict) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.completions.create(stream=True, **body):
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    return text, finish


def test_http_answers_equal_plain_serving(gqa_model):
    """Through the API, with stop strings, max_tokens, n=2 and streaming, concurrent: the
    speculative server answers what the plain one does; /metrics counts its runs."""
    prompts = _looping_prompts(gqa_model.io.vocab_size, 4, seed=8)
    bodies = []
    for i, p in enumerate(prompts):
        body = {"prompt": [int(t) for t in p], "max_tokens": 12 + 3 * i, "temperature": 0}
        bodies.append(body)
    bodies.append({**bodies[0], "n": 2, "temperature": 0.9, "seed": 4, "max_tokens": 20})
    answers = []
    for spec in (None, NGRAM):
        engine = ServeEngine(
            gqa_model, genai.Tokenizer(gqa_model), max_slots=4, lanes=1, speculative=spec
        )
        with BackgroundServer(engine) as srv:
            plain = [_ask(srv.url, b) for b in bodies[:1]]
            # a stop string from the middle of the first answer's text
            text = plain[0]["choices"][0]["text"]
            stop = text[len(text) // 2 : len(text) // 2 + 3]
            asked = [*bodies, {**bodies[0], "stop": [stop], "max_tokens": 30}]
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                replies = list(pool.map(lambda b: _ask(srv.url, b), asked))
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
            streamed = [_stream_text(client, {"model": engine.model_name, **b}) for b in asked[:2]]
            metrics = httpx.get(srv.url + "/metrics").text
        got = [
            [(c["text"], c["finish_reason"]) for c in r["choices"]] + [r["usage"]] for r in replies
        ]
        answers.append((stop, got, streamed))
        runs = [
            line
            for line in metrics.splitlines()
            if line.startswith("genai_speculative_target_runs_total")
        ]
        assert len(runs) == 1
        assert (float(runs[0].split()[-1]) > 0) == (spec is not None)
        values = {
            line.split()[0]: float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("genai_speculative_")
        }
        stats = engine.scheduler.stats
        if spec is not None:
            rate = stats["speculative_accepted_tokens"] / stats["speculative_proposed_tokens"]
            per_run = stats["speculative_emitted_tokens"] / stats["speculative_target_runs"]
            assert values["genai_speculative_acceptance_rate"] == pytest.approx(rate)
            assert values["genai_speculative_tokens_per_target_run"] == pytest.approx(per_run)
            assert (
                values["genai_speculative_accepted_tokens_total"]
                == (stats["speculative_accepted_tokens"])
            )
    assert answers[1] == answers[0]
    stop_reply = answers[0][1][-1]
    assert stop_reply[0][1] == "stop" and stop not in stop_reply[0][0]


def test_a_request_opts_out(gqa_model):
    """``"speculative": false`` takes plain steps (no verify run counted), so does a request
    for log-probabilities; a non-boolean is a 400 naming the field."""
    engine = ServeEngine(
        gqa_model, genai.Tokenizer(gqa_model), max_slots=2, lanes=1, speculative=NGRAM
    )
    prompt = [int(t) for t in _looping_prompts(gqa_model.io.vocab_size, 1, seed=9)[0]]
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
    with BackgroundServer(engine) as srv:
        off = _ask(srv.url, {**body, "speculative": False})
        assert engine.scheduler.stats["speculative_target_runs"] == 0
        with_logprobs = _ask(srv.url, {**body, "logprobs": 2})  # log-probs: plain steps
        assert engine.scheduler.stats["speculative_target_runs"] == 0
        on = _ask(srv.url, body)
        assert engine.scheduler.stats["speculative_target_runs"] > 0
        bad = httpx.post(
            srv.url + "/v1/completions", json={**body, "speculative": "no"}, timeout=60
        )
    assert on["choices"][0]["text"] == off["choices"][0]["text"]
    assert with_logprobs["choices"][0]["text"] == off["choices"][0]["text"]
    assert bad.status_code == 400 and "speculative" in bad.text


@pytest.mark.parametrize("kind", ["ngram:2", "draft", "ngram:2 backoff"])
def test_cli_serves_with_speculation(fixture_folders, kind):
    """``genai serve --speculative ngram:2`` (or ``draft:DIR``, the target's own folder; or
    with ``--speculative-backoff``) answers a batch-1 Generator's tokens and counts its verify
    runs in /metrics (and the backoff counter, 0 or more)."""
    model = genai.Model(fixture_folders["gqa"])
    prompt = [int(t) for t in _looping_prompts(model.io.vocab_size, 1, seed=10)[0]]
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0}
    expected = [t for t in alone_greedy(model, np.asarray(prompt, np.int32), 16) if t != 2]
    spec = kind.split()[0] if kind != "draft" else f"draft:{fixture_folders['gqa']}"
    extra = ["--speculative-backoff"] if kind.endswith("backoff") else []
    with serve_command(fixture_folders["gqa"], "--speculative", spec, *extra) as (url, _):
        reply = _ask(url, body)
        metrics = httpx.get(url + "/metrics").text
    assert reply["choices"][0]["text"] == genai.Tokenizer(model).decode(expected)
    runs = [m for m in metrics.splitlines() if m.startswith("genai_speculative_target_runs_total")]
    assert float(runs[0].split()[-1]) > 0
    paused = [m for m in metrics.splitlines() if m.startswith("genai_speculative_backoff_steps")]
    assert paused and float(paused[0].split()[-1]) >= 0


def test_ray_replicas_take_the_speculative_options(fixture_folders):
    """``genai serve --ray --speculative ...``: the options reach each replica's engine
    (`replica_engine_options`, what a replica passes to its ServeEngine; no cluster); a draft
    folder is loaded there."""
    pytest.importorskip("ray.serve")
    from genai.serve.ray_serve import build_app, replica_engine_options

    app = build_app({"model": "/m", "speculative": "ngram:2:3", "speculative_max_streams": "2"})
    engine_options = app._bound_deployment.init_args[1]
    assert engine_options == {"speculative": "ngram:2:3", "speculative_max_streams": 2}
    folder = str(fixture_folders["gqa"])
    options = replica_engine_options(folder, engine_options)
    assert options["speculative"] == SpeculativeServing(2, 3, 2)
    backing_off = build_app({"model": "/m", "speculative": "ngram", "speculative_backoff": "true"})
    flagged = backing_off._bound_deployment.init_args[1]
    assert flagged == {"speculative": "ngram", "speculative_backoff": True}
    spec = replica_engine_options(folder, flagged)["speculative"]
    assert spec == SpeculativeServing(backoff=True)
    engine = ServeEngine.from_path(folder, **options)
    assert engine.scheduler.speculative == SpeculativeServing(2, 3, 2)
    engine.shutdown()
    spec = replica_engine_options(folder, {"speculative": f"draft:{folder}"})["speculative"]
    assert spec.draft is not None and spec.draft.io.vocab_size == 64


# --- backing off ------------------------------------------------------------------------------

_CYCLE = 63  # the table model: token t is followed by (t + 1) % 63; 63 is EOS
#: Every token once, each followed by t + 5: the lookup proposes what the model rejects.
_WRONG = [(5 * i) % _CYCLE for i in range(_CYCLE)]
#: The cycle, then its start again: every proposal is what the model says.
_RIGHT = list(range(_CYCLE)) + list(range(10))


@pytest.fixture(scope="module")
def cycle_model(tmp_path_factory):
    folder = write_table_decoder(
        tmp_path_factory.mktemp("cycle"), transition_table(_CYCLE + 1), context_length=160
    )
    return genai.Model(str(folder))


def _serve_timed(model, monkeypatch, prompt, spec, new_tokens=40):
    """Serve ``prompt`` alone with a fake clock: a decode step takes 1 ms, a verify run
    1 ms + 0.25 ms per token beyond the first. Returns (tokens, scheduler stats)."""
    import genai.serve.scheduler as scheduler_module

    now = [0.0]
    real = scheduler_module.time
    fake = type(
        "FakeTime",
        (),
        {
            "perf_counter": staticmethod(lambda: now[0]),
            "thread_time": staticmethod(lambda: now[0]),
            "monotonic": staticmethod(real.monotonic),
        },
    )
    monkeypatch.setattr(scheduler_module, "time", fake)
    runner = make_batch_runner(model, 1, initial_capacity=128)
    decode, verify_many = runner.decode, runner.verify_many

    def timed_decode(*args, **kwargs):
        now[0] += 1e-3
        return decode(*args, **kwargs)

    def timed_verify_many(batch, alone=False):
        for _, tokens in batch:
            now[0] += (1.0 + 0.25 * (len(tokens) - 1)) * 1e-3
        return verify_many(batch, alone)

    runner.decode, runner.verify_many = timed_decode, timed_verify_many
    scheduler = Scheduler(runner, _Tokens(), [_CYCLE], speculative=spec, overlap_prefill=False)

    class Handle:
        cancelled = False

    scheduler.enqueue(Handle(), [GenerationRequest(np.asarray(prompt, np.int32), new_tokens)])
    got: list[int] = []
    while scheduler.has_work():
        for _, event in scheduler.step():
            got.extend(event.tokens)
    return got, scheduler.stats


def _cycle_after(prompt, count=40):
    return [(prompt[-1] + 1 + i) % _CYCLE for i in range(count)]


def test_verify_runs_slower_than_plain_steps_back_off(cycle_model, monkeypatch):
    """Rejected proposals: each verify run (5 tokens, 2 ms) emits one token where a plain step
    (1 ms) would; after two such rounds a plain step is measured, the third round starts a
    pause of 4 proposals, every two more rounds one of 8, 16 ... The tokens are the model's
    either way."""
    spec = SpeculativeServing(ngram_size=2, max_draft_tokens=4, backoff=True)
    tokens, stats = _serve_timed(cycle_model, monkeypatch, _WRONG, spec)
    assert tokens == _cycle_after(_WRONG)
    assert stats["speculative_accepted_tokens"] == 0
    # token 1 from the prompt; rounds 1 and 2, a measured plain step, round 3, a pause of 4,
    # rounds 4-5, 8, rounds 6-7, 16, rounds 8-9; the last step has no room to propose
    assert stats["speculative_target_runs"] == 9
    assert stats["speculative_backoff_steps"] == 4 + 8 + 16
    # without backing off every step verifies
    monkeypatch.undo()
    spec = SpeculativeServing(ngram_size=2, max_draft_tokens=4)  # the default: no backing off
    tokens, stats = _serve_timed(cycle_model, monkeypatch, _WRONG, spec)
    assert tokens == _cycle_after(_WRONG)
    assert stats["speculative_backoff_steps"] == 0
    assert stats["speculative_target_runs"] >= 35


def test_verify_runs_that_pay_never_back_off(cycle_model, monkeypatch):
    spec = SpeculativeServing(ngram_size=2, max_draft_tokens=4, backoff=True)
    tokens, stats = _serve_timed(cycle_model, monkeypatch, _RIGHT, spec)
    assert tokens == _cycle_after(_RIGHT)
    assert stats["speculative_backoff_steps"] == 0
    assert stats["speculative_accepted_tokens"] == stats["speculative_proposed_tokens"] > 20
