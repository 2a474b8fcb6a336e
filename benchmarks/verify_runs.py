"""What a speculative verify run costs next to a plain decode step, and where its time goes.

    python benchmarks/verify_runs.py [-m MODEL_DIR] [--task repeat] [--k 3 4]
                                     [--rounds 5] [--threads 1] [--profile]

For one folder (default: genai's default model) and one prompt of benchmarks/speculative.py,
greedy, ``--new-tokens`` new tokens: plain decoding and n-gram decoding with a fixed
``max_draft_tokens`` K (``ngram_size`` 3), ``--rounds`` interleaved rounds. Prints the median
(and fastest) milliseconds of a plain step (a generation's wall time over its tokens) and of a
verify run (``total_target_verify_ms`` over ``target_verify_forward_passes`` from
``get_speculative_stats``), and the verify run in plain steps. ``--profile`` instead runs each
K once more with onnxruntime's profiler on and prints, per op, the milliseconds of kernel time
per run of the session the verify runs went to (on AVX2 CPUs genai's second session with
``StepRowsMatMulNBits``; else the decoder's own, whose prompt run is then counted too) and the
median of one node of each op.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _bench_args import default_model, header, model_folder, positive_int  # noqa: E402
from speculative import TASKS, prompt_ids  # noqa: E402

import genai  # noqa: E402


def load(folder: Path, threads: int, profile_prefix: str | None = None) -> genai.Model:
    options: dict[str, object] = {"intra_op_num_threads": threads}
    if profile_prefix:
        options["enable_profiling"] = profile_prefix
    config = genai.Config(str(folder))
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return genai.Model(config)


def generate(model: genai.Model, ids, new_tokens: int, k: int) -> tuple[float, dict]:
    """Seconds per emitted token and the speculative stats of one greedy generation."""
    params = genai.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens)
    if k:
        params.set_speculative_options(ngram_size=3, max_draft_tokens=k)
    generator = genai.Generator(model, params)
    generator.append_tokens(ids)
    started = time.perf_counter()
    count = 0
    while not generator.is_done():
        generator.generate_next_token()
        count += 1
    per_token = (time.perf_counter() - started) / max(count, 1)
    return per_token, generator.get_speculative_stats() if k else {}


def timings(folder: Path, args: argparse.Namespace) -> None:
    model = load(folder, args.threads)
    ids = prompt_ids(folder, args.task)
    generate(model, ids, args.new_tokens, max(args.k))  # builds what verify runs need
    step: list[float] = []
    verify: dict[int, list[float]] = {k: [] for k in args.k}
    for _ in range(args.rounds):
        step.append(generate(model, ids, args.new_tokens, 0)[0] * 1000)
        for k in args.k:
            stats = generate(model, ids, args.new_tokens, k)[1]
            runs = stats["target_verify_forward_passes"]
            if runs:
                verify[k].append(stats["total_target_verify_ms"] / runs)
    plain = statistics.median(step)
    print(f"{folder.name}, {args.task}, {args.threads} thread(s), {args.rounds} rounds")
    print("| run | median ms | fastest ms | in plain steps |\n|---|---|---|---|")
    print(f"| plain step | {plain:.2f} | {min(step):.2f} | 1.00 |")
    for k, values in verify.items():
        if values:
            median = statistics.median(values)
            print(f"| verify, K = {k} | {median:.2f} | {min(values):.2f} | {median / plain:.2f} |")


def profile(folder: Path, args: argparse.Namespace) -> None:
    ids = prompt_ids(folder, args.task)
    for k in args.k:
        with tempfile.TemporaryDirectory() as tmp:
            model = load(folder, args.threads, str(Path(tmp) / "p"))
            generate(model, ids, args.new_tokens, k)
            del model
            gc.collect()  # the traces are written when the sessions are released
            traces = [json.loads(path.read_text()) for path in Path(tmp).glob("p*.json")]
        # the verify runs' session: the one with genai's StepRowsMatMulNBits where there is one
        events = max(traces, key=lambda t: (_has_step_rows(t), _runs(t)))
        runs = _runs(events)
        total: collections.Counter[str] = collections.Counter()
        nodes: dict[str, list[int]] = collections.defaultdict(list)
        for event in events:
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                op = event["args"]["op_name"]
                total[op] += event["dur"]
                nodes[op].append(event["dur"])
        print(f"\nK = {k}: {runs} runs of the verify runs' session, {folder.name}, {args.task}")
        print("| op | ms per run | nodes per run | median node us |\n|---|---|---|---|")
        for op, us in total.most_common(8):
            count = len(nodes[op])
            median = statistics.median(nodes[op])
            print(f"| {op} | {us / runs / 1000:.2f} | {count / runs:.0f} | {median:.0f} |")


def _runs(events: list[dict]) -> int:
    return sum(1 for event in events if event.get("name") == "model_run")


def _has_step_rows(events: list[dict]) -> bool:
    return any(event.get("args", {}).get("op_name") == "StepRowsMatMulNBits" for event in events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-m", "--model", default=None, help="model folder or cached model name (default: genai's)"
    )
    parser.add_argument("--task", default="repeat", choices=list(TASKS))
    parser.add_argument("--k", type=positive_int, nargs="+", default=[3, 4])
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--new-tokens", type=positive_int, default=120)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    header(args.threads)
    folder = model_folder(args.model, default=default_model)
    (profile if args.profile else timings)(folder, args)


if __name__ == "__main__":
    main()
