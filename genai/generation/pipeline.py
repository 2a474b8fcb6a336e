"""Multi-graph decoders: ``model.decoder.pipeline`` with ``model.type`` ``"decoder-pipeline"``.

A pipeline model is a decoder cut into stages, each its own ONNX file and session (QNN/NPU
folders split embeddings, transformer blocks and the LM head this way, or keep one graph for the
prompt and another for generation). Each step runs the stages in config order:

* A stage runs on a *prompt run* (more than one token per row) unless ``run_on_prompt`` is
  false, and on a *token run* (one token per row) unless ``run_on_token_gen`` is false.
* Its inputs are bound by name: the model inputs the engine computes (``input_ids``,
  ``attention_mask``, ``position_ids``: ``model.decoder.inputs``), the past KV of each layer
  (``past_key_names`` / ``past_value_names`` templates), or a tensor an earlier stage output
  (under its ``output_names_forwarder`` name when it has one). Stage outputs stay available
  to later stages (and to `genai.Generator.get_output`) until the stage runs again; after a
  token run the outputs of stages with ``run_on_token_gen`` false are dropped (as the
  reference does).
* KV: each layer's present (``present_key_names`` / ``present_value_names``) becomes the next
  run's past, whichever stage wrote it. With ``search.past_present_share_buffer`` one
  ``[batch, kv_heads, max_length, head_size]`` buffer per K and V is bound as both (the graph
  writes in place); otherwise pasts start empty and grow, and a present that the stage
  which wrote it also takes as a past is handed over inside that stage's binding without a
  copy (copied out only when something reads, rewinds or reorders the cache, or another
  stage needs it).
* The logits are read from the stage that outputs ``model.decoder.outputs.logits``, at each
  row's last real token.

The stages are read and checked in `genai.runtime.pipeline_stages`; `PipelineRunner` runs a
generator's pending tokens through them
(`genai.generation.drivers.pipeline.PipelineDriver` drives it for a `genai.Generator`, whose
loop keeps sequences, sampling and everything else, as for windowed models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from genai._core.bookkeeping import NO_PAD, prefill_inputs
from genai.errors import GenerationError, UnsupportedFeatureError
from genai.generation.run_logits import copy_last_rows
from genai.runtime.pipeline_stages import PipelineStage

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.runtime.model import DecoderIO, Model

__all__ = ["PipelineRunner"]


class PipelineRunner:
    """Runs a generator's pending tokens through a pipeline model's stages and writes each
    row's logits (of its last real token) into ``logits_rows``.

    Inputs follow the engine's single-graph rules (`genai._core.decoder_loop`): a first
    prompt gets mask 1 and positions 0..n-1 for each row's tokens and mask 0, position 0 for
    its trailing pads; later runs add a mask column of ones per token (batch 1: the mask is
    all ones) and continue each row's positions; a batch continued with several tokens is
    fed one token per run. Everything lives in host memory (NumPy arrays bound by name).
    """

    def __init__(
        self,
        model: Model,
        batch: int,
        max_length: int,
        share_buffer: bool,
        pad_id: int,
        logits_rows: np.ndarray,
        *,
        padded: bool = True,
    ) -> None:
        io: DecoderIO = model.io
        if io.combined_kv:
            raise UnsupportedFeatureError(
                "combined K/V caches (model.decoder.inputs.past_names) in a pipeline model"
            )
        self.io, self.batch, self.max_length = io, batch, max_length
        assert model.pipeline is not None
        self.stages: tuple[PipelineStage, ...] = model.pipeline
        self.bindings = [session.new_binding() for session in model.stage_sessions]
        self.share_buffer, self.pad_id = share_buffer, pad_id
        #: the id a prompt's trailing padding has (`NO_PAD`: none; batch 1)
        self.prompt_pad = pad_id if padded else NO_PAD
        self.logits_rows = logits_rows
        self._past_of = dict(zip(io.present_keys, io.past_keys, strict=True))
        self._past_of.update(zip(io.present_values, io.past_values, strict=True))
        #: Per stage: the (present, past) pairs it writes and reads (growing layout: handed
        #: over in its binding after each run).
        self._handover = [
            [
                (present, self._past_of[present])
                for present in stage.outputs
                if present in self._past_of and self._past_of[present] in stage.inputs
            ]
            for stage in self.stages
        ]
        self._kv_dtype: dict[str, np.dtype] = {}
        for stage, session in zip(self.stages, model.stage_sessions, strict=True):
            dtypes = session.input_dtypes
            for name in stage.inputs:
                if name in self._past_of.values():
                    self._kv_dtype[name] = np.dtype(dtypes[name])
        dtypes = {}
        for session in model.stage_sessions:
            dtypes.update(session.input_dtypes)
        self._position_dtype = (
            np.dtype(dtypes[io.position_ids]) if io.position_ids else io.mask_dtype
        )
        self.reset()

    # --- state --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every token (a fresh generator)."""
        b, io = self.batch, self.io
        self.mask = np.zeros((b, 0), io.mask_dtype)
        self.next_position = np.zeros(b, np.int64)
        #: Tokens per row the KV cache holds.
        self.computed = 0
        #: Tokens per row the last run fed (0 before any run).
        self.last_run_count = 0
        self.store: dict[str, np.ndarray] = {}
        self.logits: np.ndarray | None = None
        self.last_inputs: dict[str, np.ndarray] = {}
        width = self.max_length if self.share_buffer else 0
        self.kv = {
            past: np.zeros(
                (b, io.kv_heads, width, io.head_size), self._kv_dtype.get(past, io.kv_dtype)
            )
            for past in self._past_of.values()
        }

    @property
    def kv(self) -> dict[str, np.ndarray]:
        """The KV cache by past name, as host arrays (the next run's pasts); pasts handed
        over inside a stage's binding are copied out first."""
        for past, binding in self._live.items():
            self._kv_host[past] = binding.input_value(past)
        self._live = {}
        return self._kv_host

    @kv.setter
    def kv(self, arrays: dict[str, np.ndarray]) -> None:
        self._kv_host = arrays
        #: Pasts held by a stage's binding (its last present, rebound as its input).
        self._live: dict[str, NativeSession] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of the KV cache."""
        if not self.share_buffer:
            return self.used_bytes()
        return sum(a.nbytes for a in self._kv_host.values())

    def used_bytes(self) -> int:
        """Bytes of the KV cache the tokens so far occupy."""
        io = self.io
        per_position = io.kv_heads * io.head_size * self.batch
        return sum(per_position * self.computed * a.itemsize for a in self._kv_host.values())

    def rewind(self, length: int) -> None:
        """Keep the KV of the first ``length - 1`` tokens (the next run recomputes the last
        one's logits), as the single-graph loop does."""
        computed = min(self.computed, max(length - 1, 0))
        kept = min(self.mask.shape[1], computed)
        self.mask = np.ascontiguousarray(self.mask[:, :kept])
        self.next_position = self.mask.sum(axis=1, dtype=np.int64)
        if not self.share_buffer:
            self.kv = {k: np.ascontiguousarray(v[:, :, :kept]) for k, v in self.kv.items()}
        self.computed = computed

    def reorder(self, order: np.ndarray) -> None:
        """Beam search: row ``r`` continues from row ``order[r]`` (KV, mask, positions and the
        stage outputs kept for later runs)."""
        self.kv = {k: np.ascontiguousarray(np.take(v, order, axis=0)) for k, v in self.kv.items()}
        self.mask = np.ascontiguousarray(self.mask[order])
        self.next_position = self.next_position[order]
        self.store = {
            k: np.ascontiguousarray(np.take(v, order, axis=0))
            if v.shape[:1] == (self.batch,)
            else v
            for k, v in self.store.items()
        }

    # --- runs ---------------------------------------------------------------------------------
    def feed(self, tokens: np.ndarray, prompt: bool) -> None:
        """Run the stages on ``tokens`` ``[batch, count]``, the pending tokens of every row;
        ``prompt``: they are the first tokens of the sequences (right-padded rows)."""
        count = tokens.shape[1]
        if not prompt and self.batch > 1 and count > 1:
            for column in range(count):
                self.feed(tokens[:, column : column + 1], False)
            return
        io, b = self.io, self.batch
        if self.share_buffer and self.computed + count > self.max_length:
            raise GenerationError(f"the sequence would exceed max_length {self.max_length}")
        ids = np.ascontiguousarray(tokens, io.id_dtype)
        if prompt:  # the loop's own kernel: trailing pads get mask 0 and position 0
            self.mask = np.zeros((b, count), io.mask_dtype)
            positions = np.zeros((b, count), io.mask_dtype)
            last = np.zeros(b, np.int32)
            tokens32 = np.ascontiguousarray(tokens, np.int32)
            prefill_inputs(tokens32, self.prompt_pad, self.mask, positions, last, self.pad_id)
            self.next_position = self.mask.sum(axis=1, dtype=np.int64)
        else:
            if b == 1:
                self.mask = np.ones((1, self.mask.shape[1] + count), io.mask_dtype)
            else:
                ones = np.ones((b, count), io.mask_dtype)
                self.mask = np.concatenate([self.mask, ones], axis=1)
            positions = self.next_position[:, None] + np.arange(count)[None, :]
            self.next_position = self.next_position + count
            last = np.full(b, count - 1)
        fed: dict[str, np.ndarray] = {io.input_ids: ids}
        if io.attention_mask:
            fed[io.attention_mask] = self.mask
        if io.position_ids:
            fed[io.position_ids] = np.ascontiguousarray(positions, self._position_dtype)
        fed.update((k, v) for k, v in self._kv_host.items() if k not in self._live)
        self._run_stages(fed, count > 1)
        logits = self.logits
        assert logits is not None
        copy_last_rows(logits, self.logits_rows, last, count, io.logits)
        self.computed += count
        self.last_run_count = count

    def _run_stages(self, fed: dict[str, np.ndarray], prompt: bool) -> None:
        io = self.io
        presents: dict[str, np.ndarray] = {}
        ran: list[str] = []
        self.logits = None
        for stage, binding, handover in zip(
            self.stages, self.bindings, self._handover, strict=True
        ):
            if not stage.runs(prompt):
                continue
            for name in stage.outputs:
                self.store.pop(stage.stored_name(name), None)
            for name in stage.inputs:
                holder = self._live.get(name)
                if holder is binding:
                    continue  # its own last present, already bound as this input
                value = fed.get(name) if holder is None else holder.input_value(name)
                if value is None:
                    value = self.store.get(name)
                if value is None:
                    raise GenerationError(
                        f"stage {stage.name!r} needs {name!r}, which no stage wrote for this "
                        f"{'prompt' if prompt else 'token'} run (see run_on_prompt / "
                        "run_on_token_gen in model.decoder.pipeline)"
                    )
                binding.bind_input(name, value)
            for name in stage.outputs:
                past = self._past_of.get(name)
                if past is not None and self.share_buffer:
                    binding.bind_output(name, self._kv_host[past])
                else:
                    binding.bind_output_to_device(name)
            binding.run()
            ran.append(stage.name)
            kept = {} if self.share_buffer else dict(handover)
            for name in stage.outputs:
                past = self._past_of.get(name)
                if name == io.logits:
                    self.logits = binding.get_output(name)
                elif past is not None:
                    if self.share_buffer:
                        presents[name] = self._kv_host[past]
                    elif name in kept:
                        presents[name] = None  # handed over below
                    else:
                        presents[name] = binding.get_output(name)
                else:
                    self.store[stage.stored_name(name)] = binding.get_output(name)
            if kept:
                binding.rebind_outputs_as_inputs_py(list(kept), list(kept.values()))
                for past in kept.values():
                    self._live[past] = binding
        missing = [name for name in self._past_of if name not in presents]
        if missing or self.logits is None:
            what = ", ".join(missing + ([] if self.logits is not None else [io.logits]))
            raise GenerationError(
                f"the stages that ran for this {'prompt' if prompt else 'token'} run "
                f"({', '.join(ran) or 'none'}) did not write {what}"
            )
        if not self.share_buffer:
            for name, value in presents.items():
                past = self._past_of[name]
                if value is not None:
                    self._kv_host[past] = value
                    self._live.pop(past, None)
        if not prompt:  # as the reference: prompt-only stages' outputs end with the first token
            for stage in self.stages:
                if not stage.run_on_token_gen:
                    for name in stage.outputs:
                        self.store.pop(stage.stored_name(name), None)
        self.last_inputs = fed

    # --- reading ------------------------------------------------------------------------------
    def read_output(self, name: str) -> np.ndarray | None:
        """A copy of the last run's output ``name``: the logits, a present, or a stage output
        later stages read (by its forwarded name); None when there is none."""
        io = self.io
        if name == io.logits:
            return None if self.logits is None else self.logits.copy()
        past = self._past_of.get(name)
        if past is not None:
            return self.kv[past].copy()
        value = self.store.get(name)
        return None if value is None else value.copy()

    def read_input(self, name: str) -> np.ndarray | None:
        """A copy of what the last run fed as model input ``name`` (ids, mask, positions or a
        past)."""
        if name in self._past_of.values() and not self.share_buffer and self.last_run_count:
            # the past it fed: the cache before the run's tokens (maybe handed over since)
            return self.kv[name][:, :, : self.computed - self.last_run_count].copy()
        value = self.last_inputs.get(name)
        return None if value is None else np.array(value)
