"""`Generator`: the generation loop over ORT IOBinding.

State per generator (all buffers allocated once, bound to ORT by address):

* ``sequences`` int32 [batch, max_length] and ``length``: every token so far (prompt included);
* ``computed``: how many of them the KV cache holds; a run feeds ``sequences[:, computed:length]``;
* the attention mask (a flat buffer holding a contiguous [batch, total] prefix), per-row next
  positions, the logits rows [batch, vocab] the next token is chosen from, done flags.

The per-step bookkeeping (mask/position updates, argmax, commit with pad-after-EOS) runs in
`genai._core.bookkeeping` without the GIL.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from ._core import bookkeeping as bk
from .errors import GenerationError
from .kv_cache import make_kv_cache

if TYPE_CHECKING:
    from .generator_params import GeneratorParams
    from .model import Model

__all__ = ["Generator"]


class Generator:
    """Generates tokens for a batch of sequences, one step at a time (API of
    onnxruntime-genai's ``Generator``)."""

    def __init__(self, model: Model, params: GeneratorParams) -> None:
        self.model = model
        self.search = copy.deepcopy(params.search)
        self.search.validate(model.config.context_length)
        if self.search.num_beams > 1:
            raise NotImplementedError("beam search (num_beams > 1) is not implemented yet")
        if not self.search.is_greedy:
            raise NotImplementedError(
                "sampling (do_sample=True with top_k != 1 and temperature != 0) is not "
                "implemented yet; use greedy decoding"
            )
        io = self._io = model.io
        self.batch_size = batch = self.search.batch_size
        self.max_length = max_length = self.search.max_length
        self.vocab_size = io.vocab_size
        config = model.config
        self._pad = int(config.get("model.pad_token_id", 0))
        self._eos = np.asarray(config.eos_token_ids, dtype=np.int32)

        self._sequences = np.zeros((batch, max_length), np.int32)
        self._length = 0
        self._computed = 0
        self._mask = np.zeros(batch * max_length, io.mask_dtype)
        self._mask_length = 0
        self._next_position = np.zeros(batch, io.mask_dtype)
        self._positions = np.zeros(batch * max_length, io.mask_dtype)
        self._input_ids = np.zeros(batch * max_length, io.id_dtype)
        self._last_index = np.zeros(batch, np.int32)
        self._logits_rows = np.zeros((batch, io.vocab_size), np.float32)
        self._step_logits = np.zeros((batch, 1, io.vocab_size), io.logits_dtype)
        self._next_tokens = np.zeros(batch, np.int32)
        self._done = np.zeros(batch, np.uint8)
        self._all_done = False
        self._logits_ready = False  # logits rows predict the token after `length`
        self._ran_once = False
        self._generated = False

        self._binding = model.session.io_binding()
        self._kv = make_kv_cache(
            io, model.provider, batch, max_length, self.search.past_present_share_buffer
        )
        self._device = model.provider.device
        self._bound_inputs: dict[str, np.ndarray] = {}
        self._last_logits: np.ndarray | None = None
        self._run_options = ort.RunOptions()
        for key, value in (config.get("model.decoder.run_options", {}) or {}).items():
            self._run_options.add_run_config_entry(key, value)

    # --- feeding tokens -------------------------------------------------------------------------
    def append_tokens(self, tokens: np.ndarray | list[int] | list[list[int]]) -> None:
        """Append prompt tokens (1-D for batch 1, or [batch, length]) and run the model on them
        now. Later calls continue the sequence (batch 1)."""
        array = np.asarray(tokens)
        if array.dtype.kind not in "iu":
            raise TypeError(f"tokens must be integers, got dtype {array.dtype}")
        if array.ndim == 1:
            if array.size % self.batch_size:
                raise ValueError(
                    f"a 1-D token array of {array.size} ids cannot be split into "
                    f"batch_size {self.batch_size} rows; pass [batch, length]"
                )
            array = array.reshape(self.batch_size, -1)
        elif array.ndim != 2:
            raise ValueError(f"tokens must be 1-D or [batch, length], got shape {array.shape}")
        if array.shape[0] != self.batch_size:
            raise ValueError(
                f"tokens have {array.shape[0]} rows but batch_size is {self.batch_size}"
            )
        count = array.shape[1]
        if count == 0:
            raise ValueError("append_tokens needs at least one token")
        if array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            bad = array[(array < 0) | (array >= self.vocab_size)].flat[0]
            raise ValueError(
                f"token id {int(bad)} is outside the vocabulary [0, {self.vocab_size})"
            )
        if self._length + count > self.max_length:
            raise ValueError(
                f"appending {count} tokens to {self._length} exceeds max_length {self.max_length}"
            )
        if self._length and self.batch_size > 1:
            raise NotImplementedError(
                "continuous decoding (append_tokens after the first call) needs batch_size 1"
            )
        first = self._length == 0
        self._sequences[:, self._length : self._length + count] = array
        self._length += count
        self._done[:] = 0  # appending (also after EOS) continues every row
        self._all_done = False
        self._run(prompt=first)

    # --- one step -------------------------------------------------------------------------------
    def generate_next_token(self) -> None:
        """Run the model on pending tokens if needed, choose the next token per row and append
        it."""
        if not self._logits_ready:
            if self._length == 0:
                raise GenerationError("call append_tokens before generate_next_token")
            self._run(prompt=False)
        if self._length >= self.max_length:
            raise GenerationError(f"the sequence reached max_length {self.max_length}")
        bk.argmax_rows(self._logits_rows, self._next_tokens)
        self._all_done = bk.commit_tokens(
            self._sequences, self._length, self._next_tokens, self._eos, self._done, self._pad
        )
        # As the reference: the step that finishes the last row reports its tokens through
        # get_next_tokens but does not add them to the sequences.
        if not self._all_done:
            self._length += 1
        self._generated = True
        self._logits_ready = False

    def is_done(self) -> bool:
        """True when every row emitted EOS or the sequence reached max_length (false while the
        logits of appended tokens are waiting to be used)."""
        return self._all_done or self._length >= self.max_length

    # --- the model run --------------------------------------------------------------------------
    def _run(self, *, prompt: bool) -> None:
        io, batch, binding = self._io, self.batch_size, self._binding
        start, stop = self._computed, self._length
        count = stop - start
        if count <= 0:
            raise GenerationError("no pending tokens to run")
        ids = self._input_ids[: batch * count].reshape(batch, count)
        ids[:] = self._sequences[:, start:stop]
        self._bind_input(io.input_ids, ids)

        positions = self._positions[: batch * count].reshape(batch, count)
        if prompt:
            mask = self._mask[: batch * count].reshape(batch, count)
            bk.prefill_inputs(
                self._sequences[:, start:stop], self._pad, mask, positions, self._last_index
            )
            self._next_position[:] = self._last_index + 1
            self._mask_length = count
        elif batch == 1:
            bk.fill_mask_ones(self._mask, self._mask_length, stop)
            self._mask_length = stop
            bk.advance_positions(positions, self._next_position, count)
            self._last_index[:] = count - 1
        else:
            for _ in range(count):
                bk.append_mask_column(self._mask, batch, self._mask_length)
                self._mask_length += 1
            bk.advance_positions(positions, self._next_position, count)
            self._last_index[:] = count - 1
        if io.attention_mask:
            mask_view = self._mask[: batch * self._mask_length].reshape(batch, self._mask_length)
            self._bind_input(io.attention_mask, mask_view)
        if io.position_ids:
            self._bind_input(io.position_ids, positions)

        # Logits are bound first, so they are output 0 and the KV outputs follow.
        if count == 1:
            logits_buf = self._step_logits
            binding.bind_output(
                io.logits,
                self._device,
                0,
                logits_buf.dtype,
                list(logits_buf.shape),
                logits_buf.ctypes.data,
            )
        else:
            binding.bind_output(io.logits, self._device)
        self._kv.bind(binding)
        self.model.session.run_with_iobinding(binding, self._run_options)
        self._kv.after_run(binding, 1)
        if count == 1:
            logits = self._step_logits
        else:
            logits = binding.get_outputs()[0].numpy()
            if logits.shape[1] == 1:  # graphs that emit only the last position's logits
                self._last_index[:] = 0
        self._last_logits = logits
        self._gather_logits(logits)
        self._computed = stop
        self._logits_ready = True
        self._ran_once = True

    def _bind_input(self, name: str, array: np.ndarray) -> None:
        self._bound_inputs[name] = array
        self._binding.bind_input(
            name, self._device, 0, array.dtype, list(array.shape), array.ctypes.data
        )

    def _gather_logits(self, logits: np.ndarray) -> None:
        if logits.dtype != np.float32:
            logits = logits.astype(np.float32)
        bk.gather_rows(np.ascontiguousarray(logits), self._last_index, self._logits_rows)

    # --- reading state --------------------------------------------------------------------------
    def get_next_tokens(self) -> np.ndarray:
        """The tokens chosen by the last `generate_next_token`, int32 [batch]."""
        if not self._generated:
            raise GenerationError("no tokens generated yet")
        return self._next_tokens.copy()

    def get_sequence(self, index: int) -> np.ndarray:
        """Row ``index``: prompt (padding included) + generated tokens, int32."""
        if not 0 <= index < self.batch_size:
            raise IndexError(f"sequence index {index} outside [0, {self.batch_size})")
        return self._sequences[index, : self._length].copy()

    def token_count(self) -> int:
        """Tokens in each sequence so far (prompt included)."""
        return self._length

    def get_logits(self) -> np.ndarray:
        """A copy of the logits the next token is chosen from, float32 [batch, 1, vocab]."""
        if not self._logits_ready:
            if self._length == 0:
                raise GenerationError("no logits yet: call append_tokens first")
            self._run(prompt=False)  # logits for the token chosen last, as the reference
        return self._logits_rows[:, None, :].copy()

    def set_logits(self, logits: np.ndarray) -> None:
        """Replace the logits the next token is chosen from ([batch, vocab] or
        [batch, 1, vocab], float32)."""
        array = np.asarray(logits)
        if array.dtype != np.float32:
            raise TypeError(f"logits must be float32, got {array.dtype}")
        expected = self.batch_size * self.vocab_size
        if array.size != expected or array.ndim not in (1, 2, 3):
            raise ValueError(
                f"logits must hold [batch={self.batch_size}, vocab={self.vocab_size}], "
                f"got shape {array.shape}"
            )
        self._logits_rows[:] = array.reshape(self.batch_size, self.vocab_size)
        self._logits_ready = True

    def get_output(self, name: str) -> np.ndarray:
        """A host copy of the last run's output ``name`` (``"logits"``, ``"present.0.key"``)."""
        if not self._ran_once:
            raise GenerationError("the model has not run yet")
        if name == self._io.logits and self._last_logits is not None:
            return np.array(self._last_logits, copy=True)
        value = self._kv.read(name)
        if value is None:
            raise KeyError(f"{name!r} is not an output of the model")
        return value

    def get_input(self, name: str) -> np.ndarray:
        """A host copy of the last run's input ``name``."""
        if name in self._bound_inputs:
            return self._bound_inputs[name].copy()
        value = self._kv.read(name)
        if value is None:
            raise KeyError(f"{name!r} is not a bound input of the model")
        return value

    def rewind_to(self, length: int) -> None:
        """Drop tokens after the first ``length``; the next step continues from there."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot rewind to {length}: the sequence has {self._length} tokens")
        if length and self.batch_size > 1:
            raise NotImplementedError("rewind_to(n > 0) needs batch_size 1")
        self._length = length
        # Keep the KV of all but the last kept token: the next run recomputes that token, which
        # yields the logits to continue from (no token is replayed).
        self._computed = min(self._computed, max(length - 1, 0))
        self._mask_length = min(self._mask_length, length)
        self._next_position[:] = self._computed
        self._kv.truncate(self._computed)
        self._logits_ready = False
        self._all_done = False
        self._done[:] = 0

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes the KV cache holds."""
        return self._kv.nbytes
