"""Fixture folders for speculative-decoding tests.

* `write_table_decoder`: a decoder without KV cache whose logits depend on the last token only
  (a Markov chain: ``logits[t] = table[input_ids[t]]``), so what a run returns and the exact
  distribution of any generated token are known in closed form (`markov_distribution`);
* `transition_table`: a table where each token is followed by the next one (mod ``vocab - 1``),
  with overrides, the controlled model the reference's own n-gram tests use;
* ``last_token_only``: the same with ``logits`` pruned to the last position (what speculative
  decoding must refuse);
* `with_draft`: a target folder plus another folder's graph as its ``model.draft`` (a
  draft/target pair from any two fixture writers that share the vocabulary).
"""

from __future__ import annotations

import copy
import json
import pathlib
import shutil
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from genai.builder.genai_config import SPLIT_KV_INPUTS, SPLIT_KV_OUTPUTS
from genai.runtime.onnx_graph import GraphBuilder

__all__ = [
    "markov_distribution",
    "transition_table",
    "with_draft",
    "write_kv_free_folder",
    "write_table_decoder",
]


def transition_table(
    vocab_size: int = 10, overrides: Mapping[int, int] | None = None, high: float = 20.0
) -> np.ndarray:
    """Logits [vocab, vocab]: token t is followed by ``(t + 1) % (vocab - 1)`` (so the last id,
    the EOS of `write_table_decoder`, never follows unless an override says so); ``overrides``
    {token: next} replace a row. ``high`` / ``-high``: the chosen / other logits."""
    table = np.full((vocab_size, vocab_size), -high, np.float32)
    for token in range(vocab_size):
        table[token, (token + 1) % (vocab_size - 1)] = high
    for source, target in (overrides or {}).items():
        table[source, :] = -high
        table[source, target] = high
    return table


def write_table_decoder(
    out_dir: str | pathlib.Path,
    table: np.ndarray,
    *,
    name: str = "table-decoder",
    last_token_only: bool = False,
    context_length: int = 64,
) -> pathlib.Path:
    """A folder whose graph maps ``input_ids`` [batch, seq] (int32, with an unused
    ``attention_mask``) to ``logits = table[input_ids]`` [batch, seq, vocab] (``last_token_only``:
    [batch, 1, vocab], the last position). ``table`` is [vocab, vocab], or [ids, vocab] with
    fewer rows (ids beyond them fail). No KV cache (``num_hidden_layers`` 0). EOS is the last
    id, pad and BOS 0."""
    table = np.asarray(table, np.float32)
    vocab = table.shape[1]
    if table.ndim != 2 or table.shape[0] > vocab:
        raise ValueError(f"table must be [ids, vocab] with ids <= vocab, got {list(table.shape)}")
    g = GraphBuilder(name)
    g.input("input_ids", TensorProto.INT32, ["batch", "sequence"])
    g.input("attention_mask", TensorProto.INT32, ["batch", "total_sequence"])
    rows = g.op("Gather", g.weight("logits_table", table), "input_ids", axis=0)
    if last_token_only:
        g.op("Gather", rows, g.const([-1]), axis=1, out="logits")
        g.output("logits", TensorProto.FLOAT, ["batch", 1, vocab])
    else:
        g.op("Identity", rows, out="logits")
        g.output("logits", TensorProto.FLOAT, ["batch", "sequence", vocab])
    return write_kv_free_folder(
        pathlib.Path(out_dir) / name,
        g.model(),
        vocab_size=vocab,
        context_length=context_length,
        bos_token_id=0,
        eos_token_id=[vocab - 1],
    )


def write_kv_free_folder(
    folder: pathlib.Path,
    model: onnx.ModelProto,
    *,
    vocab_size: int,
    context_length: int,
    bos_token_id: int,
    eos_token_id: int | list[int],
    hidden_size: int = 1,
    extra_inputs: Sequence[str] = (),
) -> pathlib.Path:
    """Write ``model`` as ``folder / "model.onnx"`` with the `genai_config.json` of a decoder
    without KV cache (``num_hidden_layers`` 0, pad 0): inputs ``input_ids``,
    ``attention_mask`` and ``extra_inputs`` (named as themselves), output ``logits``."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    config = {
        "model": {
            "type": "llama",
            "vocab_size": vocab_size,
            "context_length": context_length,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "pad_token_id": 0,
            "decoder": {
                "session_options": {"provider_options": []},
                "filename": "model.onnx",
                "head_size": 1,
                "hidden_size": hidden_size,
                "num_attention_heads": 1,
                "num_key_value_heads": 1,
                "num_hidden_layers": 0,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    **{name: name for name in extra_inputs},
                    **SPLIT_KV_INPUTS,
                },
                "outputs": dict(SPLIT_KV_OUTPUTS),
            },
        },
        "search": {"max_length": context_length},
    }
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def markov_distribution(
    table: np.ndarray, last_token: int, steps: int, temperature: float = 1.0
) -> np.ndarray:
    """The exact distribution [vocab] of the token ``steps`` after ``last_token`` under plain
    temperature sampling (no top-k / top-p) from `write_table_decoder`'s model, ignoring EOS
    (its row is the table's)."""
    logits = np.asarray(table, np.float64) / temperature
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    state = np.zeros(table.shape[0])
    state[last_token] = 1.0
    for _ in range(steps):
        state = state @ probs
    return state


def with_draft(
    target: str | pathlib.Path,
    draft: str | pathlib.Path | None,
    out_dir: str | pathlib.Path,
    *,
    name: str = "with-draft",
    speculative: Mapping[str, object] | None = None,
    model_type: str | None = None,
) -> pathlib.Path:
    """A copy of the ``target`` folder whose ``model.draft`` is ``draft``'s decoder (its graph
    copied as ``draft.onnx``, its weights as ``draft.onnx.data``); ``draft`` None: the
    target's own graph (self-speculation). ``speculative``: a ``speculative`` section;
    ``model_type``: replaces ``model.type`` (the reference's builder writes
    ``"speculative"``)."""
    target, folder = pathlib.Path(target), pathlib.Path(out_dir) / name
    shutil.copytree(target, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    block = copy.deepcopy(config["model"]["decoder"])
    if draft is not None:
        draft = pathlib.Path(draft)
        draft_config = json.loads((draft / "genai_config.json").read_text())
        block = copy.deepcopy(draft_config["model"]["decoder"])
        graph = onnx.load(str(draft / block["filename"]))
        block["filename"] = "draft.onnx"
        # weights beside the graph, as builders write them
        onnx.save_model(
            graph,
            str(folder / "draft.onnx"),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="draft.onnx.data",
        )
    config["model"]["draft"] = block
    if speculative is not None:
        config["speculative"] = dict(speculative)
    if model_type is not None:
        config["model"]["type"] = model_type
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
