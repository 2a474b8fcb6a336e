"""The tiny fixture model folders of ``genai.testing.models``.

Each folder must be a valid ONNX model, run in the reference engine (onnxruntime-genai) at batch 1
and batch 2 with right padding, produce long varied greedy sequences, and have a KV-cache path
that agrees with a full-sequence forward pass when driven with plain onnxruntime exactly the way
the reference drives it (so the fixtures are correct independently of any engine).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from genai.testing.models import (  # noqa: E402
    write_gpt2_decoder,
    write_gqa_decoder,
    write_optimum_decoder,
)
from tests.conftest import FIXTURE_CASES  # noqa: E402

PROMPT = [5, 9, 12, 7, 20]
SHORT_PROMPT = [30, 31, 8]
NEW_TOKENS = 64
MIN_DISTINCT = 16  # observed 21-35 distinct tokens per 64 greedy steps over many seeds
SPECIAL_IDS = {0, 1, 2}

CASES = FIXTURE_CASES
REFERENCE_CASES = ["gqa", "gqa-noshare", "gqa-int32", "gqa-wide", "optimum", "optimum-int32"]
REFERENCE_CASES += ["optimum-mha", "gpt2", "gpt2-int32"]


@pytest.fixture(scope="module")
def folders(fixture_folders: dict[str, pathlib.Path]) -> dict[str, pathlib.Path]:
    return fixture_folders


def _config(folder: pathlib.Path) -> dict:
    return json.loads((folder / "genai_config.json").read_text())


# --------------------------------------------------------------------------------------------
# Graph structure
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_graph_passes_checker(folders: dict[str, pathlib.Path], case: str) -> None:
    model = onnx.load(str(folders[case] / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("case", ["gqa", "gqa-int32", "optimum", "gpt2"])
def test_graph_io(folders: dict[str, pathlib.Path], case: str) -> None:
    folder = folders[case]
    cfg = _config(folder)
    dec = cfg["model"]["decoder"]
    graph = onnx.load(str(folder / "model.onnx")).graph
    elem = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    shape = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }
    id_type = onnx.TensorProto.INT32 if case.endswith("int32") else onnx.TensorProto.INT64
    names = [v.name for v in graph.input]
    assert names[:2] == ["input_ids", "attention_mask"]
    assert elem["input_ids"] == elem["attention_mask"] == id_type
    assert shape["logits"] == ["batch_size", "sequence_length", cfg["model"]["vocab_size"]]
    layers, hd = dec["num_hidden_layers"], dec["head_size"]
    kv = dec["num_key_value_heads"]
    assert dec["hidden_size"] == dec["num_attention_heads"] * hd
    if case.startswith("gpt2"):
        assert cfg["model"]["type"] == "gpt2"
        assert dec["inputs"]["past_names"] == "past_%d"
        assert dec["outputs"]["present_names"] == "present_%d"
        assert names[2:] == ["position_ids"] + [f"past_{i}" for i in range(layers)]
        assert shape["past_0"] == [2, "batch_size", kv, "past_sequence_length", hd]
        assert shape["present_0"] == [2, "batch_size", kv, "total_sequence_length", hd]
        assert not cfg["search"]["past_present_share_buffer"]
        return
    assert cfg["model"]["type"] == "llama"
    kv_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    if case.startswith("gqa"):
        assert sorted(names[2:]) == sorted(kv_names)  # no position_ids: rotary inside GQA
        ops = [n.op_type for n in graph.node]
        assert ops.count("GroupQueryAttention") == layers
        assert "SkipSimplifiedLayerNormalization" in ops
        assert cfg["search"]["past_present_share_buffer"] is True
    else:
        assert names[2] == "position_ids" and elem["position_ids"] == id_type
        assert sorted(names[3:]) == sorted(kv_names)
        assert {n.domain for n in graph.node} == {""}
        assert cfg["search"]["past_present_share_buffer"] is False
    assert shape["past_key_values.0.key"] == ["batch_size", kv, "past_sequence_length", hd]
    assert shape["present.0.value"] == ["batch_size", kv, "total_sequence_length", hd]
    assert cfg["search"]["max_length"] == cfg["model"]["context_length"] == 128


def test_deterministic_from_seed(tmp_path: pathlib.Path) -> None:
    first = write_gqa_decoder(tmp_path, name="a") / "model.onnx"
    second = write_gqa_decoder(tmp_path, name="b") / "model.onnx"
    other = write_gqa_decoder(tmp_path, name="c", seed=1) / "model.onnx"
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()


def test_invalid_dimensions_rejected(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="16"):  # ORT's CPU GQA kernel needs head_size % 16 == 0
        write_gqa_decoder(tmp_path, hidden_size=32, num_heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        write_optimum_decoder(tmp_path, vocab_size=16)
    with pytest.raises(ValueError, match="num_kv_heads"):
        write_optimum_decoder(tmp_path, num_kv_heads=3)
    with pytest.raises(ValueError, match="id_dtype"):
        write_gpt2_decoder(tmp_path, id_dtype="float32")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Plain onnxruntime, driven the way the reference drives a model
# --------------------------------------------------------------------------------------------


class _Runner:
    """Runs a fixture graph step by step with numpy feeds (default or shared-buffer KV)."""

    def __init__(self, folder: pathlib.Path, *, capacity: int = 0) -> None:
        dec = _config(folder)["model"]["decoder"]
        self.layers = dec["num_hidden_layers"]
        self.kv_heads = dec["num_key_value_heads"]
        self.head_size = dec["head_size"]
        self.combined = "past_names" in dec["inputs"]
        self.capacity = capacity  # > 0: one [B, kv, capacity, hd] buffer bound as past+present
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(folder / "model.onnx"), opts, providers=["CPUExecutionProvider"]
        )
        inputs = {i.name: i.type for i in self.session.get_inputs()}
        self.id_dtype = np.int32 if inputs["input_ids"] == "tensor(int32)" else np.int64
        self.has_positions = "position_ids" in inputs
        self.outputs = [o.name for o in self.session.get_outputs()]

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        kv = (batch, self.kv_heads, self.capacity, self.head_size)
        if self.combined:
            return {f"past_{i}": np.zeros((2, *kv), np.float32) for i in range(self.layers)}
        return {
            f"past_key_values.{i}.{kind}": np.zeros(kv, np.float32)
            for i in range(self.layers)
            for kind in ("key", "value")
        }

    def run(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        past: dict[str, np.ndarray],
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feed = {
            "input_ids": ids.astype(self.id_dtype),
            "attention_mask": mask.astype(self.id_dtype),
        }
        if self.has_positions:
            feed["position_ids"] = positions.astype(self.id_dtype)
        feed.update(past)
        values = dict(zip(self.outputs, self.session.run(self.outputs, feed), strict=True))
        new_past = {}
        for name in past:
            present = name.replace("past_key_values.", "present.").replace("past_", "present_")
            new_past[name] = values[present]
        return values["logits"], new_past

    def full_logits(self, tokens: list[int]) -> np.ndarray:
        """Logits ``[len, vocab]`` of one unpadded sequence in a single forward pass."""
        ids = np.array([tokens])
        positions = np.arange(len(tokens))[None]
        logits, _ = self.run(ids, np.ones_like(ids), positions, self.empty_past(1))
        return logits[0]


def _check_cached_against_full(runner: _Runner, reference: _Runner) -> None:
    """Batch 2, right padding: prefill + 5 cached steps vs full passes of each unpadded row."""
    rows = [[*PROMPT, 40, 41, 42, 43, 44], [*SHORT_PROMPT, 50, 51, 52, 53, 54]]
    prompt_lens = [len(PROMPT), len(SHORT_PROMPT)]
    expected = [reference.full_logits(row) for row in rows]
    width = max(prompt_lens)
    ids = np.zeros((2, width), np.int64)  # pad_token_id 0
    mask = np.zeros((2, width), np.int64)
    positions = np.zeros((2, width), np.int64)  # pad positions get 0
    for b, n in enumerate(prompt_lens):
        ids[b, :n] = rows[b][:n]
        mask[b, :n] = 1
        positions[b, :n] = np.arange(n)
    logits, past = runner.run(ids, mask, positions, runner.empty_past(2))
    for b, n in enumerate(prompt_lens):
        np.testing.assert_allclose(logits[b, n - 1], expected[b][n - 1], atol=1e-4, rtol=0)
    for step in range(5):
        ids = np.array([[rows[b][n + step]] for b, n in enumerate(prompt_lens)])
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        positions = np.array([[n + step] for n in prompt_lens])
        logits, past = runner.run(ids, mask, positions, past)
        for b, n in enumerate(prompt_lens):
            np.testing.assert_allclose(logits[b, 0], expected[b][n + step], atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["optimum", "optimum-int32", "optimum-mha", "gpt2", "gqa"])
def test_kv_cache_matches_full_forward(folders: dict[str, pathlib.Path], case: str) -> None:
    runner = _Runner(folders[case])
    _check_cached_against_full(runner, runner)


def test_gqa_shared_buffer_matches_full_forward(folders: dict[str, pathlib.Path]) -> None:
    """GQA with one max_length buffer bound as past and present (past_present_share_buffer)."""
    _check_cached_against_full(_Runner(folders["gqa"], capacity=32), _Runner(folders["gqa"]))


@pytest.mark.parametrize(("gqa", "optimum"), [("gqa", "optimum"), ("gqa-int32", "optimum-int32")])
def test_gqa_and_optimum_compute_the_same_function(
    folders: dict[str, pathlib.Path], gqa: str, optimum: str
) -> None:
    """Same arguments give the same weights: contrib-op graph == plain-op graph."""
    _check_cached_against_full(_Runner(folders[gqa]), _Runner(folders[optimum]))


# --------------------------------------------------------------------------------------------
# The reference engine
# --------------------------------------------------------------------------------------------


def _reference_generate(folder: pathlib.Path, prompts: list[list[int]]) -> list[list[int]]:
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(folder))
    width = max(map(len, prompts))
    pad = _config(folder)["model"]["pad_token_id"]
    batch = np.full((len(prompts), width), pad, np.int32)
    for b, prompt in enumerate(prompts):
        batch[b, : len(prompt)] = prompt
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=width + NEW_TOKENS, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(batch if len(prompts) > 1 else batch[0])
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(b)] for b in range(len(prompts))]


def _assert_varied(new_tokens: list[int]) -> None:
    assert len(new_tokens) == NEW_TOKENS
    assert len(set(new_tokens)) >= MIN_DISTINCT, new_tokens
    assert not SPECIAL_IDS & set(new_tokens), new_tokens  # special lm_head columns are zero
    tail = new_tokens[-16:]
    assert not any(tail[i:] == tail[: len(tail) - i] for i in (1, 2, 3)), new_tokens  # no loop


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_reference_greedy_batch1_and_padded_batch2(
    folders: dict[str, pathlib.Path], case: str
) -> None:
    folder = folders[case]
    (single,) = _reference_generate(folder, [PROMPT])
    assert single[: len(PROMPT)] == PROMPT
    _assert_varied(single[len(PROMPT) :])
    (short,) = _reference_generate(folder, [SHORT_PROMPT])
    _assert_varied(short[len(SHORT_PROMPT) :])

    row0, row1 = _reference_generate(folder, [PROMPT, SHORT_PROMPT])
    # The padded row keeps its pad tokens in the sequence: [prompt, pads, generated].
    pads = [0] * (len(PROMPT) - len(SHORT_PROMPT))
    assert row1[: len(PROMPT)] == SHORT_PROMPT + pads
    # Right padding changes nothing: each row equals its own batch-1 generation.
    assert row0 == single
    assert row1[len(PROMPT) :] == short[len(SHORT_PROMPT) :]


def test_reference_feeds_masks_and_positions_per_row(folders: dict[str, pathlib.Path]) -> None:
    """How the reference drives an optimum-style graph at batch 2 with right padding."""
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(folders["optimum"]))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16, batch_size=2)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([PROMPT, [*SHORT_PROMPT, 0, 0]], np.int32))
    generator.generate_next_token()
    assert generator.get_input("attention_mask").tolist() == [[1] * 5, [1, 1, 1, 0, 0]]
    assert generator.get_input("position_ids").tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]]
    generator.generate_next_token()
    assert generator.get_input("attention_mask").tolist() == [[1] * 6, [1, 1, 1, 0, 0, 1]]
    assert generator.get_input("position_ids").tolist() == [[5], [3]]
    assert generator.get_input("past_key_values.0.key").shape == (2, 2, 5, 16)


@pytest.mark.parametrize(("case", "past_len"), [("gqa", 16), ("gqa-noshare", 5)])
def test_reference_gqa_kv_layouts(
    folders: dict[str, pathlib.Path], case: str, past_len: int
) -> None:
    """share_buffer: one max_length buffer per K/V; otherwise past grows step by step."""
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(folders[case]))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16, batch_size=2)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([PROMPT, [*SHORT_PROMPT, 0, 0]], np.int32))
    generator.generate_next_token()
    generator.generate_next_token()
    assert generator.get_input("attention_mask").tolist() == [[1] * 6, [1, 1, 1, 0, 0, 1]]
    assert generator.get_input("past_key_values.0.key").shape == (2, 2, past_len, 16)


def test_tokenizer_matches_between_reference_and_tokenizers(
    folders: dict[str, pathlib.Path],
) -> None:
    og = pytest.importorskip("onnxruntime_genai")
    from tokenizers import Tokenizer

    folder = folders["gqa"]
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert hf.get_vocab_size() == 64
    assert [hf.id_to_token(i) for i in range(3)] == ["<pad>", "<s>", "</s>"]
    tokenizer = og.Tokenizer(og.Model(str(folder)))
    assert (tokenizer.bos_token_id, list(tokenizer.eos_token_ids)) == (1, [2])
    assert tokenizer.pad_token_id == 0
    text = "the cat sat on the mat, it is here!"
    ids = [int(t) for t in tokenizer.encode(text)]
    assert ids == hf.encode(text).ids
    assert tokenizer.decode(ids) == hf.decode(ids) == text
    assert tokenizer.decode([1, *ids, 2, 0]) == text  # special tokens are skipped
    messages = json.dumps([{"role": "user", "content": "hi"}])
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True) == (
        "<s>user\nhi</s>\n<s>assistant\n"
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    special = (config["bos_token"], config["eos_token"], config["pad_token"])
    assert special == ("<s>", "</s>", "<pad>")
