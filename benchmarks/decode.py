"""Decode speed: genai vs onnxruntime-genai on the same model folder, side by side.

    python benchmarks/decode.py [-m MODEL_DIR | --fixture] [--threads 1 2] [--rounds 5]
                                [--prompt-tokens 128] [--new-tokens 128] [--spinner]

Both engines run in this process with the same intra-op thread count, in interleaved rounds
(alternating which engine goes first); the table shows medians and our/reference ratios.
``--spinner`` also runs each engine beside a pure-Python thread spinning a counter and reports
how much of its own speed each side keeps.
EOS is overridden to an id the model never produces so every run makes exactly
``--new-tokens`` tokens. ``-m`` takes a folder or a cached model's name (as ``genai -m``);
without it, the reference-built SmolLM2 in ../shared when present, else genai's default model.
``--lockstep`` times single ``generate_next_token`` calls, so it creates genai's generators
with decode ahead off (``GENAI_DECODE_AHEAD=0``): with it on, a call mostly takes a token the
native worker already made while the reference's step ran. The whole-generation timings of the
table keep genai's default (decode ahead on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _bench_args import (
    DECODE_AHEAD_NOTE,
    add_model_argument,
    decode_ahead_off,
    header,
    model_folder,
    positive_int,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import genai  # noqa: E402

TEXT = (
    "The history of the city begins with a small settlement on the river, where traders from "
    "the north and the south met to exchange grain, salt, wool and stories about distant lands. "
)


def load(engine, folder: Path, threads: int):
    config = engine.Config(str(folder))
    config.overlay(
        json.dumps(
            {
                "model": {
                    "eos_token_id": [_never_token(folder)],
                    "decoder": {"session_options": {"intra_op_num_threads": threads}},
                }
            }
        )
    )
    return engine.Model(config)


def _never_token(folder: Path) -> int:
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    return vocab - 1


def prompt_ids(folder: Path, count: int) -> np.ndarray:
    tokenizer = genai.Tokenizer(genai.Config(folder))
    ids = tokenizer.encode(TEXT * 20)
    if len(ids) < count:
        ids = np.resize(ids, count)
    return np.ascontiguousarray(ids[:count], dtype=np.int32)


def one_run(
    engine, model, ids: np.ndarray, new_tokens: int, bulk: bool = False
) -> tuple[float, float]:
    """(prefill ms, decode tokens/s) for one generation; ``bulk`` uses genai's
    `Generator.generate_until_done` instead of a generate_next_token loop."""
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new_tokens)
    generator = engine.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(ids)
    generator.generate_next_token()  # the first token comes from the prefill logits
    prefilled = time.perf_counter()
    made = 1
    if bulk:
        made += generator.generate_until_done()
    while not generator.is_done():
        generator.generate_next_token()
        made += 1
    done = time.perf_counter()
    if made != new_tokens:
        raise RuntimeError(f"{engine.__name__} made {made} tokens, expected {new_tokens}")
    return 1000 * (prefilled - start), (made - 1) / (done - prefilled)


def lockstep_step_ms(engines, models, ids: np.ndarray, new_tokens: int, rounds: int) -> dict:
    """Median ms of one ``generate_next_token`` per engine, the engines' steps interleaved
    (which goes first alternates every step) over ``rounds`` generations each. genai's
    generators are created with decode ahead off: each call is then one model step in the
    caller's thread, as the reference's (with it on, a call mostly takes a token the worker
    made during the reference's step, and that worker slows the reference's steps)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        generators = {}
        for name, model in models.items():
            params = engines[name].GeneratorParams(model)
            params.set_search_options(max_length=len(ids) + new_tokens)
            with decode_ahead_off():
                generators[name] = engines[name].Generator(model, params)
            generators[name].append_tokens(ids)
            generators[name].generate_next_token()
        names = list(models)
        for step in range(new_tokens - 1):
            for name in names if step % 2 == 0 else names[::-1]:
                start = time.perf_counter()
                generators[name].generate_next_token()
                times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


class Spinner:
    """A pure-Python thread counting loop iterations, to measure GIL pressure both ways."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        stop = self._stop
        n = 0
        while not stop.is_set():
            n += 1
            if n & 0x3FF == 0:
                self.count = n
        self.count = n

    def __enter__(self) -> Spinner:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.rate = self.count / (time.perf_counter() - self._started)


def idle_spin_rate(seconds: float = 1.0) -> float:
    with Spinner() as spinner:
        time.sleep(seconds)
    return spinner.rate


def control_spin_ratio(idle: float) -> float:
    """The spinner's rate beside CPU work that never takes the GIL, relative to idle."""
    import hashlib

    data = bytes(256 * 1024 * 1024)
    with Spinner() as spinner:
        hashlib.sha256(data).digest()  # one call; hashlib releases the GIL for large inputs
    return spinner.rate / idle


