"""Prefill (time to first token): genai vs onnxruntime-genai vs OpenVINO GenAI on the same weights.

    python benchmarks/prefill.py [-m MODEL_DIR] [--also LABEL=MODEL_DIR ...] [--openvino IR_DIR]
                                 [--lengths 32 128 512 2048] [--threads 1 2] [--rounds 5]
                                 [--chunk-sizes 0 256]
    python benchmarks/prefill.py --profile 128 [-m MODEL_DIR] [--threads 1]   # ORT per-op profile
    python benchmarks/prefill.py --profile 128 --profile-genai ...  # of genai's own sessions

Every engine x thread count runs in a worker process of its own, holding its model; the rounds
are interleaved (each round times every worker at every length, the order of the workers
rotating from round to round), and each call gets a prompt no call before it used (the ids are
rotated per round: OpenVINO GenAI reuses the KV cache of a previous call's common prefix). One
call = a new generator, ``append_tokens(prompt)``, ``generate_next_token()`` (genai and the
reference), or ``generate(prompt, max_new_tokens=1)`` (OpenVINO GenAI): the time to the first
token. Printed per engine, length and thread count: the median wall ms with its range, the
median process CPU ms (on a loaded machine the CPU time of a 1-thread run is the steadier
measure) and the ratio of medians to OpenVINO GenAI's (``--baseline LABEL``: to another
engine's; without OpenVINO GenAI, to the reference's). ``--untrimmed`` adds genai with
``GENAI_TRIM_LOGITS=0`` on ``-m``'s folder (every position's logits computed, as the
reference does; `genai.runtime.trimmed_logits`), ``--unchunked`` every genai folder again with
``GENAI_CHUNKED_ATTENTION=0`` (a long prompt's attention in one call, as the reference;
`genai.runtime.chunked_attention`), ``--unfused`` with ``GENAI_ROW_QUANTIZATION=0`` (a
``--prefill-int8`` folder's per-row quantisation as eight ops; `genai.runtime.row_quantization`),
``--ungated`` with ``GENAI_GATED_SILU=0`` (the MLP's gated SiLU product as its four to six ops;
`genai.runtime.gated_silu`).

OpenVINO GenAI runs in its own virtual environment with the model converted by
``scripts/setup_openvino_bench.sh`` (its defaults are this script's defaults; ``--openvino ''``
leaves it out; without ``--openvino``, a missing venv or IR folder leaves it out with a note).
``-m`` (a folder or a cached model's name) defaults to the default model (``genai pull``);
``--also`` adds more genai folders (e.g. a ``prefill_int8`` build); the reference runs on
``-m``'s folder.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _bench_args import (
    default_model,
    header,
    model_folder,
    non_negative_int,
    positive_int,
    require_model,
)

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "genai"
OV_VENV = Path(os.environ.get("GENAI_BENCH_OV_VENV") or CACHE / "bench-openvino-venv")
OV_IR = CACHE / "bench-openvino" / "ov-int4-g32-asym"
#: genai engines run with one of its load-time rewrites turned off: every position's logits
#: (genai.runtime.trimmed_logits), attention in one call (genai.runtime.chunked_attention),
#: per-row quantisation as eight ops (genai.runtime.row_quantization).
_SWITCHED_OFF = {
    "genai-untrimmed": {"GENAI_TRIM_LOGITS": "0"},
    "genai-unchunked": {"GENAI_CHUNKED_ATTENTION": "0"},
    "genai-unfused": {"GENAI_ROW_QUANTIZATION": "0"},
    "genai-ungated": {"GENAI_GATED_SILU": "0"},
}
TEXT = (
    "The history of the city begins with a small settlement on the river, where traders from "
    "the north and the south met to exchange grain, salt, wool and stories about distant lands. "
)


# -- workers (one engine, one thread count, one model; JSON lines on stdin/stdout) -------------
def _worker(engine: str, folder: str, threads: int, chunk: int = 0) -> None:
    import numpy as np  # lazy: the OpenVINO venv's worker imports nothing else of ours

    if engine == "openvino":
        import openvino as ov  # lazy: only in the OpenVINO venv
        import openvino_genai as ov_genai  # lazy: only in the OpenVINO venv

        pipe = ov_genai.LLMPipeline(folder, "CPU", INFERENCE_NUM_THREADS=threads)

        def first_token(ids: np.ndarray) -> None:
            ids = ids.reshape(1, -1).astype(np.int64)
            inputs = ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
            pipe.generate(inputs, max_new_tokens=1, min_new_tokens=1)

    else:
        if engine == "reference":
            import onnxruntime_genai as lib  # lazy: the reference is a test dependency
        else:
            os.environ.update(_SWITCHED_OFF.get(engine, {}))
            sys.path.insert(0, str(ROOT))
            import genai as lib  # lazy: not in the OpenVINO venv
        config = lib.Config(folder)
        options = {"intra_op_num_threads": threads}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        model = lib.Model(config)

        def first_token(ids: np.ndarray) -> None:
            params = lib.GeneratorParams(model)
            params.set_search_options(max_length=len(ids) + 1)
            if chunk:
                params.set_search_options(chunk_size=chunk)
            generator = lib.Generator(model, params)
            generator.append_tokens(ids.astype(np.int32))
            generator.generate_next_token()

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ids = np.array(json.loads(line)["ids"], np.int64)
        cpu, wall = time.process_time(), time.perf_counter()
        first_token(ids)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)


class Worker:
    def __init__(
        self, label: str, engine: str, folder: str, threads: int, python: str, chunk: int = 0
    ) -> None:
        self.label, self.threads = label, threads
        cmd = [python, __file__, "--worker", engine, "--folder", folder, "--threads", str(threads)]
        cmd += ["--chunk", str(chunk)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.label} ({self.threads} threads) exited")
        return json.loads(line)

    def time(self, ids: list[int]) -> dict:
        self.proc.stdin.write(json.dumps({"ids": ids}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def prompt_ids(folder: Path, count: int, shift: int) -> list[int]:
    """``count`` ids of the benchmark text, rotated by ``shift`` (a prompt per round)."""
    sys.path.insert(0, str(ROOT))
    import genai  # lazy: keeps the OpenVINO worker free of genai

    ids = list(genai.Tokenizer(genai.Config(str(folder))).encode(TEXT * 20))
    ids = (ids * (count // len(ids) + 2))[shift % len(ids) :][:count]
    return [int(i) for i in ids]


# -- the ORT per-op profile ------------------------------------------------------------------
def profile(folder: Path, count: int, threads: int) -> None:
    import numpy as np  # lazy: see _worker
    import onnxruntime as ort  # lazy: see _worker

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(os.environ.get("TMPDIR", "/tmp")) / "genai-prefill")
    sess = ort.InferenceSession(str(folder / "model.onnx"), opts)
    ids = np.array([prompt_ids(folder, count, 0)], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            feeds[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), np.float32)
    for _ in range(6):
        sess.run(["logits"], feeds)
    trace = Path(sess.end_profiling())
    try:
        events = json.loads(trace.read_text())
    finally:
        trace.unlink(missing_ok=True)
    _print_profile(events, f"one prefill of {count} tokens, {threads} thread(s), {folder}")


def profile_genai(folder: Path, count: int, threads: int) -> None:
    """The same table for genai's own sessions of ``folder`` (its load-time rewrites applied:
    the chunked attention and fused quantisation ops show as themselves)."""
    import gc
    import tempfile

    import numpy as np  # lazy: see _worker

    sys.path.insert(0, str(ROOT))
    import genai  # lazy: see _worker

    with tempfile.TemporaryDirectory() as tmp:
        config = genai.Config(str(folder))
        options = {"intra_op_num_threads": threads, "enable_profiling": str(Path(tmp) / "p")}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
        model = genai.Model(config)
        for round_ in range(6):
            params = genai.GeneratorParams(model)
            params.set_search_options(max_length=count + 2)
            generator = genai.Generator(model, params)
            generator.append_tokens(np.array(prompt_ids(folder, count, round_), np.int32))
            del generator
        del model, params
        gc.collect()  # the traces are written when the sessions are released
        traces = [json.loads(path.read_text()) for path in Path(tmp).glob("p*.json")]
    # the session that ran the prompts (a --prefill-int8 folder has one per branch)
    events = max(traces, key=lambda t: sum(e.get("dur", 0) for e in t if e.get("cat") == "Node"))
    _print_profile(events, f"genai, one prefill of {count} tokens, {threads} thread(s), {folder}")


def _print_profile(events: list[dict], title: str) -> None:
    # the fastest of the runs after the first (the least disturbed on a shared machine)
    last = min((e for e in events if e.get("name") == "model_run"), key=lambda e: e["dur"])
    start, end = last["ts"], last["ts"] + last["dur"]
    total: collections.Counter[str] = collections.Counter()
    count_by: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        op = e["args"]["op_name"]
        if op != "If" and start <= e["ts"] <= end:  # an If's time is its branch's nodes'
            total[op] += e["dur"]
            count_by[op] += 1
    kernels = sum(total.values())
    print(f"{title}: model_run {last['dur'] / 1000:.1f} ms, kernels {kernels / 1000:.1f} ms")
    print("| op | nodes | ms | share |\n|---|---|---|---|")
    for op, us in total.most_common():
        print(f"| {op} | {count_by[op]} | {us / 1000:.1f} | {100 * us / kernels:.1f} % |")


# -- the comparison ---------------------------------------------------------------------------
def openvino_choice(args: argparse.Namespace) -> str:
    """The OpenVINO IR folder to run, or '' to leave OpenVINO GenAI out: without ``--openvino``,
    left out with a note when its venv or IR folder is missing; asked for, they must be there."""
    given = args.openvino is not None
    folder = args.openvino if given else str(OV_IR)
    if given and not folder:
        return ""
    missing = [
        f"{what} {path}"
        for what, path in (("IR folder", folder), ("venv's python", args.openvino_python))
        if not Path(path).exists()
    ]
    if not missing:
        return folder
    message = (
        f"OpenVINO GenAI's {' and '.join(missing)} not found "
        "(scripts/setup_openvino_bench.sh sets them up)"
    )
    if given:
        sys.exit(f"prefill.py: {message}; --openvino '' leaves OpenVINO GenAI out")
    print(f"note: {message}; leaving OpenVINO GenAI out", file=sys.stderr)
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "-m", "--model", default=None, help="model folder or cached model name (default: genai's)"
    )
    ap.add_argument("--also", action="append", default=[], metavar="LABEL=DIR")
    ap.add_argument(
        "--openvino",
        default=None,
        help=f"OpenVINO IR folder ('' = skip; default: {OV_IR}, left out with a note when it "
        "or the venv is missing)",
    )
    ap.add_argument("--openvino-python", default=str(OV_VENV / "bin" / "python"))
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument(
        "--untrimmed",
        action="store_true",
        help="also genai with GENAI_TRIM_LOGITS=0 on -m's folder (every position's logits)",
    )
    ap.add_argument(
        "--unchunked",
        action="store_true",
        help="also every genai folder with GENAI_CHUNKED_ATTENTION=0 (attention in one call)",
    )
    ap.add_argument(
        "--unfused",
        action="store_true",
        help="also every genai folder with GENAI_ROW_QUANTIZATION=0 (quantisation as 8 ops)",
    )
    ap.add_argument(
        "--ungated",
        action="store_true",
        help="also every genai folder with GENAI_GATED_SILU=0 (the MLP's gate as 4-6 ops)",
    )
    ap.add_argument(
        "--baseline",
        default=None,
        help="the engine label the ratios divide by (default: openvino-genai, else reference)",
    )
    ap.add_argument("--lengths", type=positive_int, nargs="+", default=[32, 128, 512, 2048])
    ap.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument(
        "--profile",
        type=positive_int,
        default=0,
        metavar="TOKENS",
        help="print onnxruntime's per-op profile of one prefill of TOKENS tokens instead",
    )
    ap.add_argument(
        "--profile-genai",
        action="store_true",
        help="--profile genai's own sessions (its load-time rewrites) instead of the raw graph",
    )
    ap.add_argument(
        "--chunk-sizes",
        type=non_negative_int,
        nargs="+",
        default=[],
        metavar="N",
        help="run genai and the reference once per search.chunk_size N (0: whole prompts)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker, args.folder, args.threads[0], args.chunk)
        return
    header(args.threads)
    args.model = model_folder(args.model, default=default_model)
    for item in args.also:
        label, sep, folder = item.partition("=")
        if not sep or not label:
            ap.error(f"argument --also: LABEL=DIR expected, got {item!r}")
        require_model(folder, f"--also {label}'s folder")
    if args.profile:
        for threads in args.threads:
            (profile_genai if args.profile_genai else profile)(args.model, args.profile, threads)
        return
    args.openvino = openvino_choice(args)

    engines = [("genai", "genai", str(args.model), sys.executable, 0)]
    for item in args.also:
        label, _, folder = item.partition("=")
        engines.append((label, "genai", folder, sys.executable, 0))
    genai_engines = list(engines)
    if args.unchunked:
        engines += [(f"{lbl}-unchunked", "genai-unchunked", *r) for lbl, _, *r in genai_engines]
    if args.unfused:
        engines += [(f"{lbl}-unfused", "genai-unfused", *r) for lbl, _, *r in genai_engines]
    if args.ungated:
        engines += [(f"{lbl}-ungated", "genai-ungated", *r) for lbl, _, *r in genai_engines]
    if args.untrimmed:
        engines.append(("genai-untrimmed", "genai-untrimmed", str(args.model), sys.executable, 0))
    if not args.no_reference:
        engines.append(("reference", "reference", str(args.model), sys.executable, 0))
    if args.openvino:
        engines.append(("openvino-genai", "openvino", args.openvino, args.openvino_python, 0))
    if args.chunk_sizes:  # each genai / reference engine once per chunk size
        engines = [
            (f"{lbl}/chunk{c}" if c else lbl, eng, f, py, c)
            for lbl, eng, f, py, _ in engines
            for c in (args.chunk_sizes if eng != "openvino" else [0])
        ]
    workers = [
        Worker(label, engine, folder, t, python, chunk)
        for t in args.threads
        for label, engine, folder, python, chunk in engines
    ]
    results: dict[tuple[str, int, int], list[dict]] = collections.defaultdict(list)
    try:
        for w in workers:  # warm-up: first runs compile / allocate
            w.time(prompt_ids(args.model, 64, 1000))
        for r in range(args.rounds):
            for n in args.lengths:
                ids = prompt_ids(args.model, n, 7 * r + n)
                order = workers[r % len(workers) :] + workers[: r % len(workers)]
                for w in order:
                    time.sleep(0.05)  # let the previous worker's spinning threads settle
                    results[(w.label, w.threads, n)].append(w.time(ids))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for w in workers:
            w.close()

    labels = [e[0] for e in engines]
    baseline = args.baseline or ("openvino-genai" if args.openvino else "reference")
    print(f"prefill = time to the first token; {args.rounds} interleaved rounds; medians "
          "(wall range); load average at the end "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(
        f"| prompt | threads | engine | wall ms | CPU ms | wall / {baseline} | CPU / {baseline} |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.lengths:
        for t in args.threads:
            base = results.get((baseline, t, n))
            base_wall = statistics.median(x["wall"] for x in base) if base else None
            base_cpu = statistics.median(x["cpu"] for x in base) if base else None
            for label in labels:
                runs = results[(label, t, n)]
                walls = sorted(1000 * x["wall"] for x in runs)
                wall = statistics.median(walls)
                cpu = statistics.median(1000 * x["cpu"] for x in runs)
                ratio = f"{wall / (1000 * base_wall):.2f}x" if base_wall else "-"
                cpu_ratio = f"{cpu / (1000 * base_cpu):.2f}x" if base_cpu else "-"
                print(f"| {n} | {t} | {label} | {wall:.0f} ({walls[0]:.0f}-{walls[-1]:.0f}) "
                      f"| {cpu:.0f} | {ratio} | {cpu_ratio} |")  # fmt: skip


if __name__ == "__main__":
    main()
