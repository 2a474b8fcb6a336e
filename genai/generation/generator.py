"""`Generator`: onnxruntime-genai's generation API over a decode driver.

The Python side validates input, runs the search (sampling, beam search, guidance, stop strings)
and answers queries; the model kind's graphs are run by one driver
(`genai.generation.drivers`, picked by `make_driver`), and the per-step state lives in its
native loop (`genai._core.decoder_loop`):

* ``sequences`` [batch, max_length] and ``length``: every token so far (prompt included);
* ``computed``: how many of them the model has run on; a run feeds
  ``sequences[:, computed:length]``;
* the logits rows [batch, vocab] the next token is chosen from, and whether they are current.

For a single-graph decoder the driver's loop feeds the inputs, runs the session, gathers the
logits, chooses (greedy or the sampler) and commits, all without the GIL; windowed and pipeline
models are fed by a runner that writes the logits rows, and the loop chooses and commits. The
generator never asks which: what a driver cannot do it declares (`Driver.unsupported`).

Guidance (`GeneratorParams.set_guidance`) and stop strings (search option ``stop``) add a
Python stage around that step: make the logits current, apply each row's token mask
(`TokenConstraint`), let the driver choose and commit, then feed the chosen tokens
to the constraints and the stop-string matchers; a row that hits a stop string is flagged done
(padded from then on, as after EOS). Without them the step stays one native call.
"""

from __future__ import annotations

import copy
import functools
import logging
import operator
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, SupportsIndex, TypeVar

import numpy as np

from genai._core import sampling
from genai.compat.engine_enums import FinishReason
from genai.compat.logging_options import step_logging
from genai.constraints.guidance import TokenConstraint
from genai.constraints.stop import StopStringMatcher
from genai.errors import (
    ArgumentTypeError,
    GenerationError,
    InvalidArgumentError,
    LengthLimitError,
    SearchOptionError,
    TensorNotFoundError,
    UnsupportedFeatureError,
    check_type,
)
from genai.generation import step_log
from genai.generation.beam_search import BeamScorer
from genai.generation.decode_ahead import make_ahead, take_step
from genai.generation.drivers import Driver, LoopSettings, make_driver, require
from genai.generation.logits import LogitsChain
from genai.generation.speculative import (
    RowSpeculation,
    SpeculativeDecoder,
    check_speculative,
    make_speculative,
    plain_stats,
)
from genai.runtime.adapters import Adapters
from genai.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    import numpy.typing as npt

    from genai.compat.tensors import NamedTensors
    from genai.generation.generator_params import GeneratorParams
    from genai.runtime.model import DecoderIO, Model

__all__ = ["Generator", "KVSnapshot", "TensorNotFoundError"]

log = logging.getLogger(__name__)


#: One `genai.Tokenizer` per model, built on first need (stop strings, guidance).
_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _tokenizer_of(model: Model) -> Any:
    found = _TOKENIZERS.get(model)
    if found is None:
        found = _TOKENIZERS[model] = Tokenizer(model)
    return found


