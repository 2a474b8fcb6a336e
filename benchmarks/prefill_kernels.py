"""The linears of one SmolLM2-135M layer at M tokens, as each quantisation the builder could
emit: which kernel a prefill-heavy graph should use on this CPU.

    python benchmarks/prefill_kernels.py [--tokens 1 32 128 512] [--threads 1] [--reps 30]
                                         [--variants nbits-32-sym-4 dq8 ...] [--pack-gate-up]

One ORT session per variant holds the layer's five linears (qkv 576->960, o 576->576, gate and
up 576->1536, down 1536->576; random weights) as separate nodes; the sessions run in
interleaved rounds. Printed: the calling thread's CPU time per run (median and min; with one
intra-op thread ORT computes on the calling thread, so this is steady on a loaded machine),
and x30 for the model's 30 layers.

Variants: ``nbits-B-sym|asym-A`` MatMulNBits 4-bit, block B, with/without zero points,
accuracy_level A (4: int8 activations; 1: fp32); ``b8-B-A`` MatMulNBits 8-bit; ``dq8``
DynamicQuantizeMatMul over int8 per-column weights (one activation scale per tensor); ``tok8``
MatMulInteger over the same weights with uint8 activations scaled per token (what the builder's
``prefill_int8`` emits); ``du8`` DynamicQuantizeMatMul over uint8 weights with zero points;
``fp32`` MatMul.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from _bench_args import header, positive_int
from onnx import TensorProto, helper, numpy_helper

LINEARS = [("qkv", 576, 960), ("o", 576, 576), ("gate", 576, 1536), ("up", 576, 1536)]
DOWN = ("down", 1536, 576)
VARIANTS = [
    "nbits-32-sym-4",
    "nbits-32-asym-4",
    "nbits-64-sym-4",
    "nbits-128-sym-4",
    "nbits-32-sym-1",
    "b8-32-4",
    "b8-64-4",
    "dq8",
    "tok8",
    "du8",
    "fp32",
]


def _blocks(w: np.ndarray, block: int) -> np.ndarray:
    n, k = w.shape
    nb = -(-k // block)
    return np.pad(w, ((0, 0), (0, nb * block - k))).reshape(n, nb, block)


def _pack4(q: np.ndarray) -> np.ndarray:
    return q[..., 0::2] | (q[..., 1::2] << 4)


def _linear(variant: str, name: str, x: str, w: np.ndarray) -> tuple[list, list]:
    """(nodes, initializers) computing ``x @ w.T`` as ``variant``."""
    n, k = w.shape
    ms = {"domain": "com.microsoft"}
    if variant.startswith("nbits-"):
        _, block, sym, acc = variant.split("-")
        wb = _blocks(w, int(block))
        inputs = [x, f"{name}_q", f"{name}_s"]
        if sym == "sym":
            pick = np.abs(wb).argmax(2)[..., None]
            scales = np.take_along_axis(wb, pick, 2)[..., 0] / -8
            q = np.clip(np.rint(wb / scales[..., None]) + 8, 0, 15).astype(np.uint8)
            inits = []
        else:
            lo, hi = np.minimum(wb.min(2), 0), np.maximum(wb.max(2), 0)
            scales = (hi - lo) / 15
            z = np.clip(np.rint(-lo / scales), 0, 15).astype(np.uint8)
            q = np.clip(np.rint(wb / scales[..., None]) + z[..., None], 0, 15).astype(np.uint8)
            if z.shape[1] % 2:
                z = np.pad(z, ((0, 0), (0, 1)))
            inits = [numpy_helper.from_array(_pack4(z).reshape(-1), f"{name}_z")]
            inputs.append(f"{name}_z")
        inits += [
            numpy_helper.from_array(_pack4(q), f"{name}_q"),
            numpy_helper.from_array(scales.astype(np.float32).reshape(-1), f"{name}_s"),
        ]
        node = helper.make_node(
            "MatMulNBits",
            inputs,
            [name],
            K=k,
            N=n,
            bits=4,
            block_size=int(block),
            accuracy_level=int(acc),
            **ms,
        )
        return [node], inits
    if variant.startswith("b8-"):
        _, block, acc = variant.split("-")
        wb = _blocks(w, int(block))
        scales = (np.abs(wb).max(2) / 127).astype(np.float32)
        q = (np.clip(np.rint(wb / scales[..., None]), -127, 127) + 128).astype(np.uint8)
        inits = [
            numpy_helper.from_array(q, f"{name}_q"),
            numpy_helper.from_array(scales.reshape(-1), f"{name}_s"),
        ]
        node = helper.make_node(
            "MatMulNBits",
            [x, f"{name}_q", f"{name}_s"],
            [name],
            K=k,
            N=n,
            bits=8,
            block_size=int(block),
            accuracy_level=int(acc),
            **ms,
        )
        return [node], inits
    if variant == "dq8":
        scales = (np.abs(w).max(1) / 64).astype(np.float32)
        q = np.clip(np.rint(w / scales[:, None]), -64, 64).astype(np.int8)
        inits = [
            numpy_helper.from_array(np.ascontiguousarray(q.T), f"{name}_q"),
            numpy_helper.from_array(scales, f"{name}_s"),
        ]
        node = helper.make_node(
            "DynamicQuantizeMatMul", [x, f"{name}_q", f"{name}_s", "", ""], [name], **ms
        )
        return [node], inits
    if variant == "tok8":
        scales = (np.abs(w).max(1) / 64).astype(np.float32)
        q = np.clip(np.rint(w / scales[:, None]), -64, 64).astype(np.int8)
        consts = {
            "axes": np.array([-1], np.int64),
            "eps": np.array(1e-12, np.float32),
            "c127": np.array(127, np.float32),
            "c128": np.array(128, np.float32),
            "z128": np.array(128, np.uint8),
        }
        inits = [
            numpy_helper.from_array(np.ascontiguousarray(q.T), f"{name}_q"),
            numpy_helper.from_array(scales, f"{name}_s"),
        ]
        inits += [numpy_helper.from_array(v, f"{name}_{k}") for k, v in consts.items()]
        c = {k: f"{name}_{k}" for k in consts}
        t = [f"{name}_t{i}" for i in range(11)]
        nodes = [
            helper.make_node("Abs", [x], [t[0]]),
            helper.make_node("ReduceMax", [t[0], c["axes"]], [t[1]], keepdims=1),
            helper.make_node("Max", [t[1], c["eps"]], [t[2]]),
            helper.make_node("Div", [t[2], c["c127"]], [t[3]]),
            helper.make_node("Div", [x, t[3]], [t[4]]),
            helper.make_node("Round", [t[4]], [t[5]]),
            helper.make_node("Add", [t[5], c["c128"]], [t[6]]),
            helper.make_node("Cast", [t[6]], [t[7]], to=TensorProto.UINT8),
            helper.make_node("MatMulInteger", [t[7], f"{name}_q", c["z128"]], [t[8]]),
            helper.make_node("Cast", [t[8]], [t[9]], to=TensorProto.FLOAT),
            helper.make_node("Mul", [t[9], t[3]], [t[10]]),
            helper.make_node("Mul", [t[10], f"{name}_s"], [name]),
        ]
        return nodes, inits
    if variant == "du8":
        lo, hi = np.minimum(w.min(1), 0), np.maximum(w.max(1), 0)
        scales = ((hi - lo) / 255).astype(np.float32)
        z = np.clip(np.rint(-lo / scales), 0, 255).astype(np.uint8)
        q = np.clip(np.rint(w / scales[:, None]) + z[:, None], 0, 255).astype(np.uint8)
        inits = [
            numpy_helper.from_array(np.ascontiguousarray(q.T), f"{name}_q"),
            numpy_helper.from_array(scales, f"{name}_s"),
            numpy_helper.from_array(z, f"{name}_z"),
        ]
        node = helper.make_node(
            "DynamicQuantizeMatMul", [x, f"{name}_q", f"{name}_s", f"{name}_z", ""], [name], **ms
        )
        return [node], inits
    if variant == "fp32":
        init = numpy_helper.from_array(np.ascontiguousarray(w.T), f"{name}_w")
        return [helper.make_node("MatMul", [x, f"{name}_w"], [name])], [init]
    raise SystemExit(f"unknown variant {variant}")


def layer_model(variant: str, tokens: int, pack_gate_up: bool, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    linears = LINEARS
    if pack_gate_up:
        linears = [LINEARS[0], LINEARS[1], ("gate_up", 576, 3072)]
    nodes, inits = [], []
    for name, k, n in [*linears, DOWN]:
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        more_nodes, more_inits = _linear(variant, name, "x2" if name == "down" else "x", w)
        nodes += more_nodes
        inits += more_inits
    graph = helper.make_graph(
        nodes,
        "layer",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, 576]),
            helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, tokens, 1536]),
        ],
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
            for name, _, _ in [*linears, DOWN]
        ],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=positive_int, nargs="+", default=[1, 32, 128, 512])
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--reps", type=positive_int, default=30)
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--pack-gate-up", action="store_true", help="gate and up as one linear")
    args = ap.parse_args()
    header(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    for tokens in args.tokens:
        sessions = {}
        for v in args.variants:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = args.threads
            sessions[v] = ort.InferenceSession(layer_model(v, tokens, args.pack_gate_up), opts)
        rng = np.random.default_rng(1)
        feeds = {
            "x": rng.standard_normal((1, tokens, 576)).astype(np.float32),
            "x2": rng.standard_normal((1, tokens, 1536)).astype(np.float32),
        }
        times: dict[str, list[float]] = {v: [] for v in args.variants}
        for r in range(args.reps):
            for v in args.variants if r % 2 == 0 else args.variants[::-1]:
                start = clock()
                sessions[v].run(None, feeds)
                times[v].append(1000 * (clock() - start))
        for v in args.variants:
            med, low = statistics.median(times[v]), min(times[v])
            print(
                f"M={tokens:4d} threads={args.threads} {v:16s} median {med:7.3f} ms "
                f"min {low:7.3f} ms  x30 layers {30 * med:7.1f} ms"
            )


if __name__ == "__main__":
    main()
