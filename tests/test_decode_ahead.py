"""Decode ahead (`genai.generation.decode_ahead`): the per-token loop with the worker thread gives
exactly what the plain loop gives (``GENAI_DECODE_AHEAD=0``, every step run in the caller's
thread), with every state-observing or state-changing call interleaved at random points; the
plain loop itself is checked against onnxruntime-genai by tests/test_fixture_parity.py, and here
once more for greedy tokens."""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest

import genai
from genai._core.decode_ahead import AheadWorker
from genai.errors import GenaiError
from genai.generation import decode_ahead
from tests.conftest import FIXTURE_CASES

PROMPT = np.array([[5, 9, 12, 7, 20, 33, 41]], np.int32)
BATCH = np.array([[5, 9, 12, 7, 20, 33, 41], [30, 31, 8, 0, 0, 0, 0]], np.int32)
SAMPLING = {"do_sample": True, "top_k": 20, "top_p": 0.9, "temperature": 0.7, "random_seed": 11}


def make(model, monkeypatch, ahead: bool, **options):
    monkeypatch.setenv("GENAI_DECODE_AHEAD", "1" if ahead else "0")
    params = genai.GeneratorParams(model)
    params.set_search_options(**options)
    generator = genai.Generator(model, params)
    assert (generator._ahead is not None) == ahead
    return generator


def plain_loop(generator, prompt):
    generator.append_tokens(prompt)
    tokens, logits = [], []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(generator.get_next_tokens().tolist())
    rows = prompt.shape[0]
    return tokens, [generator.get_sequence(r).tolist() for r in range(rows)], logits


@pytest.mark.parametrize("case", list(FIXTURE_CASES))
@pytest.mark.parametrize("prompt", [PROMPT, BATCH], ids=["batch1", "batch2"])
@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampling"])
def test_same_tokens_as_the_plain_loop(fixture_folders, monkeypatch, case, prompt, options):
    model = genai.Model(fixture_folders[case])
    max_length = prompt.shape[1] + 40
    rows = prompt.shape[0]
    plain = plain_loop(
        make(model, monkeypatch, False, max_length=max_length, batch_size=rows, **options), prompt
    )
    ahead_gen = make(model, monkeypatch, True, max_length=max_length, batch_size=rows, **options)
    ahead = plain_loop(ahead_gen, prompt)
    assert ahead == plain
    assert ahead_gen._ahead.produced > 0, "the worker never ran a step"
    assert len(plain[0]) == 40


def test_greedy_tokens_match_the_reference(fixture_folders, monkeypatch):
    og = pytest.importorskip(
        "onnxruntime_genai", reason="the reference engine is a test dependency"
    )
    folder = fixture_folders["gqa"]
    max_length = PROMPT.shape[1] + 40
    ours = plain_loop(make(genai.Model(folder), monkeypatch, True, max_length=max_length), PROMPT)
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT)
    theirs = []
    while not generator.is_done():
        generator.generate_next_token()
        theirs.append(generator.get_next_tokens().tolist())
    assert ours[0] == theirs
    assert ours[1][0] == generator.get_sequence(0).tolist()


def test_eos_ends_rows_as_the_plain_loop(fixture_folders, monkeypatch):
    folder = fixture_folders["gqa"]
    probe = plain_loop(
        make(genai.Model(folder), monkeypatch, False, max_length=30, batch_size=2), BATCH
    )[0]
    eos = int(probe[3][0])  # row 0 finishes at step 3, row 1 when it emits that token
    config = genai.Config(folder)
    config.overlay(f'{{"model": {{"eos_token_id": [{eos}]}}}}')
    model = genai.Model(config)
    runs = []
    for ahead in (False, True):
        generator = make(model, monkeypatch, ahead, max_length=BATCH.shape[1] + 40, batch_size=2)
        result = plain_loop(generator, BATCH)
        reasons = [generator.finish_reason(r) for r in range(2)]
        runs.append((result, reasons))
    assert runs[0] == runs[1]
    assert runs[0][1][0] is genai.FinishReason.EOS


