"""A ``prefill_int8`` decoder (one run-length ``If`` at the top of the graph) runs as two
sessions, one per branch, each run routed where the ``If`` would send it
(`genai.runtime.run_length_split`, `NativeSession.route_long_runs`): every logit is the
reference's (which runs the ``If`` graph) on both sides of the threshold, at batch 1 and 2,
for prompts, decode steps, appended turns and speculative verification."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import pytest

import genai
from genai._core.native_session import NativeSession
from genai.builder.onnx_writer import VERIFY_TOKENS
from genai.runtime.run_length_split import split_by_run_length

pytest.importorskip("safetensors", reason="the safetensors package is a test dependency")


@pytest.fixture(scope="module")
def folders(prefill_int8_folders) -> dict[str, Path]:
    return prefill_int8_folders


def _logits_after(module, model, runs: list[np.ndarray], steps: int) -> list[np.ndarray]:
    """The next-token logits after each of ``runs`` (appended in turn) and after each of
    ``steps`` greedy steps following the first run."""
    batch = runs[0].shape[0]
    total = sum(r.shape[1] for r in runs) + steps + 2
    params = module.GeneratorParams(model)
    params.set_search_options(max_length=total, batch_size=batch)
    generator = module.Generator(model, params)
    out = []
    generator.append_tokens(runs[0])
    out.append(np.array(generator.get_logits()))
    for _ in range(steps):
        generator.generate_next_token()
        out.append(np.array(generator.get_logits()))
    for run in runs[1:]:
        generator.append_tokens(run)
        out.append(np.array(generator.get_logits()))
    return out


def _ids(rows: int, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 320, (rows, count)).astype(np.int32)


def test_the_split_routes_at_the_if_threshold(folders):
    split = split_by_run_length(folders["prefill_int8"] / "model.onnx")
    assert split is not None and split.above == VERIFY_TOKENS and split.ids == "input_ids"
    assert split_by_run_length(folders["int4"] / "model.onnx") is None
    assert genai.Model(folders["prefill_int8"]).session.routes_long_runs == VERIFY_TOKENS
    assert genai.Model(folders["int4"]).session.routes_long_runs is None


@pytest.mark.parametrize("prompt", [3, VERIFY_TOKENS, VERIFY_TOKENS + 1, 40])
def test_every_logit_is_the_if_graphs(folders, prompt):
    """Prompt, 6 decode steps, then appended turns of 5 and 30 tokens (int4, int8)."""
    folder = folders["prefill_int8"]
    runs = [_ids(1, prompt, prompt), _ids(1, 5, 1), _ids(1, 30, 2)]
    ours = _logits_after(genai, genai.Model(folder), runs, 6)
    ref = _logits_after(og, og.Model(str(folder)), runs, 6)
    for step, (a, b) in enumerate(zip(ours, ref, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"logits differ after run {step}")


def test_the_branches_differ(folders):
    """The int8 and int4 branches give other numbers for the same prompt, so the equality
    above shows each run took the reference's branch."""
    split = split_by_run_length(folders["prefill_int8"] / "model.onnx")
    assert split is not None
    ids = _ids(1, 24, 5).astype(np.int64)
    outs = []
    for graph in (split.short_graph, split.long_graph):
        sess = NativeSession(
            str(folders["prefill_int8"] / "model.onnx"),
            model_bytes=graph,
            config_entries={
                "session.model_external_initializers_file_folder_path": str(folders["prefill_int8"])
            },
        )
        sess.bind_input("input_ids", ids)
        sess.bind_input("attention_mask", np.ones_like(ids))
        for name, shape in sess.input_shapes.items():
            if name.startswith("past_key_values"):
                sess.bind_input(name, np.zeros((1, shape[1], 0, shape[3]), np.float32))
        for name in sess.output_names:
            sess.bind_output_to_device(name)
        sess.run()
        outs.append(np.array(sess.get_output("logits")))
    assert not np.array_equal(outs[0], outs[1])


