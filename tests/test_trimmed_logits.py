"""Trimmed logits (`genai.runtime.trimmed_logits`): a reference-style decoder's long runs
compute the lm_head for their last two positions. Checked against the untouched graph run by
onnxruntime, and against the reference engine on the same folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import genai
from genai.builder.build import build
from genai.builder.testing import ARCH_CONFIGS, random_weights, write_hf_checkpoint
from genai.runtime import onnx_wire as wire
from genai.runtime.model import in_memory_graphs
from genai.runtime.trimmed_logits import VERIFY_TOKENS, trim_logits

og = pytest.importorskip("onnxruntime_genai", reason="the reference is a test dependency")

EXTERNAL = "session.model_external_initializers_file_folder_path"

#: (rows, new tokens, past, real tokens per row or None for all)
RUNS = [
    (1, 1, 5, None),
    (1, 5, 7, None),
    (1, VERIFY_TOKENS, 0, None),
    (1, VERIFY_TOKENS + 1, 0, None),
    (1, 120, 0, None),
    (1, 40, 10, None),
    (2, 40, 0, [40, 23]),
    (3, 30, 0, [1, 30, 2]),
    (2, 9, 0, [9, 4]),
]


def _sessions(folder: Path) -> tuple[ort.InferenceSession, ort.InferenceSession, object]:
    """The untouched decoder and its trimmed twin, both on one thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry(EXTERNAL, str(folder))
    data = (folder / "model.onnx").read_bytes()
    trimmed = trim_logits(data, min_head_size=0)  # (the fixtures' lm_heads are small)
    assert trimmed is not None, "the rewrite applies to a reference-style decoder"
    return (
        ort.InferenceSession(data, options),
        ort.InferenceSession(trimmed.graph, options),
        trimmed,
    )


def _feeds(folder: Path, session: ort.InferenceSession, rows: int, count: int, past: int, real):
    rng = np.random.default_rng(count * 31 + past)
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    vocab = session.get_outputs()[0].shape[-1]
    heads, head_size = decoder["num_key_value_heads"], decoder["head_size"]
    feeds = {}
    for info in session.get_inputs():
        if info.name == "input_ids":
            dtype = np.int32 if info.type == "tensor(int32)" else np.int64
            feeds[info.name] = rng.integers(0, vocab, (rows, count)).astype(dtype)
        elif info.name == "attention_mask":
            dtype = np.int32 if info.type == "tensor(int32)" else np.int64
            mask = np.ones((rows, past + count), dtype)
            for b, length in enumerate(real or []):
                mask[b, past + length :] = 0
            feeds[info.name] = mask
        elif info.name == "position_ids":
            dtype = np.int32 if info.type == "tensor(int32)" else np.int64
            feeds[info.name] = np.tile(np.arange(past, past + count, dtype=dtype), (rows, 1))
        elif info.name.startswith("past"):
            shape = [rows, heads, past, head_size]
            feeds[info.name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        else:
            raise AssertionError(f"unexpected input {info.name}")
    return feeds


def _check_runs(folder: Path) -> None:
    full_session, trimmed_session, trimmed = _sessions(folder)
    head = ort.InferenceSession(trimmed.head, _head_options(folder))
    vocab = full_session.get_outputs()[0].shape[-1]
    for rows, count, past, real in RUNS:
        feeds = _feeds(folder, full_session, rows, count, past, real)
        full = full_session.run(["logits"], feeds)[0]
        logits, hidden = trimmed_session.run(["logits", trimmed.hidden], feeds)
        what = f"{rows} rows x {count} tokens on {past}"
        if count <= VERIFY_TOKENS or real is not None:  # every row, as the untouched graph
            assert logits.shape == full.shape, what
            np.testing.assert_array_equal(logits, full, err_msg=what)
        else:  # the last two positions, bit for bit
            assert logits.shape == (rows, 2, vocab), what
            np.testing.assert_array_equal(logits, full[:, -2:], err_msg=what)
        # the head graph over the hidden state gives every row back
        np.testing.assert_array_equal(head.run(None, {trimmed.hidden: hidden})[0], full)


def _head_options(folder: Path) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry(EXTERNAL, str(folder))
    return options


def test_an_int4_reference_style_decoder_gives_the_untouched_rows(full_logits_smollm2_path):
    """MatMulNBits lm_head: a single row would take another kernel (its last bits differ);
    the rewrite runs two, so the rows are the untouched graph's bit for bit. Padded batches
    (a zero in the mask) keep every row."""
    _check_runs(full_logits_smollm2_path)


@pytest.mark.parametrize("case", ["gqa", "gqa-int32", "optimum", "optimum-mha"])
def test_fixture_decoders_give_the_untouched_rows(fixture_folders, case):
    _check_runs(fixture_folders[case])


def test_generator_matches_the_reference_on_a_long_prompt(full_logits_smollm2_path):
    """A 200-token prompt: the first token's logits are the reference's bit for bit, the
    greedy tokens equal, and get_output("logits") still returns every position's row (the
    head graph, on demand), as the reference's."""
    folder = str(full_logits_smollm2_path)
    ours, theirs = genai.Model(folder), og.Model(folder)
    assert ours.session.trimmed is not None
    text = "The river town kept its records in a stone hall by the bridge. " * 20
    ids = list(genai.Tokenizer(ours).encode(text))[:200]
    a = _run(genai, ours, ids)
    b = _run(og, theirs, ids)
    assert a[1].shape == b[1].shape == (1, 200, b[1].shape[-1])
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2], b[2])


