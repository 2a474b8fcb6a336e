"""Fixture folders for multi-token prediction (`genai.MtpGenerator`): a main decoder that also
outputs its last hidden state, and a one-step MTP head that drafts the token after next from
that hidden state and the token just committed.

* `write_mtp_pair`: a GQA main model (`genai.testing.models.write_gqa_decoder` with its
  ``hidden_states`` output) and a head folder whose graph takes ``input_ids``,
  ``attention_mask`` and ``hidden_states`` ``[batch, seq, hidden]`` and returns
  ``logits = table[input_ids] + hidden_states @ proj`` (no KV cache); its config names the
  input in ``model.decoder.inputs.hidden_states``, as the reference's MTP export does;
* `write_markov_mtp_pair`: a Markov-chain main model (``logits = table[input_ids]``, hidden
  states an embedding of the token) and a head ``logits = head_table[input_ids]``: with
  ``head_table`` = ``table`` the head predicts the token after next exactly (every draft
  accepted), a perturbed one sometimes.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
from onnx import TensorProto

from genai.runtime.onnx_graph import GraphBuilder
from genai.testing.models import expose_hidden_states, write_gqa_decoder
from genai.testing.speculative import write_kv_free_folder

__all__ = ["write_markov_mtp_pair", "write_mtp_head", "write_mtp_pair"]


def write_mtp_head(
    out_dir: str | pathlib.Path,
    *,
    vocab_size: int,
    hidden_size: int,
    seed: int = 0,
    scale: float = 1.0,
    name: str = "mtp-head",
    context_length: int = 128,
    table: np.ndarray | None = None,
    eos_token_id: int = 2,
    proj: np.ndarray | None = None,
    feedback: np.ndarray | None = None,
) -> pathlib.Path:
    """An MTP head folder (see the module docstring): ``table`` [vocab, vocab] and ``proj``
    [hidden, vocab] random (times ``scale``, seeded by ``seed``); a given ``table`` comes with
    ``proj`` 0 unless ``proj`` is given. ``feedback`` [vocab, hidden]: the head also outputs
    ``hidden_states_out = tanh(feedback[input_ids] + hidden_states)`` [batch, seq, hidden], the
    output the reference's chained drafts (``max_draft_tokens`` > 1) feed back as the next
    step's hidden state (``model.mtp.outputs.hidden_states``, default
    ``hidden_states_out``)."""
    rng = np.random.default_rng(seed)
    if table is None:
        table = (rng.normal(0.0, 1.0, (vocab_size, vocab_size)) * scale).astype(np.float32)
        if proj is None:
            proj = rng.normal(0.0, 1.0, (hidden_size, vocab_size)) * scale / 8
    else:
        table = np.asarray(table, np.float32)
    if proj is None:
        proj = np.zeros((hidden_size, vocab_size), np.float32)
    proj = np.asarray(proj, np.float32)
    g = GraphBuilder(name)
    g.input("input_ids", TensorProto.INT64, ["batch", "sequence"])
    g.input("attention_mask", TensorProto.INT64, ["batch", "total_sequence"])
    g.input("hidden_states", TensorProto.FLOAT, ["batch", "sequence", hidden_size])
    rows = g.op("Gather", g.weight("table", table), "input_ids", axis=0)
    mixed = g.op("MatMul", "hidden_states", g.weight("proj", proj))
    g.op("Add", rows, mixed, out="logits")
    g.output("logits", TensorProto.FLOAT, ["batch", "sequence", vocab_size])
    if feedback is not None:
        fed = g.op("Gather", g.weight("feedback", np.asarray(feedback, np.float32)), "input_ids")
        g.op("Tanh", g.op("Add", fed, "hidden_states"), out="hidden_states_out")
        g.output("hidden_states_out", TensorProto.FLOAT, ["batch", "sequence", hidden_size])
    return write_kv_free_folder(
        pathlib.Path(out_dir) / name,
        g.model(),
        vocab_size=vocab_size,
        context_length=context_length,
        bos_token_id=1,
        eos_token_id=eos_token_id,
        hidden_size=hidden_size,
        extra_inputs=("hidden_states",),
    )


def write_mtp_pair(
    out_dir: str | pathlib.Path,
    *,
    vocab_size: int = 48,
    hidden_size: int = 64,
    seed: int = 7,
    head_seed: int = 1,
    fp16_logits: bool = True,
    feedback: bool = True,
) -> tuple[pathlib.Path, pathlib.Path]:
    """(main folder, head folder): a GQA main model with a ``hidden_states`` output and an MTP
    head of the same vocabulary and hidden size (``feedback``: with a random feedback output,
    see `write_mtp_head`). ``fp16_logits``: the main model's logits are
    float16 (onnxruntime-genai 0.18's MtpGenerator fails on float32 logits: "Cast - input and
    output types are the same")."""
    main = write_gqa_decoder(
        out_dir, vocab_size=vocab_size, hidden_size=hidden_size, seed=seed, name="mtp-main"
    )
    expose_hidden_states(main)
    if fp16_logits:  # the reference's MtpGenerator casts the main logits to fp32: not fp32 ones
        _logits_to_fp16(main / "model.onnx")
    config = json.loads((main / "genai_config.json").read_text())
    config["model"]["decoder"]["outputs"]["hidden_states"] = "hidden_states"
    (main / "genai_config.json").write_text(json.dumps(config, indent=4) + "\n")
    rng = np.random.default_rng(head_seed + 1000)
    head = write_mtp_head(
        out_dir,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        seed=head_seed,
        name="mtp-head",
        feedback=rng.normal(0.0, 1.0, (vocab_size, hidden_size)) if feedback else None,
    )
    return main, head


def _logits_to_fp16(path: pathlib.Path) -> None:
    """Make graph output ``logits`` float16 (a Cast after the float32 value)."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        node.output[:] = ["logits_fp32" if out == "logits" else out for out in node.output]
    model.graph.node.append(
        onnx.helper.make_node("Cast", ["logits_fp32"], ["logits"], to=TensorProto.FLOAT16)
    )
    for output in model.graph.output:
        if output.name == "logits":
            output.type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.save_model(model, str(path))


def write_markov_mtp_pair(
    out_dir: str | pathlib.Path,
    table: np.ndarray,
    head_table: np.ndarray,
    *,
    hidden_size: int = 8,
    context_length: int = 64,
    proj: np.ndarray | None = None,
    feedback: np.ndarray | None = None,
) -> tuple[pathlib.Path, pathlib.Path]:
    """(main folder, head folder) of Markov chains (see the module docstring); EOS is the last
    id. The main model's logits are float16 (see `write_mtp_pair`). ``proj`` [hidden, vocab]
    and ``feedback`` [vocab, hidden]: the head's hidden-state term and feedback output (see
    `write_mtp_head`; the main model's hidden state at a position is ``embed[token]``, with
    ``embed`` drawn from seed 0, [vocab, hidden] normal)."""
    table = np.asarray(table, np.float32)
    vocab = table.shape[0]
    embed = np.random.default_rng(0).normal(0.0, 1.0, (vocab, hidden_size)).astype(np.float32)
    g = GraphBuilder("markov-main")
    g.input("input_ids", TensorProto.INT64, ["batch", "sequence"])
    g.input("attention_mask", TensorProto.INT64, ["batch", "total_sequence"])
    rows = g.op("Gather", g.weight("table", table), "input_ids", axis=0)
    g.op("Cast", rows, to=TensorProto.FLOAT16, out="logits")
    g.op("Gather", g.weight("embed", embed), "input_ids", axis=0, out="hidden_states")
    g.output("logits", TensorProto.FLOAT16, ["batch", "sequence", vocab])
    g.output("hidden_states", TensorProto.FLOAT, ["batch", "sequence", hidden_size])
    main = pathlib.Path(out_dir) / "markov-main"
    main.mkdir(parents=True, exist_ok=True)
    onnx.save_model(g.model(), str(main / "model.onnx"))
    head = write_mtp_head(
        out_dir,
        vocab_size=vocab,
        hidden_size=hidden_size,
        table=head_table,
        proj=proj,
        feedback=feedback,
        name="markov-head",
        context_length=context_length,
        eos_token_id=vocab - 1,
    )
    config = json.loads((head / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    del decoder["inputs"]["hidden_states"]
    decoder["outputs"]["hidden_states"] = "hidden_states"
    (main / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return main, head
