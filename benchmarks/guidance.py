"""Cost of the guidance mask per token: genai vs onnxruntime-genai, JSON schema, vocab 49152.

    PYTHONPATH=. python benchmarks/guidance.py [-m MODEL_DIR] [--rounds 5] [--threads 1]

Both engines load the same model folder in this process with the same intra-op thread count.
For each chat prompt, four generators decode it greedily side by side, one step each in turn:
genai guided by a JSON schema (`set_guidance("json_schema", ...)`), genai unguided, and the
same two for the reference (the engine that goes first alternates per prompt and round). The
guided ones end with the EOS the mask forces once the grammar completes (both engines write the
same tokens); the unguided ones make as many tokens (``min_length`` bans EOS until then).
Interleaving steps exposes all four to the same machine load, so the per-step times stay
comparable on a busy machine. The mask cost per token is what guidance adds to a decoding step:
guided minus unguided step time (both the median and the 10 %-trimmed mean of the per-step times),
covering the mask computation not hidden behind the model run, applying the mask and the
Python-level work. Only decoding steps are timed (prefill and generator creation excluded).
genai's generators are created with decode ahead off (``GENAI_DECODE_AHEAD=0``; it is off for
guided generators anyway): with it on, the unguided generator's ``generate_next_token`` mostly
takes a token its native worker already made, and "guided minus unguided" becomes a whole model
step. ``-m`` takes a folder or a cached model's name; without it, the reference-built SmolLM2 in
../shared when present, else genai's default model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from _bench_args import (
    DECODE_AHEAD_NOTE,
    add_model_argument,
    decode_ahead_off,
    header,
    model_folder,
    positive_int,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import genai  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}
SUBJECTS = ["a doctor from Paris", "a retired teacher", "a chef who loves Italian food", "a pilot"]


def load(engine, folder: Path, threads: int):
    config = engine.Config(str(folder))
    config.overlay(
        json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}})
    )
    return engine.Model(config)


def generator(engine, model, ids: np.ndarray, max_length: int, schema: str | None, min_length=0):
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=max_length, min_length=min_length)
    if schema is not None:
        params.set_guidance("json_schema", schema)
    with decode_ahead_off():  # per-step timings: every step in the caller's thread
        gen = engine.Generator(model, params)
    gen.append_tokens(ids)
    return gen


def guided_length(model, ids: np.ndarray, schema: str) -> int:
    """Steps the guided greedy decoding of ``ids`` takes (EOS step included)."""
    gen = generator(genai, model, ids, len(ids) + 256, schema)
    steps = 0
    while not gen.is_done():
        gen.generate_next_token()
        steps += 1
    return steps


def one_prompt(engines, ids: np.ndarray, schema: str, first: int) -> dict[str, list[float]]:
    """Per-step seconds of the four generators on one prompt, steps interleaved."""
    steps = guided_length(engines[0][2], ids, schema)
    runs = []
    for name, engine, model in engines[first:] + engines[:first]:
        runs.append((f"{name} guided", generator(engine, model, ids, len(ids) + 256, schema)))
        runs.append(
            (
                f"{name} unguided",
                generator(engine, model, ids, len(ids) + steps, None, len(ids) + steps),
            )
        )
    times: dict[str, list[float]] = {key: [] for key, _ in runs}
    tokens: dict[str, list[int]] = {key: [] for key, _ in runs}
    clock = time.perf_counter
    for _ in range(steps):
        for key, gen in runs:
            start = clock()
            gen.generate_next_token()
            times[key].append(clock() - start)
            tokens[key].append(int(gen.get_next_tokens()[0]))
    for key, gen in runs:
        assert gen.is_done(), key
    assert tokens["genai guided"] == tokens["reference guided"], "guided tokens differ"
    return times


def trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    ordered = sorted(values)
    drop = int(len(ordered) * cut)
    kept = ordered[: len(ordered) - drop] if drop else ordered
    return sum(kept) / len(kept)


def mask_only(folder: Path, prompts: list[np.ndarray], model, schema: str) -> float:
    """Our mask alone (no model run to hide behind): microseconds per token to compute and
    apply the mask and consume the token, replaying the guided greedy outputs."""
    from genai.constraints.guidance import TokenConstraint

    tokenizer = genai.Tokenizer(model)
    eos = int(model.config.eos_token_ids[0])
    rows, total = [], 0.0
    for ids in prompts:
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + 256)
        params.set_guidance("json_schema", schema)
        generator = genai.Generator(model, params)
        generator.append_tokens(ids)
        generator.generate_until_done()
        rows.append(generator.get_sequence(0)[len(ids) :])
    logits = np.random.default_rng(0).standard_normal(model.io.vocab_size).astype(np.float32)
    count = 0
    for out in rows:
        constraint = TokenConstraint.create(tokenizer, "json_schema", schema, eos_token_id=eos)
        row = logits.copy()
        for token in out:
            start = time.perf_counter()
            constraint.fill_mask(row)
            constraint.advance(int(token))
            total += time.perf_counter() - start
            count += 1
            if int(token) == eos:
                break
    return 1e6 * total / count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=DECODE_AHEAD_NOTE + "."
    )
    add_model_argument(parser)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args()
    header(args.threads)
    args.model = model_folder(args.model)
    import onnxruntime_genai as og

    vocab = json.loads((args.model / "genai_config.json").read_text())["model"]["vocab_size"]
    ours = load(genai, args.model, args.threads)
    ref = load(og, args.model, args.threads)
    engines = [("genai", genai, ours), ("reference", og, ref)]
    tokenizer = genai.Tokenizer(ours)
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                json.dumps([{"role": "user", "content": f"Describe {s} as a JSON object."}]),
                add_generation_prompt=True,
            )
        )
        for s in SUBJECTS
    ]
    schema = json.dumps(SCHEMA)
    one_prompt(engines, prompts[0], schema, 0)  # warm up: sessions, tokenizers, grammars
    times: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for i, ids in enumerate(prompts):
            for key, values in one_prompt(engines, ids, schema, (r + i) % 2).items():
                times.setdefault(key, []).extend(values)
        print(f"round {r + 1}/{args.rounds}: {len(times['genai guided'])} steps each", flush=True)

    def us(key: str, stat) -> float:
        return 1e6 * stat(times[key])

    steps = len(times["genai guided"])
    print(f"\nvocab {vocab}, {len(prompts)} prompts x {args.rounds} rounds = {steps} guided steps")
    print(
        f"per engine, {args.threads} intra-op thread; per-step times in us (median / trimmed mean)"
        "; genai's decode ahead off"
    )
    print("| engine | unguided step | guided step | mask cost per token |")
    print("|---|---|---|---|")
    cost = {}
    for name in ("genai", "reference"):
        row = []
        for stat in (statistics.median, trimmed_mean):
            plain, guided = us(f"{name} unguided", stat), us(f"{name} guided", stat)
            row.append((plain, guided, guided - plain))
        cost[name] = row
        (pm, gm, cm), (pt, gt, ct) = row
        print(f"| {name} | {pm:.0f} / {pt:.0f} | {gm:.0f} / {gt:.0f} | {cm:.0f} / {ct:.0f} |")
    for i, label in enumerate(("median", "trimmed mean")):
        ours_cost, ref_cost = cost["genai"][i][2], cost["reference"][i][2]
        ratio = ours_cost / ref_cost if ref_cost > 0 else float("nan")
        guided = cost["genai"][i][1] / cost["reference"][i][1]
        print(f"{label}: mask cost ratio genai/reference {ratio:.2f}x; guided step {guided:.3f}x")
    alone = mask_only(args.model, prompts, ours, schema)
    print(f"our mask alone (compute + apply + consume, nothing to overlap with): {alone:.0f} us")


if __name__ == "__main__":
    main()