def test_max_new_tokens_and_max_length_end_as_the_plain_loop(fixture_folders, monkeypatch):
    model = genai.Model(fixture_folders["gqa"])
    for options in ({"max_length": 20}, {"max_length": 60, "max_new_tokens": 9}):
        outcomes = []
        for ahead in (False, True):
            generator = make(model, monkeypatch, ahead, **options)
            result = plain_loop(generator, PROMPT)
            with pytest.raises(GenaiError) as error:
                generator.generate_next_token()
            outcomes.append((result, str(error.value), generator.finish_reason(0)))
        assert outcomes[0] == outcomes[1]


def _observe(value):
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    return value


def _scripted_run(generator, prompt, seed, ahead_of_caller):
    """Steps with random calls between them (fixed seed); every observation, in order.
    ``ahead_of_caller`` gets the worker's lead over the caller before each call."""
    rng = random.Random(seed)
    rows = prompt.shape[0]
    seen = []
    generator.append_tokens(prompt)
    for _ in range(60):
        if generator.is_done():
            seen.append(("done", generator.token_count()))
            if generator.token_count() > 40:
                break
            generator.rewind_to(prompt.shape[1] + rng.randrange(generator.token_count() - 7))
            continue
        generator.generate_next_token()
        seen.append(("token", generator.get_next_tokens().tolist(), generator.token_count()))
        if rng.random() < 0.6:
            continue  # a run of plain steps, so that the worker gets ahead
        fill = rng.random() < 0.7  # drawn in both runs: the same script
        worker = generator._ahead
        if worker is not None and worker.running:
            if fill:
                worker.fill()  # the most a call can find run ahead
            ahead_of_caller.append(worker.produced - worker.consumed)
        action = rng.choice(
            [
                "logits",
                "set_logits",
                "rewind",
                "append",
                "output",
                "input",
                "present",
                "sequence",
                "finish",
                "row_options",
                "runtime_option",
                "snapshot",
                "kv_bytes",
            ]
        )
        if action == "logits":
            seen.append(_observe(generator.get_logits()))
        elif action == "set_logits":
            logits = generator.get_logits()
            logits[..., rng.randrange(logits.shape[-1])] += 50.0
            generator.set_logits(logits)
        elif action == "rewind":
            generator.rewind_to(rng.randrange(prompt.shape[1], generator.token_count() + 1))
        elif action == "append" and rows == 1:
            tokens = np.array([rng.randrange(1, 40) for _ in range(rng.randrange(1, 4))], np.int32)
            if generator.token_count() + len(tokens) < 70:
                generator.append_tokens(tokens)
        elif action == "output":
            seen.append(_observe(generator.get_output("logits")))
        elif action == "input":
            name = rng.choice(["input_ids", "attention_mask"])
            seen.append(_observe(generator.get_input(name)))
        elif action == "present":
            # a shared buffer's positions past the sequence hold whatever was written there
            # last (zeros, a rewound token's, a token run ahead): unspecified, not compared
            present = generator.get_output("present.0.key")
            for row, count in enumerate(generator._loop.row_tokens().tolist()):
                seen.append(_observe(present[row, :, :count]))
        elif action == "sequence":
            seen.append([generator.get_sequence(r).tolist() for r in range(rows)])
        elif action == "finish":
            seen.append([generator.finish_reason(r) for r in range(rows)])
        elif action == "row_options" and generator.search.do_sample:
            generator.set_row_search_options(0, temperature=rng.choice([0.5, 1.0, 1.5]))
        elif action == "runtime_option":
            generator.set_runtime_option("terminate_session", "0")
        elif action == "snapshot" and rows == 1:
            snapshot = generator.snapshot()
            seen.append(_observe(snapshot.tokens))
            seen.extend(_observe(kv) for kv in snapshot.kv[:2])
        elif action == "kv_bytes":
            seen.append((generator.kv_cache_bytes, generator.kv_cache_used_bytes))
    seen.append([generator.get_sequence(r).tolist() for r in range(rows)])
    return seen


