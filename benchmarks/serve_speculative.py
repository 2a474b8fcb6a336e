"""``genai serve --speculative ngram`` against plain serving: the scheduler (no HTTP) on a real
folder, every task's prompt submitted at once (greedy, ``--new-tokens`` at most), rounds
interleaved.

    python benchmarks/serve_speculative.py [-m MODEL_DIR] [--rounds 3] [--new-tokens 120]
                                           [--streams 1] [--spec ngram:3:4] [--threads 1]
                                           [--tasks repeat chat ...] [--max-streams 1]
                                           [--also-backoff]

For each configuration: median wall time of a round (every request finished), generated
tokens/s, the speed-up over plain serving, acceptance (accepted / proposed), tokens per verify
run, and whether each request's tokens equal plain serving's ("same"). ``--streams N`` submits
every task N times (N sequences per task at once). Default folder: the reference-built SmolLM2
in ../shared (logits per position), else genai's default model (it needs ``new_token_logits``:
a folder built before 2026-12-01 serves plainly, as the server's log says); ``-m`` also takes a
cached model's name. Before the rounds, each configuration serves one untimed round (the first
speculative run of a model sets up what its verify runs need). Backing off is opt-in
(``SpeculativeServing.backoff``, ``genai serve --speculative-backoff``): ``--also-backoff`` adds
each ``--spec`` with it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _bench_args import add_model_argument, header, model_folder, positive_int

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from speculative import TASKS  # noqa: E402

import genai  # noqa: E402
from genai.generation.search import SearchOptions  # noqa: E402
from genai.serve.batch_runner import make_batch_runner  # noqa: E402
from genai.serve.scheduler import GenerationRequest, Scheduler  # noqa: E402
from genai.serve.speculative import SpeculativeServing  # noqa: E402


def load(folder: Path, threads: int) -> genai.Model:
    config = genai.Config(str(folder))
    overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}
    config.overlay(json.dumps(overlay))
    return genai.Model(config)


def one_round(model, tokenizer, prompts, new_tokens, spec, slots):
    runner = make_batch_runner(model, slots, initial_capacity=512)
    eos = [int(e) for e in model.config.eos_token_ids]
    scheduler = Scheduler(runner, tokenizer, eos, speculative=spec, prefix_cache_bytes=0)

    async def one(ids):
        tokens: list[int] = []
        async for event in scheduler.submit([GenerationRequest(ids, new_tokens, SearchOptions())]):
            tokens.extend(event.tokens)
        return tokens

    async def main():
        return await asyncio.gather(*(one(p) for p in prompts))

    scheduler.start()
    try:
        started = time.perf_counter()
        got = asyncio.run(main())
        elapsed = time.perf_counter() - started
    finally:
        scheduler.shutdown()
    return got, elapsed, dict(scheduler.stats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--new-tokens", type=positive_int, default=120)
    parser.add_argument("--streams", type=positive_int, default=1)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--spec", action="append", default=[])
    parser.add_argument("--max-streams", type=positive_int, default=1, help="SpeculativeServing's")
    parser.add_argument(
        "--also-backoff",
        action="store_true",
        help="each --spec also with backing off (SpeculativeServing.backoff=True)",
    )
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    args = parser.parse_args()
    configs = [("plain", None)]
    for text in args.spec or ["ngram"]:
        try:
            spec = SpeculativeServing.parse(text, args.max_streams)
        except genai.errors.InvalidArgumentError as exc:
            parser.error(f"argument --spec: {exc}")
        configs.append((text, spec))
        if args.also_backoff:
            configs.append((f"{text} backoff", dataclasses.replace(spec, backoff=True)))
    header(args.threads)
    folder = model_folder(args.model)
    model = load(folder, args.threads)
    tokenizer = genai.Tokenizer(model)
    prompts = []
    for task in (TASKS[name] for name in args.tasks):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": task}], add_generation_prompt=True
        )
        prompts += [np.asarray(tokenizer.encode(text), np.int32)] * args.streams
    slots = max(2, len(prompts))
    times: dict[str, list[float]] = {label: [] for label, _ in configs}
    outputs: dict[str, list[list[int]]] = {}
    stats: dict[str, dict[str, float]] = {}
    for _label, spec in configs:  # untimed: the first speculative run sets up verify runs
        one_round(model, tokenizer, prompts, args.new_tokens, spec, slots)
    for _ in range(args.rounds):
        for label, spec in configs:
            got, elapsed, stat = one_round(model, tokenizer, prompts, args.new_tokens, spec, slots)
            times[label].append(elapsed)
            outputs[label], stats[label] = got, stat
    print(f"{folder} ({len(prompts)} requests at once, {args.threads} thread(s)):")
    print(
        f"{'config':<14} {'s/round':>8} {'tok/s':>7} {'speed-up':>8} {'accept':>7} "
        f"{'tok/run':>7} same"
    )
    base = statistics.median(times["plain"])
    for label, _ in configs:
        median = statistics.median(times[label])
        tokens = sum(len(t) for t in outputs[label])
        s = stats[label]
        proposed = s["speculative_proposed_tokens"]
        accept = s["speculative_accepted_tokens"] / proposed if proposed else 0.0
        runs = s["speculative_target_runs"]
        per_run = s["speculative_emitted_tokens"] / runs if runs else 0.0
        same = sum(a == b for a, b in zip(outputs[label], outputs["plain"], strict=True))
        print(
            f"{label:<14} {median:8.2f} {tokens / median:7.1f} {base / median:7.2f}x "
            f"{accept:7.2f} {per_run:7.2f} {same}/{len(prompts)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
