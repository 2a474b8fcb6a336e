"""Per-step time of the sampling chain: Cython kernel vs its NumPy twin.

One row, one core: ``Sampler.sample_batch`` with top_k=50, top_p=0.9, temperature=0.7,
repetition_penalty=1.1 over a 512-token history (the headline configuration), plus a few other
configurations for context. Logits are standard-normal * 3 (a realistic spread of ~25 nats).

    PYTHONPATH=. python benchmarks/sampling_kernels.py [--vocab 32000 151936] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _bench_args import header, positive_int

from genai._core import sampling as kernel
from genai._core import sampling_reference as twin

VOCABS = (32000, 49152, 128256, 151936, 262144)
HEADLINE = {"top_k": 50, "top_p": 0.9, "temperature": 0.7, "repetition_penalty": 1.1}
EXTRA = {
    "greedy": {"do_sample": False, "repetition_penalty": 1.1},
    "top_p=0.9 (k=0)": {"top_k": 0, "top_p": 0.9, "temperature": 0.7, "repetition_penalty": 1.1},
    "headline+logprobs": dict(HEADLINE),
}
HISTORY = 512
TARGET_MS = 0.25  # at vocab 151936, headline configuration


def time_steps(impl, vocab: int, options: dict, steps: int, with_logprobs: bool = False) -> float:
    """Median milliseconds of one `sample_batch` call (the logits the chain edits in place are
    restored between calls, outside the timed region)."""
    rng = np.random.default_rng(vocab)
    logits = (rng.standard_normal((1, vocab)) * 3).astype(np.float32)
    history = rng.integers(0, vocab, size=(1, HISTORY), dtype=np.int32)
    touched = np.unique(history)
    saved = logits[0, touched].copy()
    eos = np.array([vocab - 1], np.int32)
    out = np.zeros(1, np.int32)
    extra = {}
    if with_logprobs:
        extra = {
            "logprobs": np.zeros(1, np.float32),
            "top_ids": np.zeros((1, 5), np.int32),
            "top_logprobs": np.zeros((1, 5), np.float32),
        }
    sampler = impl.Sampler(1, vocab, seed=0)
    sampler.configure(**{"do_sample": True, **options})
    times = []
    for _ in range(steps):
        logits[0, touched] = saved
        start = time.perf_counter()
        sampler.sample_batch(logits, history, HISTORY, eos, out, prompt_lengths=256, **extra)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=positive_int, nargs="*", default=list(VOCABS))
    parser.add_argument("--steps", type=positive_int, default=300, help="kernel steps per point")
    parser.add_argument(
        "--twin-steps", type=positive_int, default=10, help="NumPy twin steps per point"
    )
    parser.add_argument("--no-twin", action="store_true", help="skip the (slow) NumPy twin")
    args = parser.parse_args()
    header(1)

    print(f"headline: {HEADLINE}, history {HISTORY} tokens, one row, one core")
    print(f"{'vocab':>8} {'kernel ms':>10} {'numpy ms':>10} {'ratio':>8}")
    for vocab in args.vocab:
        ours = time_steps(kernel, vocab, HEADLINE, args.steps)
        if args.no_twin:
            print(f"{vocab:>8} {ours:>10.4f}")
            continue
        theirs = time_steps(twin, vocab, HEADLINE, args.twin_steps)
        print(f"{vocab:>8} {ours:>10.4f} {theirs:>10.3f} {theirs / ours:>7.0f}x")
        if vocab == 151936:
            verdict = "meets" if ours <= TARGET_MS else "MISSES"
            print(f"{'':>8} target <= {TARGET_MS} ms at 151936: {verdict}")

    print("\nother configurations, kernel only (ms per step)")
    print(f"{'vocab':>8} " + " ".join(f"{name:>20}" for name in EXTRA))
    for vocab in args.vocab:
        cells = []
        for name, options in EXTRA.items():
            ms = time_steps(kernel, vocab, options, args.steps, "logprobs" in name)
            cells.append(f"{ms:>20.4f}")
        print(f"{vocab:>8} " + " ".join(cells))


if __name__ == "__main__":
    main()