@pytest.mark.parametrize("case", ["gqa", "gqa-noshare", "optimum"])
@pytest.mark.parametrize("prompt", [PROMPT, BATCH], ids=["batch1", "batch2"])
@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampling"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interleaved_calls_see_the_plain_loop(
    fixture_folders, monkeypatch, case, prompt, options, seed
):
    model = genai.Model(fixture_folders[case])
    runs, leads = [], []
    for ahead in (False, True):
        generator = make(
            model, monkeypatch, ahead, max_length=72, batch_size=prompt.shape[0], **options
        )
        runs.append(_scripted_run(generator, prompt, seed, leads))
    plain, ahead = runs
    assert len(ahead) == len(plain)
    for index, (a, b) in enumerate(zip(ahead, plain, strict=True)):
        assert a == b, f"observation {index} differs"
    assert sum(1 for item in plain if item[0] == "token") >= 20
    assert max(leads) > 0, "the calls never met steps run ahead (nothing was rolled back)"
    assert max(leads) <= decode_ahead.RING


def test_early_stop_runs_at_most_the_ring_ahead(fixture_folders, monkeypatch):
    """A caller that stops after a few tokens leaves at most `RING` steps run ahead."""
    model = genai.Model(fixture_folders["gqa"])
    generator = make(model, monkeypatch, True, max_length=70)
    generator.append_tokens(PROMPT)
    for _ in range(5):
        generator.generate_next_token()
    worker = generator._ahead
    assert worker.running
    assert worker.produced - worker.consumed <= decode_ahead.RING
    assert generator.token_count() == PROMPT.shape[1] + 5
    dropped = worker.settle()
    assert 0 <= dropped <= decode_ahead.RING
    assert generator._loop.length == PROMPT.shape[1] + 5


def test_not_used_where_steps_need_python(fixture_folders, monkeypatch):
    model = genai.Model(fixture_folders["gqa"])
    monkeypatch.setenv("GENAI_DECODE_AHEAD", "1")
    for options in ({"num_beams": 2}, {"logprobs": True, "do_sample": True}):
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=30, **options)
        assert genai.Generator(model, params)._ahead is None


@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampling"])
def test_kv_growth_while_running_ahead(fixture_folders, monkeypatch, options):
    """A shared KV cache that starts small grows when the worker's next run does not fit (the
    step is redone in the caller's thread, which grows it): same tokens and logits."""
    model = genai.Model(fixture_folders["gqa"])
    runs = []
    for ahead in (False, True):
        generator = make(model, monkeypatch, ahead, max_length=64, kv_initial_capacity=8, **options)
        generator.append_tokens(PROMPT)
        seen = []
        while not generator.is_done():
            generator.generate_next_token()
            seen.append(int(generator.get_next_tokens()[0]))
            if len(seen) % 9 == 0:
                seen.append(_observe(generator.get_logits()))
        runs.append((seen, generator.kv_cache_bytes))
    assert runs[0] == runs[1]
    assert runs[0][1] > 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")
def test_fork_while_running_ahead(fixture_folders, monkeypatch):
    """A fork settles the worker first; parent and child both go on with the plain tokens."""
    model = genai.Model(fixture_folders["gqa"])
    expected = plain_loop(make(model, monkeypatch, False, max_length=40), PROMPT)[0]
    generator = make(model, monkeypatch, True, max_length=40)
    generator.append_tokens(PROMPT)
    head = []
    for _ in range(6):
        generator.generate_next_token()
        head.append(generator.get_next_tokens().tolist())
    generator._ahead.fill()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: finish the loop, report its tokens
        code = 1
        try:
            tail = []
            while not generator.is_done():
                generator.generate_next_token()
                tail.append(generator.get_next_tokens().tolist())
            os.write(write, json.dumps(tail).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    tail = []
    while not generator.is_done():
        generator.generate_next_token()
        tail.append(generator.get_next_tokens().tolist())
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read() or "null")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert head + tail == expected
    assert child == tail


@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampling"])
def test_real_model_same_run_as_the_plain_loop(smollm2_path, monkeypatch, options):
    """SmolLM2: tokens, a logits read and a rewind mid-run, with the worker a full ring ahead."""
    model = genai.Model(smollm2_path)
    prompt = np.array([[1, 504, 3458, 282, 4194, 314, 253]], np.int32)
    runs = []
    for ahead in (False, True):
        generator = make(model, monkeypatch, ahead, max_length=40, **options)
        generator.append_tokens(prompt)
        seen = []
        while not generator.is_done():
            generator.generate_next_token()
            seen.append(int(generator.get_next_tokens()[0]))
            if generator._ahead is not None:
                generator._ahead.fill()
            if len(seen) == 8:
                seen.append(_observe(generator.get_output("logits")))
            if len(seen) == 15:
                generator.rewind_to(generator.token_count() - 3)
        seen.append(generator.get_sequence(0).tolist())
        runs.append(seen)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("gather", [1, 2, decode_ahead.RING])