def _run(module, model, ids: list[int], new: int = 12):
    params = module.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, do_sample=False)
    generator = module.Generator(model, params)
    generator.append_tokens(ids)
    first = np.array(generator.get_logits())
    every = np.array(generator.get_output("logits"))
    while not generator.is_done():
        generator.generate_next_token()
    return first, every, np.array(generator.get_sequence(0))


def test_a_padded_batch_of_long_prompts_matches_the_reference(full_logits_smollm2_path):
    """Right-padded rows of 40 and 23 tokens (the graph keeps every row then): tokens and the
    first logits equal the reference's."""
    folder = str(full_logits_smollm2_path)
    ours, theirs = genai.Model(folder), og.Model(folder)
    assert ours.session.trimmed is not None
    rng = np.random.default_rng(4)
    prompts = [rng.integers(100, 9000, 40).tolist(), rng.integers(100, 9000, 23).tolist()]
    results = []
    for module, model in ((genai, ours), (og, theirs)):
        params = module.GeneratorParams(model)
        params.set_search_options(max_length=52, do_sample=False, batch_size=2)
        generator = module.Generator(model, params)
        batch = np.zeros((2, 40), np.int32)
        batch[0] = prompts[0]
        batch[1, :23] = prompts[1]
        batch[1, 23:] = _pad_id(folder)
        generator.append_tokens(batch)
        first = np.array(generator.get_logits())
        while not generator.is_done():
            generator.generate_next_token()
        results.append((first, [np.array(generator.get_sequence(b)) for b in range(2)]))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    for mine, reference in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_array_equal(mine, reference)


def _pad_id(folder: str) -> int:
    config = json.loads((Path(folder) / "genai_config.json").read_text())
    return int(config["model"]["pad_token_id"])


def test_the_switch_turns_it_off(full_logits_smollm2_path, monkeypatch):
    monkeypatch.setenv("GENAI_TRIM_LOGITS", "0")
    model = genai.Model(str(full_logits_smollm2_path))
    assert model.session.trimmed is None
    assert model.extra_outputs == ()