def main(argv: list[str] | None = None) -> int:
    import onnxruntime_genai as og

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(parser)
    parser.add_argument("--fixture", action="store_true", help="use a tiny fixture model")
    parser.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--prompt-tokens", type=positive_int, default=128)
    parser.add_argument("--new-tokens", type=positive_int, default=128, help="at least 2")
    parser.add_argument("--spinner", action="store_true", help="also measure beside a busy thread")
    parser.add_argument(
        "--lockstep",
        action="store_true",
        help="also time single decode steps of the two engines in turn (order rotated each "
        "step): load changes hit both alike; medians of per-step times; " + DECODE_AHEAD_NOTE,
    )
    args = parser.parse_args(argv)
    if args.new_tokens < 2:
        parser.error("argument --new-tokens: at least 2 (the first token comes from the prefill)")
    header(args.threads)
    if not args.fixture:
        return run(og, args, model_folder(args.model))
    from genai.testing.models import write_gqa_decoder

    with tempfile.TemporaryDirectory(prefix="genai-bench-decode-") as tmp:
        folder = write_gqa_decoder(
            tmp, vocab_size=512, hidden_size=64, context_length=512, name="tiny"
        )
        return run(og, args, Path(folder))


def run(og, args: argparse.Namespace, folder: Path) -> int:
    ids = prompt_ids(folder, args.prompt_tokens)
    print(f"model {folder}  prompt {len(ids)} tokens  new {args.new_tokens}  rounds {args.rounds}")
    print(f"genai {genai.__version__}  onnxruntime-genai {og.__version__}")
    # The first ORT session a process creates decodes 4-9 % slower, whichever engine owns it
    # (memory in 4 KB pages reused from earlier allocations; measured: reference created first ->
    # the reference is the slow one; a throwaway session first -> both equal within 1-2 %). A
    # throwaway session, kept alive, takes that slot so neither engine is measured in it.
    first_session_sink = load(genai, folder, args.threads[0])
    for threads in args.threads:
        models = {"genai": load(genai, folder, threads), "reference": load(og, folder, threads)}
        engines = {"genai": genai, "reference": og}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
        for name in models:  # warm-up
            one_run(engines[name], models[name], ids, min(8, args.new_tokens))
        for round_index in range(args.rounds):
            order = list(models) if round_index % 2 == 0 else list(models)[::-1]  # ABBA
            for name in order:
                results[name].append(one_run(engines[name], models[name], ids, args.new_tokens))
        med = {
            name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
            for name, runs in results.items()
        }
        print(f"\nthreads={threads}")
        print(f"{'engine':<10} {'prefill ms':>11} {'decode tok/s':>13} {'ms/token':>9}")
        for name, (prefill, rate) in med.items():
            print(f"{name:<10} {prefill:>11.1f} {rate:>13.1f} {1000 / rate:>9.3f}")
        ours, ref = med["genai"], med["reference"]
        print(
            f"ratio genai/reference: decode tok/s {ours[1] / ref[1]:.3f}x, "
            f"prefill time {ours[0] / ref[0]:.3f}x, per-token time {ref[1] / ours[1]:.3f}x"
        )
        if args.lockstep:
            steps = lockstep_step_ms(engines, models, ids, args.new_tokens, args.rounds)
            print(
                f"lockstep ({args.rounds} generations each, steps interleaved, genai's decode "
                "ahead off): median step "
                f"genai {steps['genai']:.3f} ms, reference {steps['reference']:.3f} ms, "
                f"per-token time ratio {steps['genai'] / steps['reference']:.3f}x"
            )
        if args.spinner:
            idle = idle_spin_rate()
            print(
                f"control: the thread keeps {control_spin_ratio(idle):.2f} of its rate beside "
                "one long GIL-free native call (hashlib): the machine's own contention"
            )
            modes = [("reference", False), ("genai", False), ("genai", True)]
            for name, bulk in modes:
                rounds = max(1, args.rounds // 2)
                alone = statistics.median(
                    one_run(engines[name], models[name], ids, args.new_tokens, bulk)[1]
                    for _ in range(rounds)
                )
                with Spinner() as spinner:
                    beside = statistics.median(
                        one_run(engines[name], models[name], ids, args.new_tokens, bulk)[1]
                        for _ in range(rounds)
                    )
                label = f"{name} ({'generate_until_done' if bulk else 'per-token loop'})"
                print(
                    f"{label:<33} beside a spinning thread: keeps {beside / alone:.2f} of its "
                    f"decode speed; the thread keeps {spinner.rate / idle:.2f} of its rate"
                )
    del first_session_sink
    return 0


if __name__ == "__main__":
    sys.exit(main())
