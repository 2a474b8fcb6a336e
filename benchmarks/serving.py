"""Serving throughput: aggregate generated tokens/s and time to first token (p50/p95) with 1, 4,
8 and 16 concurrent streams of chat requests.

Engines, each in its own subprocess, run one after another per concurrency level, in
alternating order between rounds (ABC, CBA, ...):

* ``genai``: ``genai serve`` (continuous batching) in a subprocess, driven over HTTP with
  streaming chat completions (SSE) from client threads; TTFT is measured at the client;
* ``ref-engine``: onnxruntime-genai's ``Engine`` (static batching, ``max_batch_size`` 8),
  driven in-process: no HTTP in its numbers;
* ``ref-threads``: one onnxruntime-genai ``Generator`` per client thread, in-process.

Every request is a chat prompt (a different question per request) and generates exactly
``--new-tokens`` tokens (EOS ignored: ``ignore_eos`` / ``min_generated_tokens``), greedy. Each
stream sends ``--requests`` requests one after another.

    python benchmarks/serving.py [--model DIR] [--streams 1 4 8 16] [--threads N] [--rounds R]

``--threads`` sets the intra-op threads of every engine (default: each engine's default:
the reference's is half the hardware threads; genai's the same). ``--model`` takes a folder or
a cached model's name; without it, the reference-built SmolLM2 in ../shared when present, else
genai's default model. When ``genai serve`` does not start, the end of its stderr is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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
    "Describe a sunset in two sentences.",
    "Why is the sky blue?",
    "Name a famous painter.",
    "How do plants make food?",
    "What is a prime number?",
    "Give me a tip for learning to cook.",
    "What does a compiler do?",
    "Suggest a name for a dog.",
    "How far is the Moon?",
]


def _messages(i: int) -> list[dict[str, str]]:
    """Request ``i``'s chat: a question tagged with ``i``, so no two requests of a run share
    more than the chat template's system prefix (no prompt is answered from a cache)."""
    return [{"role": "user", "content": f"({i}) {QUESTIONS[i % len(QUESTIONS)]}"}]


def _summary(ttfts: list[float], tokens: int, seconds: float) -> dict[str, float]:
    ttfts = sorted(ttfts)
    p95 = ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))]
    return {
        "tok_s": tokens / seconds,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p95": p95,
        "tokens": tokens,
        "seconds": seconds,
    }