def _as_index(value: Any, what: str) -> int:
    """``value`` as an int (Python or NumPy integers); `ArgumentTypeError` naming ``what``
    for anything else (1.5, "0")."""
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{what} must be an int, not {type(value).__name__}") from None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_thread_at_a_time(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """``method`` of a `Generator`, refused with a `GenerationError` while another thread is
    inside one of the generator's guarded methods (a generator keeps one sequence of steps;
    from two threads at once they would interleave, or wait on each other's run-ahead
    forever). Calls nested in the same thread pass."""

    @functools.wraps(method)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        self = args[0]
        assert isinstance(self, Generator)
        busy = self._busy
        if not busy.acquire(blocking=False):
            if self._busy_thread == threading.get_ident():
                return method(*args, **kwargs)  # nested in the same thread
            raise GenerationError(
                f"Generator.{method.__name__}: this generator is in use by another thread; "
                "a generator takes one thread at a time (use one per thread, or genai.Engine)"
            )
        self._busy_thread = threading.get_ident()
        try:
            return method(*args, **kwargs)
        finally:
            self._busy_thread = None
            busy.release()

    return guarded


@dataclass(frozen=True)
class KVSnapshot:
    """Tokens and KV cache of a generator at one point (see `Generator.snapshot`)."""

    io: DecoderIO
    layout: str
    tokens: np.ndarray
    kv: list[np.ndarray]

    @property
    def nbytes(self) -> int:
        """Bytes the snapshot holds."""
        return self.tokens.nbytes + sum(a.nbytes for a in self.kv)


class Generator:
    """Generates tokens for a batch of sequences, one step at a time (API of
    onnxruntime-genai's ``Generator``)."""

    def __init__(self, model: Model, params: GeneratorParams) -> None:
        from genai.generation.generator_params import GeneratorParams  # lazy: imports us
        from genai.runtime.model import Model  # lazy: the runtime imports the generation

        if not isinstance(model, Model):
            raise ArgumentTypeError(
                f"Generator: model must be a genai.Model, not {type(model).__name__}"
            )
        if not isinstance(params, GeneratorParams):
            raise ArgumentTypeError(
                f"Generator: params must be a genai.GeneratorParams, not {type(params).__name__}"
            )
        #: held while a thread is inside a guarded method (`_one_thread_at_a_time`)
        self._busy = threading.Lock()
        self._busy_thread: int | None = None
        self.model = model
        self.search = copy.deepcopy(params.search)
        check_speculative(params.speculative, model.config, self.search, params.draft_model)
        if self.search.max_length == 0:  # set so (the config's 0 is its context length)
            raise SearchOptionError("search max_length is 0")
        self.search.validate(model.config.context_length, model.io.vocab_size)
        io = self._io = model.io
        search = self.search
        config = model.config
        self.batch_size = self.search.batch_size
        self.num_beams = self.search.num_beams
        #: Rows the model runs: batch_size * num_beams.
        self.rows = batch = self.batch_size * self.num_beams
        self.max_length = max_length = self.search.max_length
        self.vocab_size = io.vocab_size
        self._eos = np.asarray(config.eos_token_ids, dtype=np.int32)
        self._pad_id = pad_id = int(config.get("model.pad_token_id", 0))
        if search.do_sample and search.top_k > io.vocab_size:
            raise SearchOptionError(
                f"top_k ({search.top_k}) must be less than or equal to vocab_size ({io.vocab_size})"
            )
        self._sampler = None
        self._beams: BeamScorer | None = None
        if self.num_beams > 1:
            if params.guidance is not None:
                raise SearchOptionError(
                    "guidance (set_guidance) does not work with beam search (num_beams > 1)"
                )
            if search.stop:
                raise SearchOptionError("stop strings do not work with beam search (num_beams > 1)")
            if search.do_sample:
                raise SearchOptionError(
                    "beam search (num_beams > 1) does not sample: set do_sample=False"
                )
            if params.logit_bias or search.logprobs or search.top_logprobs:
                raise SearchOptionError("beam search does not take logit_bias or logprobs")
            if params.logits_processors:
                raise SearchOptionError("beam search does not take custom logits processors")
            self._beams = BeamScorer(
                self.batch_size,
                self.num_beams,
                io.vocab_size,
                self._eos,
                pad_id,
                search.length_penalty,
                search.early_stopping,
            )
        #: The logits-processing chain (`genai.generation.logits`). With beam search only its
        #: stages 3-7 run (`LogitsChain.apply_stages`), the beam scorer chooses.
        self._chain = LogitsChain(
            batch,
            io.vocab_size,
            self._eos,
            search,
            logit_bias=params.logit_bias,
            processors=params.logits_processors,
        )
        if self.num_beams == 1:
            self._sampler = self._chain.loop_sampler  # None: the loop takes the argmax
        settings = LoopSettings(
            rows=batch,
            max_length=max_length,
            pad_id=pad_id,
            eos=self._eos,
            sampler=self._sampler,
            padded=self.batch_size > 1,
            logprobs=search.top_logprobs if (search.logprobs or search.top_logprobs) else -1,
        )
        #: Runs the model kind's graphs (`genai.generation.drivers`).
        self._driver: Driver = make_driver(model, search, settings)
        self._loop = self._driver.loop
        #: The binding runs go through (None for a pipeline model); adapters bind to it.
        self._session = self._driver.session
        #: The KV cache (None where the driver's runner keeps its own).
        self._kv = self._driver.kv
        #: Names of the adapters activated on this generator (see `set_active_adapter`).
        self.active_adapters: list[str] = []
        self._sequences = self._loop.array("sequences")
        self._logits_rows = self._loop.array("logits_rows")
        self._init_python_stage(model, params)
        #: Speculative decoding (`GeneratorParams.set_speculative_options`), or None: rounds
        #: that verify several proposed tokens in one run, emitted one per step.
        self._spec: SpeculativeDecoder | RowSpeculation | None = make_speculative(
            self, params.speculative, params.draft_model, params
        )
        #: The sequence length at which a batch-1 generator re-runs its whole sequence as one
        #: prompt before the next step, as the reference does for Phi-3 long-RoPE models
        #: (`genai.runtime.model.ROPE_REWIND_LENGTHS`); 0: never.
        self._rope_rewind_at = model.rope_rewind_length if self.rows == 1 else 0
        #: names given to `set_model_input` that neither the model nor its draft takes
        self._missing_inputs: set[str] = set()
        #: Decode ahead (`genai.generation.decode_ahead`): a native thread runs the per-token
        #: loop's steps while Python runs; None where the steps need Python.
        self._ahead = make_ahead(self)

    def _settle(self, replay: bool = False, runs: bool = False) -> None:
        """Stop decoding ahead and bring the loop back to the visible state (the tokens
        taken so far). ``replay``: the caller reads or replaces the last run's outputs or
        bindings, which must be the visible state's; ``runs``: the caller runs the model next."""
        ahead = self._ahead
        if ahead is None:
            return
        ahead.settle()
        if runs:
            ahead.forget_run()
        elif replay:
            ahead.replay_last_run()

    def _run_limit(self, length: int) -> int:
        """The length steps from ``length`` may reach before Python looks again: the stop
        length, or the rope rewind length when the sequence is below it."""
        at = self._rope_rewind_at
        return at if at and length < at < self._stop_length else self._stop_length

    def _rope_rewind_if_due(self) -> None:
        """At `_rope_rewind_at` tokens, re-run the sequence from its start as one prompt (the
        reference's Phi-3 rewind: the KV is recomputed with the long rotary factors); the
        tokens, the counts of max_new_tokens and the Python stage stay as they are."""
        at = self._rope_rewind_at
        if not at or at >= self._stop_length or self.token_count() != at or self.is_done():
            return
        self._settle(runs=True)
        if self._spec is not None:
            self._spec.settle()
            self._spec.proposer.invalidate()
        loop = self._loop
        tokens = self._sequences[:, : loop.length].copy()
        self._driver.rewind(0)
        loop.append(self._driver.prepare_prompt(tokens, 0))
        self._run_model(prompt=True)

    def _init_python_stage(self, model: Model, params: GeneratorParams) -> None:
        """State beyond the loop: finish tracking, guidance and stop strings."""
        io, search, batch = self._io, self.search, self.rows
        self._done = self._loop.array("done")
        #: where the tokens counted by max_new_tokens start (the end of the last append)
        self._gen_start = 0
        #: the sequence length at which the rows stop: max_length, or sooner by max_new_tokens
        self._stop_length = self.max_length
        #: after `rewind_to(n)`: the tokens that sat at index n, [rows], replayed by the next
        #: step or `get_logits` (the reference's rewind); None otherwise
        self._boundary: np.ndarray | None = None
        # --- the Python stage: guidance and stop strings (None when unused) ---
        self._constraints: list[Any] | None = None
        self._ff_tokens = False
        #: fast-forward tokens the grammar forced after the last chosen token: as the
        #: reference, they join the sequence when the next run is due and run as a run of
        #: their own after the chosen token's (`_run_pending`)
        self._pending_ff: list[int] = []
        if params.guidance is not None:
            kind, data = params.guidance
            tokenizer = _tokenizer_of(model)
            self._constraints = [
                TokenConstraint.create(
                    tokenizer, kind, data, vocab_size=io.vocab_size, eos_token_id=int(self._eos[0])
                )
                for _ in range(batch)
            ]
            # as the reference: fast-forward only at batch 1 (every row shares one sequence
            # length here)
            self._ff_tokens = params.guidance_ff_tokens and batch == 1
            for constraint in self._constraints:
                constraint.enable_ff_tokens = self._ff_tokens
        self._stops: list[StopStringMatcher] | None = None
        self._streams: list[Any] | None = None
        if search.stop:
            self._stops = [StopStringMatcher(search.stop) for _ in range(batch)]
            tokenizer = _tokenizer_of(model)
            self._streams = [tokenizer.create_stream() for _ in range(batch)]
        if self._chain is not None:
            self._chain.set_constraints(self._constraints)
        chain_stage = self._chain is not None and self._chain.python_stage
        self._python_stage = chain_stage or self._stops is not None
        #: per row: STOP_STRING once a stop string matched (other reasons are read from the loop)
        self._finish: list[FinishReason | None] = [None] * batch
        self._all_finished = False
        #: set_runtime_option("terminate_session", "1"): every call that would run the model
        #: or read its state raises until "0".
        self._terminated = False

    def _check_terminated(self) -> None:
        if self._terminated:
            raise GenerationError(
                "Session in Terminated state: the session was terminated "
                "(set_runtime_option('terminate_session', '1')); set it to '0' to continue"
            )

    # --- feeding tokens -------------------------------------------------------------------------
    @_one_thread_at_a_time
    def append_tokens(self, tokens: npt.ArrayLike) -> None:
        """Append prompt tokens (1-D for batch 1, or [batch, length]) and run the model on them
        now. Later calls continue the sequence (batch 1)."""
        self._check_terminated()
        if self._missing_inputs:
            raise TensorNotFoundError(
                f"Speculative decoding model input '{sorted(self._missing_inputs)[0]}' was not "
                "found in the target or draft model."
            )
        self._settle(runs=True)
        self._drop_boundary()  # the appended tokens take the rewound token's place
        if self._spec is not None:
            self._spec.settle()  # tokens of a round not emitted yet are dropped
            if not self._loop.length:
                self._spec.reset()  # a new sequence: adaptive K, cooldown, lookup start over
        try:
            array = np.asarray(tokens)
        except ValueError:  # ragged nested lists
            raise InvalidArgumentError(
                "tokens must be 1-D or a rectangular [batch, length] array (rows of equal length)"
            ) from None
        if array.size == 0:
            raise InvalidArgumentError("append_tokens needs at least one token")
        if array.dtype.kind not in "iu":
            raise ArgumentTypeError(f"tokens must be integers, got dtype {array.dtype}")
        if array.ndim == 1:
            if array.size % self.batch_size:
                raise InvalidArgumentError(
                    f"a 1-D token array of {array.size} ids cannot be split into "
                    f"batch_size {self.batch_size} rows; pass [batch, length]"
                )
            array = array.reshape(self.batch_size, -1)
        elif array.ndim != 2:
            raise InvalidArgumentError(
                f"tokens must be 1-D or [batch, length], got shape {array.shape}"
            )
        if array.shape[0] != self.batch_size:
            raise InvalidArgumentError(
                f"tokens have {array.shape[0]} rows but batch_size is {self.batch_size}"
            )
        if self.num_beams > 1:
            if self._loop.length:
                raise UnsupportedFeatureError("append_tokens after generating needs num_beams 1")
            array = np.repeat(array, self.num_beams, axis=0)  # every beam starts from the prompt
        count = array.shape[1]
        if count == 0:
            raise InvalidArgumentError("append_tokens needs at least one token")
        if array.min() < 0 or array.max() >= self.vocab_size:
            bad = array[(array < 0) | (array >= self.vocab_size)].flat[0]
            raise InvalidArgumentError(
                f"token id {int(bad)} is outside the vocabulary [0, {self.vocab_size})"
            )
        length = self._loop.length
        if step_logging():  # (beam search: the reference writes the prompt as one span)
            beams = self.num_beams > 1
            step_log.log_appended(
                array[:: self.num_beams].reshape(-1, 1) if beams else array, self._eos
            )
        array = self._driver.prepare_prompt(array, length)  # e.g. padded to whole windows
        count = array.shape[1]
        if length + count > self.max_length:
            raise LengthLimitError(
                f"appending {count} tokens to {length} exceeds max_length {self.max_length}"
            )
        if length and self.num_beams > 1:
            raise UnsupportedFeatureError(
                "continuous decoding (append_tokens after the first call) needs num_beams 1"
            )
        self._loop.append(array)
        self._new_generation()
        if self._spec is not None and self._spec.take_tokens(array, length):
            return  # batch > 1: each row's generator runs its tokens
        self._run_prompt(length)
        if self._spec is not None:
            self._spec.appended()

    def _run_prompt(self, length: int) -> None:
        """Run the tokens appended after ``length``; when a first prompt's run fails (inputs
        that do not belong together, an onnxruntime error) no half-run prompt is kept: the
        generator is empty again, so a corrected call starts afresh."""
        try:
            self._run_model(prompt=length == 0)
        except Exception:
            if length == 0:
                try:
                    self.rewind_to(0)
                except Exception:  # (the run's error is the one to report)
                    log.debug("rewind after a failed prompt run failed", exc_info=True)
            raise

    @_one_thread_at_a_time
    def set_active_adapter(self, adapters: Adapters, name: str) -> None:
        """Activate the LoRA adapter ``name`` loaded in ``adapters`` for this generator's
        runs; several adapters may be active at once (onnxruntime-genai's API)."""
        check_type(adapters, Adapters, "set_active_adapter: adapters")
        check_type(name, str, "set_active_adapter: name")
        self._settle(replay=True)
        adapters._activate(self, name)
        if self._spec is not None:
            self._spec.forward("set_active_adapter", adapters, name)

    # --- steps ----------------------------------------------------------------------------------
    @_one_thread_at_a_time
    def generate_next_token(self) -> None:
        """Run the model on pending tokens if needed, choose the next token per row and append
        it."""
        if step_logging():
            self._logged_next_token()
        else:
            self._next_token()

    def _logged_next_token(self) -> None:
        """A step with the reference's log lines (`genai.generation.step_log`): one step at a
        time (no decoding ahead), so each model run's logits are written as they come."""
        self._settle(runs=True)
        ahead, self._ahead = self._ahead, None
        try:
            message = step_log.step_message(self.search, self._loop.length)
            running = self._done == 0
            self._next_token(logged=True)
        finally:
            self._ahead = ahead
        step_log.log_step(
            message,
            self.get_next_tokens(),
            running & (self._done != 0),
            self._eos,
            self._loop.length,
            self.max_length,
            self._beams is not None,
        )

    def _run_model(self, prompt: bool = False) -> None:
        """Run the model on the pending tokens (the driver's run), writing its logits when
        the ``model_logits`` log item is on."""
        self._driver.run(prompt=prompt)
        if step_logging():
            step_log.log_values("model_logits", self._logits_rows)

    def _next_token(self, logged: bool = False) -> None:
        """`generate_next_token`'s step; ``logged``: the model runs' logits are written (no
        decoding ahead then)."""
        self._check_terminated()
        if self._replay_boundary() and self.is_done():
            return  # the replayed token finished every row
        self._rope_rewind_if_due()
        ahead = self._ahead
        if ahead is not None and ahead.running:
            if not ahead.all_done and ahead.length < self._run_limit(ahead.length):
                if take_step(ahead):
                    return  # the worker's next step: the visible state moves on
            else:
                ahead.settle()  # the plain path below raises as the plain loop does
        spec = self._spec
        if spec is not None and spec.drain():  # a speculative round's next token
            return
        loop = self._loop
        if not loop.logits_ready and loop.length == 0:
            raise GenerationError(
                "generate_next_token called with no prior state: call append_tokens first"
            )
        if loop.length >= self._stop_length:
            if loop.length >= self.max_length:
                raise GenerationError(f"the sequence reached max_length {self.max_length}")
            raise GenerationError(
                f"the rows generated max_new_tokens ({self.search.max_new_tokens}) tokens"
            )
        if self._ended() and not loop.logits_ready:
            # as the reference: every row ended, nothing is added, the next tokens are pads
            loop.array("next_tokens")[:] = self._pad_id
            return
        if spec is not None:
            spec.step()
            return
        if self._python_stage:
            self._guided_step()
            return
        if self._beams is None:
            if ahead is not None and not loop.logits_ready and not loop.all_done:
                ahead.start(self._run_limit(loop.length))  # this step and the next ones
                if ahead.running and take_step(ahead):
                    return
            ran = not loop.logits_ready
            if ran and logged:
                self._run_model()  # the run's logits are written before the choice
            self._driver.step()
            if ahead is not None:
                ahead.forget_run()
                limit = self._run_limit(loop.length)
                if ran and not loop.all_done and loop.length < limit:
                    ahead.start(limit)  # the next steps run meanwhile
            return
        if not loop.logits_ready:
            self._run_model()
        self._beam_step()

    # --- the Python stage (guidance, stop strings) ----------------------------------------------
    def _new_generation(self) -> None:
        """After appending a prompt: max_new_tokens counts from here; constraints, stop
        matching and finish reasons start over."""
        self._gen_start = self._loop.length
        self._set_stop_length()
        self._finish = [None] * self.rows
        self._all_finished = False
        self._pending_ff = []
        for constraint in self._constraints or ():
            constraint.reset()
        for matcher in self._stops or ():
            matcher.reset()
        for stream in self._streams or ():
            stream.reset()

    def _guided_step(self) -> None:
        loop, done = self._loop, self._done
        # plain Python on the flags: a NumPy call right after a model run costs tens of us
        active = [r for r, flag in enumerate(done.tolist()) if not flag]
        chain = self._chain
        assert chain is not None
        if chain.python_stage:
            if not loop.logits_ready:
                self._run_pending()  # the next masks are computed meanwhile, on llguidance's side
                if self._ended() or loop.length >= self._stop_length:
                    return  # forced tokens ended the row (a stop string) or reached the limit
            chain.prepare(
                self._logits_rows,
                self._sequences,
                loop.length,
                prompt_lengths=loop.prompt_length,
                done=done,
            )
        self._driver.step()  # the choice, by the chain's sampler (chain.loop_sampler)
        tokens = loop.array("next_tokens")
        forced: list[int] = []
        for r in active:
            token = int(tokens[r])
            forced = chain.accept(r, token)
            if self._stops is not None:
                self._match_stop(r, token)
        # fast-forward (batch 1): the forced tokens join the sequence at the next run
        self._pending_ff = forced if self._ff_tokens and not done[0] else []
        self._all_finished = all(done.tolist())

    def _run_pending(self) -> None:
        """Run the pending tokens; then, as the reference, a guided step's fast-forward
        tokens join the sequence and run as a run of their own (the chosen token alone first:
        the same numbers as the reference's two runs)."""
        self._run_model()
        if self._push_forced():
            self._run_model()

    def _push_forced(self) -> bool:
        """Append the pending fast-forward tokens (up to a stop string or the length limit);
        True if any were appended (their run is then due)."""
        forced, self._pending_ff = self._pending_ff, []
        if not forced:
            return False
        loop, done, pushed = self._loop, self._done, False
        for token in forced:
            if done[0] or loop.all_done or loop.length >= self._stop_length:
                break
            loop.push_tokens(np.array([token], dtype=np.int32), False)
            pushed = True
            if self._stops is not None:
                self._match_stop(0, token)
        self._all_finished = all(done.tolist())
        return pushed

    def _match_stop(self, row: int, token: int) -> None:
        assert self._stops is not None and self._streams is not None
        matcher = self._stops[row]
        _, stopped = matcher.push(self._streams[row].decode(token))
        if stopped and not self._done[row]:
            self._finish[row] = FinishReason.STOP_STRING
            self._done[row] = 1  # padded from now on, as after EOS

    def _replay(self, length: int) -> None:
        """Bring constraints and stop matchers to the sequence's first ``length`` tokens (after
        a rewind): start over and feed the generated part again."""
        self._gen_start = min(self._gen_start, length)
        generated = self._sequences[:, self._gen_start : length]
        self._done[:] = 0  # as the loop's rewind: the rows finish again as the tokens say
        self._finish = [None] * self.rows
        self._all_finished = False
        for r in range(self.rows):
            if self._constraints is not None:
                self._chain.replay(r, generated[r])
            if self._stops is not None and self._streams is not None:
                self._stops[r].reset()
                self._streams[r].reset()
                for token in generated[r]:
                    self._match_stop(r, int(token))
        self._all_finished = all(self._done.tolist())

    def _beam_step(self) -> None:
        loop, beams = self._loop, self._beams
        assert beams is not None
        length = loop.length
        logits = self._logits_rows
        self._chain.apply_stages(logits, self._sequences, length, loop.prompt_length)
        beams.step(logits, self._sequences, length)
        order = beams.next_indices
        if (order != np.arange(self.rows)).any():
            self._sequences[:, :length] = self._sequences[order, :length]
            self._driver.reorder(order)
        loop.push_tokens(beams.next_tokens, beams.all_done)

    @_one_thread_at_a_time
    def generate_until_done(self, max_new_tokens: int | None = None) -> int:
        """Run greedy steps until every row is done, max_length, or ``max_new_tokens`` steps,
        in one GIL-free block; returns the number of steps made. Same tokens as calling
        `generate_next_token` in a loop, without returning to Python between tokens."""
        self._settle(runs=True)
        self._replay_boundary()
        loop = self._loop
        if not loop.logits_ready and loop.length == 0:
            raise GenerationError("call append_tokens before generate_until_done")
        limit = self.max_length if max_new_tokens is None else int(max_new_tokens)
        if limit < 0:
            raise InvalidArgumentError(f"max_new_tokens must be >= 0, got {limit}")
        limit = min(limit, max(self._stop_length - self.token_count(), 0))
        driver = self._driver
        fused = driver.fused_steps and self._spec is None
        if self._beams is None and not self._python_stage and fused:
            made = 0
            while made < limit:  # in one call, or two around a rope rewind
                self._rope_rewind_if_due()
                chunk = min(limit - made, self._run_limit(self._loop.length) - self._loop.length)
                ran = driver.steps(chunk) if chunk > 0 else 0
                made += ran
                if ran < chunk or chunk <= 0:
                    break
            return made
        made = 0
        while made < limit and not self.is_done():
            self.generate_next_token()
            made += 1
        return made

    def get_next_logprobs(
        self,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32], npt.NDArray[np.float32]]:
        """Log-probabilities of the last step (search options ``logprobs`` / ``top_logprobs``;
        beyond the reference): the chosen tokens' [batch], and the ``top_logprobs`` most likely
        ids [batch, n] with theirs. Log-softmax of the processed logits at temperature 1."""
        if not (self.search.logprobs or self.search.top_logprobs):
            raise GenerationError("set the search option logprobs=True (or top_logprobs=N)")
        self._settle()
        if not self._loop.generated:
            raise GenerationError("no tokens generated yet")
        n = self.search.top_logprobs
        loop = self._loop
        return (
            loop.array("logprobs").copy(),
            loop.array("top_ids")[:, :n].copy(),
            loop.array("top_logprobs")[:, :n].copy(),
        )

    @_one_thread_at_a_time
    def set_row_search_options(self, row: int, **options: float | int | bool) -> None:
        """Per-row sampling options in a batch (beyond the reference): do_sample,
        temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty, no_repeat_ngram_size, min_length, and random_seed (that row's own
        stream)."""
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside [0, {self.rows})")
        self._settle()
        if self._sampler is None:
            raise GenerationError(
                "per-row options need the sampling chain: create the generator with a "
                "processing search option (e.g. do_sample=True)"
            )
        if self._spec is not None:
            self._spec.forward("set_row_search_options", row, dict(options))
        seed = options.pop("random_seed", None)
        assert self._chain is not None
        try:
            self._chain.configure(row, **options)
        except (TypeError, ValueError) as exc:
            raise SearchOptionError(str(exc)) from exc
        if seed is not None:
            self._chain.seed(int(seed), row=row, stream=0)  # as a batch-1 run with that seed

    @_one_thread_at_a_time
    def is_done(self) -> bool:
        """True when every row finished (EOS, a stop string; beam search: every batch entry has
        its hypotheses) or the sequence reached max_length or max_new_tokens."""
        self._check_terminated()
        ahead = self._ahead
        if ahead is not None and ahead.running:
            return ahead.all_done or ahead.length >= self._stop_length
        if self._spec is not None and self._spec.pending:
            return False
        loop = self._loop
        return loop.all_done or self.token_count() >= self._stop_length or self._all_finished

    def finish_reason(self, row: int = 0) -> FinishReason:
        """Why row ``row`` finished, as a `genai.FinishReason` (beyond the reference's
        Generator; its Engine's events carry the same values): ``EOS`` (an EOS token, including
        the one guidance forces once its grammar is complete), ``STOP_STRING`` (search option
        ``stop``), ``MAX_GENERATED_TOKENS`` (search option ``max_new_tokens``),
        ``MAX_SESSION_TOKENS`` (``max_length``), or ``NONE`` while it is still generating
        (``NONE`` is falsy). With beam search ``row`` is a batch entry."""
        if not 0 <= row < self.batch_size:
            raise IndexError(f"row {row} outside [0, {self.batch_size})")
        ahead = self._ahead
        if ahead is not None and ahead.running:  # the visible state (no Python stage here)
            if ahead.done[row]:
                return FinishReason.EOS
            return self._length_reason(ahead.length)
        if self._spec is not None and self._spec.pending:
            return FinishReason.NONE
        loop = self._loop
        if self._beams is None:
            reason = self._finish[row]
            if reason is not None:
                return reason
            if self._done[row]:
                return FinishReason.EOS
        elif loop.all_done:
            return FinishReason.EOS
        return self._length_reason(self.token_count())

    def _length_reason(self, length: int) -> FinishReason:
        """The reason a row that is not done has at sequence length ``length``."""
        if length >= self.max_length:
            return FinishReason.MAX_SESSION_TOKENS
        if length >= self._stop_length:
            return FinishReason.MAX_GENERATED_TOKENS
        return FinishReason.NONE

    # --- reading state --------------------------------------------------------------------------
    @_one_thread_at_a_time
    def get_next_tokens(self) -> npt.NDArray[np.int32]:
        """The tokens chosen by the last step, int32 [batch]; right after `append_tokens`,
        as the reference, each row's last appended token."""
        ahead = self._ahead
        if ahead is not None and ahead.running:
            return ahead.next_tokens.copy()
        if self._boundary is not None:
            return self._boundary.copy()  # as the reference: the token to be replayed
        loop = self._loop
        if not loop.length:  # also after rewind_to(0)
            raise GenerationError("no tokens yet: call append_tokens first")
        if not loop.generated:
            return self._sequences[:, loop.length - 1].copy()
        return loop.array("next_tokens").copy()

    def get_sequence(self, index: SupportsIndex) -> npt.NDArray[np.int32]:
        """Row ``index``: prompt (padding included) + generated tokens, int32. With beam
        search, index ``b * num_return_sequences + r`` is batch entry b's r-th best
        hypothesis (this finalizes the search, as the reference)."""
        index = _as_index(index, "index")
        if self._beams is not None:
            returned = self.search.num_return_sequences
            if not 0 <= index < self.batch_size * returned:
                raise IndexError(
                    f"sequence index {index} outside [0, {self.batch_size * returned})"
                )
            self._beams.finalize(self._sequences, self._loop.length)
            return self._beams.hypothesis(index // returned, index % returned)
        if not 0 <= index < self.batch_size:
            raise IndexError(f"sequence index {index} outside [0, {self.batch_size})")
        return self._sequences[index, : self.token_count()].copy()

    def token_count(self) -> int:
        """Tokens in each sequence so far (prompt included)."""
        ahead = self._ahead
        if ahead is not None and ahead.running:
            return int(ahead.length)  # the tokens taken so far
        if self._spec is not None and self._spec.pending:
            return self._spec.visible  # the round's tokens emitted so far
        return int(self._loop.length) - (self._boundary is not None)

    @_one_thread_at_a_time
    def get_logits(self) -> npt.NDArray[np.float32]:
        """A copy of the logits the next token is chosen from, float32 [batch, 1, vocab]
        (runs the model on a pending token first, as the reference)."""
        self._settle(runs=True)
        self._replay_boundary()
        self._refuse_logits_after_the_end()
        found = self._spec.logits() if self._spec is not None else None
        if found is not None:
            return found  # the verified row the next token comes from (or the rows')
        loop = self._loop
        if not loop.logits_ready:
            self._check_terminated()
            if loop.length == 0:
                raise GenerationError("no logits yet: call append_tokens first")
            self._run_pending()
        return self._logits_rows[:, None, :].copy()

    def _ended(self) -> bool:
        """Every row ended before the length limits (EOS, a stop string, a completed
        grammar); beam search keeps its own account."""
        if self._beams is not None or (self._spec is not None and self._spec.pending):
            return False
        return bool(self._loop.all_done or self._all_finished)

    def _refuse_logits_after_the_end(self) -> None:
        """No logits follow the end of every row (the reference: speculative decoding refuses
        with these words; its plain decoding would run the model on the EOS token)."""
        if self._ended() and not self._loop.logits_ready:
            if self._spec is not None:
                raise GenerationError(
                    "Speculative decoding logits are unavailable after generation is complete."
                )
            raise GenerationError(
                "logits are unavailable after generation is complete: every row ended"
            )

    @_one_thread_at_a_time
    def set_logits(self, logits: np.ndarray) -> None:
        """Replace the logits the next token is chosen from ([batch, vocab] or
        [batch, 1, vocab], float32)."""
        self._settle(replay=True)
        if self._spec is not None:
            self._refuse_logits_after_the_end()
        self._drop_boundary()  # the next token comes from these logits, after the kept ones
        if self._spec is not None:
            self._spec.settle()  # the next token comes from these logits, not a round's
        self._push_forced()  # the grammar consumed them: they precede the next token
        if self._sampler is not None:
            # Copies in and records block maxima on the way (the top-k then skips that pass).
            self._sampler.load_logits(logits, self._logits_rows)
        else:
            self._logits_rows[:] = sampling.check_logits(logits, self.rows, self.vocab_size)
        self._loop.set_logits_ready()
        if self._spec is not None:
            self._spec.forward("set_logits", logits)

    def get_output(self, name: str) -> npt.NDArray[Any]:
        """A host copy of the last run's output ``name``: ``"logits"``, ``"present.0.key"``,
        or any other output the graph declares (e.g. ``"hidden_states"``)."""
        self._check_terminated()
        self._settle(replay=True)
        return self._driver.read_output(name)

    def get_input(self, name: str) -> npt.NDArray[Any]:
        """A host copy of the last run's input ``name`` (also the inputs bound with
        `set_model_input` and preset inputs such as ``num_logits_to_keep``)."""
        self._check_terminated()
        self._settle(replay=True)
        draft = getattr(self._spec, "draft_driver", None)
        if (
            draft is not None
            and name in draft.model_inputs
            and name not in self._driver.model_inputs
        ):
            return draft.read_input(name)  # an input only the draft takes
        return self._driver.read_input(name)

    # --- model inputs and run options -----------------------------------------------------------
    @_one_thread_at_a_time
    def set_model_input(self, name: str, value: np.ndarray) -> None:
        """Feed graph input ``name`` with ``value`` (a copy is bound) in this generator's runs
        from the next one on: an input the model takes beyond ids, mask, positions and KV
        (e.g. an extra input of an exported graph). As the reference, a name the graph does not
        take is ignored (with a warning here); the dtype must be the graph's."""
        check_type(name, str, "name")
        if hasattr(value, "as_numpy") and not isinstance(value, np.ndarray):
            value = value.as_numpy()  # a genai.Tensor
        check_type(value, np.ndarray, "value")
        self._settle(replay=True)
        draft = getattr(self._spec, "draft_driver", None)
        if draft is None:
            self._driver.set_model_input(name, value)
            if self._spec is not None:
                self._spec.forward("set_model_input", name, value)
            return
        # with a draft model, as the reference: each model that takes the input gets it; one
        # neither takes fails the next run
        takers = [d for d in (self._driver, draft) if name in d.session.input_dtypes]
        for driver in takers:
            driver.set_model_input(name, value)
        if takers:
            self._missing_inputs.discard(name)
        else:
            self._missing_inputs.add(name)

    @_one_thread_at_a_time
    def set_inputs(self, named_tensors: NamedTensors) -> None:
        """The reference's input path for multimodal models: a processor's output
        (``input_ids`` with the image placeholders, pixel values, ...) is appended and run
        now, as `append_tokens`. A decoder-only model takes its tokens through
        `append_tokens` (the reference raises the same)."""
        self._check_terminated()
        self._settle(runs=True)
        take = getattr(self._driver, "set_inputs", None)
        if take is None:
            raise GenerationError(
                f"Please use generator.append_tokens for {self.model.type}. set_inputs is not "
                "supported for this model type."
            )
        self._drop_boundary()
        array = take(named_tensors)  # the driver keeps the rest; ids may be placeholders
        if array is None:  # inputs without ids (e.g. audio alone): appended later
            return
        length = self._loop.length
        if length + array.shape[1] > self.max_length:
            raise LengthLimitError(
                f"input_ids size ({array.shape[1]}) + current sequence length ({length}) "
                f"exceeds max length ({self.max_length})"
            )
        if array.shape[1] == 0:
            return  # as the reference: no ids, nothing added
        self._loop.append(array)
        self._new_generation()
        self._run_prompt(length)

    def set_runtime_option(self, key: str, value: str) -> None:
        """A run option for this generator's runs (the reference's ``SetRuntimeOption``):
        ``terminate_session`` ``"1"`` makes every call that runs the model or reads its state
        raise until ``"0"``; ``enable_profiling`` turns on onnxruntime's run-level profiling
        (onnxruntime >= 1.25; ``"0"`` off, ``"1"`` the prefix ``onnxruntime_run_profile``, any
        other value the prefix: each run writes ``<prefix>_<time>.json``); any other key is an
        onnxruntime run config entry (e.g. ``memory.enable_memory_arena_shrinkage``) for this
        generator's runs, and a draft model's."""
        key, value = str(key), str(value)
        self._settle()
        if key == "terminate_session":
            if value not in ("0", "1"):
                raise GenerationError(f"terminate_session key value unexpected: {value}")
            self._terminated = value == "1"
            return
        self._driver.set_run_option(key, value)
        draft = getattr(self._spec, "draft_driver", None)
        if draft is not None:  # as the reference: a draft model's runs take them too
            draft.set_run_option(key, value)
        if self._spec is not None:
            self._spec.forward("set_runtime_option", key, value)

    def snapshot_state(self) -> None:
        """The reference's snapshot of recurrent state (conv / linear-attention layers) for a
        later `rewind_to`; the decoder-only models genai runs keep only a KV cache, which
        `rewind_to` truncates, so there is nothing to capture (the reference does nothing
        either). See `snapshot` for genai's prefix snapshots."""
        self._check_terminated()

    def set_hidden_states(self, hidden_states: np.ndarray) -> None:
        """Stage a ``hidden_states`` input for the next runs (a model whose config names
        ``model.decoder.inputs.hidden_states``, e.g. a multi-token-prediction head); a copy is
        bound. Without that input it does nothing, as the reference."""
        self._check_terminated()
        self._settle(replay=True)
        self._driver.set_hidden_states(hidden_states)

    def get_speculative_stats(self) -> dict[str, Any]:
        """Speculative decoding's counters, as the reference reports them (rounds, proposed /
        accepted tokens, acceptance_rate, target runs, ...; every counter 0 without
        speculative decoding); see `genai.generation.speculative.stats`."""
        return plain_stats() if self._spec is None else self._spec.stats()

    @_one_thread_at_a_time
    def rewind_to(self, length: SupportsIndex) -> None:
        """Drop the tokens after the first ``length``, as the reference does. The token that
        sat at index ``length`` is replayed: the next `generate_next_token`,
        `generate_until_done` or `get_logits` first runs it, on the KV cache kept, and it joins
        the sequence as a generated token. `append_tokens` or `set_logits` before that replaces
        it. Rewinding to the current length changes nothing. `truncate` continues from
        ``length`` instead."""
        length = self._check_rewind(length)
        if length == self.token_count():
            return
        if not length:
            self._cut(0)
            return
        self._settle()
        boundary = self._sequences[:, length].astype(np.int32)
        # the boundary token pending on the KV of the first `length`: as just generated;
        # stop matching, guidance and max_new_tokens see the visible tokens
        self._cut(length + 1, visible=length)
        self._boundary = boundary

    @_one_thread_at_a_time
    def truncate(self, length: SupportsIndex) -> None:
        """Keep the first ``length`` tokens and continue from there (beyond the reference):
        the next step recomputes token ``length - 1`` and chooses the token at index
        ``length``, as if generation had stopped at ``length`` tokens."""
        length = self._check_rewind(length)
        self._cut(length)

    def _check_rewind(self, length: SupportsIndex) -> int:
        """``length`` as an int, checked as a length to rewind or truncate to."""
        length = _as_index(length, "length")
        current = self.token_count()
        if not 0 <= length <= current:
            raise InvalidArgumentError(
                f"cannot rewind to {length}: the sequence has {current} tokens"
            )
        if length and self.num_beams > 1:
            raise UnsupportedFeatureError("rewind_to(n > 0) needs num_beams 1")
        return length

    def _cut(self, length: int, keep_last: bool = False, visible: int | None = None) -> None:
        """Keep the first ``length`` tokens of the loop: the KV of all but the last (of all
        with ``keep_last``, when tokens are appended or logits set next). ``visible``: the
        tokens the caller sees (default ``length``), those the Python stage is brought to."""
        visible = length if visible is None else visible
        self._boundary = None
        self._pending_ff = []  # the grammar is brought to the kept tokens below
        self._settle(replay=True)
        if self._spec is not None:
            self._spec.settle()  # tokens of a round not emitted yet are dropped
            if length == 0:
                self._spec.reset()
            else:
                self._spec.proposer.invalidate()
        self._driver.rewind(length, keep_last)
        if self._beams is not None and length == 0:
            self._beams.reset()  # (rewinds to n > 0 are refused with beam search)
        if self._spec is not None:
            self._spec.forward("truncate", length)
        if self._python_stage:
            self._replay(visible)
        else:
            self._gen_start = min(self._gen_start, visible)
        self._set_stop_length()

    def _drop_boundary(self) -> None:
        """Before appended tokens or set logits take the rewound token's place: keep the
        KV of the visible tokens and nothing pending."""
        if self._boundary is not None:
            self._cut(self._loop.length - 1, keep_last=True)

    def _replay_boundary(self) -> bool:
        """After `rewind_to`: the rewound token joins the visible sequence (its run is the
        next); True when it finished every row (a stop string, guidance)."""
        if self._boundary is None:
            return False
        self._boundary = None
        if not self._python_stage:
            return False
        self._replay(self._loop.length)
        return self._all_finished

    def _set_stop_length(self) -> None:
        self._stop_length = self.max_length
        if self.search.max_new_tokens:
            self._stop_length = min(self.max_length, self._gen_start + self.search.max_new_tokens)

    @_one_thread_at_a_time
    def snapshot(self) -> KVSnapshot:
        """The state after the tokens so far (tokens and their KV cache), to start other
        generators from (`restore`) without recomputing them: e.g. after a system prompt.
        Batch 1, beam 1."""
        self._settle()
        if self._spec is not None:
            self._spec.settle()
        if self.rows != 1:
            raise UnsupportedFeatureError("snapshot needs batch_size 1 and num_beams 1")
        driver = self._driver
        require(driver, "snapshot")
        length = self.token_count()
        if length < 1:
            raise GenerationError("nothing to snapshot: append tokens first")
        return KVSnapshot(
            io=self._io,
            layout=driver.kv_layout,
            tokens=self._sequences[:, :length].copy(),
            kv=driver.snapshot_kv(length),
        )

    @_one_thread_at_a_time
    def restore(self, snapshot: KVSnapshot) -> None:
        """Continue from ``snapshot`` (made by `snapshot` on a generator of the same model and
        KV layout): the same tokens follow as after appending those tokens here."""
        if self._loop.length:
            raise GenerationError("restore needs a fresh generator (no tokens appended)")
        if self.rows != 1:
            raise UnsupportedFeatureError("restore needs batch_size 1 and num_beams 1")
        driver = self._driver
        require(driver, "snapshot")
        if snapshot.io != self._io or snapshot.layout != driver.kv_layout:
            raise InvalidArgumentError("the snapshot comes from another model or KV layout")
        length = snapshot.tokens.shape[1]
        if length > self.max_length:
            raise LengthLimitError(
                f"the snapshot's {length} tokens exceed max_length {self.max_length}"
            )
        driver.restore(snapshot.tokens, snapshot.kv)
        self._new_generation()

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes allocated for the KV cache."""
        self._settle()
        return self._driver.kv_bytes

    @property
    def kv_cache_used_bytes(self) -> int:
        """Bytes of the KV cache the tokens so far occupy (every layer, K and V; a
        sliding-window layer only its resident positions)."""
        self._settle()
        return self._driver.kv_used_bytes
