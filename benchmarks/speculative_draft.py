"""Draft-model speculative decoding: speed-up over plain greedy decoding of the target, genai and
onnxruntime-genai side by side on the same folders, with the tokens checked identical.

    python benchmarks/speculative_draft.py [--rounds 3] [--new-tokens 120] [--threads 1]
                                           [--tasks repeat chat ...] [--ks 2 4] [--work DIR]
                                           [--min-adaptive-k 1]

Two pairs, each a target folder and a copy of it whose ``model.draft`` is the draft's decoder
(`genai.testing.speculative.with_draft`; the reference's folder format, so both engines run it):

* **real**: the default model's weights (SmolLM2-135M-Instruct, the GGUF ``genai pull`` builds
  from) built twice by our builder: the target in fp32 with logits for every position (the
  reference verifies only on such graphs), the draft int4 (the default model as ``genai pull``
  writes it). The draft shares the target's tokenizer and most of its predictions;
* **fixture** (``--pairs fixture``): `genai.testing.models.write_gqa_decoder` random weights,
  hidden 256: a 4-layer target and a 1-layer draft from the same seed. Random layers do not
  agree, so nothing is accepted: it measures what a useless draft costs.

For each pair, task and engine: plain decoding of the target folder, then the combined folder
with ``max_draft_tokens`` = each ``--ks`` (and with ``--min-adaptive-k``, each again as adaptive
K's maximum). Rounds are interleaved (engines alternate first);
the table shows median tokens/s, the speed-up over the same engine's plain decoding, the
acceptance rate, tokens per target run, the plain steps among the calls (adaptive K's backing
off, cooldown), and whether the tokens equal plain decoding's ("same") and the reference's
("same as ref"). Before the rounds, each engine runs each configuration once untimed (a
model's first speculative generation sets up what its verify runs need).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
from _bench_args import default_model, header, non_negative_int, positive_int

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from speculative import TASKS, load, print_table, prompt_ids, run  # noqa: E402

import genai  # noqa: E402
from genai.builder import pull  # noqa: E402
from genai.testing.models import write_gqa_decoder  # noqa: E402
from genai.testing.speculative import with_draft  # noqa: E402

#: Prompt ids of the fixture pair (its vocabulary has 256 ids).
FIXTURE_PROMPT = np.asarray([5, 9, 12, 3, 30, 41, 7, 7, 100, 200, 17], np.int32)


def real_pair(work: Path) -> tuple[Path, Path]:
    """(target folder, target + draft folder) from the default model's GGUF."""
    from genai.builder.build import build  # lazy: only this pair needs the builder

    target, combined = work / "real-target-fp32", work / "real-fp32-with-int4-draft"
    if not combined.is_dir():
        gguf = pull.default_source_path()
        if not gguf.is_file():
            raise SystemExit(f"{gguf} is missing: run `genai pull --keep-source` first")
        if not target.is_dir():
            build(gguf, target, precision="fp32", all_logits=True)
        with_draft(target, default_model(), work, name=combined.name)
    return target, combined


def fixture_pair(work: Path) -> tuple[Path, Path]:
    """(target folder, target + draft folder) of random GQA decoders."""
    target, combined = work / "fixture-target", work / "fixture-with-draft"
    if not combined.is_dir():
        kwargs = {"vocab_size": 256, "hidden_size": 256, "num_heads": 4, "num_kv_heads": 2}
        write_gqa_decoder(work, seed=11, num_layers=4, name=target.name, **kwargs)
        draft = write_gqa_decoder(work, seed=11, num_layers=1, name="fixture-draft", **kwargs)
        with_draft(target, draft, work, name=combined.name)
    return target, combined


def bench_pair(
    pair: str, target: Path, combined: Path, args: argparse.Namespace, engines: list
) -> list[dict]:
    models = {
        (name, kind): load(engine, folder, args.threads)
        for name, engine in engines
        for kind, folder in (("plain", target), ("draft", combined))
    }
    configs: list[tuple[str, str, dict | None]] = [("plain", "plain", None)]
    configs += [(f"draft K={k}", "draft", {"max_draft_tokens": k}) for k in args.ks]
    if args.min_adaptive_k:
        adaptive = {"min_adaptive_k": args.min_adaptive_k}
        configs += [
            (f"draft K={k} adaptive", "draft", {"max_draft_tokens": k, **adaptive}) for k in args.ks
        ]
    tasks = args.tasks if pair == "real" else ["fixture"]
    warm = prompt_ids(target, tasks[0]) if pair == "real" else FIXTURE_PROMPT
    for name, engine in engines:  # untimed: the first speculative run sets up verify runs
        for _, kind, spec in configs:
            run(engine, models[(name, kind)], warm, args.new_tokens, spec)
    rows = []
    for task in tasks:
        ids = prompt_ids(target, task) if pair == "real" else FIXTURE_PROMPT
        times: dict[tuple[str, str], list[float]] = {}
        results: dict[tuple[str, str], tuple[list[int], dict]] = {}
        for r in range(args.rounds):
            for name, engine in engines if r % 2 == 0 else engines[::-1]:
                for label, kind, spec in configs:
                    tokens, elapsed, stats = run(
                        engine, models[(name, kind)], ids, args.new_tokens, spec
                    )
                    times.setdefault((name, label), []).append(len(tokens) / elapsed)
                    results[(name, label)] = (tokens, stats)
        for (name, label), speeds in times.items():
            tokens, stats = results[(name, label)]
            speed = statistics.median(speeds)
            runs = stats["target_forward_passes"] + stats["standard_fallback_steps"]
            ref = results.get(("onnxruntime-genai", label))
            rows.append(
                {
                    "pair": pair,
                    "task": task,
                    "engine": name,
                    "config": label,
                    "tokens": len(tokens),
                    "tok/s": speed,
                    "speed-up": speed / statistics.median(times[(name, "plain")]),
                    "acceptance": stats["acceptance_rate"] if label != "plain" else None,
                    "tokens/run": len(tokens) / runs if label != "plain" and runs else None,
                    "plain steps": stats["standard_fallback_steps"] if label != "plain" else None,
                    "same": tokens == results[(name, "plain")][0],
                    "same as ref": tokens == ref[0] if name == "genai" and ref else None,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--new-tokens", type=positive_int, default=120)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--tasks", nargs="+", default=["repeat", "chat"], choices=list(TASKS))
    parser.add_argument("--ks", type=positive_int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--min-adaptive-k",
        type=non_negative_int,
        default=0,
        help="also run each K as adaptive K's maximum, from this minimum (0: fixed K only)",
    )
    parser.add_argument("--pairs", nargs="+", default=["real"], choices=["real", "fixture"])
    parser.add_argument(
        "--work",
        type=Path,
        default=Path.home() / ".cache" / "genai" / "bench-speculative-draft",
        help="where the pairs are built (kept for the next run)",
    )
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    header(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    engines: list = [("genai", genai)]
    if not args.no_reference:
        import onnxruntime_genai as og  # lazy: the reference is a test dependency

        engines.append(("onnxruntime-genai", og))
    makers = {"real": real_pair, "fixture": fixture_pair}
    rows = []
    for pair in args.pairs:
        rows += bench_pair(pair, *makers[pair](args.work), args, engines)
    print_table(rows, "pair")


if __name__ == "__main__":
    main()
