"""GroupQueryAttention in chunks of query rows (`genai.runtime.chunked_attention`,
`genai._core.custom_ops`): every output bit equals onnxruntime's own op on the whole run (the
kernel alone, with onnxruntime's Python API as the reference, and whole models against the
reference engine), the rewrite takes only the nodes it can run, and bad input is an error.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
from onnx import TensorProto, helper

import genai
from genai._core import custom_ops
from genai._core.native_session import NativeSession
from genai.runtime.chunked_attention import chunk_attention, single_rows
from genai.testing.models import write_gqa_decoder

HEADS, KV_HEADS, HEAD_SIZE, CACHE = 6, 2, 16, 1024


def _gqa_model(
    *, packed: bool = True, extra: dict | None = None, shaped: bool = True, empty_tail: int = 0
) -> bytes:
    """One GroupQueryAttention node over a shared past/present buffer, rotary inside;
    ``empty_tail`` empty input names after the nine (as the reference's builder writes)."""
    width = (HEADS + 2 * KV_HEADS) * HEAD_SIZE if packed else HEADS * HEAD_SIZE
    names = ["query", "", ""] if packed else ["query", "key", "value"]
    node = helper.make_node(
        "GroupQueryAttention",
        [*names, "past_key", "past_value", "seqlens_k", "total", "cos", "sin"] + [""] * empty_tail,
        ["out", "present_key", "present_value"],
        domain="com.microsoft",
        num_heads=HEADS,
        kv_num_heads=KV_HEADS,
        do_rotary=1,
        scale=0.3,
        **(extra or {}),
    )
    query_shape = ["batch", "rows", width] if shaped else None
    inputs = [helper.make_tensor_value_info("query", TensorProto.FLOAT, query_shape)]
    if not packed:
        inputs += [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "rows", KV_HEADS * 16])
            for n in ("key", "value")
        ]
    kv = ["batch", KV_HEADS, "cache", HEAD_SIZE]
    inputs += [
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT, kv),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT, kv),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    angles = np.arange(CACHE)[:, None] / 100.0 ** (np.arange(HEAD_SIZE // 2)[None] / 8)
    inits = [
        onnx.numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
        onnx.numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
    ]
    outputs = [
        helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("present_key", TensorProto.FLOAT, kv),
        helper.make_tensor_value_info("present_value", TensorProto.FLOAT, kv),
    ]
    graph = helper.make_graph([node], "gqa", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _feeds(rng, batch: int, past: int, rows: int, packed: bool) -> dict[str, np.ndarray]:
    width = (HEADS + 2 * KV_HEADS) * HEAD_SIZE if packed else HEADS * HEAD_SIZE
    feeds = {"query": rng.standard_normal((batch, rows, width)).astype(np.float32)}
    if not packed:
        for name in ("key", "value"):
            feeds[name] = rng.standard_normal((batch, rows, KV_HEADS * HEAD_SIZE))
            feeds[name] = feeds[name].astype(np.float32)
    for name in ("past_key", "past_value"):
        feeds[name] = rng.standard_normal((batch, KV_HEADS, CACHE, HEAD_SIZE)).astype(np.float32)
    feeds["seqlens_k"] = np.full(batch, past + rows - 1, np.int32)
    feeds["total"] = np.array(past + rows, np.int32)
    return feeds


def _run_onnxruntime(data: bytes, feeds: dict[str, np.ndarray], threads: int) -> list:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    key, value = feeds["past_key"].copy(), feeds["past_value"].copy()
    binding = session.io_binding()
    for name, array in feeds.items():
        if name not in ("past_key", "past_value"):
            binding.bind_cpu_input(name, array)
    binding.bind_output("out")  # (first: copy_outputs_to_cpu lists outputs as bound)
    for past, array in (("past_key", key), ("past_value", value)):
        shared = ort.OrtValue.ortvalue_from_numpy(array)
        binding.bind_ortvalue_input(past, shared)
        binding.bind_ortvalue_output(past.replace("past", "present"), shared)
    session.run_with_iobinding(binding)
    return [binding.copy_outputs_to_cpu()[0], key, value]


def _run_genai(data: bytes, feeds: dict[str, np.ndarray], threads: int) -> list:
    session = NativeSession(None, model_bytes=data, intra_op_num_threads=threads, genai_ops=True)
    key, value = feeds["past_key"].copy(), feeds["past_value"].copy()
    for name, array in feeds.items():
        if name not in ("past_key", "past_value"):
            session.bind_input(name, array)
    session.bind_input("past_key", key)
    session.bind_input("past_value", value)
    session.bind_output("present_key", key)
    session.bind_output("present_value", value)
    batch, rows = feeds["query"].shape[:2]
    out = np.empty((batch, rows, HEADS * HEAD_SIZE), np.float32)
    session.bind_output("out", out)
    session.run()
    return [out, key, value]


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize(
    ("past", "rows", "chunked"),
    [
        (0, 130, True),
        (37, 300, True),
        (0, 129, True),  # 32k + 1 rows: one call runs its last row alone
        (0, 193, True),
        (0, 513, True),
        (11, 577, True),
        (0, 1000, True),
        (5, 127, False),
        (100, 1, False),
    ],
)
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_is_onnxruntimes_op_bit_for_bit(packed, past, rows, chunked, threads) -> None:
    """Prompts (past 0) and continued runs, row counts the chunk size does not divide (32k + 1
    among them, whose last row onnxruntime's GEMM computes alone), runs too short to chunk: the
    output and both whole KV buffers equal onnxruntime's, every bit."""
    rewritten = chunk_attention(_gqa_model(packed=packed))
    assert rewritten is not None
    feeds = _feeds(np.random.default_rng(rows + past), 1, past, rows, packed)
    before = custom_ops.chunked_calls()
    ours = _run_genai(rewritten, feeds, threads)
    assert (custom_ops.chunked_calls() > before) == chunked
    want = _run_onnxruntime(_gqa_model(packed=packed), feeds, threads)
    for got, expected in zip(ours, want, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize(("past", "rows"), [(40, 2), (300, 5), (7, 17), (0, 9)])
def test_single_rows_give_one_token_steps_numbers(packed, past, rows) -> None:
    """Speculative verification (`single_rows`): a run of several tokens gives, every bit, the
    output and KV of the same tokens run one per call (one-token steps); onnxruntime's kernel on
    the whole run gives other last bits on most inputs."""
    rewritten = chunk_attention(_gqa_model(packed=packed))
    feeds = _feeds(np.random.default_rng(past * 31 + rows), 1, past, rows, packed)
    steps = [feeds["past_key"].copy(), feeds["past_value"].copy()]
    outs = []
    for r in range(rows):
        step = {
            **{n: feeds[n][:, r : r + 1].copy() for n in ("query", "key", "value") if n in feeds},
            "past_key": steps[0],
            "past_value": steps[1],
            "seqlens_k": np.array([past + r], np.int32),
            "total": np.array(past + r + 1, np.int32),
        }
        out, steps[0], steps[1] = _run_onnxruntime(_gqa_model(packed=packed), step, 1)
        outs.append(out)
    before = custom_ops.single_row_calls()
    with single_rows():
        ours = _run_genai(rewritten, feeds, 2)
    assert custom_ops.single_row_calls() == before + 1
    for got, expected in zip(ours, [np.concatenate(outs, axis=1), *steps], strict=True):
        np.testing.assert_array_equal(got, expected)
    assert not custom_ops.single_row_attention(False)  # the block put the switch back
    whole = _run_onnxruntime(_gqa_model(packed=packed), feeds, 1)
    assert not np.array_equal(whole[0], ours[0])  # (what the switch is for)
    np.testing.assert_array_equal(_run_genai(rewritten, feeds, 1)[0], whole[0])


def _growing_steps(data: bytes, feeds: dict[str, np.ndarray], past: int) -> list:
    """onnxruntime's op on a growing past, one token per call: output rows, last presents."""
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    caches = [feeds[name][:, :, :past].copy() for name in ("past_key", "past_value")]
    outs = []
    for r in range(feeds["query"].shape[1]):
        step = {n: feeds[n][:, r : r + 1].copy() for n in ("query", "key", "value") if n in feeds}
        step.update(past_key=caches[0], past_value=caches[1])
        step["seqlens_k"] = np.array([past + r], np.int32)
        step["total"] = np.array(past + r + 1, np.int32)
        out, *caches = session.run(None, step)
        outs.append(out)
    return [np.concatenate(outs, axis=1), *caches]


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize(("past", "rows"), [(40, 1), (40, 2), (300, 5), (0, 9)])
@pytest.mark.parametrize("threads", [0, 1])
def test_rows_on_a_growing_past_give_one_token_steps_numbers(packed, past, rows, threads) -> None:
    """A growing past (``past_present_share_buffer`` false: past buffers of their own, present
    ones a position per row longer): a decode step, and a verify run in `single_rows`, give the
    output and presents of onnxruntime's one-token steps, every bit, by onnxruntime's kernel
    (``threads`` 0) or, where the rewrite marks the node, genai's decode kernel (packed QKV)."""
    rewritten = chunk_attention(_gqa_model(packed=packed), threads=threads)
    feeds = _feeds(np.random.default_rng(past * 7 + rows), 1, past, rows, packed)
    want = _growing_steps(_gqa_model(packed=packed), feeds, past)
    session = NativeSession(None, model_bytes=rewritten, intra_op_num_threads=1, genai_ops=True)
    for name, array in feeds.items():
        session.bind_input(name, array[:, :, :past].copy() if name.startswith("past") else array)
    got = [np.empty((1, rows, HEADS * HEAD_SIZE), np.float32)]
    got += [np.full((1, KV_HEADS, past + rows, HEAD_SIZE), np.nan, np.float32) for _ in range(2)]
    for name, array in zip(("out", "present_key", "present_value"), got, strict=True):
        session.bind_output(name, array)
    before = custom_ops.single_row_calls(), custom_ops.exact_row_calls()
    with single_rows():
        session.run()
    after = custom_ops.single_row_calls(), custom_ops.exact_row_calls()
    assert after[0] == before[0] + (rows > 1)  # the run went row by row
    exact = packed and b"genai_exact_decode" in rewritten  # (the kernel takes packed QKV)
    assert after[1] == before[1] + exact
    for ours, expected in zip(got, want, strict=True):
        np.testing.assert_array_equal(ours, expected)


def test_batches_of_several_rows_run_whole() -> None:
    rewritten = chunk_attention(_gqa_model())
    assert rewritten is not None
    feeds = _feeds(np.random.default_rng(3), 2, 0, 200, True)
    before = custom_ops.chunked_calls()
    ours = _run_genai(rewritten, feeds, 1)
    assert custom_ops.chunked_calls() == before
    for got, expected in zip(ours, _run_onnxruntime(_gqa_model(), feeds, 1), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_rewrite_takes_only_nodes_it_can_run() -> None:
    rewritten = chunk_attention(_gqa_model(), chunk_rows=32)
    assert rewritten is not None
    model = onnx.load_from_string(rewritten)
    (node,) = model.graph.node
    assert (node.domain, node.op_type) == (custom_ops.DOMAIN, custom_ops.CHUNKED_GQA)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs[custom_ops.CHUNK_ATTRIBUTE] == 32
    assert attrs["num_heads"] == HEADS and attrs["do_rotary"] == 1
    assert {(o.domain, o.version) for o in model.opset_import} >= {(custom_ops.DOMAIN, 1)}
    # the reference builder's twelve inputs, the last three empty: the nine kept
    (node,) = onnx.load_from_string(chunk_attention(_gqa_model(empty_tail=3))).graph.node
    assert node.op_type == custom_ops.CHUNKED_GQA and len(node.input) == 9
    # an attribute the op does not pass on, or a non-positive chunk size
    assert chunk_attention(_gqa_model(extra={"qk_output": 1})) is None
    with pytest.raises(ValueError, match="chunk_rows"):
        chunk_attention(_gqa_model(), chunk_rows=0)
    assert chunk_attention(b"not a model") is None


def test_bad_input_is_an_error_not_a_crash() -> None:
    """A query of the wrong rank reaches the op (the graph declares no shape) and is refused
    with onnxruntime's error, naming the problem."""
    rewritten = chunk_attention(_gqa_model(shaped=False))
    assert rewritten is not None
    feeds = _feeds(np.random.default_rng(4), 1, 0, 8, True)
    feeds["query"] = feeds["query"][0]
    with pytest.raises(Exception, match="wrong rank"):
        _run_genai(rewritten, feeds, 1)


@pytest.fixture(scope="module")
def long_folder(tmp_path_factory):
    return write_gqa_decoder(tmp_path_factory.mktemp("chunked"), context_length=640)


def _greedy(module, model, ids: np.ndarray, steps: int = 8) -> tuple[np.ndarray, np.ndarray]:
    params = module.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + steps + 1)
    generator = module.Generator(model, params)
    generator.append_tokens(ids)
    logits = np.array(generator.get_logits())
    for _ in range(steps):
        generator.generate_next_token()
    return logits, np.array(generator.get_sequence(0))


@pytest.mark.parametrize("length", [129, 400, 600])
def test_model_prompt_is_the_references_bit_for_bit(long_folder, length: int) -> None:
    """A builder-style GQA decoder: a long prompt's next-token logits and greedy tokens equal
    the reference engine's on the same folder, every bit, with the prompt run in chunks."""
    model = genai.Model(long_folder)
    assert model.session.genai_ops
    ids = np.random.default_rng(length).integers(5, 60, (1, length)).astype(np.int64)
    before = custom_ops.chunked_calls()
    ours = _greedy(genai, model, ids)
    assert custom_ops.chunked_calls() > before
    ref = _greedy(og, og.Model(str(long_folder)), ids)
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[1], ref[1])


def test_switch_turns_the_rewrite_off(long_folder, monkeypatch) -> None:
    monkeypatch.setenv("GENAI_CHUNKED_ATTENTION", "0")
    assert not genai.Model(long_folder).session.genai_ops


def test_reference_built_real_model_is_the_reference(reference_built_smollm2_path) -> None:
    """SmolLM2-135M as the reference's builder wrote it (GroupQueryAttention with twelve
    inputs): a 300-token prompt runs in chunks, and its next-token logits and greedy tokens are
    the reference engine's, bit for bit."""
    folder = reference_built_smollm2_path
    model = genai.Model(folder)
    assert model.session.genai_ops
    ids = np.random.default_rng(3).integers(100, 40000, (1, 300)).astype(np.int64)
    before = custom_ops.chunked_calls()
    ours = _greedy(genai, model, ids, steps=6)
    assert custom_ops.chunked_calls() > before
    ref = _greedy(og, og.Model(str(folder)), ids, steps=6)
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[1], ref[1])
