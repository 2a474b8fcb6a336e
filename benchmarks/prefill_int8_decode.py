"""Decode speed and prompt time of a ``--prefill-int8`` folder: genai's one session per branch
of the graph's run-length If, the If graph as it is (``GENAI_RUN_LENGTH_SPLIT=0``), and the
plain int4 build of the same weights.

    python benchmarks/prefill_int8_decode.py --int4 INT4_DIR --prefill-int8 P8_DIR
                                             [--threads 1] [--rounds 9] [--prompt 128] [--steps 128]

All three models load in this process; the rounds are interleaved (the order alternating).
Per round and folder: a fresh generator, the prompt appended and the first token chosen (the
calling thread's CPU time: ``prompt CPU ms``), then ``--steps`` greedy steps (wall tok/s and
tokens per process-CPU second). Medians; ratios are medians of each round's own ratio to the
plain int4 folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _bench_args import header, model_folder, positive_int

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import genai


def load(folder: Path, split: bool, threads: int) -> genai.Model:
    os.environ["GENAI_RUN_LENGTH_SPLIT"] = "1" if split else "0"
    config = genai.Config(str(folder))
    options = {"intra_op_num_threads": threads}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return genai.Model(config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--int4", required=True, help="the plain int4 build (a folder or cached model name)"
    )
    ap.add_argument(
        "--prefill-int8", required=True, help="the --prefill-int8 build (a folder or name)"
    )
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--rounds", type=positive_int, default=9)
    ap.add_argument("--prompt", type=positive_int, default=128)
    ap.add_argument("--steps", type=positive_int, default=128)
    args = ap.parse_args()
    header(args.threads)
    args.int4, args.prefill_int8 = model_folder(args.int4), model_folder(args.prefill_int8)
    models = {
        "plain int4": load(args.int4, True, args.threads),
        "prefill-int8, If graph": load(args.prefill_int8, False, args.threads),
        "prefill-int8, split": load(args.prefill_int8, True, args.threads),
    }
    ids = np.random.default_rng(0).integers(100, 40000, args.prompt).astype(np.int32)
    total = args.prompt + args.steps + 2
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in models}
    names = list(models)
    for r in range(args.rounds + 1):
        for name in names if r % 2 else names[::-1]:
            model = models[name]
            params = genai.GeneratorParams(model)
            params.set_search_options(max_length=total, min_length=total)
            generator = genai.Generator(model, params)
            prompt_cpu = time.thread_time()
            generator.append_tokens(ids)
            generator.generate_next_token()
            prompt_cpu = time.thread_time() - prompt_cpu
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                generator.generate_next_token()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if r:  # the first round warms up
                rows[name].append((args.steps / wall, args.steps / cpu, prompt_cpu))
    base = rows["plain int4"]
    print(f"{args.threads} thread(s), {args.prompt}-token prompt, {args.steps} steps, "
          f"{args.rounds} rounds, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| folder | decode tok/s | ratio | tokens per CPU s ratio | prompt CPU ms |")
    print("|---|---|---|---|---|")
    for name, runs in rows.items():
        rate = statistics.median(x[0] for x in runs)
        ratio = statistics.median(a[0] / b[0] for a, b in zip(runs, base, strict=True))
        cpu_ratio = statistics.median(a[1] / b[1] for a, b in zip(runs, base, strict=True))
        prompt = 1000 * statistics.median(x[2] for x in runs)
        print(f"| {name} | {rate:.1f} | {ratio:.3f} | {cpu_ratio:.3f} | {prompt:.0f} |")


if __name__ == "__main__":
    main()
