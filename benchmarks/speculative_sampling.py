"""Draft-model speculative *sampling*: how often the target keeps the draft's proposals and what
that gives, with proposals drawn from the draft's q and kept with min(1, p/q) (genai since
2026-12-03, as the reference) against the one-token accept test genai used before (the target's
own draw must equal the draft's greedy proposal).

    python benchmarks/speculative_sampling.py [--seeds 5] [--new-tokens 80] [--ks 4]
                                              [--work DIR] [--self-draft]

The pair is `speculative_draft.py`'s **real** one: the default model's weights as an fp32
target with an int4 draft (``--self-draft``: the int4 default model as its own draft). Each
seed samples with top_k 40, top_p 0.95, temperature 0.8; modes alternate per seed. The table
shows the acceptance rate, tokens per target run (verify runs and plain steps), and tokens/s
with the ratio to plain sampling of the target. Before the timed runs, plain sampling and each
mode of each K run once untimed (a model's first speculative generation sets up what its verify
runs need: timed, it would be charged to whichever mode went first). Without ``--work`` the pair
is built into a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _bench_args import default_model, header, positive_int

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from speculative_draft import real_pair  # noqa: E402

import genai  # noqa: E402
from genai.testing.speculative import with_draft  # noqa: E402

PROMPT = "Write a short story about a robot who learns to paint."
SEARCH = {"do_sample": True, "top_k": 40, "top_p": 0.95, "temperature": 0.8}


def sample(model: genai.Model, ids, seed: int, new: int, mode: str) -> tuple[float, int, dict]:
    """(seconds, new tokens, speculative stats) of one sampled generation."""
    params = genai.GeneratorParams(model)
    params.set_search_options(random_seed=seed, max_length=len(ids) + new, **SEARCH)
    gen = genai.Generator(model, params)
    if mode == "one-token test":
        gen._spec._stream = None  # the accept test genai used before 2026-12-03
    gen.append_tokens(ids)
    started = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()
    return time.perf_counter() - started, gen.token_count() - len(ids), gen.get_speculative_stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=positive_int, default=5)
    parser.add_argument("--new-tokens", type=positive_int, default=80)
    parser.add_argument("--ks", type=positive_int, nargs="+", default=[4])
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="where the pair is built and kept (default: a temporary folder, removed at the end)",
    )
    parser.add_argument("--self-draft", action="store_true")
    args = parser.parse_args()
    header()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        measure(args, args.work)
        return
    with tempfile.TemporaryDirectory(prefix="genai-spec-sampling-") as work:
        measure(args, Path(work))


def measure(args: argparse.Namespace, work: Path) -> None:
    """Build (or reuse) the pair in ``work``, sample, print the table."""
    target = default_model() if args.self_draft else real_pair(work)[0]
    plain = genai.Model(str(target))
    ids = genai.Tokenizer(plain).encode(PROMPT)
    sample_plain(plain, ids, args.seeds, args.new_tokens)  # warm-up, untimed
    base = [sample_plain(plain, ids, seed, args.new_tokens) for seed in range(args.seeds)]
    base_rate = sum(n for _, n in base) / sum(t for t, _ in base)
    print(f"pair: {'self-draft' if args.self_draft else 'fp32 target, int4 draft'}")
    print(f"plain sampling of the target: {base_rate:.1f} tokens/s")
    print("| K | accept test | acceptance | tokens per target run | tokens/s | vs plain |")
    print("|---|---|---|---|---|---|")
    for k in args.ks:
        folder = work / (f"k{k}-self-draft" if args.self_draft else f"k{k}")
        if not (folder / "genai_config.json").is_file():  # (a --work folder keeps it)
            folder = with_draft(
                target,
                None if args.self_draft else default_model(),
                work,
                name=folder.name,
                speculative={"max_draft_tokens": k},
            )
        model = genai.Model(str(folder))
        found: dict[str, list] = {"one-token test": [], "min(1, p/q)": []}
        for mode in found:  # warm-up, untimed: neither mode is charged the first run's setup
            sample(model, ids, args.seeds, args.new_tokens, mode)
        for seed in range(args.seeds):
            modes = list(found) if seed % 2 == 0 else list(reversed(found))
            for mode in modes:
                found[mode].append(sample(model, ids, seed, args.new_tokens, mode))
        for mode, runs in found.items():
            seconds = sum(t for t, _, _ in runs)
            tokens = sum(n for _, n, _ in runs)
            accepted = sum(s["draft_tokens_accepted"] for _, _, s in runs)
            evaluated = sum(s["draft_tokens_evaluated"] for _, _, s in runs)
            target_runs = sum(
                s["target_forward_passes"] + s["standard_fallback_steps"] for _, _, s in runs
            )
            rate = tokens / seconds
            print(
                f"| {k} | {mode} | {accepted / max(evaluated, 1):.3f} | "
                f"{tokens / max(target_runs, 1):.2f} | {rate:.1f} | {rate / base_rate:.2f}x |"
            )


def sample_plain(model: genai.Model, ids, seed: int, new: int) -> tuple[float, int]:
    """(seconds, new tokens) of plain sampling."""
    params = genai.GeneratorParams(model)
    params.set_search_options(random_seed=seed, max_length=len(ids) + new, **SEARCH)
    gen = genai.Generator(model, params)
    gen.append_tokens(ids)
    started = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()
    return time.perf_counter() - started, gen.token_count() - len(ids)


if __name__ == "__main__":
    main()
