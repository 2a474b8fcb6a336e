"""The logits-processing chain: every stage between a step's logits and its chosen token,
in one documented order, behind one entry point.

Both `genai.Generator` and the server's scheduler (`genai.serve.scheduler`) build a
`LogitsChain` from the same `SearchOptions` (plus a logit bias, guidance constraints and
custom processors) and call it every step. For every row not flagged done, in this order:

1. **guidance mask**: the row's `TokenConstraint` sets every token its grammar forbids to the
   lowest float (once the grammar is complete only EOS stays);
2. **EOS ban** (the server's ``ignore_eos``, rows without a constraint): every EOS logit ->
   lowest float;
3. ``min_length``, 4. ``repetition_penalty``, 5. ``no_repeat_ngram_size``,
6. ``presence_penalty`` / ``frequency_penalty``, 7. **logit bias** (the sampling kernels'
   stages 1-5, docs/sampling.md);
8. **custom processors** (`LogitsProcessor`, added with
   `GeneratorParams.add_logits_processor`), in the order they were added: each sees the
   logits after every stage above;
9. **the choice** (temperature, top-k, top-p, min-p, the draw; log-probabilities are read
   from the logits as stage 8 left them).

After the choice, `LogitsChain.accept` feeds the token to the row's constraint and returns
the tokens the grammar forces next (fast-forward), if any.

Kernels: stages 3-7 and 9 are the Cython `genai._core.sampling` kernels. Without a custom
processor the chain hands them to one `Sampler.sample_batch` call (or the native decode loop
calls the same `Sampler` without Python: `loop_sampler`); with one, stages 3-7 run first
through the kernels' single-stage functions (same row functions, same bits) and the sampler
then makes only the choice. The RNG streams are the sampler's either way: one uniform per
active row per step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from genai._core import sampling
from genai._core.sampling import Sampler
from genai.errors import GenerationError, InvalidArgumentError
from genai.generation.search import SearchOptions

__all__ = ["STAGE_OPTIONS", "LogitsChain", "LogitsProcessor", "check_processor"]

#: The sampler options that belong to stages 3-6 (the rest belong to the choice).
STAGE_OPTIONS = (
    "min_length",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "presence_penalty",
    "frequency_penalty",
)
_NEUTRAL = {
    "min_length": 0,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


@runtime_checkable
class LogitsProcessor(Protocol):
    """A custom stage of the chain (stage 8, after penalties and logit bias, before the
    choice), called once per active row per step.

    ``token_ids``: the row's tokens so far, prompt included, int32 [length] (read-only).
    ``logits``: the row's logits after stages 1-7, float32 [vocab], writable. Edit
    ``logits`` in place and return None, or return a new [vocab] array (converted to
    float32) that replaces the row. Neither array may be kept after the call: the buffers
    are reused. Ban a token with ``-inf`` or `genai._core.sampling.LOWEST`; a NaN makes the
    step fail. Any callable with this signature works (a function, a lambda, an object
    with ``__call__``).
    """

    def __call__(self, token_ids: np.ndarray, logits: np.ndarray) -> np.ndarray | None: ...


#: What `add_processor` takes: a `LogitsProcessor` or any callable of that signature.
ProcessorLike = Callable[[np.ndarray, np.ndarray], "np.ndarray | None"]


def check_processor(processor: Any) -> ProcessorLike:
    """``processor`` if it is callable, else `InvalidArgumentError` naming what was given."""
    if not callable(processor):
        raise InvalidArgumentError(
            "a logits processor must be callable as processor(token_ids, logits), got "
            f"{type(processor).__name__} {processor!r}"
        )
    return processor


class LogitsChain:
    """The logits-processing chain of ``rows`` rows over a ``vocab``-token vocabulary (see the
    module docstring for the order).

    ``options``: the search options (their sampling part and ``random_seed``; greedy
    defaults when None). ``logit_bias``: ``{token id: bias}`` for every row. ``processors``:
    custom stages (`LogitsProcessor`). ``constraints``: per row, a `TokenConstraint` or None
    (None: no guidance). ``ban_eos``: stage 2 for every row without a constraint.
    ``logprobs``: None, or how many alternatives `process` reports beside the chosen
    token's log-probability (`logprobs`, `top_ids`, `top_logprobs` after each call).
    """

    def __init__(
        self,
        rows: int,
        vocab: int,
        eos_ids: Sequence[int] | np.ndarray,
        options: SearchOptions | None = None,
        *,
        logit_bias: Mapping[int, float] | None = None,
        processors: Sequence[ProcessorLike] = (),
        constraints: Sequence[Any | None] | None = None,
        ban_eos: bool = False,
        logprobs: int | None = None,
    ) -> None:
        options = options if options is not None else SearchOptions()
        self.rows = int(rows)
        self.vocab = int(vocab)
        self.eos_ids = np.ascontiguousarray(eos_ids, dtype=np.int32).reshape(-1)
        self.sampler = Sampler(self.rows, self.vocab, seed=options.random_seed)
        sampler_options = options.sampler_options()
        #: per row: the options of stages 3-6 (the chain's record; the sampler holds them
        #: too unless a processor splits the chain)
        self._stage = [
            {name: sampler_options[name] for name in STAGE_OPTIONS} for _ in range(self.rows)
        ]
        #: per row: the logit bias (ids int32, biases float32)
        self._bias = [(np.zeros(0, np.int32), np.zeros(0, np.float32))] * self.rows
        self._processors: list[ProcessorLike] = []
        self._needs_sampler = options.needs_processing
        self.sampler.configure(**sampler_options)
        if logit_bias:
            self.set_logit_bias(None, logit_bias)
        for processor in processors:
            self.add_processor(processor)
        self.constraints: list[Any | None] | None = None
        self.set_constraints(constraints)
        self.ban_eos = bool(ban_eos)
        self.n_logprobs = logprobs
        if logprobs is not None:
            if logprobs < 0:
                raise InvalidArgumentError(f"logprobs must be None or >= 0, got {logprobs}")
            self.logprobs: np.ndarray | None = np.zeros(self.rows, np.float32)
            self.top_ids: np.ndarray | None = (
                np.zeros((self.rows, logprobs), np.int32) if logprobs else None
            )
            self.top_logprobs: np.ndarray | None = (
                np.zeros((self.rows, logprobs), np.float32) if logprobs else None
            )
        else:
            self.logprobs = self.top_ids = self.top_logprobs = None

    @classmethod
    def for_search(
        cls,
        rows: int,
        vocab: int,
        eos_ids: Sequence[int] | np.ndarray,
        options: SearchOptions,
        **kwargs: Any,
    ) -> LogitsChain:
        """A chain for ``options`` that reports the log-probabilities they ask for
        (``logprobs`` / ``top_logprobs``); ``kwargs`` as the constructor."""
        wanted = options.top_logprobs if (options.logprobs or options.top_logprobs) else None
        kwargs.setdefault("logprobs", wanted)
        return cls(rows, vocab, eos_ids, options, **kwargs)

    # --- configuration ---------------------------------------------------------------------------
    @property
    def processors(self) -> tuple[ProcessorLike, ...]:
        """The custom processors, in the order they run."""
        return tuple(self._processors)

    @property
    def split(self) -> bool:
        """True when stages 3-7 run before the custom processors, outside the sampler."""
        return bool(self._processors)

    @property
    def python_stage(self) -> bool:
        """True when a step needs Python before the choice (`prepare`): guidance, an EOS
        ban or a custom processor. Otherwise the choice can run without Python."""
        return self.constraints is not None or self.ban_eos or bool(self._processors)

    @property
    def loop_sampler(self) -> Sampler | None:
        """The sampler a native decode loop should choose with, or None when the plain
        argmax of the logits is the choice (greedy, no stage changes anything)."""
        if self._needs_sampler or self._processors or any(len(ids) for ids, _ in self._bias):
            return self.sampler
        return None

    def add_processor(self, processor: ProcessorLike) -> None:
        """Append a custom stage (runs after those added before it)."""
        self._processors.append(check_processor(processor))
        if len(self._processors) == 1:  # stages 3-7 move out of the sampler, before it
            self.sampler.configure(**_NEUTRAL)
            self.sampler.set_logit_bias(None, [], [])

    def configure(self, row: int | None = None, **options: Any) -> None:
        """Set sampling options (the names of `Sampler.configure`) of one row, or of every
        row (``row`` None); options not named keep their value. Raises `ValueError` /
        `TypeError` naming a bad option."""
        checked = sampling.check_options(options)
        rows = self._rows_of(row)
        stage = {k: v for k, v in checked.items() if k in STAGE_OPTIONS}
        choice = {k: v for k, v in checked.items() if k not in STAGE_OPTIONS}
        for r in rows:
            self._stage[r].update(stage)
        self.sampler.configure(row, **(choice if self.split else checked))
        self._needs_sampler = True  # rows may differ now: the sampler decides per row

    def options(self, row: int) -> dict[str, Any]:
        """Row ``row``'s sampling options (as `Sampler.options`)."""
        self._rows_of(row)
        current = self.sampler.options(row)
        current.update(
            {
                k: float(np.float32(v)) if isinstance(v, float) else v
                for k, v in self._stage[row].items()
            }
        )
        return current

    def set_logit_bias(self, row: int | None, bias: Mapping[int, float]) -> None:
        """Replace the logit bias of ``row`` (None: every row) by ``bias`` ({id: bias};
        an empty mapping clears it). Raises ValueError for an id outside the vocabulary or
        a non-finite bias."""
        ids = np.fromiter((int(k) for k in bias), np.int64, len(bias))
        values = np.fromiter((float(v) for v in bias.values()), np.float32, len(bias))
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            raise InvalidArgumentError(f"logit bias ids must be in [0, {self.vocab})")
        if not np.isfinite(values).all():
            raise InvalidArgumentError("logit biases must be finite")
        for r in self._rows_of(row):
            self._bias[r] = (ids.astype(np.int32), values)
        if not self.split:
            self.sampler.set_logit_bias(row, ids, values)

    def seed(self, seed: int = -1, row: int | None = None, stream: int | None = None) -> None:
        """Reseed the RNG streams (as `Sampler.seed`)."""
        self.sampler.seed(seed, row=row, stream=stream)

    def set_constraints(self, constraints: Sequence[Any | None] | None) -> None:
        """Per row, the `TokenConstraint` of stage 1 (None: that row is unconstrained);
        None: no guidance."""
        if constraints is not None and len(constraints) != self.rows:
            raise InvalidArgumentError(
                f"{len(constraints)} constraints for {self.rows} rows: pass one per row (or None)"
            )
        self.constraints = (
            list(constraints) if constraints is not None and any(constraints) else None
        )

    def _rows_of(self, row: int | None) -> range | tuple[int]:
        if row is None:
            return range(self.rows)
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside [0, {self.rows})")
        return (row,)

    # --- one step --------------------------------------------------------------------------------
    def prepare(
        self,
        logits: np.ndarray,
        sequences: np.ndarray,
        lengths: int | Sequence[int] | np.ndarray,
        *,
        prompt_lengths: int | Sequence[int] | np.ndarray = 0,
        done: np.ndarray | None = None,
    ) -> None:
        """Stages 1-8 that need Python, in place on ``logits`` (float32 [batch, vocab],
        C-contiguous): the guidance masks, the EOS ban, and, with custom processors, stages
        3-7 and the processors. Rows flagged in ``done`` are left alone. ``sequences``
        (int32 [batch, max_len]) holds each row's first ``lengths`` tokens (prompt
        included); ``prompt_lengths``: where the generated ones start. The choice that
        follows must use `sampler` (the native loop's step, or `process`)."""
        if not self.python_stage:
            return
        batch = logits.shape[0]
        active = _active_rows(batch, done)
        if not active:
            return
        constraints = self.constraints
        for r in active:
            constraint = constraints[r] if constraints is not None else None
            if constraint is not None:
                constraint.fill_mask(logits[r])
            elif self.ban_eos:
                logits[r, self.eos_ids] = sampling.LOWEST
        if self._processors:
            self._split_stages(logits, sequences, lengths, prompt_lengths, active)
        self.sampler.forget_logits()  # block maxima of set_logits predate these writes

    def apply_stages(
        self,
        logits: np.ndarray,
        sequences: np.ndarray,
        lengths: Any,
        prompt_lengths: Any = 0,
        rows: Sequence[int] | None = None,
    ) -> None:
        """Stages 3-7 (min_length, repetition penalty, no_repeat_ngram, presence/frequency,
        logit bias) in place on ``rows`` (default all) by the kernels' single-stage functions:
        what beam search runs before its scorer, and what precedes custom processors."""
        batch = logits.shape[0]
        lengths = np.broadcast_to(np.asarray(lengths, np.int64), (batch,))
        starts = np.broadcast_to(np.asarray(prompt_lengths, np.int64), (batch,))
        for r in range(batch) if rows is None else rows:
            row, history, length = logits[r : r + 1], sequences[r : r + 1], int(lengths[r])
            p = self._stage[r]
            if p["min_length"]:
                sampling.apply_min_length(row, length, p["min_length"], self.eos_ids)
            if p["repetition_penalty"] != 1.0:
                sampling.apply_repetition_penalty(row, history, length, p["repetition_penalty"])
            if p["no_repeat_ngram_size"]:
                sampling.apply_no_repeat_ngram(row, history, length, p["no_repeat_ngram_size"])
            if p["presence_penalty"] or p["frequency_penalty"]:
                sampling.apply_presence_frequency(
                    row,
                    history,
                    length,
                    int(starts[r]),
                    p["presence_penalty"],
                    p["frequency_penalty"],
                )
            ids, biases = self._bias[r]
            if ids.size:
                sampling.apply_logit_bias(row, ids, biases)

    def _split_stages(
        self,
        logits: np.ndarray,
        sequences: np.ndarray,
        lengths: Any,
        prompt_lengths: Any,
        active: list[int],
    ) -> None:
        """Stages 3-7 by the kernels' single-stage functions, then the custom processors."""
        self.apply_stages(logits, sequences, lengths, prompt_lengths, active)
        lengths = np.broadcast_to(np.asarray(lengths, np.int64), (logits.shape[0],))
        for r in active:
            tokens = sequences[r, : int(lengths[r])]
            tokens.flags.writeable = False
            for processor in self._processors:
                result = processor(tokens, logits[r])
                if result is not None:
                    logits[r] = _checked_row(result, self.vocab, processor)

    def process(
        self,
        logits: np.ndarray,
        sequences: np.ndarray,
        lengths: int | Sequence[int] | np.ndarray,
        out: np.ndarray | None = None,
        *,
        prompt_lengths: int | Sequence[int] | np.ndarray = 0,
        done: np.ndarray | None = None,
    ) -> np.ndarray:
        """The whole chain, stages 1-9: choose the next token of every row of ``logits``
        (float32 [batch, vocab], batch <= rows, MODIFIED IN PLACE) into ``out`` (int32
        [batch], made when None) and return it. Arguments as `prepare`. With ``logprobs``
        set, `logprobs` / `top_ids` / `top_logprobs` hold this step's values after the
        call. Raises ValueError naming a row whose logits hold a NaN."""
        batch = logits.shape[0]
        if out is None:
            out = np.zeros(batch, np.int32)
        self.prepare(logits, sequences, lengths, prompt_lengths=prompt_lengths, done=done)
        self.sampler.sample_batch(
            logits,
            sequences,
            lengths,
            self.eos_ids,
            out,
            done=done,
            prompt_lengths=prompt_lengths,
            logprobs=self.logprobs,
            top_ids=self.top_ids,
            top_logprobs=self.top_logprobs,
        )
        return out

    # --- after the choice: guidance ------------------------------------------------------------
    def accept(self, row: int, token: int) -> list[int]:
        """Feed row ``row``'s chosen ``token`` to its constraint; returns the tokens the
        grammar forces next (fast-forward; already consumed by the constraint: append them),
        ``[]`` without a constraint or after an EOS."""
        constraint = self.constraints[row] if self.constraints is not None else None
        if constraint is None:
            return []
        forced = constraint.advance(int(token))
        return [] if int(token) in self.eos_ids else forced

    def replay(self, row: int, tokens: Sequence[int] | np.ndarray) -> None:
        """Bring row ``row``'s constraint back to the start, then through ``tokens`` (the
        generated tokens kept after a rewind); tokens the grammar forced (fast-forward) are
        consumed with the token before them (those past the end of ``tokens`` given back),
        tokens after the grammar completed are skipped."""
        constraint = self.constraints[row] if self.constraints is not None else None
        if constraint is None:
            return
        constraint.reset()
        forced: list[int] = []
        for token in tokens:
            token = int(token)
            if forced and forced[0] == token:  # consumed already, with the token before it
                forced.pop(0)
                continue
            if constraint.is_finished:
                break
            forced = list(constraint.advance(token))
        if forced:  # the tokens end inside a forced span: give back the rest of it
            consumed, _ = constraint.mark()
            constraint.restore((consumed - len(forced), False))

    def reset(self) -> None:
        """Every constraint back to the start of its grammar (a new sequence)."""
        for constraint in self.constraints or ():
            if constraint is not None:
                constraint.reset()

    def finished(self, row: int) -> bool:
        """True when row ``row``'s grammar is complete (False without a constraint)."""
        constraint = self.constraints[row] if self.constraints is not None else None
        return constraint is not None and bool(constraint.is_finished)

    def close(self) -> None:
        """Wait for the constraints' mask computations still running (before dropping the
        chain mid-sequence)."""
        for constraint in self.constraints or ():
            if constraint is not None:
                constraint.close()


def _active_rows(batch: int, done: np.ndarray | None) -> list[int]:
    if done is None:
        return list(range(batch))
    # plain Python on the flags: a NumPy call right after a model run costs tens of us
    return [r for r, flag in enumerate(done[:batch].tolist()) if not flag]


def _checked_row(result: Any, vocab: int, processor: Any) -> np.ndarray:
    array = np.asarray(result, dtype=np.float32)
    if array.shape != (vocab,):
        raise GenerationError(
            f"logits processor {processor!r} returned shape {array.shape}; expected ({vocab},) "
            "(or None after editing the row in place)"
        )
    return array
