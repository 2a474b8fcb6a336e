"""The Engine and guided generators against what threads and signals do to them: Ctrl-C during
`Engine.run` (caught, then run again, as after interrupting a notebook cell), work still going
in a non-daemon thread after the main thread returned, and the owner-thread rule of
`TurnOptions`. The scripts run in their own interpreter (a SIGINT to the test process would
reach pytest)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import genai

ROOT = Path(__file__).resolve().parents[1]

_CTRL_C = r"""
import os, random, signal, sys, threading, time
import numpy as np
import genai

# Python's own Ctrl-C handler, whatever was inherited (a background job starts with SIGINT
# ignored, and Python then installs none)
signal.signal(signal.SIGINT, signal.default_int_handler)
config = genai.Config(sys.argv[1])
config.overlay({"model": {"decoder": {"session_options": {"intra_op_num_threads": 1}}}})
model = genai.Model(config)
tokenizer = genai.Tokenizer(model)
engine = genai.Engine(model)
random.seed(int(sys.argv[2]))
QUESTIONS = ["What is the capital of France?", "Name three colors.", "Why is the sky blue?"]


def batch():
    requests = []
    for question in QUESTIONS:
        request = engine.create_request()
        options = genai.TurnOptions(request)
        options.set_max_generated_tokens(20)
        prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        request.begin_turn(np.asarray(tokenizer.encode(prompt), np.int32), options)
        requests.append(request)
    return requests


def tokens(interrupt):
    requests, got = batch(), {}
    buffer = engine.create_event_buffer(2)
    timer = threading.Timer(random.uniform(0.0, 0.3), os.kill, (os.getpid(), signal.SIGINT))
    if interrupt:
        timer.start()
    interrupted = False
    while True:
        try:
            if not engine.has_pending_requests():
                break
            for event in engine.run(buffer):
                if event.flags & genai.EngineEventFlags.TOKEN:
                    got.setdefault(id(event.request), []).append(event.token)
        except KeyboardInterrupt:
            interrupted = True
    timer.cancel()
    if interrupt:  # an interrupt that comes after the last run lands here
        try:
            timer.join()
            time.sleep(0.05)
        except KeyboardInterrupt:
            pass
    for request in requests:
        request.close()
    return [got.get(id(r), []) for r in requests], interrupted


plain, _ = tokens(False)
caught = 0
for _ in range(12):
    seen, interrupted = tokens(True)
    caught += interrupted
    assert seen == plain, (seen, plain)
print("ok", caught)
"""


@pytest.mark.parametrize("lanes", ["1", "2"])
def test_ctrl_c_during_engine_run_leaves_it_working(smollm2_path, lanes) -> None:
    """A Ctrl-C at a random moment of a run is raised once the operation ends; the requests
    then finish with the tokens of an uninterrupted run (a step cut half way left requests
    that never finished: the next run waited for ever)."""
    env = dict(os.environ, GENAI_SERVE_LANES=lanes, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", _CTRL_C, str(smollm2_path), lanes],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    status, caught = result.stdout.split()
    assert status == "ok" and int(caught) >= 1  # some interrupts landed inside the runs


_AFTER_MAIN = r"""
import json, sys, threading
import numpy as np
import genai

model = genai.Model(sys.argv[1])
tokenizer = genai.Tokenizer(model)


def engine_turn():
    engine = genai.Engine(model)
    request = engine.create_request()
    options = genai.TurnOptions(request)
    options.set_max_generated_tokens(12)
    request.begin_turn(np.asarray([1, 504, 3575, 28], np.int32), options)
    buffer, count = engine.create_event_buffer(4), 0
    while engine.has_pending_requests():
        count += sum(1 for e in engine.run(buffer) if e.flags & genai.EngineEventFlags.TOKEN)
    print("engine", count, flush=True)


def guided():
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=40)
    params.set_guidance("regex", "[a-z ]{3,20}")
    generator = genai.Generator(model, params)
    generator.append_tokens(np.asarray([1, 504, 3575, 28], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    print("guided", len(generator.get_sequence(0)) > 4, flush=True)


started = threading.Event()


def later():
    started.wait()
    import time; time.sleep(0.5)  # the main thread has returned by then
    engine_turn()
    guided()


threading.Thread(target=later).start()  # not a daemon: the interpreter waits for it
started.set()
"""


def test_work_in_a_thread_that_outlives_the_main_thread(smollm2_path) -> None:
    """After the main thread returns, Python's thread pools take no new work: the Engine's
    lane steps, the scheduler's prefill and guidance's mask computations then run on the
    calling thread (they raised "cannot schedule new futures after interpreter shutdown")."""
    env = dict(os.environ, GENAI_SERVE_LANES="2", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", _AFTER_MAIN, str(smollm2_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["engine 12", "guided True"], result.stderr


def test_turn_options_belong_to_the_engines_owner_thread(fixture_folders) -> None:
    """As the reference: every TurnOptions setter raises the owner-thread error on another
    thread (genai checked only the constructor)."""
    engine = genai.Engine(genai.Model(str(fixture_folders["gqa"])))
    options = genai.TurnOptions(engine.create_request())
    calls = {
        "set_max_generated_tokens": (5,),
        "set_temperature": (0.5,),
        "set_seed": (3,),
        "set_stop_strings": (["x"],),
        "reset": (),
    }
    errors: dict[str, str] = {}

    def other_thread() -> None:
        for name, args in calls.items():
            try:
                getattr(options, name)(*args)
            except RuntimeError as exc:
                errors[name] = str(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert set(errors) == set(calls)
    assert all("owner thread" in message for message in errors.values())
    options.set_max_generated_tokens(np.int64(5))  # the owner may
