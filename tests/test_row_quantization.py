"""Per-row uint8 quantisation as one op (`genai.runtime.row_quantization`, the QuantizeRows op
of `genai._core.custom_ops`): the kernel's bytes and scales equal onnxruntime's eight ops and
the NumPy twin on every code path this CPU has, the rewrite fuses the builder's chains and only
those, and a ``--prefill-int8`` folder's prompt logits stay the reference engine's, bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
from onnx import TensorProto, helper

import genai
from genai._core import custom_ops, reference
from genai.runtime.row_quantization import fuse_row_quantization

FLOOR = 1e-12


def _chain_model(extra_output: bool = False) -> bytes:
    """The builder's chain (onnx_writer.per_token_matmul) over ``x``, outputs ``q`` and
    ``scale``; ``extra_output``: its ``top`` is a graph output too (nothing to fuse)."""

    def const(name: str, value, dtype=np.float32) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(np.array(value, dtype), name)

    nodes = [
        helper.make_node("Abs", ["x"], ["abs"]),
        helper.make_node("ReduceMax", ["abs", "axes"], ["max"], keepdims=1),
        helper.make_node("Max", ["max", "floor"], ["top"]),
        helper.make_node("Div", ["c127", "top"], ["inverse"]),
        helper.make_node("Mul", ["x", "inverse"], ["scaled"]),
        helper.make_node("Add", ["scaled", "offset"], ["shifted"]),
        helper.make_node("Cast", ["shifted"], ["q"], to=TensorProto.UINT8),
        helper.make_node("Div", ["top", "c127"], ["scale"]),
    ]
    inits = [
        const("axes", [-1], np.int64),
        const("floor", [FLOOR]),
        const("c127", [127.0]),
        const("offset", [128.5]),
    ]
    outputs = [
        helper.make_tensor_value_info("q", TensorProto.UINT8, None),
        helper.make_tensor_value_info("scale", TensorProto.FLOAT, None),
    ]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("top", TensorProto.FLOAT, None))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", "n"])
    graph = helper.make_graph(nodes, "chain", [x], outputs, inits)
    opsets = [helper.make_opsetid("", 18)]  # (ReduceMax takes its axes as an input from 18)
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _onnxruntime(x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(_chain_model(), providers=["CPUExecutionProvider"])
    return session.run(["q", "scale"], {"x": x})


def _rows(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((9, n)).astype(np.float32)
    x[1] *= 1e4  # a wide row
    x[2] = 0.0  # all zeros: the floor
    x[3, ::3] = -x[3, ::3] * 50  # outliers of both signs
    x[4] = np.float32(1e-30)  # below the floor
    return x


@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 64, 100, 576, 1536])
def test_kernel_is_the_ops_on_every_code_path(n: int) -> None:
    x = _rows(n, n)
    q_ops, scale_ops = _onnxruntime(x)
    q_twin, scale_twin = reference.quantize_rows(x, FLOOR)
    np.testing.assert_array_equal(q_twin, q_ops)
    np.testing.assert_array_equal(scale_twin, scale_ops)
    for level in range(custom_ops.quantize_level() + 1):
        q, scale = custom_ops.quantize_rows(x, FLOOR, level)
        np.testing.assert_array_equal(q, q_ops, err_msg=f"level {level}")
        np.testing.assert_array_equal(scale, scale_ops, err_msg=f"level {level}")


def test_level_above_the_cpus_is_refused() -> None:
    with pytest.raises(ValueError, match="level"):
        custom_ops.quantize_rows(_rows(8, 0), FLOOR, custom_ops.quantize_level() + 1)


def test_rewrite_fuses_the_chain_and_runs_as_the_ops() -> None:
    fused = fuse_row_quantization(_chain_model())
    assert fused is not None
    model = onnx.load_from_string(fused)
    assert [(n.domain, n.op_type) for n in model.graph.node] == [
        (custom_ops.DOMAIN, custom_ops.QUANTIZE_ROWS)
    ]
    assert not model.graph.initializer  # the chain's constants went with it
    from genai._core.native_session import NativeSession

    session = NativeSession(None, model_bytes=fused, genai_ops=True, intra_op_num_threads=2)
    x = np.random.default_rng(5).standard_normal((300, 576)).astype(np.float32)
    q = np.empty(x.shape, np.uint8)
    scale = np.empty((300, 1), np.float32)
    session.bind_input("x", x)
    session.bind_output("q", q)
    session.bind_output("scale", scale)
    session.run()
    q_ops, scale_ops = _onnxruntime(x)
    np.testing.assert_array_equal(q, q_ops)
    np.testing.assert_array_equal(scale, scale_ops)


def test_rewrite_leaves_chains_others_read() -> None:
    assert fuse_row_quantization(_chain_model(extra_output=True)) is None
    assert fuse_row_quantization(b"not a model") is None


@pytest.fixture(scope="module")
def folder(prefill_int8_folders):
    return prefill_int8_folders["prefill_int8"]


def _prompt(module, model, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    params = module.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + 7)
    generator = module.Generator(model, params)
    generator.append_tokens(ids)
    logits = np.array(generator.get_logits())
    for _ in range(6):
        generator.generate_next_token()
    return logits, np.array(generator.get_sequence(0))


def test_prefill_int8_folder_prompt_is_the_references(folder, monkeypatch) -> None:
    """Our builder's ``--prefill-int8`` folder: the long-run session's chains are fused (its
    attention chunked, its gated SiLU products fused too: `genai.runtime.gated_silu`), and a
    110-token prompt's logits and greedy tokens equal the reference engine's on the same
    folder, and genai's with the rewrites off, every bit."""
    from genai.runtime import model as model_module

    seen: dict[str, list] = {"rows": [], "gate": []}
    for key, name in (("rows", "fuse_row_quantization"), ("gate", "fuse_gated_silu")):
        real = getattr(model_module, name)
        monkeypatch.setattr(
            model_module,
            name,
            lambda g, real=real, key=key: seen[key].append(real(g)) or seen[key][-1],
        )
    ids = np.random.default_rng(7).integers(3, 320, (1, 110)).astype(np.int64)
    ours = _prompt(genai, genai.Model(folder), ids)
    # (the short-run branch has neither: its calls give None)
    assert any(found is not None for found in seen["rows"])
    assert any(found is not None for found in seen["gate"])
    ref = _prompt(og, og.Model(str(folder)), ids)
    for switch in ("GENAI_ROW_QUANTIZATION", "GENAI_CHUNKED_ATTENTION", "GENAI_GATED_SILU"):
        monkeypatch.setenv(switch, "0")
    plain = _prompt(genai, genai.Model(folder), ids)
    for got in (ref, plain):
        np.testing.assert_array_equal(ours[0], got[0])
        np.testing.assert_array_equal(ours[1], got[1])
