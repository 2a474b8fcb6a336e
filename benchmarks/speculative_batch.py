"""Speculative decoding at batch > 1: genai's n-gram decoding of a batch of different prompts
next to its plain batched decoding (and the reference's plain batched decoding, which is what a
reference user runs: its speculative decoding refuses batch_size > 1), tokens checked identical.

    python benchmarks/speculative_batch.py [-m MODEL_DIR] [--batch 2] [--rounds 3]
                                           [--new-tokens 120] [--threads 1] [--no-reference]
                                           [--cases copy chat mixed] [--keep-rows]

Each case is a batch of ``--batch`` chat prompts (right-padded), greedy, ``--new-tokens`` new
tokens at most (timed after the prompt run): "copy" batches take their prompts from the tasks
where the answer copies the prompt (repeat, rewrite, code-edit), "chat" batches are open-ended,
"mixed" one of each. Rounds are interleaved; the table shows the median generated tokens (every
row) per second of wall time and per second of process CPU time, each speed-up over genai's
plain batched decoding, the acceptance rate, whether the batch went back to plain batched steps
("left", `genai.generation.speculative.rows`), and whether the tokens equal plain batched
decoding's.

Each row runs its own rounds (one verify run per row: GroupQueryAttention takes several new
tokens on top of a past only at batch 1). ``lockstep keeps`` estimates what the alternative
would have cost: if every round committed the fewest tokens any row accepted (pairing the rows'
rounds in order), the share of the emitted tokens per round it would have kept.

Before the rounds, each configuration runs once untimed on the first case's batch (a model's
first speculative generation sets up what its verify runs need). ``-m`` takes a folder or a
cached model's name; without it, genai's default model.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _bench_args import default_model, header, model_folder, positive_int

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from speculative import TASKS, load  # noqa: E402

import genai  # noqa: E402
from genai.generation.speculative import rows as rows_module  # noqa: E402

CASES = {
    "copy": ["repeat", "code-edit", "rewrite", "extract"],
    "chat": ["chat", "chat-2", "chat-3", "chat-4"],
    "mixed": ["repeat", "chat", "code-edit", "chat-2"],
}
PROMPTS = {
    **TASKS,
    "chat-2": "Explain in a few sentences why the sky is blue.",
    "chat-3": "Write a short poem about autumn leaves.",
    "chat-4": "Give three tips for learning a new language.",
}
SPEC = {"ngram_size": 3, "max_draft_tokens": 4}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def batch_ids(folder: Path, tasks: list[str], pad: int) -> np.ndarray:
    tokenizer = genai.Tokenizer(genai.Model(str(folder)))
    rows = []
    for task in tasks:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPTS[task]}], add_generation_prompt=True
        )
        rows.append([int(t) for t in tokenizer.encode(text)])
    width = max(len(r) for r in rows)
    return np.array([r + [pad] * (width - len(r)) for r in rows], np.int32)


def run(engine, model, ids: np.ndarray, new_tokens: int, spec) -> dict:
    params = engine.GeneratorParams(model)
    params.set_search_options(
        do_sample=False, max_length=ids.shape[1] + new_tokens, batch_size=ids.shape[0]
    )
    if spec:
        params.set_speculative_options(**spec)
    gen = engine.Generator(model, params)
    gen.append_tokens(ids)
    wall, cpu = time.perf_counter(), cpu_seconds()
    per_row: list[list[int]] = [[] for _ in range(ids.shape[0])]
    rows = getattr(getattr(gen, "_spec", None), "rows", None)
    seen = [(0, 0)] * ids.shape[0]
    while not gen.is_done():
        gen.generate_next_token()
        for r, sub in enumerate(rows or ()):
            counters = sub._spec.counters
            if counters.rounds > seen[r][0]:  # a round started: what it queued
                per_row[r].append(counters.tokens_queued - seen[r][1])
                seen[r] = (counters.rounds, counters.tokens_queued)
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    sequences = [[int(t) for t in gen.get_sequence(r)] for r in range(ids.shape[0])]
    generated = sum(len(s) - ids.shape[1] for s in sequences)
    stats = gen.get_speculative_stats() if spec else {}
    kept = None
    if rows:
        pairs = list(zip(*per_row, strict=False))
        if pairs:
            kept = sum(min(p) for p in pairs) / sum(sum(p) / len(p) for p in pairs)
    return {
        "batched": bool(getattr(getattr(gen, "_spec", None), "batched", False)),
        "sequences": sequences,
        "tok/s": generated / wall,
        "tok/cpu-s": generated / cpu,
        "acceptance": stats.get("acceptance_rate"),
        "lockstep keeps": kept,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-m",
        "--model",
        default=None,
        help="model folder or cached model name (default: genai's default model)",
    )
    parser.add_argument(
        "--batch", type=positive_int, default=2, help=f"at most {min(map(len, CASES.values()))}"
    )
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--new-tokens", type=positive_int, default=120)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument(
        "--keep-rows", action="store_true", help="never go back to batched steps (measure rows)"
    )
    args = parser.parse_args()
    most = min(len(tasks) for tasks in CASES.values())
    if args.batch > most:
        parser.error(f"argument --batch: at most {most} (the prompts of a case)")
    header(args.threads)
    if args.keep_rows:
        rows_module.CHECK_EVERY = 1 << 30
    folder = model_folder(args.model, default=default_model)
    engines = [("genai", genai)]
    if not args.no_reference:
        import onnxruntime_genai as og  # lazy: the reference is a test dependency

        engines.append(("onnxruntime-genai", og))
    models = {name: load(engine, folder, args.threads) for name, engine in engines}
    pad = int(genai.Model(str(folder)).config.get("model.pad_token_id", 0))
    configs = [("genai", "plain", None), ("genai", "ngram 3/4", SPEC)]
    if not args.no_reference:
        configs.append(("onnxruntime-genai", "plain", None))
    columns = ["case", "engine", "config", "tok/s", "speed-up", "tok/cpu-s", "cpu speed-up"]
    columns += ["acceptance", "lockstep keeps", "left", "same"]
    warm = batch_ids(folder, CASES[args.cases[0]][: args.batch], pad)
    for name, _label, spec in configs:  # untimed: the first speculative run sets up verify runs
        run(dict(engines)[name], models[name], warm, args.new_tokens, spec)
    print(" | ".join(columns))
    for case in args.cases:
        ids = batch_ids(folder, CASES[case][: args.batch], pad)
        found: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for name, label, spec in order:
                found.setdefault((name, label), []).append(
                    run(dict(engines)[name], models[name], ids, args.new_tokens, spec)
                )
        base = found[("genai", "plain")]
        base_wall = statistics.median(x["tok/s"] for x in base)
        base_cpu = statistics.median(x["tok/cpu-s"] for x in base)
        for name, label, _spec in configs:
            results = found[(name, label)]
            wall = statistics.median(x["tok/s"] for x in results)
            cpu = statistics.median(x["tok/cpu-s"] for x in results)
            last = results[-1]
            row = [
                case,
                name,
                label,
                f"{wall:.1f}",
                f"{wall / base_wall:.2f}",
                f"{cpu:.1f}",
                f"{cpu / base_cpu:.2f}",
                "-" if last["acceptance"] is None else f"{last['acceptance']:.2f}",
                "-" if last["lockstep keeps"] is None else f"{last['lockstep keeps']:.2f}",
                str(last["batched"]) if label != "plain" else "-",
                str(last["sequences"] == base[-1]["sequences"]),
            ]
            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