# --- workers (each runs in its own process) -------------------------------------------------
def _run_clients(streams: int, requests: int, one, base: int = 0) -> dict[str, float]:
    """``streams`` threads, each calling ``one(base + index) -> (ttft, tokens)`` ``requests``
    times (indices differ between calls with different ``base``)."""
    results: list[tuple[float, int]] = []
    lock = threading.Lock()

    def client(stream: int) -> None:
        for k in range(requests):
            ttft, tokens = one(base + stream * requests + k)
            with lock:
                results.append((ttft, tokens))

    threads = [threading.Thread(target=client, args=(s,)) for s in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return _summary([r[0] for r in results], sum(r[1] for r in results), elapsed)


def worker_genai(args: argparse.Namespace) -> dict[str, float]:
    import httpx

    from genai.serve.server import free_port

    port = free_port()
    command = [sys.executable, "-m", "genai", "serve", "-m", str(args.model), "--port", str(port)]
    command += ["--log-level", "warning", "--max-slots", str(max(16, max(args.streams)))]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.no_prefix_cache:
        command += ["--prefix-cache-mb", "0"]
    command += args.server_args.split()
    root = args.baseline if args.worker == "genai-baseline" else ROOT
    env = dict(os.environ, PYTHONPATH=str(root))
    # in the checkout's folder: `python -m genai` imports from the working directory first;
    # its stderr goes to a temporary file, printed when the server does not start
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in the finally below)
    server = subprocess.Popen(command, env=env, cwd=root, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                code = server.poll()
                why = "timed out after 120 s" if code is None else f"exited with status {code}"
                log.seek(0)
                tail = "\n".join(log.read().strip().splitlines()[-20:]) or "(nothing)"
                raise SystemExit(
                    f"genai serve did not start ({why}): {' '.join(command)}\n"
                    f"its stderr ends with:\n{tail}"
                )
            time.sleep(0.2)
        client = httpx.Client(timeout=300)

        def one(i: int) -> tuple[float, int]:
            body = {
                "messages": _messages(i),
                "max_tokens": args.new_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            start = time.perf_counter()
            ttft = None
            tokens = 0
            with client.stream("POST", url + "/v1/chat/completions", json=body) as reply:
                for line in reply.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
            return ttft or 0.0, tokens

        def engine_stats() -> dict[str, float]:
            out: dict[str, float] = {}
            for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
                name, _, value = line.rpartition(" ")
                if name.startswith(("genai_engine_seconds", "genai_decode_", "genai_prefill_")):
                    out[name.replace("_total", "")] = float(value)
            return out

        def cpu_seconds() -> tuple[float, float]:
            """CPU seconds of the server process and of this (client) process."""
            fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
            tick = os.sysconf("SC_CLK_TCK")
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return (int(fields[11]) + int(fields[12])) / tick, usage.ru_utime + usage.ru_stime

        _run_clients(min(8, max(args.streams)), 1, one, 10_000)  # warm-up (batched shapes too)
        results = {}
        for k, s in enumerate(args.streams):
            before, cpu = engine_stats(), cpu_seconds()
            results[str(s)] = _run_clients(s, args.requests, one, 1000 * (k + 1))
            after, cpu_after = engine_stats(), cpu_seconds()
            results[str(s)]["engine"] = {n: after[n] - before.get(n, 0.0) for n in after}
            results[str(s)]["server_cpu_s"] = cpu_after[0] - cpu[0]
            results[str(s)]["client_cpu_s"] = cpu_after[1] - cpu[1]
        return results
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def _ref_model(args: argparse.Namespace, engine: bool):
    import onnxruntime_genai as og

    config = og.Config(str(args.model))
    overlay: dict = {}
    if args.threads:
        overlay["model"] = {"decoder": {"session_options": {"intra_op_num_threads": args.threads}}}
    if engine:
        overlay["engine"] = {"static_batching": {"max_batch_size": 8}}
    if overlay:
        config.overlay(json.dumps(overlay))
    model = og.Model(config)
    return og, model, og.Tokenizer(model)


class _RefPrompts:
    """Request i's prompt ids for the reference (same text as the HTTP requests)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __getitem__(self, i: int):
        import numpy as np

        text = self.tokenizer.apply_chat_template(
            json.dumps(_messages(i)), add_generation_prompt=True
        )
        return np.asarray(self.tokenizer.encode(text), np.int32)


def worker_ref_threads(args: argparse.Namespace) -> dict[str, float]:
    og, model, tokenizer = _ref_model(args, engine=False)
    prompts = _RefPrompts(tokenizer)

    def one(i: int) -> tuple[float, int]:
        prompt = prompts[i]
        params = og.GeneratorParams(model)
        params.set_search_options(
            max_length=len(prompt) + args.new_tokens, min_length=len(prompt) + args.new_tokens
        )
        start = time.perf_counter()
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)
        gen.generate_next_token()
        ttft = time.perf_counter() - start
        tokens = 1
        while not gen.is_done():
            gen.generate_next_token()
            tokens += 1
        return ttft, tokens

    _run_clients(min(8, max(args.streams)), 1, one, 10_000)  # warm-up
    return {
        str(s): _run_clients(s, args.requests, one, 1000 * (k + 1))
        for k, s in enumerate(args.streams)
    }


def worker_ref_engine(args: argparse.Namespace) -> dict[str, float]:
    og, model, tokenizer = _ref_model(args, engine=True)
    prompts = _RefPrompts(tokenizer)
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(256)
    token_flag = int(og.EngineEventFlags.TOKEN.value)
    finished_flag = int(og.EngineEventFlags.TURN_FINISHED.value)

    def run_level(streams: int, base: int) -> dict[str, float]:
        # `streams` clients; each submits its next request when the previous one finishes.
        queue = {
            s: list(range(base + s * args.requests, base + (s + 1) * args.requests))
            for s in range(streams)
        }
        live: dict[int, tuple[int, float]] = {}  # id(request) -> (stream, start)
        keep: dict[int, object] = {}
        ttfts: list[float] = []
        seen_first: set[int] = set()
        tokens = 0

        def submit(stream: int) -> None:
            if not queue[stream]:
                return
            i = queue[stream].pop(0)
            request = engine.create_request()
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(args.new_tokens)
            options.set_min_generated_tokens(args.new_tokens)
            request.begin_turn(prompts[i], options)
            live[id(request)] = (stream, time.perf_counter())
            keep[id(request)] = request

        start = time.perf_counter()
        for s in range(streams):
            submit(s)
        while engine.has_pending_requests():
            events = engine.run(buffer)
            now = time.perf_counter()
            for k in range(len(events)):
                event = events[k]
                key = id(event.request) if event.request is not None else None
                flags = (
                    int(event.flags.value) if hasattr(event.flags, "value") else int(event.flags)
                )
                stream_start = None
                for rid, (stream, began) in live.items():
                    if keep[rid] is event.request or rid == key:
                        key, stream_start = rid, (stream, began)
                        break
                if stream_start is None:
                    continue
                if flags & token_flag:
                    tokens += 1
                    if key not in seen_first:
                        seen_first.add(key)
                        ttfts.append(now - stream_start[1])
                if flags & finished_flag:
                    live.pop(key)
                    keep.pop(key).close()
                    submit(stream_start[0])
        if not tokens:
            raise SystemExit(
                f"the reference's Engine made no tokens on {args.model}: it needs logits for "
                "every position (../shared's reference-built SmolLM2, or `genai build GGUF -o DIR "
                "--all-logits`); --engines genai ref-threads leaves it out"
            )
        return _summary(ttfts, tokens, time.perf_counter() - start)

    saved, args.requests = args.requests, 1
    run_level(min(8, max(args.streams)), 10_000)  # warm-up (batched shapes too)
    args.requests = saved
    return {str(s): run_level(s, 1000 * (k + 1)) for k, s in enumerate(args.streams)}


PHASES = ("model", "host", "idle")

WORKERS = {
    "genai": worker_genai,
    "genai-baseline": worker_genai,  # `genai serve` of another checkout (--baseline DIR)
    "ref-engine": worker_ref_engine,
    "ref-threads": worker_ref_threads,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(parser)
    parser.add_argument("--streams", type=positive_int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--requests", type=positive_int, default=2, help="requests per stream")
    parser.add_argument("--new-tokens", type=positive_int, default=48)
    parser.add_argument("--threads", type=positive_int, help="intra-op threads of every engine")
    parser.add_argument("--rounds", type=positive_int, default=1)
    parser.add_argument("--engines", nargs="+", choices=list(WORKERS))
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of this repository (built): adds engine genai-baseline, its "
        "`genai serve`, to compare code versions in the same rounds",
    )
    parser.add_argument("--no-prefix-cache", action="store_true", help="genai without it")
    parser.add_argument("--server-args", default="", help="more `genai serve` options")
    parser.add_argument("--json", type=Path, help="write all results here")
    parser.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engines is None:
        args.engines = [n for n in WORKERS if n != "genai-baseline" or args.baseline]
    if "genai-baseline" in args.engines and not args.baseline:
        parser.error("engine genai-baseline needs --baseline DIR")
    if args.baseline and not (args.baseline / "genai" / "__init__.py").is_file():
        parser.error(f"argument --baseline: {args.baseline} is not a checkout of this repository")
    if args.worker:
        args.model = Path(args.model)
        print(json.dumps(WORKERS[args.worker](args)))
        return
    header(args.threads)
    args.model = model_folder(args.model).resolve()
    results: dict[str, list[dict]] = {name: [] for name in args.engines}
    for round_ in range(args.rounds):
        order = args.engines if round_ % 2 == 0 else list(reversed(args.engines))
        for name in order:
            command = [sys.executable, __file__, "--worker", name, "--model", str(args.model)]
            command += ["--streams", *map(str, args.streams), "--requests", str(args.requests)]
            command += ["--new-tokens", str(args.new_tokens)]
            if args.threads:
                command += ["--threads", str(args.threads)]
            if args.no_prefix_cache:
                command += ["--no-prefix-cache"]
            if args.server_args:
                command += [f"--server-args={args.server_args}"]
            if args.baseline:
                command += ["--baseline", str(args.baseline)]
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name} failed")
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1}: {name} done", file=sys.stderr)
    threads = args.threads or "default"
    print(f"\nthreads: {threads}; {args.new_tokens} new tokens/request, {args.requests} "
          f"requests/stream; medians of {args.rounds} round(s)")  # fmt: skip
    print(f"{'streams':>7}  {'engine':<12} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p95':>9}")
    for streams in map(str, args.streams):
        best_ref = 0.0
        for name in args.engines:
            runs = [r[streams] for r in results[name]]
            tok_s = statistics.median(r["tok_s"] for r in runs)
            p50 = statistics.median(r["ttft_p50"] for r in runs)
            p95 = statistics.median(r["ttft_p95"] for r in runs)
            if name.startswith("ref"):
                best_ref = max(best_ref, tok_s)
            print(f"{streams:>7}  {name:<12} {tok_s:7.1f} {p50:8.3f}s {p95:8.3f}s")
        if "genai" in results and best_ref:
            ours = statistics.median(r[streams]["tok_s"] for r in results["genai"])
            print(f"{'':>7}  genai / best reference: {ours / best_ref:.2f}x")
        if "genai" in results and "genai-baseline" in results:
            ours = statistics.median(r[streams]["tok_s"] for r in results["genai"])
            base = statistics.median(r[streams]["tok_s"] for r in results["genai-baseline"])
            print(f"{'':>7}  genai / genai-baseline: {ours / base:.2f}x")
        for run in results.get("genai", []):
            e, level = run[streams].get("engine"), run[streams]
            if e:
                phase = {p: e.get(f'genai_engine_seconds{{phase="{p}"}}', 0.0) for p in PHASES}
                steps = e.get("genai_decode_steps", 0) or 1
                rows = e.get('genai_decode_rows{kind="advancing"}', 0)
                print(
                    f"{'':>7}  genai engine: {level['seconds']:.2f} s wall; scheduler threads "
                    f"(summed) model {phase['model']:.2f} s, host {phase['host']:.2f} s, idle "
                    f"{phase['idle']:.2f} s; {steps:.0f} decode steps, "
                    f"{rows / steps:.1f} rows/step, {e.get('genai_prefill_tokens', 0):.0f} "
                    f"prefill tokens in {e.get('genai_prefill_runs', 0):.0f} runs; CPU s: "
                    f"server {level.get('server_cpu_s', 0):.1f}, "
                    f"client {level.get('client_cpu_s', 0):.1f}"
                )
    if args.json:
        saved = vars(args) | {
            "model": str(args.model),
            "json": str(args.json),
            "baseline": str(args.baseline or ""),
        }
        args.json.write_text(json.dumps({"args": saved, "results": results}, indent=2))


if __name__ == "__main__":
    main()
