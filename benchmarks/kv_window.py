"""KV memory and decode speed of sliding-window layers: window-sized caches against the same
weights with full-length (window-masked) caches.

    PYTHONPATH=. python benchmarks/kv_window.py [--max-length 8192] [--new-tokens 1024]

The fixture has Gemma 3's pattern and KV shape proportions at a tiny width: 6 layers, five
local (window 512) and one global, 1 KV head of 128, fp32. Both graphs run greedy from a
64-token prompt with max_length left large: the windowed one keeps window + 16 positions for
the local layers (as the reference on the CPU), the masked one max_length (shared buffer,
allocated up front as the reference: ``kv_initial_capacity=0``) or what it grew to (our
default growing buffer). Prints the KV bytes each way and decode tokens per second.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from _bench_args import header, positive_int

import genai
from genai.testing.models import write_gqa_decoder

LAYERS, LOCAL, WINDOW = 6, (0, 1, 2, 3, 4), 512
PROMPT = 64  # tokens


def run(folder, max_length: int, new_tokens: int, initial: int) -> tuple[int, float]:
    model = genai.Model(folder)
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=max_length, kv_initial_capacity=initial)
    generator = genai.Generator(model, params)
    generator.append_tokens(np.arange(3, 3 + PROMPT, dtype=np.int32))
    generator.generate_next_token()
    start = time.perf_counter()
    made = generator.generate_until_done(new_tokens - 1)
    rate = made / (time.perf_counter() - start)
    return generator.kv_cache_bytes, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-length", type=positive_int, default=8192)
    parser.add_argument("--new-tokens", type=positive_int, default=1024)
    args = parser.parse_args()
    if args.max_length < PROMPT + args.new_tokens:
        parser.error(
            f"argument --max-length: at least the {PROMPT}-token prompt + --new-tokens "
            f"({PROMPT + args.new_tokens})"
        )
    header()
    shape = {
        "vocab_size": 256,
        "hidden_size": 256,
        "num_heads": 2,
        "num_kv_heads": 1,
        "num_layers": LAYERS,
        "context_length": args.max_length,
        "sliding_window": WINDOW,
        "local_layers": LOCAL,
    }
    with tempfile.TemporaryDirectory() as tmp:
        windowed = write_gqa_decoder(tmp, name="windowed", **shape)
        masked = write_gqa_decoder(tmp, name="masked", window_cache=False, **shape)
        print(
            f"{LAYERS} layers ({len(LOCAL)} local, window {WINDOW}), max_length "
            f"{args.max_length}, 64-token prompt + {args.new_tokens} new tokens"
        )
        print(f"{'cache':<34} {'KV MiB':>8} {'tok/s':>8}")
        for label, folder, initial in (
            ("full length, up front (reference)", masked, 0),
            ("window caches, up front", windowed, 0),
            ("full length, growing (default)", masked, 128),
            ("window caches, growing (default)", windowed, 128),
        ):
            kv, rate = run(folder, args.max_length, args.new_tokens, initial)
            print(f"{label:<34} {kv / 2**20:>8.2f} {rate:>8.0f}")


if __name__ == "__main__":
    main()