@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampling"])
def test_a_waiting_caller_takes_gather_steps_at_once(fixture_folders, monkeypatch, gather, options):
    """A caller that finds no step ready waits for `GATHER` of them: the tokens are the plain
    loop's, and at most one take in ``gather`` waits (the others find their step ready), but
    for the first one after the worker starts."""
    model = genai.Model(fixture_folders["gqa"])
    monkeypatch.setattr(decode_ahead, "GATHER", gather)
    plain = plain_loop(make(model, monkeypatch, False, max_length=60, **options), PROMPT)
    generator = make(model, monkeypatch, True, max_length=60, **options)
    assert generator._ahead.gather == gather
    assert plain_loop(generator, PROMPT) == plain
    worker = generator._ahead
    stats = worker.stats()
    assert stats["takes"] == worker.consumed > 40
    assert stats["steps"] == worker.produced
    # the first take after the worker starts waits for one step, each later wait for `gather`
    assert 1 <= stats["empty"] <= 1 + -(-(stats["takes"] - 1) // gather)
    worker.reset_stats()
    assert all(value == 0 for value in worker.stats().values())


def test_worker_rejects_a_gather_outside_the_ring(fixture_folders, monkeypatch):
    generator = make(genai.Model(fixture_folders["gqa"]), monkeypatch, False, max_length=30)
    for ring, gather in ((3, 0), (3, 4)):
        with pytest.raises(ValueError, match="gather"):
            AheadWorker(generator._loop, generator._driver.rewind, ring, gather)


@pytest.mark.parametrize("options", [{}, SAMPLING], ids=["greedy", "sampling"])
def test_dropping_a_generator_mid_run(fixture_folders, monkeypatch, options):
    """A generator dropped while its worker runs ahead: the run in flight finishes on buffers
    the worker still holds (another generator's tokens are the plain loop's), then the worker
    and those buffers go."""
    model = genai.Model(fixture_folders["gqa"])
    expected = plain_loop(make(model, monkeypatch, False, max_length=60, **options), PROMPT)
    workers = []
    for stop in (2, 5, 9, 14):
        generator = make(model, monkeypatch, True, max_length=60, **options)
        generator.append_tokens(PROMPT)
        for _ in range(stop):
            generator.generate_next_token()
        worker = generator._ahead
        workers.append(weakref.ref(worker))
        del generator
        assert not worker.running
        del worker
        again = make(model, monkeypatch, True, max_length=60, **options)
        assert plain_loop(again, PROMPT) == expected
        del again
    for _ in range(600):  # the drain threads end with the runs in flight (a liveness bound)
        gc.collect()
        if all(w() is None for w in workers):
            break
        time.sleep(0.1)
    assert [w() for w in workers] == [None] * len(workers)


def test_dropped_generator_with_a_run_in_flight_at_exit(fixture_folders, tmp_path):
    """The interpreter exits cleanly while an abandoned worker's run may be in flight."""
    script = tmp_path / "drop.py"
    script.write_text(
        "import sys\n"
        "import numpy as np\n"
        "import genai\n"
        "model = genai.Model(sys.argv[1])\n"
        "for stop in range(1, 12):\n"
        "    params = genai.GeneratorParams(model)\n"
        "    params.set_search_options(max_length=60)\n"
        "    g = genai.Generator(model, params)\n"
        "    assert g._ahead is not None\n"
        "    g.append_tokens(np.array([[5, 9, 12, 7]], np.int32))\n"
        "    for _ in range(stop):\n"
        "        g.generate_next_token()\n"
        "    del g\n"
        "params = genai.GeneratorParams(model)\n"
        "params.set_search_options(max_length=60)\n"
        "g = genai.Generator(model, params)\n"
        "g.append_tokens(np.array([[5, 9, 12, 7]], np.int32))\n"
        "for _ in range(3):\n"
        "    g.generate_next_token()\n"
        "print('ok')\n"
    )
    env = dict(os.environ, GENAI_DECODE_AHEAD="1")
    done = subprocess.run(
        [sys.executable, str(script), str(fixture_folders["gqa"])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_a_woken_waiter_never_holds_the_worker_mutex_while_it_waits_for_the_gil(
    smollm2_path, tmp_path
):
    """A thread waiting for the worker (here `fill`, as `wait_idle`, `take` and `settle` wait)
    is woken while another thread holds the GIL and then takes the worker's mutex
    (`in_flight`, as `_stop_all`'s `abandon` does at exit). The woken waiter must not hold the
    mutex while it waits for the GIL: that deadlocked both. A 10 s switch interval keeps the
    GIL with the main thread while the waiter wakes; a deadlock shows as the subprocess's
    timeout."""
    script = tmp_path / "woken.py"
    script.write_text(
        "import sys, threading, time\n"
        "import numpy as np\n"
        "import genai\n"
        "model = genai.Model(sys.argv[1])\n"
        "params = genai.GeneratorParams(model)\n"
        "params.set_search_options(max_length=64)\n"
        "g = genai.Generator(model, params)\n"
        "g.append_tokens(np.array([[5, 9, 12, 7]], np.int32))\n"
        "for _ in range(2):  # the second step starts the worker\n"
        "    g.generate_next_token()\n"
        "worker = g._ahead\n"
        "waited = []\n"
        "def fill():\n"
        "    start = time.perf_counter()\n"
        "    worker.fill()\n"
        "    waited.append(time.perf_counter() - start)\n"
        "waiter = threading.Thread(target=fill)\n"
        "waiter.start()\n"
        "time.sleep(0.002)  # the waiter takes the GIL, finds the ring not full, waits\n"
        "sys.setswitchinterval(10)\n"
        "end = time.perf_counter() + 1.0\n"
        "while time.perf_counter() < end:  # the ring fills, the waiter wakes\n"
        "    pass\n"
        "busy = worker.in_flight\n"
        "sys.setswitchinterval(0.005)\n"
        "waiter.join()\n"
        "print('ok', busy, waited[0])\n"
    )
    env = dict(os.environ, GENAI_DECODE_AHEAD="1")
    done = subprocess.run(
        [sys.executable, str(script), str(smollm2_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[:2] == ["ok", "False"]  # the ring was full: nothing in flight
    assert float(done.stdout.split()[2]) >= 0.9  # the waiter did wait for the GIL


def test_a_second_thread_is_refused_not_left_waiting(fixture_folders, monkeypatch):
    """While one thread is inside a generator's method, another thread's call raises at once
    (with decode ahead, two threads stepping one generator used to wait on each other
    forever); once the first call returns, the other thread may go on."""
    import threading

    generator = make(genai.Model(fixture_folders["gqa"]), monkeypatch, True, max_length=30)
    entered, release = threading.Event(), threading.Event()
    run = generator._driver.run

    def slow_run(*args, **kwargs):
        entered.set()
        assert release.wait(60)
        return run(*args, **kwargs)

    monkeypatch.setattr(generator._driver, "run", slow_run)
    first = threading.Thread(target=generator.append_tokens, args=(PROMPT,))
    first.start()
    assert entered.wait(60)
    for call in (generator.generate_next_token, generator.is_done, generator.get_logits):
        with pytest.raises(GenaiError, match="in use by another thread"):
            call()
    release.set()
    first.join(60)
    assert not first.is_alive()
    monkeypatch.setattr(generator._driver, "run", run)
    plain = make(genai.Model(fixture_folders["gqa"]), monkeypatch, False, max_length=30)
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(generator.get_next_tokens().tolist())
    assert tokens == plain_loop(plain, PROMPT)[0]


def test_two_threads_stepping_one_generator_end(fixture_folders, monkeypatch):
    """Two threads running the per-token loop on one generator: both end (one of them is
    told the generator is in use), neither waits forever."""
    import threading

    generator = make(genai.Model(fixture_folders["gqa"]), monkeypatch, True, max_length=128)
    generator.append_tokens(PROMPT)
    errors: list[str] = []

    def loop() -> None:
        try:
            while not generator.is_done():
                generator.generate_next_token()
                generator.get_next_tokens()
        except GenaiError as error:
            errors.append(str(error))

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a thread is still waiting"
    assert all("in use by another thread" in error for error in errors)
