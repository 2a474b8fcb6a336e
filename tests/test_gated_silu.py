"""The MLP's gated SiLU product as one op (`genai.runtime.gated_silu`, the ScaledSiluMul op of
`genai._core.custom_ops`): its output (and its QuantizeRows) equals onnxruntime's ops bit for
bit, as onnxruntime runs them by default (Mul(g, Sigmoid(g)) fused into QuickGelu); the rewrite
takes the builder's chains and only those, and only where onnxruntime makes that QuickGelu.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from genai._core import custom_ops
from genai._core.native_session import NativeSession
from genai.runtime import model as model_module
from genai.runtime.gated_silu import fuse_gated_silu
from genai.runtime.row_quantization import fuse_row_quantization

F = TensorProto.FLOAT
FLOOR = 1e-12
OPSETS = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]


def _const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(value, dtype), name)


def _quantize_chain(x: str, q: str, scale: str, tag: str) -> tuple[list, list]:
    """The builder's per-row quantisation of ``x`` (onnx_writer.per_token_matmul)."""
    nodes = [
        helper.make_node("Abs", [x], [f"{tag}abs"]),
        helper.make_node("ReduceMax", [f"{tag}abs", "axes"], [f"{tag}max"], keepdims=1),
        helper.make_node("Max", [f"{tag}max", "floor"], [f"{tag}top"]),
        helper.make_node("Div", ["c127", f"{tag}top"], [f"{tag}inverse"]),
        helper.make_node("Mul", [x, f"{tag}inverse"], [f"{tag}scaled"]),
        helper.make_node("Add", [f"{tag}scaled", "offset"], [f"{tag}shifted"]),
        helper.make_node("Cast", [f"{tag}shifted"], [q], to=TensorProto.UINT8),
        helper.make_node("Div", [f"{tag}top", "c127"], [scale]),
    ]
    inits = [
        _const("axes", [-1], np.int64),
        _const("floor", [FLOOR]),
        _const("c127", [127.0]),
        _const("offset", [128.5]),
    ]
    return nodes, inits


def _gate_nodes(gate: str, up: str, gate_scale: str | None, up_scale: str | None, out: str):
    nodes = []
    if gate_scale:
        nodes.append(helper.make_node("Mul", [gate, gate_scale], ["g"]))
        gate = "g"
    if up_scale:
        nodes.append(helper.make_node("Mul", [up_scale, up], ["u"]))  # (either order)
        up = "u"
    return [
        *nodes,
        helper.make_node("Sigmoid", [gate], ["sig"]),
        helper.make_node("Mul", [gate, "sig"], ["gelu"]),
        helper.make_node("Mul", [up, "gelu"], [out]),
    ]


def _ops_model(scales: bool, quantize: bool) -> bytes:
    """gate, up (and their row scales) -> the MLP's ops -> ``out`` (and its quantisation)."""
    names = ["gate", "up", *(["gate_scale", "up_scale"] if scales else [])]
    inputs = [
        helper.make_tensor_value_info(n, F, ["rows", "n" if "scale" not in n else 1]) for n in names
    ]
    nodes = _gate_nodes("gate", "up", *(names[2:] if scales else [None, None]), "out")
    inits = []
    outputs = [helper.make_tensor_value_info("out", F, None)]
    if quantize:
        chain, inits = _quantize_chain("out", "q", "q_scale", "o_")
        nodes += chain
        outputs = [
            helper.make_tensor_value_info("q", TensorProto.UINT8, None),
            helper.make_tensor_value_info("q_scale", F, None),
        ]
    graph = helper.make_graph(nodes, "ops", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=OPSETS).SerializeToString()


