"""genai's StepRowsMatMulNBits (`genai._core.custom_ops`, ``step_rows_kernels.h``): every row of
a run with the numbers onnxruntime's MatMulNBits gives that row alone on AVX2 CPUs, checked bit
for bit against its NumPy twin (every CPU) and onnxruntime's one-row runs (AVX2 CPUs), and the
second session speculative verify runs go to (`genai.runtime.verify_rows`)."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import genai
from genai._core import custom_ops, reference
from genai._core.native_session import NativeSession
from genai.runtime.verify_rows import (
    StepRowsSession,
    exact_rows,
    linear_ops,
    op_gives_steps,
    rows_like_steps,
    step_rows_graph,
)

# (K, N): the default model's linears' shapes, an odd block count, N % 4 != 0, tiny ones
SHAPES = [(576, 576), (1536, 576), (576, 1536), (544, 578), (96, 10), (64, 7), (32, 5)]
LEVELS = sorted({0, custom_ops.step_rows_level()})


def _weights(k: int, n: int, zero_points: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    blocks = k // 32
    b = rng.integers(0, 256, (n, blocks, 16), dtype=np.uint8)
    scales = (rng.standard_normal((n, blocks)) * 0.02).astype(np.float32)
    zp = rng.integers(0, 256, (n, (blocks + 1) // 2), dtype=np.uint8) if zero_points else None
    return b, scales, zp


def _rows(count: int, k: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((count, k)) * rng.uniform(0.1, 3.0, (count, 1))).astype(np.float32)
    a[0, :7] *= 20  # outliers set a block's scale
    if count > 1:
        a[1, :32] = 0  # an all-zero block
    return a


def _model(
    k: int, n: int, b, scales, zp, accuracy: int = 4, block: int = 32, bits: int = 4, width=None
):
    inits = [numpy_helper.from_array(b, "w"), numpy_helper.from_array(scales.ravel(), "s")]
    names = ["a", "w", "s"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp.ravel(), "z"))
        names.append("z")
    node = helper.make_node(
        "MatMulNBits",
        names,
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=accuracy,
    )
    graph = helper.make_graph(
        [node],
        "linear",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "m", width or k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "m", n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("level", LEVELS)
def test_kernel_equals_its_numpy_twin(k: int, n: int, zero_points: bool, level: int) -> None:
    b, scales, zp = _weights(k, n, zero_points)
    a = _rows(11, k)  # more than a group of 8 rows
    got = custom_ops.step_rows_matmul(a, b, scales, zp, level=level)
    np.testing.assert_array_equal(_bits(got), _bits(reference.step_rows_matmul(a, b, scales, zp)))
    # a row's numbers do not depend on the rows beside it
    np.testing.assert_array_equal(
        _bits(custom_ops.step_rows_matmul(a[3:4], b, scales, zp, level=level)), _bits(got[3:4])
    )


@pytest.mark.parametrize("zero_points", [False, True])
def test_every_row_count_of_a_group_equals_the_twin(zero_points: bool) -> None:
    # The AVX2 path runs groups of up to 8 rows, their scale products 4 rows at a time: each
    # count from 1 to 17 takes another mix of full and partial groups.
    b, scales, zp = _weights(576, 36, zero_points, seed=5)
    a = _rows(17, 576, seed=7)
    for count in range(1, 18):
        got = custom_ops.step_rows_matmul(a[:count], b, scales, zp)
        want = reference.step_rows_matmul(a[:count], b, scales, zp)
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{count} rows")


def _ort_alone(data: bytes, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    alone = np.concatenate(
        [session.run(None, {"a": a[None, i : i + 1]})[0][0] for i in range(len(a))]
    )
    return alone, session.run(None, {"a": a[None]})[0][0]


@pytest.mark.skipif(
    custom_ops.quantize_level() != 1,
    reason="onnxruntime's one-row int4 kernel is its AVX2 one only on AVX2 CPUs without AVX-512",
)
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("zero_points", [False, True])
def test_kernel_gives_onnxruntimes_one_row_numbers_on_avx2(k: int, n: int, zero_points: bool):
    b, scales, zp = _weights(k, n, zero_points, seed=k + n)
    a = _rows(6, k, seed=n)
    alone, together = _ort_alone(_model(k, n, b, scales, zp), a)
    for level in LEVELS:
        got = custom_ops.step_rows_matmul(a, b, scales, zp, level=level)
        np.testing.assert_array_equal(_bits(got), _bits(alone))
    if n >= 64:  # what the op is for: onnxruntime's own run of several rows differs
        assert not np.array_equal(_bits(together), _bits(alone))
    assert op_gives_steps(frozenset({(k, n, 4, 32, 4, zero_points)}))


def test_op_in_a_session_equals_the_kernel_and_names_bad_input() -> None:
    k, n = 96, 40
    b, scales, zp = _weights(k, n, True)
    rewritten = step_rows_graph(_model(k, n, b, scales, zp, width="k"))
    assert rewritten is not None
    session = NativeSession(None, model_bytes=rewritten, intra_op_num_threads=2, genai_ops=True)
    a = _rows(6, k).reshape(2, 3, k)
    out = np.empty((2, 3, n), np.float32)
    session.bind_input("a", a)
    session.bind_output("y", out)
    session.run()
    want = reference.step_rows_matmul(a.reshape(6, k), b, scales, zp).reshape(2, 3, n)
    np.testing.assert_array_equal(_bits(out), _bits(want))
    session.bind_input("a", np.zeros((1, 2, k + 32), np.float32))
    session.bind_output("y", np.empty((1, 2, n), np.float32))
    with pytest.raises(Exception, match="A's last dimension is not K"):
        session.run()


@pytest.mark.parametrize("settings", [{"accuracy": 0}, {"accuracy": 1}, {"block": 64}, {"bits": 8}])
def test_graph_rewrite_takes_only_what_the_kernel_computes(settings: dict) -> None:
    k, n = 128, 16
    bits, block = settings.get("bits", 4), settings.get("block", 32)
    b = np.zeros((n, k // block, block * bits // 8), np.uint8)
    scales = np.ones((n, k // block), np.float32)
    data = _model(k, n, b, scales, None, settings.get("accuracy", 4), block, bits)
    assert step_rows_graph(data) is None
    assert not op_gives_steps(linear_ops(data))
    assert step_rows_graph(b"not a model") is None
    assert not op_gives_steps(None) and not op_gives_steps(frozenset())


def test_route_verify_runs_checks_the_sessions_and_clears() -> None:
    k, n = 64, 8
    b, scales, _ = _weights(k, n, False)
    plain = NativeSession(None, model_bytes=_model(k, n, b, scales, None))
    ours = NativeSession(None, model_bytes=step_rows_graph(_model(k, n, b, scales, None)),
                         genai_ops=True)  # fmt: skip
    binding = plain.new_binding()
    a = _rows(3, k)[None]
    out = np.empty((1, 3, n), np.float32)
    binding.bind_input("a", a)
    binding.bind_output("y", out)
    binding.route_verify_runs(ours)
    assert binding.routes_verify_runs
    binding.run()
    np.testing.assert_array_equal(_bits(out[0]), _bits(reference.step_rows_matmul(a[0], b, scales)))
    binding.route_verify_runs(None)
    assert not binding.routes_verify_runs
    with pytest.raises(ValueError, match="inputs and outputs differ"):
        binding.route_verify_runs(NativeSession(None, model_bytes=_linear_other(k)))


def _linear_other(k: int) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "other",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", k])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_step_rows_session_builds_once_and_survives_a_failure(caplog) -> None:
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("no room")

    lazy = StepRowsSession(broken)
    with caplog.at_level(logging.WARNING, logger="genai.runtime.verify_rows"):
        assert lazy.get() is None
        assert lazy.get() is None
    assert calls == [1]
    assert "no room" in caplog.text
    built = StepRowsSession(lambda: "session")
    assert not built.built
    assert built.get() == "session" == built.get()
    assert built.built


def _greedy(model, prompt: list[int], new: int, spec: bool) -> tuple[list[int], dict | None]:
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new)
    if spec:
        params.set_speculative_options(ngram_size=2, max_draft_tokens=4)
    gen = genai.Generator(model, params)
    gen.append_tokens(np.array([prompt], np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)], gen.get_speculative_stats() if spec else None


@pytest.fixture(scope="module")
def weights_inside(default_model_path, tmp_path_factory):
    """The default model with its weights inside its graph file (``onnx.save`` without
    external data: 86 MB, more than genai reads whole to rewrite)."""
    import onnx

    folder = tmp_path_factory.mktemp("weights_inside")
    for item in default_model_path.iterdir():
        if item.is_file() and not item.name.startswith("model.onnx"):
            (folder / item.name).write_bytes(item.read_bytes())
    onnx.save(onnx.load(str(default_model_path / "model.onnx")), str(folder / "model.onnx"))
    assert not (folder / "model.onnx.data").exists()
    return folder


@pytest.mark.parametrize(
    ("share_buffer", "inside"),
    [(True, False), (False, False), (True, True)],
    ids=["shared", "growing", "weights-inside"],
)
def test_default_model_ngram_tokens_are_plain_decodings_where_the_op_applies(
    default_model_path, request, share_buffer, inside
):
    """On the folder our builder writes by default (int4, blocks of 32, accuracy level 4), the
    verify runs get one-token steps' numbers on AVX-512 CPUs (the linears already) and on AVX2
    ones (the second session with StepRowsMatMulNBits): n-gram decoding's tokens are plain
    decoding's, on its shared KV buffer, on a growing one, and with the weights inside the
    graph file (`genai.runtime.outlined_weights`). (With verify runs in one call, this
    prompt's text parts from plain decoding's within 64 tokens on an AVX2 Zen 3, on either.)"""
    folder = request.getfixturevalue("weights_inside") if inside else default_model_path
    config = genai.Config(str(folder))
    config.overlay({"search": {"past_present_share_buffer": share_buffer}})
    model = genai.Model(config)
    session = model.session
    if inside:
        # the graph was read (a graph left as it is has no linear settings), and its
        # settings are the folder's with an external-data file
        assert session.linear_ops is not None
        assert session.linear_ops == genai.Model(str(default_model_path)).session.linear_ops
    if not exact_rows(session):
        pytest.skip("this CPU's int4 kernels give a run's rows other numbers than one-token steps")
    tokenizer = genai.Tokenizer(model)
    story = "Tell me a short story about a lighthouse keeper who finds a message in a bottle."
    text = tokenizer.apply_chat_template(
        json.dumps([{"role": "user", "content": story}]), add_generation_prompt=True
    )
    prompt = [int(t) for t in tokenizer.encode(text)]
    plain, _ = _greedy(model, prompt, 64, False)
    got, stats = _greedy(model, prompt, 64, True)
    assert stats["target_verify_forward_passes"] > 0
    assert got == plain
    # the second session exactly where the linears alone do not give the steps' numbers
    assert session.step_rows_session.built != rows_like_steps(session.linear_ops)
