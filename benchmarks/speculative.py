"""Prompt-lookup (n-gram) speculative decoding: speed-up over plain greedy decoding, genai and
onnxruntime-genai side by side, with the tokens checked identical.

    python benchmarks/speculative.py [-m MODEL_DIR]... [--rounds 3] [--new-tokens 120]
                                     [--threads 1] [--tasks repeat rewrite ...]
                                     [--configs "ngram 3/3" "ngram 3/adaptive" ...]

For each model folder (default: genai's default model, as our builder writes it, and the
reference-built SmolLM2 in ../shared when present) and each task (a chat prompt: repeat a
passage, rewrite it, extract from it, edit code, open-ended chat), greedy, ``--new-tokens`` new
tokens at most: plain decoding and n-gram decoding (``ngram_size`` / ``max_draft_tokens``
configurations), for genai and the reference (the reference's n-gram decoding only runs on
folders with a logits row per position: it refuses our builder's last-token graph). Rounds are
interleaved; the table shows median tokens/s, the speed-up over the same engine's plain
decoding, the acceptance rate, tokens per counted target run (the stats' verify and re-anchor
runs plus plain steps: the one-token run before a round that follows a plain step is counted by
neither engine), and whether the generated tokens equal plain decoding's ("same") and the
reference's with the same options on the same folder ("same as ref").

A folder built before ``new_token_logits`` (genai's builder, 2026-12-01) cannot verify proposals:
rebuild it (``genai pull --force`` for the default model) or pass ``--build`` to build a current
copy of the default model into a temporary folder (removed at the end).

Before the rounds, each engine runs each configuration once untimed on the ``repeat`` prompt (the
first speculative generation of a model sets up what its verify runs need, ~240 ms more).
``-m`` takes a folder or a cached model's name (as ``genai -m``), and may be repeated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench_args import SHARED_MODEL, default_model, header, model_folder, positive_int

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import genai  # noqa: E402
from genai.builder import pull  # noqa: E402

SHARED = SHARED_MODEL

PASSAGE = (
    "The town council met on Tuesday evening to discuss the new budget. After a long debate, "
    "the members approved funds for road repairs, two public libraries, and a community garden "
    "near the river. The mayor said the garden would open in the spring, and that volunteers "
    "could sign up at the town hall. Residents who want to comment on the plan can write to the "
    "council before the end of the month, or speak at the next public meeting on the first "
    "Monday of May."
)
CODE = (
    "def total_price(items, tax_rate):\n"
    "    total = 0\n"
    "    for item in items:\n"
    "        total = total + item.price * item.quantity\n"
    "    total = total + total * tax_rate\n"
    "    return total\n"
)
TASKS = {
    "repeat": f"Repeat this passage exactly:\n\n{PASSAGE}",
    "rewrite": f"Rewrite this passage in the past tense, changing nothing else:\n\n{PASSAGE}",
    "extract": f"Copy every sentence of this passage that mentions the council:\n\n{PASSAGE}",
    "code-edit": (
        "Rename the variable `total` to `amount` in this Python function and return the "
        f"whole function:\n\n```python\n{CODE}```"
    ),
    "chat": "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
}
#: (label, speculative options); None: plain decoding.
CONFIGS: list[tuple[str, dict[str, object] | None]] = [
    ("plain", None),
    ("ngram 3/2", {"ngram_size": 3, "max_draft_tokens": 2}),
    ("ngram 3/3", {"ngram_size": 3, "max_draft_tokens": 3}),
    ("ngram 3/4", {"ngram_size": 3, "max_draft_tokens": 4}),
    ("ngram 3/adaptive", {"ngram_size": 3, "max_draft_tokens": 4, "min_adaptive_k": 1}),
]


def load(engine, folder: Path, threads: int):
    config = engine.Config(str(folder))
    overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}
    config.overlay(json.dumps(overlay))
    return engine.Model(config)


def prompt_ids(folder: Path, task: str) -> np.ndarray:
    tokenizer = genai.Tokenizer(genai.Model(str(folder)))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": TASKS[task]}], add_generation_prompt=True
    )
    return np.asarray(tokenizer.encode(text), np.int32)


def run(engine, model, ids: np.ndarray, new_tokens: int, spec) -> tuple[list[int], float, dict]:
    params = engine.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens)
    if spec:
        params.set_speculative_options(**spec)
    gen = engine.Generator(model, params)
    gen.append_tokens(ids[None, :])
    started = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()
    elapsed = time.perf_counter() - started
    tokens = [int(t) for t in gen.get_sequence(0)][len(ids) :]
    return tokens, elapsed, gen.get_speculative_stats()


def can_verify(engine, model) -> bool:
    params = engine.GeneratorParams(model)
    params.set_speculative_options(ngram_size=3)
    try:
        engine.Generator(model, params)
    except RuntimeError as exc:  # the refusal of a graph with last-token logits only
        if isinstance(exc, genai.SearchOptionError):
            raise  # a bad folder, not a graph that cannot verify
        return False
    return True


def bench_folder(folder: Path, args: argparse.Namespace) -> list[dict]:
    engines = [("genai", genai)]
    if not args.no_reference:
        import onnxruntime_genai as og  # lazy: the reference is a test dependency

        engines.append(("onnxruntime-genai", og))
    models = {name: load(engine, folder, args.threads) for name, engine in engines}
    warm_up(engines, models, prompt_ids(folder, "repeat"), args)
    rows = []
    for task in args.tasks:
        ids = prompt_ids(folder, task)
        times: dict[tuple[str, str], list[float]] = {}
        results: dict[tuple[str, str], tuple[list[int], dict]] = {}
        for r in range(args.rounds):
            order = engines if r % 2 == 0 else engines[::-1]
            for name, engine in order:
                model = models[name]
                for label, spec in CONFIGS:
                    if label not in args.configs and spec:
                        continue
                    if spec and not can_verify(engine, model):
                        continue
                    tokens, elapsed, stats = run(engine, model, ids, args.new_tokens, spec)
                    times.setdefault((name, label), []).append(len(tokens) / elapsed)
                    results[(name, label)] = (tokens, stats)
        for (name, label), speeds in times.items():
            tokens, stats = results[(name, label)]
            plain_tokens = results[(name, "plain")][0]
            plain_speed = statistics.median(times[(name, "plain")])
            speed = statistics.median(speeds)
            runs = stats["target_forward_passes"] + stats["standard_fallback_steps"]
            rows.append(
                {
                    "folder": folder.name if folder != SHARED else "shared (reference-built)",
                    "task": task,
                    "engine": name,
                    "config": label,
                    "tokens": len(tokens),
                    "tok/s": speed,
                    "speed-up": speed / plain_speed,
                    "acceptance": stats["acceptance_rate"] if label != "plain" else None,
                    "tokens/run": len(tokens) / runs if label != "plain" and runs else None,
                    "same": tokens == plain_tokens,
                    "same as ref": (
                        tokens == results[("onnxruntime-genai", label)][0]
                        if name == "genai" and ("onnxruntime-genai", label) in results
                        else None
                    ),
                }
            )
    return rows


def warm_up(engines: list, models: dict, ids: np.ndarray, args: argparse.Namespace) -> None:
    """One untimed run of every (engine, configuration) the rounds time: a model's first
    speculative generation sets up what its verify runs need (genai's is ~240 ms slower)."""
    for name, engine in engines:
        for label, spec in CONFIGS:
            if spec and (label not in args.configs or not can_verify(engine, models[name])):
                continue
            run(engine, models[name], ids, args.new_tokens, spec)


def default_folder(args: argparse.Namespace, work: Path) -> Path:
    """genai's default model (pulled on first use); ``--build``: a current build of it in
    ``work``."""
    if not args.build:
        return default_model()
    gguf = pull.default_source_path()
    if not gguf.is_file():
        gguf = pull.fetch_default_gguf(work, progress=True)
    from genai.builder.build import build  # lazy: only --build needs the builder

    return build(gguf, work / "model", precision="int4")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-m",
        "--model",
        action="append",
        default=None,
        help="model folder or cached model name (repeatable; default: genai's default model "
        "and ../shared's SmolLM2 when present)",
    )
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--new-tokens", type=positive_int, default=120)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    labels = [label for label, spec in CONFIGS if spec]
    parser.add_argument(
        "--configs", nargs="+", default=labels, choices=labels, help="(plain always runs)"
    )
    parser.add_argument("--build", action="store_true", help="build a current default model")
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    header(args.threads)
    with tempfile.TemporaryDirectory(prefix="genai-speculative-") as work:
        if args.model:
            folders = [model_folder(spec) for spec in args.model]
        else:
            folders = [default_folder(args, Path(work))]
            folders += [SHARED] if (SHARED / "genai_config.json").is_file() else []
        rows = []
        for folder in folders:
            rows += bench_folder(folder, args)
    print_table(rows, "folder")


def print_table(rows: list[dict], first: str) -> None:
    """The rows as a ``|``-separated table: column ``first`` (the folder or pair), then the
    task, engine, configuration and measures."""
    columns = (first, "task", "engine", "config", "tokens", "tok/s", "speed-up", "acceptance")
    columns += ("tokens/run",)
    columns += ("plain steps",) if any("plain steps" in row for row in rows) else ()
    columns += ("same", "same as ref")
    print(" | ".join(columns))
    for row in rows:
        cells = []
        for key in columns:
            value = row[key]
            if isinstance(value, float):
                value = f"{value:.2f}"
            cells.append("-" if value is None else str(value))
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
