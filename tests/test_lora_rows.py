"""LoRA branches' MatMuls one row per call in speculative verify runs (`genai.runtime.lora_rows`,
genai's ``SingleRowsMatMul``): each row gets onnxruntime's one-row numbers there, the same bits
as a whole run elsewhere; n-gram decoding with an adapter active on an int4 folder gives plain
decoding's tokens."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import genai
from genai._core import custom_ops
from genai._core.native_session import NativeSession
from genai.runtime.chunked_attention import single_rows
from genai.runtime.lora_rows import single_rows_lora
from genai.runtime.verify_rows import exact_rows
from genai.testing.lora import copy_with_lora, write_lora_adapter

K, N = 96, 40


def _matmul_model(weight_input: bool = True, rank: int = 2) -> bytes:
    """``y = MatMul(a, w)``: ``w`` a graph input of ``rank`` dimensions, or an initializer."""
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["b", "m", K])]
    inits = []
    if weight_input:
        shape = ["k", "r"] if rank == 2 else [1, "k", "r"]
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, shape))
    else:
        weight = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, "w"))
    node = helper.make_node("MatMul", ["a", "w"], ["y"])
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "mm", inputs, [output], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _ours(data: bytes, a: np.ndarray, w: np.ndarray) -> np.ndarray:
    session = NativeSession(None, model_bytes=data, intra_op_num_threads=1, genai_ops=True)
    out = np.empty((*a.shape[:-1], w.shape[-1]), np.float32)
    session.bind_input("a", a)
    session.bind_input("w", w)
    session.bind_output("y", out)
    session.run()
    return out


def _theirs(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(_matmul_model(), providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a, "w": w})[0]


def _data(rows: int, batch: int = 1, n: int = N, seed: int = 3):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, rows, K)).astype(np.float32)
    return a, rng.standard_normal((K, n)).astype(np.float32)


def test_rewrite_takes_only_matmuls_on_rank_2_weight_inputs():
    rewritten = single_rows_lora(_matmul_model())
    assert rewritten is not None and custom_ops.SINGLE_ROWS_MATMUL.encode() in rewritten
    assert single_rows_lora(_matmul_model(weight_input=False)) is None  # packed by onnxruntime
    assert single_rows_lora(_matmul_model(rank=3)) is None
    assert single_rows_lora(b"not a model") is None


@pytest.mark.parametrize("rows", [2, 5, 17])
def test_verify_rows_get_one_row_runs_bits(rows):
    """Inside `single_rows` each row equals onnxruntime's MatMul on that row alone, every bit;
    outside, the whole run equals onnxruntime's whole run."""
    data = single_rows_lora(_matmul_model())
    a, w = _data(rows)
    alone = np.concatenate([_theirs(a[:, r : r + 1], w) for r in range(rows)], axis=1)
    whole = _theirs(a, w)
    before = custom_ops.matmul_row_calls()
    with single_rows():
        got = _ours(data, a, w)
    assert custom_ops.matmul_row_calls() == before + 1
    np.testing.assert_array_equal(got.view(np.uint32), alone.view(np.uint32))
    np.testing.assert_array_equal(_ours(data, a, w).view(np.uint32), whole.view(np.uint32))
    assert custom_ops.matmul_row_calls() == before + 1


def test_several_sequences_and_empty_weights_run_whole():
    data = single_rows_lora(_matmul_model())
    a, w = _data(4, batch=2)
    before = custom_ops.matmul_row_calls()
    with single_rows():
        got = _ours(data, a, w)
        empty = _ours(data, a, np.zeros((K, 0), np.float32))  # no adapter active: rank 0
    assert custom_ops.matmul_row_calls() == before
    np.testing.assert_array_equal(got, _theirs(a, w))
    assert empty.shape == (2, 4, 0)


def test_bad_shapes_are_errors_not_crashes():
    data = single_rows_lora(_matmul_model())
    a, _ = _data(3)
    with pytest.raises(Exception, match="inner dimensions"):
        _ours(data, a, np.zeros((K + 1, 4), np.float32))


def test_int4_folder_with_an_adapter_gives_plain_decodings_tokens(default_model_path, tmp_path):
    """The default model with LoRA branches on its qkv, o and down projections and a random
    adapter active: n-gram decoding's tokens are plain decoding's (with the MatMuls in one
    call, this prompt's text parts from plain decoding's within 64 tokens on an AVX2 Zen 3),
    and plain decoding's logits are those of the graph without the rewrite."""
    folder = copy_with_lora(default_model_path, tmp_path / "lora")
    write_lora_adapter(folder, folder / "a.onnx_adapter", rank=4, seed=1, scale=0.05)
    model = genai.Model(str(folder))
    assert model.session.linear_ops is not None  # every LoRA MatMul is genai's op
    if not exact_rows(model.session):
        pytest.skip("this CPU's int4 kernels give a run's rows other numbers than one-token steps")
    adapters = genai.Adapters(model)
    adapters.load(str(folder / "a.onnx_adapter"), "a")
    tokenizer = genai.Tokenizer(model)
    story = "Tell me a short story about a lighthouse keeper who finds a message in a bottle."
    text = tokenizer.apply_chat_template(
        json.dumps([{"role": "user", "content": story}]), add_generation_prompt=True
    )
    prompt = np.array([tokenizer.encode(text)], np.int32)

    def greedy(spec: bool) -> list[int]:
        params = genai.GeneratorParams(model)
        params.set_search_options(max_length=prompt.shape[1] + 64)
        if spec:
            params.set_speculative_options(ngram_size=2, max_draft_tokens=4)
        generator = genai.Generator(model, params)
        generator.set_active_adapter(adapters, "a")
        generator.append_tokens(prompt)
        while not generator.is_done():
            generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(0)]

    before = custom_ops.matmul_row_calls()
    plain = greedy(False)
    assert custom_ops.matmul_row_calls() == before
    assert greedy(True) == plain
    assert custom_ops.matmul_row_calls() > before  # the verify runs took the LoRA rows
