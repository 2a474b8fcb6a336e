"""Peak memory and KV bytes at max_length = context length, each engine in its own process.

    PYTHONPATH=. python benchmarks/memory.py [-m MODEL_DIR] [--prompt-tokens 128]
        [--new-tokens 256] [--speed-rounds N]

SmolLM2 int4 by default (context 8192): a 128-token prompt and 256 new tokens with max_length
left at the context length, the setting that makes the reference allocate and zero-fill the
whole [batch, kv_heads, 8192, head] cache per layer up front. Runs: the reference; genai with
its growing shared buffer (the default); genai with the full-size buffer (kv_initial_capacity=0)
for the decode-speed comparison. Each in a fresh subprocess; peak RSS from getrusage.
``-m`` takes a folder or a cached model's name; without it, the reference-built SmolLM2 in
../shared when present, else genai's default model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _bench_args import add_model_argument, header, model_folder, non_negative_int, positive_int

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
import numpy as np
engine_name, folder, prompt_tokens, new_tokens, initial = {args!r}
if engine_name == "reference":
    import onnxruntime_genai as engine
else:
    import genai as engine
import genai
config = engine.Config(folder)
config.overlay(json.dumps({{"model": {{"eos_token_id": [49151]}}}}))
model = engine.Model(config)
ids = genai.Tokenizer(genai.Config(folder)).encode("The history of the city begins. " * 60)
ids = np.ascontiguousarray(np.resize(ids, prompt_tokens), dtype=np.int32)
params = engine.GeneratorParams(model)
options = {{}}
if initial is not None:
    options["kv_initial_capacity"] = initial
params.set_search_options(**options)  # max_length stays at the context length
generator = engine.Generator(model, params)
generator.append_tokens(ids)
generator.generate_next_token()
start = time.perf_counter()
for _ in range(new_tokens - 1):
    generator.generate_next_token()
rate = (new_tokens - 1) / (time.perf_counter() - start)
kv = getattr(generator, "kv_cache_bytes", None)
used = getattr(generator, "kv_cache_used_bytes", None)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"peak": peak, "rate": rate, "kv": kv, "used": used}}))
"""


def run(engine: str, folder: Path, prompt: int, new: int, initial: int | None) -> dict:
    code = CHILD.format(root=str(ROOT), args=(engine, str(folder), prompt, new, initial))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or [f"exit status {out.returncode}"]
        sys.exit(f"memory.py: the {engine} run failed: {tail[0]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(parser)
    parser.add_argument("--prompt-tokens", type=positive_int, default=128)
    parser.add_argument("--new-tokens", type=positive_int, default=256, help="at least 2")
    parser.add_argument(
        "--speed-rounds",
        type=non_negative_int,
        default=0,
        help="also compare decode speed in one process",
    )
    args = parser.parse_args(argv)
    if args.new_tokens < 2:
        parser.error("argument --new-tokens: at least 2 (the first token comes from the prefill)")
    header()
    args.model = model_folder(args.model)
    runs = {
        "reference": run("reference", args.model, args.prompt_tokens, args.new_tokens, None),
        "genai (growing)": run("genai", args.model, args.prompt_tokens, args.new_tokens, None),
        "genai (full size)": run("genai", args.model, args.prompt_tokens, args.new_tokens, 0),
    }
    mib = 1024 * 1024
    print(f"model {args.model}, prompt {args.prompt_tokens}, new {args.new_tokens}, "
          "max_length = context length")  # fmt: skip
    print(f"{'engine':<18} {'peak RSS MiB':>12} {'KV alloc MiB':>12} {'KV used MiB':>11} "
          f"{'decode tok/s':>12}")  # fmt: skip
    for name, r in runs.items():
        kv = f"{r['kv'] / mib:.1f}" if r["kv"] is not None else "-"
        used = f"{r['used'] / mib:.1f}" if r["used"] is not None else "-"
        print(f"{name:<18} {r['peak'] / mib:>12.0f} {kv:>12} {used:>11} {r['rate']:>12.1f}")
    grow, ref, full = runs["genai (growing)"], runs["reference"], runs["genai (full size)"]
    print(f"KV allocated / used: {grow['kv'] / grow['used']:.2f}x (target <= 1.5x)")
    print(f"peak RSS genai / reference: {grow['peak'] / ref['peak']:.2f}x (target <= 0.5x)")
    ratio = grow["rate"] / full["rate"]
    print(f"decode growing / full-size buffer (separate processes): {ratio:.2f}x")
    if args.speed_rounds:
        ratio = interleaved_speed(
            args.model, args.prompt_tokens, args.new_tokens, args.speed_rounds
        )
        print(f"decode growing / full-size buffer (one process, ABBA, medians): {ratio:.3f}x")
    return 0


def interleaved_speed(folder: Path, prompt: int, new: int, rounds: int) -> float:
    """Decode tok/s of the growing vs the full-size shared buffer in one process, alternating
    which goes first each round; the ratio of the medians."""
    import json as _json
    import statistics
    import time

    import numpy as np

    sys.path.insert(0, str(ROOT))
    import genai

    config = genai.Config(folder)
    config.overlay(_json.dumps({"model": {"eos_token_id": [49151]}}))
    model = genai.Model(config)
    ids = genai.Tokenizer(model).encode("The history of the city begins. " * 60)
    ids = np.ascontiguousarray(np.resize(ids, prompt), dtype=np.int32)

    def rate(initial: int) -> float:
        params = genai.GeneratorParams(model)
        params.set_search_options(kv_initial_capacity=initial)  # max_length: the context
        generator = genai.Generator(model, params)
        generator.append_tokens(ids)
        generator.generate_next_token()
        start = time.perf_counter()
        for _ in range(new - 1):
            generator.generate_next_token()
        return (new - 1) / (time.perf_counter() - start)

    rates: dict[int, list[float]] = {128: [], 0: []}
    for index in range(rounds):
        for initial in (128, 0) if index % 2 == 0 else (0, 128):
            rates[initial].append(rate(initial))
    return statistics.median(rates[128]) / statistics.median(rates[0])


if __name__ == "__main__":
    sys.exit(main())