def _op_model(scales: bool, quantize: bool) -> bytes:
    """The same as one ScaledSiluMul node."""
    names = ["gate", "up", *(["gate_scale", "up_scale"] if scales else [])]
    inputs = [
        helper.make_tensor_value_info(n, F, ["rows", "n" if "scale" not in n else 1]) for n in names
    ]
    attrs = {"floor": FLOOR} if quantize else {}
    outs = ["", "q", "q_scale"] if quantize else ["out"]
    node = helper.make_node(custom_ops.SCALED_SILU_MUL, names, outs, domain="genai", **attrs)
    outputs = [
        helper.make_tensor_value_info(n, F if n != "q" else TensorProto.UINT8, None)
        for n in outs
        if n
    ]
    graph = helper.make_graph([node], "op", inputs, outputs)
    opsets = [*OPSETS, helper.make_opsetid("genai", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _feeds(rows: int, n: int, scales: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {
        "gate": (rng.standard_normal((rows, n)) * 8).astype(np.float32),  # sigmoid's tails too
        "up": rng.standard_normal((rows, n)).astype(np.float32),
    }
    feeds["gate"][0, : min(n, 4)] = [0.0, -0.0, 90.0, -90.0][: min(n, 4)]
    if scales:
        feeds["gate_scale"] = (rng.random((rows, 1)) * 3).astype(np.float32)
        feeds["up_scale"] = rng.random((rows, 1)).astype(np.float32)
    return feeds


def _onnxruntime(data: bytes, feeds: dict, threads: int, level=None) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if level is not None:
        options.graph_optimization_level = level
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _genai(data: bytes, feeds: dict, outputs: dict[str, np.ndarray], threads: int) -> None:
    session = NativeSession(None, model_bytes=data, genai_ops=True, intra_op_num_threads=threads)
    for name, array in feeds.items():
        session.bind_input(name, array)
    for name, array in outputs.items():
        session.bind_output(name, array)
    session.run()


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("scales", [True, False])
@pytest.mark.parametrize(
    ("rows", "n"), [(1, 1), (3, 7), (5, 17), (37, 100), (300, 576), (129, 1536)]
)
def test_op_is_onnxruntimes_ops(rows: int, n: int, scales: bool, threads: int) -> None:
    feeds = _feeds(rows, n, scales, rows * n)
    (want,) = _onnxruntime(_ops_model(scales, False), feeds, threads)
    got = np.full((rows, n), np.nan, np.float32)
    _genai(_op_model(scales, False), feeds, {"out": got}, threads)
    _same_bits(got, want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("rows", "n"), [(2, 9), (45, 1536), (300, 576)])
def test_quantised_op_is_the_ops_and_quantisation(rows: int, n: int, threads: int) -> None:
    feeds = _feeds(rows, n, True, rows + n)
    q_want, scale_want = _onnxruntime(_ops_model(True, True), feeds, threads)
    q = np.zeros((rows, n), np.uint8)
    scale = np.full((rows, 1), np.nan, np.float32)
    _genai(_op_model(True, True), feeds, {"q": q, "q_scale": scale}, threads)
    _same_bits(q, q_want)
    _same_bits(scale, scale_want)


@pytest.mark.skipif(
    custom_ops.quantize_level() != 2,
    reason="onnxruntime's Sigmoid and QuickGelu round alike without AVX-512 (measured on an AVX2 "
    "Zen 3, onnxruntime 1.32): nothing to show there",
)
def test_sigmoid_op_alone_would_differ() -> None:
    """Why the op calls QuickGelu: on AVX-512 CPUs onnxruntime's Sigmoid op and its QuickGelu
    round some products differently, and by default onnxruntime runs the graph's Sigmoid and
    Mul as QuickGelu (at the basic level it does not, and neither does genai's rewrite)."""
    feeds = _feeds(512, 1536, True, 0)
    data = _ops_model(True, False)
    (fused,) = _onnxruntime(data, feeds, 1)
    (basic,) = _onnxruntime(data, feeds, 1, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert not np.array_equal(fused, basic)


def test_bad_input_names_the_problem() -> None:
    feeds = _feeds(4, 8, True, 1)
    with pytest.raises(Exception, match="gate and up differ in shape"):
        _genai(_op_model(True, False), {**feeds, "up": feeds["up"][:, :7].copy()},
               {"out": np.empty((4, 8), np.float32)}, 1)  # fmt: skip
    with pytest.raises(Exception, match="one value per row"):
        _genai(_op_model(True, False), {**feeds, "up_scale": np.ones((3, 1), np.float32)},
               {"out": np.empty((4, 8), np.float32)}, 1)  # fmt: skip


def _builder_mlp(with_output_read: bool = False) -> bytes:
    """A --prefill-int8 MLP as genai's builder writes it: x quantised per row (once for gate
    and once for up), two int8 linears scaled back by the rows' scales, the gated SiLU, and
    the down projection's quantisation of the product."""
    rng = np.random.default_rng(3)
    nodes, inits = [], []
    for tag in ("g_", "u_"):
        chain, inits = _quantize_chain("x", f"{tag}q", f"{tag}s", tag)
        nodes += chain
    extra = []
    for tag, out in (("g_", "gate_y"), ("u_", "up_y")):
        weight = rng.integers(-127, 128, (16, 24)).astype(np.int8)
        inits += [
            _const(f"{tag}w", weight, np.int8),
            _const(f"{tag}ws", rng.random(24) * 0.01),
        ]
        nodes.append(
            helper.make_node(
                "MatMulIntegerToFloat",
                [f"{tag}q", f"{tag}w", "one", f"{tag}ws", "zero"],
                [out],
                domain="com.microsoft",
            )
        )
    inits += [_const("one", 1.0), _const("zero", 128, np.uint8)]
    nodes += _gate_nodes("gate_y2", "up_y2", None, None, "out")
    nodes.insert(-3, helper.make_node("Mul", ["gate_y", "g_s"], ["gate_y2"]))
    nodes.insert(-3, helper.make_node("Mul", ["u_s", "up_y"], ["up_y2"]))
    chain, _ = _quantize_chain("out", "q", "q_scale", "o_")
    nodes += chain
    outputs = [
        helper.make_tensor_value_info("q", TensorProto.UINT8, None),
        helper.make_tensor_value_info("q_scale", F, None),
    ]
    if with_output_read:
        extra.append(helper.make_tensor_value_info("gate_y2", F, None))
    x = helper.make_tensor_value_info("x", F, ["rows", 16])
    graph = helper.make_graph(nodes, "mlp", [x], outputs + extra, inits)
    return helper.make_model(graph, opset_imports=OPSETS).SerializeToString()


@pytest.mark.parametrize("rows", [1, 50, 700])
def test_rewrite_fuses_the_builders_mlp_and_runs_as_its_ops(rows: int) -> None:
    data = _builder_mlp()
    fused = fuse_gated_silu(fuse_row_quantization(data))
    assert fused is not None
    ops = [(n.domain, n.op_type) for n in onnx.load_from_string(fused).graph.node]
    assert ops == [
        ("genai", custom_ops.QUANTIZE_ROWS),  # gate's and up's quantisation: one node
        ("com.microsoft", "MatMulIntegerToFloat"),
        ("com.microsoft", "MatMulIntegerToFloat"),
        ("genai", custom_ops.SCALED_SILU_MUL),  # the row scales, the gate, the down's quantisation
    ]
    x = (np.random.default_rng(rows).standard_normal((rows, 16)) * 3).astype(np.float32)
    q_want, scale_want = _onnxruntime(data, {"x": x}, 2)
    q = np.zeros((rows, 24), np.uint8)
    scale = np.full((rows, 1), np.nan, np.float32)
    _genai(fused, {"x": x}, {"q": q, "q_scale": scale}, 2)
    _same_bits(q, q_want)
    _same_bits(scale, scale_want)


def test_rewrite_without_row_scales_fuses_the_gate_only() -> None:
    fused = fuse_gated_silu(_ops_model(False, False))
    assert fused is not None
    ops = [n.op_type for n in onnx.load_from_string(fused).graph.node]
    assert ops == [custom_ops.SCALED_SILU_MUL]
    # scales that are not a QuantizeRows' stay their own Mul ops
    fused = fuse_gated_silu(_ops_model(True, False))
    ops = [n.op_type for n in onnx.load_from_string(fused).graph.node]
    assert ops == ["Mul", "Mul", custom_ops.SCALED_SILU_MUL]


def test_rewrite_leaves_values_others_read() -> None:
    fused = fuse_gated_silu(fuse_row_quantization(_builder_mlp(with_output_read=True)))
    ops = [n.op_type for n in onnx.load_from_string(fused).graph.node]
    assert "Mul" in ops  # the gate's row-scale product is a graph output: it stays
    assert custom_ops.SCALED_SILU_MUL in ops
    assert fuse_gated_silu(b"not a model") is None
    plain = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", F, None)],
        [helper.make_tensor_value_info("y", F, None)],
    )
    assert fuse_gated_silu(helper.make_model(plain).SerializeToString()) is None


def test_only_where_onnxruntime_makes_quickgelu_and_only_for_prompts() -> None:
    data = _builder_mlp()
    ops = lambda graph: {n.op_type for n in onnx.load_from_string(graph).graph.node}  # noqa: E731
    assert custom_ops.SCALED_SILU_MUL in ops(model_module._host_ops(data, 99, prompts_only=True))
    assert custom_ops.SCALED_SILU_MUL in ops(model_module._host_ops(data, 2, prompts_only=True))
    assert custom_ops.SCALED_SILU_MUL not in ops(model_module._host_ops(data, 1, prompts_only=True))
    assert custom_ops.SCALED_SILU_MUL not in ops(model_module._host_ops(data, 99))


def test_switch_turns_it_off(monkeypatch) -> None:
    monkeypatch.setenv("GENAI_GATED_SILU", "0")
    graph = model_module._host_ops(_builder_mlp(), 99, prompts_only=True)
    assert custom_ops.SCALED_SILU_MUL not in {
        n.op_type for n in onnx.load_from_string(graph).graph.node
    }


@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 100, 1536])
def test_row_kernels_are_numpys_products_on_every_code_path(n: int) -> None:
    rng = np.random.default_rng(n)
    a = (rng.standard_normal((5, n)) * 1e3).astype(np.float32)
    b = rng.standard_normal((5, n)).astype(np.float32)
    factors = rng.random(5).astype(np.float32) * 7
    a[1, 0], b[2, -1] = np.float32(3.4e38), np.float32(1e-38)  # overflow, subnormal products
    with np.errstate(over="ignore"):
        want = (a * factors[:, None], a * (b * factors[:, None]), a * b)
    for level in range(custom_ops.quantize_level() + 1):
        for got, expected in zip(custom_ops.row_products(a, b, factors, level), want, strict=True):
            _same_bits(got, expected)
    with pytest.raises(ValueError, match="level"):
        custom_ops.row_products(a, b, factors, custom_ops.quantize_level() + 1)