def test_graphs_it_does_not_apply_to_load_as_they_are(default_model_path, fixture_folders):
    """The builder's last-position graph (logits from a Slice), a graph without the mask
    input, an old opset, bytes that are not a model and a small lm_head (64 x 64 weights: the
    nodes would cost a decode step more than a prompt saves) are left alone."""
    assert trim_logits((default_model_path / "model.onnx").read_bytes(), min_head_size=0) is None
    data = (fixture_folders["gqa"] / "model.onnx").read_bytes()
    assert trim_logits(data, mask="no_such_input", min_head_size=0) is None
    assert trim_logits(data, logits="no_such_output", min_head_size=0) is None
    assert trim_logits(b"\x0a\x03abc\xff\xff", min_head_size=0) is None
    assert trim_logits(_with_opset(data, 12), min_head_size=0) is None
    assert trim_logits(data, min_head_size=0) is not None
    assert trim_logits(data, min_head_size=64 * 64 + 1) is None
    assert trim_logits(data, min_head_size=64 * 64) is not None
    assert genai.Model(str(fixture_folders["gqa"])).session.trimmed is None


def _with_opset(data: bytes, version: int) -> bytes:
    out = bytearray()
    for number, _, value, raw in wire.fields(data):
        if number == wire.MODEL_OPSET_IMPORT:
            entry = wire.fields(value)  # type: ignore[arg-type]
            if (wire.strings(entry, 1) or [""])[0] == "":
                raw = wire.len_field(
                    number, wire.encode_varint(2 << 3) + wire.encode_varint(version)
                )
        out += raw
    return bytes(out)


def _linked_folder(source: Path, root: Path) -> Path:
    """``source``'s files as a Hugging Face cache snapshot lays them out: links into the
    repo's ``blobs`` folder."""
    repo = root / "models--org--m"
    snapshot, blobs = repo / "snapshots" / "rev", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, entry in enumerate(sorted(source.iterdir())):
        blob = blobs / f"{i:04d}"
        blob.write_bytes(entry.read_bytes())
        (snapshot / entry.name).symlink_to(blob)
    return snapshot


def test_a_folder_of_links_into_a_cache_is_trimmed(full_logits_smollm2_path, tmp_path):
    """onnxruntime refuses external data that links out of the folder of a model given as
    bytes; the loader renames the initializers' files to the blobs they link to."""
    folder = _linked_folder(full_logits_smollm2_path, tmp_path)
    ours = genai.Model(str(folder))
    assert ours.session.trimmed is not None
    assert ours.session.trimmed.data_folder == str(folder.parent.parent / "blobs")
    ids = list(range(100, 160))
    a = _run(genai, ours, ids, new=4)
    b = _run(og, og.Model(str(full_logits_smollm2_path)), ids, new=4)
    for mine, reference in zip(a, b, strict=True):
        np.testing.assert_array_equal(mine, reference)


def test_external_data_in_two_folders_is_not_moved(full_logits_smollm2_path, tmp_path):
    """A graph whose external files link into two folders cannot name one data folder."""
    data = (full_logits_smollm2_path / "model.onnx").read_bytes()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "model.onnx.data").write_bytes(b"")
    (tmp_path / "b" / "other.data").write_bytes(b"")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.onnx.data").symlink_to(tmp_path / "a" / "model.onnx.data")
    (folder / "other.data").symlink_to(tmp_path / "b" / "other.data")
    other = wire.relocated(data, {"model.onnx.data": "other.data"})
    assert in_memory_graphs(folder, [data]) == ([data], str(tmp_path / "a"))
    assert in_memory_graphs(folder, [data, other]) is None


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_our_builders_all_logits_graphs_are_trimmed(tmp_path, arch):
    """genai build --all-logits: the lm_head's Identity and Gemma 2's softcap (Div, Tanh, Mul)
    are part of the head chain."""
    pytest.importorskip("safetensors", reason="the safetensors package is a test dependency")
    cfg = ARCH_CONFIGS[arch]
    source = write_hf_checkpoint(tmp_path / "hf", cfg, random_weights(cfg))
    _check_runs(build(source, tmp_path / arch, precision="int4", all_logits=True))
