"""``og.Engine`` throughput: aggregate generated tokens/s of concurrent requests through
genai's Engine (the ``genai serve`` scheduler, driven in-process) and onnxruntime-genai's
Engine on the same folder, in the same run.

Each round runs both engines one after the other (order alternating between rounds: AB, BA,
...) on ``--requests`` chat requests begun together, each generating exactly
``--new-tokens`` tokens (``set_min_generated_tokens`` = ``set_max_generated_tokens``: EOS
cannot end a turn early), greedy, read with ``Engine.run`` into one event buffer. The
reference gets ``engine.static_batching.max_batch_size`` = ``--requests`` (it still runs
static batches of 4, one after the other, whatever the setting: ``--count-reference-runs``
shows its runs). The script also prints the CPU time the process used (cores busy on
average, tokens per CPU second): on a loaded machine the engines get a fraction of a core.
Every request asks a different question, tagged with its number and the
round, so no prompt is answered from genai's prefix cache. One turn per request: the
reference's static-batch Engine cannot continue several resident requests ("Continuous
decoding requires exactly one resident request"; tests/test_engine.py checks genai's
multi-turn tokens against it one conversation at a time).

For genai each round also prints what its lanes ran: model runs per generated token (decode
runs and their rows, prefill runs), the CPU time per token of the model runs against the rest
of the process, and the share of the wall time each lane spent in model runs.
``--count-reference-runs`` adds one unmeasured reference round under ONNX Runtime's profiler
for its model runs per token and their batch shapes; ``--lockstep`` adds genai with its lanes
stepped together (its Engine before they stepped at their own pace) to every round.

    python benchmarks/engine.py [--model DIR] [--requests 8] [--new-tokens 64] [--rounds 3]
                                [--lockstep] [--count-reference-runs]

``--model`` takes a folder or a cached model's name; without it, the reference-built SmolLM2 in
../shared when present, else genai's default model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
from _bench_args import add_model_argument, header, model_folder, positive_int

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity briefly.",
    "List three fruits.",
    "Who wrote Hamlet?",
    "What is 2+2?",
    "Tell me a joke about cats.",
    "Why is the sky blue?",
]


def prompts(tokenizer: Any, count: int, tag: str) -> list[np.ndarray]:
    out = []
    for i in range(count):
        question = f"({tag}-{i}) {QUESTIONS[i % len(QUESTIONS)]}"
        text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        out.append(np.asarray(tokenizer.encode(text), np.int32))
    return out


def lockstep_advance(engine: Any) -> None:
    """genai's ``Engine._advance`` before its lanes stepped at their own pace (commit
    725791d and earlier): every lane with work steps, one on the caller's thread, and ``run``
    waits for all of them (``--lockstep``)."""
    import concurrent.futures

    while not engine._events:
        busy = [s for s in engine._schedulers if s.has_work()]
        if not busy:
            return
        if len(busy) == 1:
            engine._translate(busy[0].step())
            continue
        if not hasattr(engine, "_lockstep_pool"):
            engine._lockstep_pool = concurrent.futures.ThreadPoolExecutor(
                len(engine._schedulers) - 1
            )
        others = [engine._lockstep_pool.submit(s.step) for s in busy[1:]]
        engine._translate(busy[0].step())
        for future in others:
            engine._translate(future.result())


def run_engine(
    og: Any,
    model: Any,
    tokenizer: Any,
    args: argparse.Namespace,
    tag: str,
    lockstep: bool = False,
) -> dict:
    """Time ``args.requests`` requests on a fresh ``og.Engine``; for genai's engine also what
    its schedulers ran (`lane_stats`); ``lockstep``: genai's lanes stepped together
    (`lockstep_advance`)."""
    engine = og.Engine(model)
    if lockstep:
        engine._advance = types.MethodType(lockstep_advance, engine)
    buffer = engine.create_event_buffer(256)
    requests = [engine.create_request() for _ in range(args.requests)]
    tokens = 0
    began, cpu = time.perf_counter(), os.times()
    for request, prompt in zip(requests, prompts(tokenizer, args.requests, tag), strict=True):
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(args.new_tokens)
        options.set_min_generated_tokens(args.new_tokens)
        request.begin_turn(prompt, options)
    while engine.has_pending_requests():
        engine.run(buffer)
        tokens += sum(buffer[k].token is not None for k in range(len(buffer)))
    seconds = time.perf_counter() - began
    now = os.times()
    cpu_seconds = now.user + now.system - cpu.user - cpu.system
    for request in requests:
        request.close()
    result = {
        "tok_s": tokens / seconds,
        "tokens": tokens,
        "seconds": seconds,
        "cores": cpu_seconds / seconds,
        "cpu_seconds": cpu_seconds,
        "tok_cpu_s": tokens / max(cpu_seconds, 1e-9),
    }
    if hasattr(engine, "_schedulers"):  # genai
        result.update(lane_stats(engine, seconds, cpu_seconds, tokens))
    return result


def lane_stats(engine: Any, seconds: float, cpu_seconds: float, tokens: int) -> dict:
    """What genai's lanes ran in a round: model runs per generated token, rows per decode
    run, the CPU time of the model runs (ONNX Runtime, the threads running them) against the
    process's (the rest: scheduling, sampling, detokenizing, events, thread hand-offs), and
    the share of the round's wall time each lane spent in model runs."""
    stats = [s.stats for s in engine._schedulers]
    decode_runs = sum(s["decode_steps"] for s in stats)
    prefill_runs = sum(s["prefill_runs"] for s in stats)
    model_cpu = sum(s["model_cpu_seconds"] for s in stats)
    return {
        "runs_per_token": (decode_runs + prefill_runs) / max(tokens, 1),
        "decode_runs": decode_runs,
        "prefill_runs": prefill_runs,
        "rows_per_decode_run": sum(s["decode_rows"] for s in stats) / max(decode_runs, 1),
        "prefill_tokens": sum(s["prefill_tokens"] for s in stats),
        "model_cpu_ms_per_token": 1000 * model_cpu / max(tokens, 1),
        "other_cpu_ms_per_token": 1000 * (cpu_seconds - model_cpu) / max(tokens, 1),
        "lanes_in_model": [s["model_seconds"] / seconds for s in stats],
    }


