"""Feeding a QNN-style windowed model (`genai.kv.windowed_cache`): windowed inputs and the runs.

What the reference does with ``slide_inputs`` (its ``WindowedInputIDs`` /
``WindowedPositionInputs``), for each row:

* A prompt is padded with ``model.pad_token_id`` to whole windows of W tokens: in front
  (``alignment: "right"``, the default: the prompt ends where a window ends) or behind
  (``"left"``). The padding stays in the sequence (`Generator.get_sequence`, `token_count` and
  ``max_length`` count it), as in the reference.
* The prompt is fed W tokens per run. First window: a pad token gets position 0 and mask 0,
  the others positions 0, 1, ...; the mask's last W columns (the current window; the first
  N - W columns, the past, are 0) say which are real. Each later window: positions continue
  from the previous window's last one, and W more mask columns (to the left of the ones already
  set: the cache slid W positions to the left) become 1. (In a batch, a row whose first windows
  hold only pads takes the first-window rule at its first window with a real token.)
* Then one token per run: position + 1, one more mask column set.

The logits of a window are those of its last token that is not a pad (so with ``"left"``
alignment the prompt's last token; the positions and the mask still treat the pads behind it
as the reference does: later positions continue from the last pad's, 0).

With static shapes (``io.shape_sessions``: one session per run length, built by `genai.Model`
for a provider that wants them), a window runs on the session of W tokens and a token on the
session of 1; each gets its own binding, and the cache is bound to the one that runs.

Beyond the reference: prompts longer than one window (its single-decoder path feeds only the
first window), batches (rows are re-aligned so each prompt ends at the last column; the graph
must leave the batch axis dynamic), and tokens appended after generating (fed one per run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from genai.errors import InvalidArgumentError
from genai.kv.windowed_cache import SlidingWindowSpec, WindowedKVCache

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.runtime.model import DecoderIO

__all__ = ["WindowedInputs", "WindowedRunner"]


class WindowedInputs:
    """input_ids, position_ids and attention_mask of each run, per row (the reference's
    windowed inputs, see the module docstring)."""

    def __init__(
        self,
        spec: SlidingWindowSpec,
        batch: int,
        id_dtype: np.dtype,
        position_dtype: np.dtype,
        mask_dtype: np.dtype,
    ) -> None:
        self.spec, self.batch = spec, batch
        self.id_dtype, self.position_dtype = id_dtype, position_dtype
        self.mask = np.zeros((batch, spec.context), mask_dtype)
        #: Per row: the mask column the next generated token sets.
        self._offset = np.zeros(batch, np.int64)
        self._last_position = np.zeros(batch, np.int64)
        #: Per row: whether a real token was fed yet (rows of a batch may start with windows of
        #: pads only).
        self._started = np.zeros(batch, bool)
        self.input_ids = np.zeros((batch, 0), id_dtype)
        self.position_ids = np.zeros((batch, 0), position_dtype)

    def window(self, tokens: np.ndarray) -> None:
        """The next prompt window: ``tokens`` ``[batch, W]``."""
        spec, n, w = self.spec, self.spec.context, self.spec.window
        self.input_ids = np.ascontiguousarray(tokens, self.id_dtype)
        real = tokens != spec.pad_token
        positions = np.empty((self.batch, w), np.int64)
        for b in range(self.batch):
            if self._started[b]:  # positions go on; W more columns of real tokens
                positions[b] = self._last_position[b] + 1 + np.arange(w)
                hi = self._offset[b] + 1
                self.mask[b, max(hi - w, 0) : hi] = 1
                self._offset[b] -= w
                continue
            # the row's first window with a real token (batch 1: the first window): pads get
            # position 0 and mask 0, the others count from 0
            positions[b] = np.where(real[b], np.cumsum(real[b]) - 1, 0)
            self.mask[b, : n - w] = 0
            self.mask[b, n - w :] = real[b]
            found = np.flatnonzero(real[b])
            self._offset[b] = n - w + (found[0] if found.size else w) - 1
            self._started[b] = found.size > 0
        self.position_ids = np.ascontiguousarray(positions, self.position_dtype)
        self._last_position = positions[:, -1].copy()

    def token(self, tokens: np.ndarray) -> None:
        """One generated (or appended) token per row: ``tokens`` ``[batch]``."""
        self.input_ids = np.ascontiguousarray(tokens.reshape(self.batch, 1), self.id_dtype)
        self._last_position += 1
        self.position_ids = np.ascontiguousarray(self._last_position[:, None], self.position_dtype)
        rows = np.arange(self.batch)
        self.mask[rows, np.maximum(self._offset, 0)] = 1
        self._offset = np.where(self._offset > 0, self._offset - 1, self._offset)


class WindowedRunner:
    """Runs a windowed model on a generator's pending tokens and writes each row's logits
    (those of the last non-pad token of a window, of the token of a one-token run) into
    ``logits_rows`` (`genai.generation.drivers.windowed.WindowedDriver` drives it for a
    `genai.Generator`, whose loop keeps sequences, sampling and everything else).

    ``session`` (a generator's binding) runs every window, unless the model has one static
    session per run length (``io.shape_sessions``): then ``session`` runs those of its own
    length and a new binding of the other session runs the rest."""

    def __init__(
        self,
        io: DecoderIO,
        spec: SlidingWindowSpec,
        session: NativeSession,
        batch: int,
        logits_rows: np.ndarray,
    ) -> None:
        self.io, self.spec, self.session, self.batch = io, spec, session, batch
        self.logits_rows = logits_rows
        #: The session (binding) of each run length; empty: ``session`` runs every length.
        self.sessions: dict[int, NativeSession] = {}
        for count, static in (getattr(io, "shape_sessions", None) or {}).items():
            same = static.ort_session_address == session.ort_session_address
            self.sessions[count] = session if same else static.new_binding()
        dtypes = session.input_dtypes
        self._position_dtype = np.dtype(dtypes[io.position_ids]) if io.position_ids else None
        self._logits: dict[int, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every token: pads in every cache position, no window fed."""
        io, spec = self.io, self.spec
        self.cache = WindowedKVCache(io, spec, self.session, self.batch)
        self.inputs = WindowedInputs(
            spec, self.batch, io.id_dtype, self._position_dtype or io.mask_dtype, io.mask_dtype
        )
        #: Tokens per row the cache holds (the padded prompt included).
        self.computed = 0
        #: Tokens the last run fed (0 before any run).
        self.last_run_count = 0

    # --- prompts ------------------------------------------------------------------------------
    def pad_prompt(self, tokens: np.ndarray) -> np.ndarray:
        """A first prompt ``[batch, n]`` padded to whole windows (see the module docstring).
        With batch > 1 each row's trailing pad tokens move in front first, so every prompt
        ends at the last column."""
        spec = self.spec
        if self.batch > 1:
            rows = []
            for row in tokens:
                real = np.flatnonzero(row != spec.pad_token)
                end = real[-1] + 1 if real.size else 0
                rows.append(np.concatenate([row[end:], row[:end]]))
            tokens = np.stack(rows)
        pad = spec.padded_length(tokens.shape[1]) - tokens.shape[1]
        fill = np.full((tokens.shape[0], pad), spec.pad_token, tokens.dtype)
        parts = [tokens, fill] if spec.alignment == "left" else [fill, tokens]
        return np.concatenate(parts, axis=1)

    # --- runs ---------------------------------------------------------------------------------
    def feed(self, tokens: np.ndarray) -> None:
        """Run the model on ``tokens`` ``[batch, k]``, the pending tokens of every row: a
        padded prompt window by window on a fresh cache, else one token per run."""
        if self.computed == 0:
            w = self.spec.window
            if tokens.shape[1] % w:
                raise InvalidArgumentError(f"a first prompt is fed in whole windows of {w} tokens")
            for start in range(0, tokens.shape[1], w):
                self.inputs.window(tokens[:, start : start + w])
                self._run(w)
        else:
            for column in range(tokens.shape[1]):
                self.inputs.token(tokens[:, column])
                self._run(1)

    def _run(self, count: int) -> None:
        io, inputs = self.io, self.inputs
        session = self.sessions.get(count, self.session)
        self.cache.prepare(count, session)
        session.bind_input(io.input_ids, inputs.input_ids)
        if io.position_ids:
            session.bind_input(io.position_ids, inputs.position_ids)
        if io.attention_mask:
            session.bind_input(io.attention_mask, inputs.mask)
        logits = self._logits.get(count)
        if logits is None:
            shape = (self.batch, count, io.vocab_size)
            logits = self._logits[count] = np.empty(shape, io.logits_dtype)
        session.bind_output(io.logits, logits)
        session.run()
        self.cache.ran()
        if count == 1:
            self.logits_rows[:] = logits[:, 0, :]
        else:  # each row's last token that is not a pad (as the reference)
            real = inputs.input_ids != self.spec.pad_token
            last = np.where(
                real.any(axis=1), count - 1 - np.argmax(real[:, ::-1], axis=1), count - 1
            )
            self.logits_rows[:] = logits[np.arange(self.batch), last, :]
        self.computed += count
        self.last_run_count = count

    # --- reading ------------------------------------------------------------------------------
    def read_input(self, name: str) -> np.ndarray | None:
        """A copy of what the last run fed as ``name`` (ids, positions, mask or a past)."""
        io = self.io
        if name == io.input_ids:
            return self.inputs.input_ids.copy()
        if name == io.position_ids:
            return self.inputs.position_ids.copy()
        if name == io.attention_mask:
            return self.inputs.mask.copy()
        return self.cache.read(name)

    def read_output(self, name: str) -> np.ndarray | None:
        """A copy of the last run's output ``name`` (logits or a present)."""
        if name == self.io.logits:
            return self._logits[self.last_run_count].astype(np.float32)
        return self.cache.read(name)
