"""Per-step sampling time through the Generator, genai vs onnxruntime-genai.

Each step: ``set_logits`` (random logits, standard normal * 3) then ``generate_next_token``
with top_k=50, top_p=0.9, temperature=0.7, repetition_penalty=1.1 on a tiny fixture model
whose vocabulary is the size under test. The reference only accepts set_logits once the
pending token's logits are computed, so each step first calls get_logits (untimed, both
engines); the timed part is the search step itself as users drive it. genai's generators are
created with decode ahead off (``GENAI_DECODE_AHEAD=0``), so each step runs in the caller's
thread as the reference's (with it on, a native worker runs the model ahead between the calls).
The kernel-only numbers (and the NumPy twin) come from ``benchmarks/sampling_kernels.py``.

    PYTHONPATH=. python benchmarks/sampling.py [--vocab 32000 151936] [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bench_args import DECODE_AHEAD_NOTE, decode_ahead_off, header, positive_int

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import genai
from genai.testing.models import write_gqa_decoder

VOCABS = (32000, 49152, 128256, 151936, 262144)
OPTIONS = {
    "do_sample": True,
    "top_k": 50,
    "top_p": 0.9,
    "temperature": 0.7,
    "repetition_penalty": 1.1,
    "random_seed": 1,
}


def per_step_ms(engine, model, logits: np.ndarray, prompt: np.ndarray) -> float:
    """Median ms of set_logits + generate_next_token over len(logits) steps (genai's generator
    with decode ahead off: every step in the caller's thread, as the reference's)."""
    params = engine.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + len(logits) + 1, **OPTIONS)
    with decode_ahead_off():
        generator = engine.Generator(model, params)
    generator.append_tokens(prompt)
    times = []
    for row in logits:
        generator.get_logits()  # the reference needs the pending logits computed first (untimed)
        start = time.perf_counter()
        generator.set_logits(row[None, :])
        generator.generate_next_token()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import onnxruntime_genai as og

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=DECODE_AHEAD_NOTE + "."
    )
    parser.add_argument("--vocab", type=positive_int, nargs="+", default=list(VOCABS))
    parser.add_argument("--steps", type=positive_int, default=200)
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args(argv)
    if min(args.vocab) < 4:
        parser.error("argument --vocab: at least 4 (the prompt's ids start at 3)")
    header()
    with tempfile.TemporaryDirectory(prefix="genai-bench-sampling-") as root:
        return measure(og, args, Path(root))


def measure(og, args: argparse.Namespace, root: Path) -> int:
    """Write the fixtures into ``root`` (removed by the caller), time, print."""
    print(
        f"options {OPTIONS}, {args.steps} steps x {args.rounds} rounds, medians; genai's decode "
        "ahead off"
    )
    print(f"{'vocab':>7} {'genai ms':>9} {'reference ms':>13} {'speed-up':>9}")
    for vocab in args.vocab:
        folder = write_gqa_decoder(
            root, vocab_size=vocab, hidden_size=64, context_length=1024, name=f"v{vocab}"
        )
        rng = np.random.default_rng(vocab)
        logits = (rng.standard_normal((args.steps, vocab)) * 3).astype(np.float32)
        prompt = rng.integers(3, vocab, size=256, dtype=np.int32)
        models = {"genai": genai.Model(folder), "reference": og.Model(str(folder))}
        engines = {"genai": genai, "reference": og}
        results: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(args.rounds):
            for name in models:
                results[name].append(per_step_ms(engines[name], models[name], logits, prompt))
        ours = statistics.median(results["genai"])
        ref = statistics.median(results["reference"])
        print(f"{vocab:>7} {ours:>9.3f} {ref:>13.3f} {ref / ours:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