def count_reference_runs(ref: Any, args: argparse.Namespace, tokenizer: Any) -> str:
    """One unmeasured round of the reference's Engine with ONNX Runtime's profiler on: its
    model runs per generated token and the batch shapes they had."""
    import collections
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        config = ref.Config(args.model)
        session = {"enable_profiling": str(Path(folder) / "ort")}
        config.overlay(
            json.dumps(
                {
                    "engine": {"static_batching": {"max_batch_size": args.requests}},
                    "model": {"decoder": {"session_options": session}},
                }
            )
        )
        model = ref.Model(config)
        result = run_engine(ref, model, tokenizer, args, "profile")
        del model  # writes the trace
        import gc

        gc.collect()
        trace = json.loads(next(Path(folder).glob("ort*.json")).read_text())
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    shapes: collections.Counter[str] = collections.Counter()
    ids = [
        e
        for e in trace
        if e.get("cat") == "Node"
        and e.get("args", {}).get("op_name") == "GroupQueryAttention"
        and e.get("name", "").endswith("_kernel_time")
    ]
    for run in runs:  # the first attention node of each run: its query's [batch, tokens]
        end = run["ts"] + run["dur"]
        node = next((e for e in ids if run["ts"] <= e["ts"] <= end), None)
        if node is not None:
            query = next(iter(node["args"]["input_type_shape"][0].values()))
            shapes[f"{query[0]}x{query[1]}"] += 1
    return (
        f"reference: {len(runs)} model runs for {result['tokens']} tokens "
        f"({len(runs) / max(result['tokens'], 1):.3f} per token); [rows x new tokens]: "
        + ", ".join(f"{k} x{n}" for k, n in sorted(shapes.items()))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_argument(parser)
    parser.add_argument("--requests", type=positive_int, default=8)
    parser.add_argument("--new-tokens", type=positive_int, default=64)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument(
        "--lockstep",
        action="store_true",
        help="also run genai with its lanes stepped together, as before they stepped at their "
        "own pace ('genai-lockstep'), in the same rounds",
    )
    parser.add_argument(
        "--count-reference-runs",
        action="store_true",
        help="after the rounds, one more reference round under ONNX Runtime's profiler: its "
        "model runs per token and their batch shapes",
    )
    args = parser.parse_args()
    header()
    args.model = str(model_folder(args.model))

    import onnxruntime_genai as ref

    import genai

    config = ref.Config(args.model)
    config.overlay(json.dumps({"engine": {"static_batching": {"max_batch_size": args.requests}}}))
    engines = {
        "genai": (genai, genai.Model(args.model)),
        "reference": (ref, ref.Model(config)),
    }
    if args.lockstep:
        engines["genai-lockstep"] = engines["genai"]
    engines["genai"][1].huge_pages.wait()  # weights on 2 MiB pages before any round
    tokenizer = genai.Tokenizer(engines["genai"][1])
    # warm-up: each engine once (sessions, allocator, caches), not measured
    small = argparse.Namespace(**{**vars(args), "new_tokens": 4})
    for name, (og, model) in engines.items():
        warm = run_engine(og, model, tokenizer, small, f"warm-{name}", name == "genai-lockstep")
        if not warm["tokens"]:
            raise SystemExit(
                f"engine.py: {name} made no tokens on {args.model}; the reference's Engine needs "
                "logits for every position (../shared's reference-built SmolLM2, or "
                "`genai build GGUF -o DIR --all-logits`)"
            )
    results: dict[str, list[float]] = {name: [] for name in engines}
    per_cpu: dict[str, list[float]] = {name: [] for name in engines}
    for round_ in range(args.rounds):
        order = list(engines) if round_ % 2 == 0 else list(engines)[::-1]
        for name in order:
            og, model = engines[name]
            result = run_engine(og, model, tokenizer, args, f"r{round_}", name == "genai-lockstep")
            results[name].append(result["tok_s"])
            per_cpu[name].append(result["tok_cpu_s"])
            print(
                f"round {round_} {name:14s} {result['tok_s']:7.1f} tok/s "
                f"({result['tokens']} tokens in {result['seconds']:.2f} s, "
                f"{result['cores']:.2f} cores busy, {result['tok_cpu_s']:.1f} tok per CPU s)",
                flush=True,
            )
            if "runs_per_token" in result:
                lanes = ", ".join(f"{x:.0%}" for x in result["lanes_in_model"])
                print(
                    f"        model runs: {result['decode_runs']} decode "
                    f"({result['rows_per_decode_run']:.2f} rows each) + "
                    f"{result['prefill_runs']} prefill ({result['prefill_tokens']} tokens), "
                    f"{result['runs_per_token']:.3f} per token; CPU per token: model "
                    f"{result['model_cpu_ms_per_token']:.2f} ms, the rest "
                    f"{result['other_cpu_ms_per_token']:.2f} ms; lanes in model runs: {lanes} "
                    "of the wall time",
                    flush=True,
                )
    for name in [n for n in engines if n != "reference"]:
        ratios = [a / b for a, b in zip(results[name], results["reference"], strict=True)]
        print(
            f"\n{args.requests} requests x {args.new_tokens} tokens, "
            f"median tok/s: {name} {statistics.median(results[name]):.1f}, reference "
            f"{statistics.median(results['reference']):.1f}; {name}/reference per round: "
            + ", ".join(f"{r:.2f}x" for r in ratios)
            + f" (median {statistics.median(ratios):.2f}x); tokens per CPU second: {name} "
            f"{statistics.median(per_cpu[name]):.1f}, reference "
            f"{statistics.median(per_cpu['reference']):.1f}; load average "
            + " ".join(f"{x:.1f}" for x in os.getloadavg())
        )
    if args.count_reference_runs:
        print(count_reference_runs(ref, args, tokenizer))


if __name__ == "__main__":
    main()
