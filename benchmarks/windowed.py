"""Decode speed of a QNN-style windowed model (a static cache slid by the engine) on the CPU,
genai against the reference (onnxruntime-genai) on the same folder.

    PYTHONPATH=. python benchmarks/windowed.py [--context 128] [--window 8] [--new-tokens 100]

The folder is `genai.testing.windowed.write_windowed_decoder`'s (2 layers, uint8 cache). Each
engine appends a prompt of one window minus 3 tokens (the reference feeds only one window) and
makes ``--new-tokens`` greedy steps, five times; the best rate is printed.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from _bench_args import header, positive_int

import genai
from genai.testing.windowed import write_windowed_decoder


def rate(engine, folder: str, prompt: np.ndarray, new_tokens: int) -> float:
    model = engine.Model(folder)
    best = 0.0
    for _ in range(5):
        params = engine.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + 3 + new_tokens)
        generator = engine.Generator(model, params)
        generator.append_tokens(prompt)
        start = time.perf_counter()
        for _ in range(new_tokens):
            generator.generate_next_token()
        best = max(best, new_tokens / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=positive_int, default=128)
    parser.add_argument("--window", type=positive_int, default=8, help="at least 4")
    parser.add_argument("--new-tokens", type=positive_int, default=100)
    args = parser.parse_args()
    if args.window < 4:
        parser.error("argument --window: at least 4 (the prompt is one window minus 3 tokens)")
    if args.context <= args.window:
        parser.error("argument --context: must exceed --window")
    header()
    prompt = (np.arange(args.window - 3) * 7 % 50 + 4).astype(np.int32)
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(
            write_windowed_decoder(tmp, window_size=args.window, context_length=args.context)
        )
        print(f"context {args.context}, window {args.window}, {args.new_tokens} new tokens")
        print(f"genai     {rate(genai, folder, prompt, args.new_tokens):8.0f} tok/s")
        try:
            import onnxruntime_genai as og
        except ImportError:
            print("reference not installed")
            return
        print(f"reference {rate(og, folder, prompt, args.new_tokens):8.0f} tok/s")


if __name__ == "__main__":
    main()
