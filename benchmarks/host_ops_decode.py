"""What genai's CPU ops cost a decode step: one folder loaded with them (its GroupQueryAttention
run through `genai.runtime.chunked_attention`'s op, which a one-token step passes straight to
onnxruntime's kernel; its MLP's gated SiLU through `genai.runtime.gated_silu`'s) and without
(``GENAI_CHUNKED_ATTENTION=0 GENAI_ROW_QUANTIZATION=0 GENAI_GATED_SILU=0``), plus a second
copy with them, to show the spread between identical models.

    python benchmarks/host_ops_decode.py [-m MODEL_DIR] [--threads 1] [--rounds 21] [--steps 64]

All three models load in this process; the rounds are interleaved (the order alternating). Per
round and model: a fresh generator, a 73-token prompt, then ``--steps`` greedy steps (wall
tok/s). Medians, and the ratio to the model without the ops; the greedy tokens must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _bench_args import default_model, header, model_folder, positive_int

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import genai

_SWITCHES = ("GENAI_CHUNKED_ATTENTION", "GENAI_ROW_QUANTIZATION", "GENAI_GATED_SILU")


def load(folder: str, ops: bool, threads: int) -> genai.Model:
    for name in _SWITCHES:
        os.environ[name] = "1" if ops else "0"
    config = genai.Config(folder)
    options = {"intra_op_num_threads": threads}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return genai.Model(config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "-m", "--model", default=None, help="model folder or cached model name (default: genai's)"
    )
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--rounds", type=positive_int, default=21)
    ap.add_argument("--steps", type=positive_int, default=64, help="at least 2")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("argument --steps: at least 2 (the first token comes from the prompt)")
    header(args.threads)
    folder = str(model_folder(args.model, default=default_model))
    models = {
        "with ops": load(folder, True, args.threads),
        "without": load(folder, False, args.threads),
        "with ops (copy)": load(folder, True, args.threads),
    }
    tokenizer = genai.Tokenizer(models["without"])
    prompt = tokenizer.encode("Write a long story about a robot who learns to paint. " * 6)
    rates: dict[str, list[float]] = {name: [] for name in models}
    tokens: dict[str, list[int]] = {}
    for r in range(args.rounds):
        order = list(models) if r % 2 == 0 else list(reversed(models))
        for name in order:
            params = genai.GeneratorParams(models[name])
            params.set_search_options(max_length=len(prompt) + args.steps + 1, do_sample=False)
            generator = genai.Generator(models[name], params)
            generator.append_tokens(prompt)
            generator.generate_next_token()
            start, steps = time.perf_counter(), 0
            while steps < args.steps - 1 and not generator.is_done():  # (a model may end early)
                generator.generate_next_token()
                steps += 1
            rates[name].append(steps / (time.perf_counter() - start))
            tokens[name] = list(generator.get_sequence(0))
    base = statistics.median(rates["without"])
    print(f"{folder}, {args.threads} thread(s), {args.rounds} rounds of {args.steps} steps")
    print("| model | decode tok/s | ratio to without |")
    print("|---|---|---|")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"| {name} | {rate:.1f} | {rate / base:.3f} |")
    if len({tuple(t) for t in tokens.values()}) != 1:
        raise SystemExit("the models' greedy tokens differ")


if __name__ == "__main__":
    main()
