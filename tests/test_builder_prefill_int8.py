"""The builder's ``prefill_int8`` option: prompts (runs of more than VERIFY_TOKENS new tokens)
take an int8 branch of the graph, decode steps and short runs the int4 one. Prompt logits
against a NumPy forward pass of the same weights, short runs against the plain int4 build, the
int8 arithmetic against NumPy, tokens against the reference engine on the same folder."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import genai
from genai.builder import build, cli
from genai.builder.errors import BuildError
from genai.builder.onnx_writer import VERIFY_TOKENS, _Decoder, _GraphWriter
from genai.builder.quantize import INT8_RANGE, quantize_int8_columns
from genai.builder.testing import ARCH_CONFIGS, numpy_forward, random_weights, write_hf_checkpoint
from tests.parity import assert_same_run, greedy

pytest.importorskip("safetensors", reason="the safetensors package is a test dependency")

PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 320, 20)]  # > VERIFY_TOKENS


@pytest.fixture(scope="module")
def folders(prefill_int8_folders) -> dict[str, Path]:
    return prefill_int8_folders


def _session(folder: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(folder / "model.onnx"), opts)


def _run(sess: ort.InferenceSession, ids: list[int], past: dict | None = None):
    """One run on top of ``past`` (None: empty); returns (last logits row, presents)."""
    feeds: dict[str, np.ndarray] = {"input_ids": np.array([ids], np.int64)}
    past_len = 0
    for inp in sess.get_inputs():
        if inp.name.startswith("past_key_values"):
            kv = past[inp.name] if past else np.zeros((1, inp.shape[1], 0, inp.shape[3]))
            feeds[inp.name] = kv.astype(np.float32)
            past_len = kv.shape[2]
    feeds["attention_mask"] = np.ones((1, past_len + len(ids)), np.int64)
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(names, feeds), strict=True))
    presents = {
        k.replace("present", "past_key_values"): v for k, v in outs.items() if "present" in k
    }
    return outs["logits"][0, -1], presents


def test_graph_is_one_if_on_the_run_length(folders):
    model = onnx.load(str(folders["prefill_int8"] / "model.onnx"), load_external_data=False)
    (branch,) = [n for n in model.graph.node if n.op_type == "If"]
    ops = {attr.name: {n.op_type for n in attr.g.node} for attr in branch.attribute if attr.g.node}
    assert "MatMulIntegerToFloat" in ops["then_branch"]
    assert "MatMulIntegerToFloat" not in ops["else_branch"]
    assert "MatMulNBits" in ops["else_branch"]
    assert [o.name for o in model.graph.output] == list(branch.output)


def test_prompt_logits_within_the_int4_tolerance(folders):
    cfg = ARCH_CONFIGS["llama"]
    expected = numpy_forward(cfg, random_weights(cfg), PROMPT)[-1]
    mine, _ = _run(_session(folders["prefill_int8"]), PROMPT)
    plain, _ = _run(_session(folders["int4"]), PROMPT)
    scale = np.abs(expected).max()
    assert np.abs(mine - expected).max() < 0.25 * scale  # the int4 builds' tolerance
    assert not np.array_equal(mine, plain)  # the prompt took the int8 branch


def test_decode_steps_and_short_runs_take_the_int4_branch(folders):
    p8, plain = _session(folders["prefill_int8"]), _session(folders["int4"])
    _, past = _run(p8, PROMPT)
    for count in (1, VERIFY_TOKENS):  # a decode step, the longest speculative verification
        ids = (PROMPT * 2)[:count]
        np.testing.assert_array_equal(_run(p8, ids, past)[0], _run(plain, ids, past)[0])
    ids = (PROMPT * 2)[: VERIFY_TOKENS + 1]  # a turn appended on top of the past
    assert not np.array_equal(_run(p8, ids, past)[0], _run(plain, ids, past)[0])


def test_per_token_int8_matmul_against_numpy(tmp_path):
    """The prefill branch's linear (int8 columns, uint8 activations scaled per token) against
    the same arithmetic in NumPy, and within rounding of the float product, with one outlier
    token 100x the others (a scale per tensor would lose the rest)."""
    rng = np.random.default_rng(0)
    n, k, m = 24, 96, 5
    w = rng.standard_normal((n, k)).astype(np.float32)
    q, scales = quantize_int8_columns(w)
    assert q.shape == (k, n) and q.dtype == np.int8 and np.abs(q).max() == INT8_RANGE
    deq = q.astype(np.float32) * scales
    assert np.abs(deq - w.T).max() <= scales.max() / 2 + 1e-6

    g = _GraphWriter(tmp_path / "w.data", TensorProto.FLOAT)
    decoder = _Decoder(g, None, "int4")  # per_token_matmul needs no spec
    decoder.per_token_matmul("x", g.weight("q", q), g.weight("s", scales), "y")
    g.finish()
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k]))
    g.outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n]))
    onnx.save_model(g.model(), str(tmp_path / "m.onnx"))  # beside w.data
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0] *= 100
    (y,) = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})
    top = np.maximum(np.abs(x).max(axis=1, keepdims=True), np.float32(1e-12))
    xq = np.floor(x * (np.float32(127) / top) + np.float32(128.5)) - 128  # round half up
    assert np.abs(xq).max() <= 127
    exact = (xq @ q.astype(np.float32)) * scales * (top / np.float32(127))
    np.testing.assert_allclose(y, exact, rtol=1e-4, atol=1e-3)
    expected = x @ deq
    err = np.abs(y - expected).max(axis=1) / np.abs(expected).max(axis=1)
    assert err.max() < 0.02  # every token, the small ones beside the outlier too


def test_engines_agree_on_the_folder(folders):
    og = pytest.importorskip("onnxruntime_genai")
    folder = folders["prefill_int8"]
    ids = np.array(PROMPT, np.int32)
    mine = greedy(genai, genai.Model(str(folder)), ids, len(PROMPT) + 16)
    theirs = greedy(og, og.Model(str(folder)), ids, len(PROMPT) + 16)
    assert_same_run(mine, theirs)
    assert len(mine.next_tokens) == 16


def test_engines_agree_on_a_batch(folders):
    """Two rows: the prompts through the int8 branch, batched decode steps through int4."""
    og = pytest.importorskip("onnxruntime_genai")
    folder = folders["prefill_int8"]
    ids = np.array([PROMPT, PROMPT[::-1]], np.int32)
    mine = greedy(genai, genai.Model(str(folder)), ids, len(PROMPT) + 10)
    theirs = greedy(og, og.Model(str(folder)), ids, len(PROMPT) + 10)
    assert_same_run(mine, theirs)


def test_prefill_int8_needs_int4(tmp_path):
    cfg = ARCH_CONFIGS["llama"]
    source = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    with pytest.raises(BuildError, match="int4"):
        build(source, tmp_path / "out", precision="fp32", prefill_int8=True)


def test_build_command_flag(tmp_path):
    parser = argparse.ArgumentParser(prog="genai")
    cli.add_build_commands(parser.add_subparsers(dest="command", required=True))
    cfg = ARCH_CONFIGS["llama"]
    source = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    args = parser.parse_args(["build", str(source), "-o", str(tmp_path / "out"), "-q"])
    assert not args.prefill_int8
    args = parser.parse_args(
        [*["build", str(source), "-o", str(tmp_path / "out")], "-q", "--prefill-int8"]
    )
    assert args.handler(args) == 0
    model = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    assert [n.op_type for n in model.graph.node][-1] == "If"