def test_batch_two_matches_the_reference(folders):
    folder = folders["prefill_int8"]
    runs = [_ids(2, 24, 9)]
    ours = _logits_after(genai, genai.Model(folder), runs, 5)
    ref = _logits_after(og, og.Model(str(folder)), runs, 5)
    for a, b in zip(ours, ref, strict=True):
        np.testing.assert_array_equal(a, b)


def test_switched_off_runs_the_if_graph(folders, monkeypatch):
    monkeypatch.setenv("GENAI_RUN_LENGTH_SPLIT", "0")
    model = genai.Model(folders["prefill_int8"])
    assert model.session.routes_long_runs is None
    runs = [_ids(1, 24, 3)]
    ours = _logits_after(genai, model, runs, 3)
    ref = _logits_after(og, og.Model(str(folders["prefill_int8"])), runs, 3)
    for a, b in zip(ours, ref, strict=True):
        np.testing.assert_array_equal(a, b)


def test_route_long_runs_refuses_other_graphs(folders, fixture_folders):
    ours = NativeSession(str(folders["int4"] / "model.onnx"))
    other = NativeSession(str(fixture_folders["gqa"] / "model.onnx"))
    with pytest.raises(ValueError, match="inputs and outputs differ"):
        ours.route_long_runs(other, "input_ids", VERIFY_TOKENS)
    same = NativeSession(str(folders["int4"] / "model.onnx"))
    with pytest.raises(ValueError, match="above must be >= 0"):
        ours.route_long_runs(same, "input_ids", -1)
    with pytest.raises(KeyError):
        ours.route_long_runs(same, "no_such_input", 3)
    ours.route_long_runs(same, "input_ids", 3)
    assert ours.routes_long_runs == 3
    assert ours.new_binding().routes_long_runs == 3
    with pytest.raises(ValueError, match="at most once"):
        ours.route_long_runs(same, "input_ids", 3)


def test_the_flattened_graphs_are_the_branches(folders):
    """Read back with the onnx package (an independent protobuf reader): each graph is its
    branch's nodes, outputs renamed to the If's, with the outer graph's inputs, outputs and
    opsets and exactly the initializers its nodes read."""
    import onnx

    path = folders["prefill_int8"] / "model.onnx"
    split = split_by_run_length(path)
    assert split is not None
    model = onnx.load(str(path), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "If")
    branches = {attr.name: attr.g for attr in node.attribute}
    for flat_bytes, name in ((split.short_graph, "else_branch"), (split.long_graph, "then_branch")):
        flat = onnx.load_from_string(flat_bytes)
        branch = branches[name]
        rename = {o.name: outer for o, outer in zip(branch.output, node.output, strict=True)}
        assert len(flat.graph.node) == len(branch.node)
        for got, want in zip(flat.graph.node, branch.node, strict=True):
            assert got.op_type == want.op_type and got.domain == want.domain
            assert list(got.input) == [rename.get(i, i) for i in want.input]
            assert list(got.output) == [rename.get(o, o) for o in want.output]
            assert list(got.attribute) == list(want.attribute)
        assert flat.graph.input == model.graph.input
        assert flat.graph.output == model.graph.output
        assert flat.opset_import == model.opset_import
        read = {i for n in branch.node for i in n.input}
        expected = {init.name for init in model.graph.initializer if init.name in read}
        assert {init.name for init in flat.graph.initializer} == expected


def test_other_or_damaged_graphs_are_not_split(folders, tmp_path):
    original = (folders["prefill_int8"] / "model.onnx").read_bytes()
    assert split_by_run_length(tmp_path / "missing.onnx") is None
    for name, data in {
        "truncated": original[: len(original) // 2],
        "garbage": b"prefill_or_decode" + bytes(range(256)) * 4,
    }.items():
        (tmp_path / f"{name}.onnx").write_bytes(data)
        assert split_by_run_length(tmp_path / f"{name}.onnx") is None
    # the marker in a graph of another shape: a plain decoder whose first node is renamed
    import onnx

    model = onnx.load(str(folders["int4"] / "model.onnx"), load_external_data=False)
    model.graph.node[0].name = "prefill_or_decode"
    (tmp_path / "other.onnx").write_bytes(model.SerializeToString())
    assert split_by_run_length(tmp_path / "other.onnx") is None
