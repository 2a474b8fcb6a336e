"""Beam-search KV reorder: `move_rows` (each row moved once, filled positions only) against the
previous kernel (every row copied to scratch and back, whole capacity).

    PYTHONPATH=. python benchmarks/beam_reorder.py [--beams 4] [--capacity 8192] [--filled 512]

The cache has SmolLM2-135M's shape (30 layers, K and V, 3 KV heads of 64, fp32) with
``--beams`` rows of ``--capacity`` positions, ``--filled`` of them holding tokens: the shared
buffer the reference allocates at max_length. The beam orders are the ones a real beam search
produces: recorded from a 4-beam run on the GQA test fixture (the same orders replayed), plus
a few fixed patterns. Reports microseconds per reorder of the whole cache and bytes copied.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from _bench_args import header, positive_int

import genai
from genai._core.bookkeeping import move_rows
from genai.testing.models import write_gqa_decoder

LAYERS, KV_HEADS, HEAD = 30, 3, 64


def recorded_orders(beams: int, steps: int = 120) -> list[np.ndarray]:
    """The non-identity beam orders of a greedy beam search on the fixture model."""
    with tempfile.TemporaryDirectory() as tmp:
        model = genai.Model(write_gqa_decoder(tmp, context_length=steps + 8))
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=steps + 8, num_beams=beams)
        generator = genai.Generator(model, params)
        generator.append_tokens(np.array([5, 9, 12, 7, 20, 33, 41], np.int32))
        orders = []
        while not generator.is_done():
            generator.generate_next_token()
            order = np.array(generator._beams.next_indices, np.int32)
            if (order != np.arange(beams)).any():
                orders.append(order)
    return orders


def old_reorder(view: np.ndarray, order: np.ndarray, scratch: np.ndarray) -> None:
    """The previous kernel: gather every row into scratch, copy the whole block back."""
    np.take(view, order, axis=0, out=scratch)
    view[...] = scratch


def bench(orders: list[np.ndarray], buffers: list[np.ndarray], filled: int, repeat: int) -> dict:
    views = [b.reshape(b.shape[0], -1).view(np.uint8) for b in buffers]
    row_bytes = views[0].shape[1]
    scratch_rows = np.empty_like(views[0])
    scratch_one = np.empty(row_bytes, np.uint8)
    chunk_bytes = filled * HEAD * buffers[0].itemsize
    timings = {"old": 0.0, "new": 0.0}
    copied = {"old": 0, "new": 0}
    for _ in range(repeat):
        for order in orders:
            start = time.perf_counter()
            for view in views:
                old_reorder(view, order, scratch_rows)
            timings["old"] += time.perf_counter() - start
            copied["old"] += 2 * len(order) * row_bytes * len(views)
            start = time.perf_counter()
            rows = 0
            for view in views:
                rows = move_rows(view, order, scratch_one, KV_HEADS, chunk_bytes)
            timings["new"] += time.perf_counter() - start
            copied["new"] += rows * KV_HEADS * chunk_bytes * len(views)
    count = repeat * len(orders)
    return {
        key: (1e6 * timings[key] / count, copied[key] / count / 2**20) for key in ("old", "new")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beams", type=positive_int, default=4, help="2 to 4")
    parser.add_argument("--capacity", type=positive_int, default=8192)
    parser.add_argument("--filled", type=positive_int, default=512, help="at most --capacity")
    parser.add_argument("--repeat", type=positive_int, default=3)
    args = parser.parse_args()
    if not 2 <= args.beams <= 4:
        parser.error("argument --beams: 2 to 4 (the fixed patterns are of 4 beams)")
    if args.filled > args.capacity:
        parser.error(f"argument --filled: at most --capacity ({args.filled} > {args.capacity})")
    header()
    buffers = [
        np.random.default_rng(i).standard_normal(
            (args.beams, KV_HEADS, args.capacity, HEAD), dtype=np.float32
        )
        for i in range(2 * LAYERS)
    ]
    recorded = recorded_orders(args.beams)
    moved = [int((o != np.arange(args.beams)).sum()) for o in recorded]
    print(
        f"cache: {LAYERS} layers x K/V, {args.beams} beams, {KV_HEADS}x{HEAD} fp32, "
        f"capacity {args.capacity}, filled {args.filled}"
    )
    print(
        f"recorded orders: {len(recorded)} non-identity steps, "
        f"rows changing beam per step: mean {np.mean(moved):.2f} of {args.beams}"
    )
    patterns = {
        "recorded (fixture beam run)": recorded,
        "one fork [0,0,2,3]": [np.array([0, 0, 2, 3][: args.beams], np.int32)],
        "swap [1,0,2,3]": [np.array([1, 0, 2, 3][: args.beams], np.int32)],
        "all from beam 0": [np.zeros(args.beams, np.int32)],
    }
    print(f"{'orders':<30} {'old us':>10} {'old MiB':>9} {'new us':>10} {'new MiB':>9} {'x':>6}")
    for name, orders in patterns.items():
        result = bench(orders, buffers, args.filled, args.repeat if len(orders) > 1 else 20)
        (old_us, old_mib), (new_us, new_mib) = result["old"], result["new"]
        print(
            f"{name:<30} {old_us:>10.0f} {old_mib:>9.1f} {new_us:>10.0f} {new_mib:>9.1f} "
            f"{old_us / max(new_us, 1e-9):>6.1f}"
        )


if __name__ == "__main__":
    main()
