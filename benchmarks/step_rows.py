"""StepRowsMatMulNBits (genai's verify-run linear, `genai._core.custom_ops`) against
onnxruntime's MatMulNBits on the default model's linear shapes: a run of R rows through genai's
op, through onnxruntime's several-row kernel (other numbers on AVX2 CPUs), and R one-row runs
(the numbers genai's op gives), each in a session of its own.

    python benchmarks/step_rows.py [--rows 1 2 4 8] [--threads 1] [--repeats 200]

Prints microseconds per run (the fastest of 5 batches of ``--repeats``) and two ratios: genai's
op over onnxruntime's several-row run, and over R one-row runs. Whether the bits agree with the
one-row runs is printed too ("same": every output bit equal).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from _bench_args import header, positive_int
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from genai._core.native_session import NativeSession
from genai.runtime.verify_rows import step_rows_graph

#: SmolLM2-135M's linears: (name, K, N)
SHAPES = [
    ("qkv", 576, 960),
    ("o_proj", 576, 576),
    ("gate_up", 576, 3072),
    ("down", 1536, 576),
    ("lm_head", 576, 49152),
]


def model(k: int, n: int) -> bytes:
    rng = np.random.default_rng(0)
    blocks = k // 32
    inits = [
        numpy_helper.from_array(rng.integers(0, 256, (n, blocks, 16), dtype=np.uint8), "w"),
        numpy_helper.from_array((rng.standard_normal(n * blocks) * 0.02).astype(np.float32), "s"),
    ]
    node = helper.make_node(
        "MatMulNBits", ["a", "w", "s"], ["y"], domain="com.microsoft",
        K=k, N=n, bits=4, block_size=32, accuracy_level=4,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "linear",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, "m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "m", n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def timed(
    session: NativeSession, rows: np.ndarray, n: int, repeats: int
) -> tuple[float, np.ndarray]:
    out = np.empty((1, rows.shape[1], n), np.float32)
    session.bind_input("a", rows)
    session.bind_output("y", out)
    for _ in range(5):
        session.run()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            session.run()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1e6, out.copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=positive_int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=200)
    args = parser.parse_args()
    header(args.threads)
    print("linear | K | N | rows | genai op us | ort several-row us | ort one-row runs us | "
          "op / several-row | op / one-row runs | same")  # fmt: skip
    for name, k, n in SHAPES:
        data = model(k, n)
        theirs = NativeSession(None, model_bytes=data, intra_op_num_threads=args.threads)
        ours = NativeSession(
            None, model_bytes=step_rows_graph(data), intra_op_num_threads=args.threads,
            genai_ops=True,
        )  # fmt: skip
        repeats = max(5, args.repeats * 576 // n)
        for count in args.rows:
            rows = np.random.default_rng(count).standard_normal((1, count, k)).astype(np.float32)
            op_us, op_out = timed(ours, rows, n, repeats)
            many_us, _ = timed(theirs, rows, n, repeats)
            one_us, alone = 0.0, []
            for i in range(count):
                us, out = timed(theirs, rows[:, i : i + 1], n, repeats)
                one_us += us
                alone.append(out)
            same = np.array_equal(op_out.view(np.uint32), np.concatenate(alone, 1).view(np.uint32))
            print(f"{name} | {k} | {n} | {count} | {op_us:.1f} | {many_us:.1f} | {one_us:.1f} | "
                  f"{op_us / many_us:.2f} | {op_us / one_us:.2f} | {same}")  # fmt: skip


if __name__ == "__main__":
    main()
