"""`Generator`: onnxruntime-genai's generation API over the native decode loop.

The Python side validates input and answers queries; every model run and the per-step
bookkeeping (input ids, attention mask and positions written into bound buffers, the run,
logits gathering, the greedy choice, pad-after-EOS) happen in `genai._core.decoder_loop`
without the GIL. State lives there:

* ``sequences`` [batch, max_length] and ``length``: every token so far (prompt included);
* ``computed``: how many of them the KV cache holds; a run feeds ``sequences[:, computed:length]``;
* the logits rows [batch, vocab] the next token is chosen from, and whether they are current.

Guidance (`GeneratorParams.set_guidance`) and stop strings (search option ``stop``) add a
Python stage around that step: make the logits current, apply each row's token mask
(`TokenConstraint`), let the loop choose and commit, then feed the chosen tokens
to the constraints and the stop-string matchers; a row that hits a stop string is flagged done
(padded from then on, as after EOS). Without them the step stays one native call.

QNN-style windowed models (``sliding_window.slide_key_value_cache``) run outside the native loop:
a `WindowedRunner` feeds the pending tokens (prompts a window at a time)
and writes the logits rows; the loop still chooses, commits and keeps the sequences. Pipeline
models (``model.decoder.pipeline``, several graphs) run the same way, through a
`genai.generation.pipeline.PipelineRunner`.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from genai._core import sampling
from genai._core.decoder_loop import DecoderLoop
from genai._core.sampling import Sampler
from genai.compat.unsupported import not_implemented
from genai.constraints.stop import StopStringMatcher
from genai.errors import GenerationError, SearchOptionError, TensorNotFoundError
from genai.generation.beam_search import BeamScorer
from genai.generation.pipeline import PipelineRunner
from genai.generation.windowed_runner import WindowedRunner
from genai.kv.kv_cache import make_kv_cache
from genai.kv.windowed_cache import sliding_window_spec

if TYPE_CHECKING:
    from genai.generation.generator_params import GeneratorParams
    from genai.runtime.adapters import Adapters
    from genai.runtime.model import DecoderIO, Model

__all__ = ["Generator", "KVSnapshot", "TensorNotFoundError"]


#: One `genai.Tokenizer` per model, built on first need (stop strings, guidance).
_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _tokenizer_of(model: Model) -> Any:
    found = _TOKENIZERS.get(model)
    if found is None:
        from genai.text.tokenizer import Tokenizer

        found = _TOKENIZERS[model] = Tokenizer(model)
    return found


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
        self.model = model
        self.search = copy.deepcopy(params.search)
        self.search.validate(model.config.context_length)
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
        pad_id = int(config.get("model.pad_token_id", 0))
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
            self._beams = BeamScorer(
                self.batch_size,
                self.num_beams,
                io.vocab_size,
                self._eos,
                pad_id,
                search.length_penalty,
                search.early_stopping,
            )
        elif search.needs_processing or params.logit_bias:
            self._sampler = Sampler(batch, io.vocab_size, seed=search.random_seed)
            self._sampler.configure(**search.sampler_options())
            if params.logit_bias:
                self._sampler.set_logit_bias(
                    None, list(params.logit_bias), list(params.logit_bias.values())
                )
        if model.pipeline is not None:
            self._init_pipeline(model, params, pad_id)
            return
        self._pipeline: PipelineRunner | None = None
        # Each generator binds its own buffers: it gets its own binding on the shared session.
        self._session = session = model.session.new_binding()
        # Inputs beyond ids/mask/positions/KV that every run needs (e.g. LoRA weights, bound to
        # their empty base values until an adapter is activated).
        model.bind_extra_inputs(session)
        #: Names of the adapters activated on this generator (see `set_active_adapter`).
        self.active_adapters: list[str] = []
        # A QNN-style windowed model (sliding_window.slide_*) is fed by a WindowedRunner: a
        # static cache slid after each run, prompts fed a window at a time.
        window = sliding_window_spec(config, io, session)
        self._windowed: WindowedRunner | None = None
        self._kv: Any = None
        if window is not None:
            window.check_search(batch_size=self.batch_size, num_beams=self.num_beams)
        else:
            self._kv = make_kv_cache(
                io,
                model.provider,
                session,
                batch,
                max_length,
                self.search.past_present_share_buffer,
                initial_capacity=search.kv_initial_capacity,
                growth_factor=search.kv_growth_factor,
            )
        kv = self._kv
        self._loop = self._new_loop(
            session,
            pad_id,
            kv_pairs=kv.handover if kv is not None else [],
            grow_kv=kv.ensure if kv is not None else None,
            kv_capacity=kv.capacity if kv is not None else -1,
        )
        # Graph capture (a provider whose capture is on): single-token steps bind tensors at
        # fixed addresses and replay a graph captured for this generator. One that cannot
        # (more rows, growing or host KV, a windowed runner) runs uncaptured and says so on
        # every run (gpu_graph_id=-1), else onnxruntime would capture its first run.
        graph = model.provider.graph_capture_id(
            model.provider_options,
            session,
            rows=batch,
            shared_kv=self._kv is not None and not self._kv.handover,
        )
        if graph:
            self._loop.use_graph_capture(graph)
        # Outputs beyond logits and KV (e.g. hidden_states): ORT allocates them at every run so
        # that get_output serves them (only models that have them pay for it). A captured
        # graph needs every output at a fixed address: they are not produced then.
        self._extra_outputs: tuple[str, ...] = () if graph else model.extra_outputs
        for name in self._extra_outputs:
            session.bind_output_to_device(name)
        self._sequences = self._loop.array("sequences")
        self._logits_rows = self._loop.array("logits_rows")
        if window is not None:
            self._windowed = WindowedRunner(io, window, session, batch, self._logits_rows)
        self._init_python_stage(model, params)

    def _init_pipeline(self, model: Model, params: GeneratorParams, pad_id: int) -> None:
        """A pipeline model (`pipeline`): its runner feeds the stages and writes the
        logits rows; the loop (without a session) chooses, commits and keeps the sequences."""
        search = self.search
        self._session = None
        self._kv = None
        self._windowed = None
        self._extra_outputs = ()
        self.active_adapters = []
        self._loop = self._new_loop(None, pad_id, kv_pairs=[])
        self._sequences = self._loop.array("sequences")
        self._logits_rows = self._loop.array("logits_rows")
        self._pipeline = PipelineRunner(
            model,
            self.rows,
            self.max_length,
            search.past_present_share_buffer,
            pad_id,
            self._logits_rows,
        )
        self._init_python_stage(model, params)

    def _new_loop(self, session: Any, pad_id: int, **kv: Any) -> DecoderLoop:
        """The native loop over ``session`` (None: the model runs outside the loop) for this
        generator's rows, with the KV handover ``kv`` (``kv_pairs``, ``grow_kv``,
        ``kv_capacity``)."""
        io, search = self._io, self.search
        return DecoderLoop(
            session,
            input_ids=io.input_ids,
            attention_mask=io.attention_mask,
            position_ids=io.position_ids,
            logits=io.logits,
            batch=self.rows,
            vocab=io.vocab_size,
            max_length=self.max_length,
            pad_id=pad_id,
            eos_ids=self._eos,
            id_dtype=io.id_dtype,
            mask_dtype=io.mask_dtype,
            logits_dtype=io.logits_dtype,
            sampler=self._sampler,
            logprobs=search.top_logprobs if (search.logprobs or search.top_logprobs) else -1,
            **kv,
        )

    def _init_python_stage(self, model: Model, params: GeneratorParams) -> None:
        """State beyond the loop: finish tracking, guidance and stop strings."""
        io, search, batch = self._io, self.search, self.rows
        self._done = self._loop.array("done")
        #: where the tokens counted by max_new_tokens start (the end of the last append)
        self._gen_start = 0
        #: the sequence length at which the rows stop: max_length, or sooner by max_new_tokens
        self._stop_length = self.max_length
        # --- the Python stage: guidance and stop strings (None when unused) ---
        self._constraints: list[Any] | None = None
        self._ff_tokens = False
        if params.guidance is not None:
            from genai.constraints.guidance import TokenConstraint

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
        self._python_stage = self._constraints is not None or self._stops is not None
        #: per row: "stop" once a stop string matched (other reasons are read from the loop)
        self._finish: list[str | None] = [None] * batch
        self._all_finished = False
        #: set_runtime_option("terminate_session", "1"): every call that would run the model
        #: or read its state raises until "0".
        self._terminated = False
        #: Inputs given with set_model_input (name -> this generator's copy).
        self._model_inputs: dict[str, np.ndarray] = {}

    def _check_terminated(self) -> None:
        if self._terminated:
            raise GenerationError(
                "the session was terminated (set_runtime_option('terminate_session', '1')); "
                "set it to '0' to continue"
            )

    # --- feeding tokens -------------------------------------------------------------------------
    def append_tokens(self, tokens: np.ndarray | list[int] | list[list[int]]) -> None:
        """Append prompt tokens (1-D for batch 1, or [batch, length]) and run the model on them
        now. Later calls continue the sequence (batch 1)."""
        self._check_terminated()
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
        if self.num_beams > 1:
            if self._loop.length:
                raise NotImplementedError("append_tokens after generating needs num_beams 1")
            array = np.repeat(array, self.num_beams, axis=0)  # every beam starts from the prompt
        count = array.shape[1]
        if count == 0:
            raise ValueError("append_tokens needs at least one token")
        if array.min() < 0 or array.max() >= self.vocab_size:
            bad = array[(array < 0) | (array >= self.vocab_size)].flat[0]
            raise ValueError(
                f"token id {int(bad)} is outside the vocabulary [0, {self.vocab_size})"
            )
        length = self._loop.length
        if self._windowed is not None and length == 0:
            array = self._windowed.pad_prompt(array)  # whole windows, pads kept (reference)
            if array.shape[1] > self.max_length:
                raise ValueError(
                    f"{count} tokens padded to whole windows of {self._windowed.spec.window} "
                    f"({array.shape[1]}) exceed max_length {self.max_length}"
                )
            count = array.shape[1]
        if length + count > self.max_length:
            raise ValueError(
                f"appending {count} tokens to {length} exceeds max_length {self.max_length}"
            )
        if length and self.num_beams > 1:
            raise NotImplementedError(
                "continuous decoding (append_tokens after the first call) needs num_beams 1"
            )
        self._loop.append(array)
        self._new_generation()
        if self._windowed is not None or self._pipeline is not None:
            self._run_pending(prompt=length == 0)
        else:
            self._loop.run(length == 0)

    def _run_pending(self, prompt: bool = False) -> None:
        """Run the model on the pending tokens so the logits are current (``prompt``: they
        start the sequences)."""
        loop = self._loop
        if self._pipeline is not None:
            pipeline = self._pipeline
            pipeline.feed(self._sequences[:, pipeline.computed : loop.length], prompt)
        elif self._windowed is not None:
            runner = self._windowed
            runner.feed(self._sequences[:, runner.computed : loop.length])
        else:
            loop.run(False)
            return
        if self._sampler is not None:
            self._sampler.forget_logits()  # rows rewritten outside the loop
        loop.set_logits_ready()

    def set_active_adapter(self, adapters: Adapters, name: str) -> None:
        """Activate the LoRA adapter ``name`` loaded in ``adapters`` for this generator's
        runs; several adapters may be active at once (onnxruntime-genai's API)."""
        adapters._activate(self, name)

    # --- steps ----------------------------------------------------------------------------------
    def generate_next_token(self) -> None:
        """Run the model on pending tokens if needed, choose the next token per row and append
        it."""
        self._check_terminated()
        loop = self._loop
        if not loop.logits_ready and loop.length == 0:
            raise GenerationError("call append_tokens before generate_next_token")
        if loop.length >= self._stop_length:
            if loop.length >= self.max_length:
                raise GenerationError(f"the sequence reached max_length {self.max_length}")
            raise GenerationError(
                f"the rows generated max_new_tokens ({self.search.max_new_tokens}) tokens"
            )
        if (self._windowed is not None or self._pipeline is not None) and not loop.logits_ready:
            self._run_pending()
        if self._python_stage:
            self._guided_step()
            return
        if self._beams is None:
            loop.step()
            return
        if not loop.logits_ready:
            self._run_pending()
        self._beam_step()

    # --- the Python stage (guidance, stop strings) ----------------------------------------------
    def _new_generation(self) -> None:
        """After appending a prompt: max_new_tokens counts from here; constraints, stop
        matching and finish reasons start over."""
        self._gen_start = self._loop.length
        self._stop_length = self.max_length
        if self.search.max_new_tokens:
            self._stop_length = min(self.max_length, self._gen_start + self.search.max_new_tokens)
        self._finish = [None] * self.rows
        self._all_finished = False
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
        constraints = self._constraints
        if constraints is not None:
            if not loop.logits_ready:
                self._run_pending()  # the next masks are computed meanwhile, on llguidance's side
            logits = self._logits_rows
            for r in active:
                constraints[r].fill_mask(logits[r])  # stage 1 of the chain
            if self._sampler is not None:
                self._sampler.forget_logits()  # set_logits' block maxima predate the mask
        loop.step()
        tokens = loop.array("next_tokens")
        forced: list[int] = []
        for r in active:
            token = int(tokens[r])
            if constraints is not None:
                forced = constraints[r].advance(token)
            if self._stops is not None:
                self._match_stop(r, token)
        # fast-forward (batch 1): append the forced tokens; the next step runs them at once
        for token in forced:
            if done[0] or loop.all_done or loop.length >= self._stop_length:
                break
            loop.push_tokens(np.array([token], dtype=np.int32), False)
            if self._stops is not None:
                self._match_stop(0, token)
        self._all_finished = all(done.tolist())

    def _match_stop(self, row: int, token: int) -> None:
        assert self._stops is not None and self._streams is not None
        matcher = self._stops[row]
        _, stopped = matcher.push(self._streams[row].decode(token))
        if stopped and not self._done[row]:
            self._finish[row] = "stop"
            self._done[row] = 1  # padded from now on, as after EOS

    def _replay(self, length: int) -> None:
        """Bring constraints and stop matchers to the sequence's first ``length`` tokens (after
        a rewind): start over and feed the generated part again."""
        self._gen_start = min(self._gen_start, length)
        generated = self._sequences[:, self._gen_start : length]
        self._finish = [None] * self.rows
        self._all_finished = False
        for r in range(self.rows):
            if self._constraints is not None:
                constraint = self._constraints[r]
                constraint.reset()
                for token in generated[r]:
                    if constraint.is_finished:
                        break
                    constraint.advance(int(token))
            if self._stops is not None and self._streams is not None:
                self._stops[r].reset()
                self._streams[r].reset()
                for token in generated[r]:
                    self._match_stop(r, int(token))

    def _beam_step(self) -> None:
        loop, beams, search = self._loop, self._beams, self.search
        assert beams is not None
        length = loop.length
        logits = self._logits_rows
        if search.min_length > 0:
            sampling.apply_min_length(logits, length, search.min_length, self._eos)
        if search.repetition_penalty != 1.0:
            sampling.apply_repetition_penalty(
                logits, self._sequences, length, search.repetition_penalty
            )
        if search.no_repeat_ngram_size > 0:
            sampling.apply_no_repeat_ngram(
                logits, self._sequences, length, search.no_repeat_ngram_size
            )
        beams.step(logits, self._sequences, length)
        order = beams.next_indices
        if (order != np.arange(self.rows)).any():
            self._sequences[:, :length] = self._sequences[order, :length]
            (self._pipeline or self._kv).reorder(order)
        loop.push_tokens(beams.next_tokens, beams.all_done)

    def generate_until_done(self, max_new_tokens: int | None = None) -> int:
        """Run greedy steps until every row is done, max_length, or ``max_new_tokens`` steps,
        in one GIL-free block; returns the number of steps made. Same tokens as calling
        `generate_next_token` in a loop, without returning to Python between tokens."""
        loop = self._loop
        if not loop.logits_ready and loop.length == 0:
            raise GenerationError("call append_tokens before generate_until_done")
        limit = self.max_length if max_new_tokens is None else int(max_new_tokens)
        if limit < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {limit}")
        limit = min(limit, max(self._stop_length - loop.length, 0))
        external = self._windowed is not None or self._pipeline is not None
        if self._beams is None and not self._python_stage and not external:
            return loop.steps(limit)
        made = 0
        while made < limit and not self.is_done():
            self.generate_next_token()
            made += 1
        return made

    def get_next_logprobs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Log-probabilities of the last step (search options ``logprobs`` / ``top_logprobs``;
        beyond the reference): the chosen tokens' [batch], and the ``top_logprobs`` most likely
        ids [batch, n] with theirs. Log-softmax of the processed logits at temperature 1."""
        if not (self.search.logprobs or self.search.top_logprobs):
            raise GenerationError("set the search option logprobs=True (or top_logprobs=N)")
        if not self._loop.generated:
            raise GenerationError("no tokens generated yet")
        n = self.search.top_logprobs
        loop = self._loop
        return (
            loop.array("logprobs").copy(),
            loop.array("top_ids")[:, :n].copy(),
            loop.array("top_logprobs")[:, :n].copy(),
        )

    def set_row_search_options(self, row: int, **options: float | int | bool) -> None:
        """Per-row sampling options in a batch (beyond the reference): do_sample,
        temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty, no_repeat_ngram_size, min_length, and random_seed (that row's own
        stream)."""
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} outside [0, {self.rows})")
        if self._sampler is None:
            raise GenerationError(
                "per-row options need the sampling chain: create the generator with a "
                "processing search option (e.g. do_sample=True)"
            )
        seed = options.pop("random_seed", None)
        try:
            self._sampler.configure(row, **options)
        except (TypeError, ValueError) as exc:
            raise SearchOptionError(str(exc)) from exc
        if seed is not None:
            self._sampler.seed(int(seed), row=row, stream=0)  # as a batch-1 run with that seed

    def is_done(self) -> bool:
        """True when every row finished (EOS, a stop string; beam search: every batch entry has
        its hypotheses) or the sequence reached max_length or max_new_tokens."""
        self._check_terminated()
        loop = self._loop
        return loop.all_done or loop.length >= self._stop_length or self._all_finished

    def finish_reason(self, row: int = 0) -> str | None:
        """Why row ``row`` finished (beyond the reference): ``"eos"`` (an EOS token, including
        the one guidance forces once its grammar is complete), ``"stop"`` (a stop string,
        search option ``stop``), ``"length"`` (max_length or max_new_tokens), or None while it
        is still generating. With beam search ``row`` is a batch entry."""
        if not 0 <= row < self.batch_size:
            raise IndexError(f"row {row} outside [0, {self.batch_size})")
        loop = self._loop
        if self._beams is not None:
            if loop.all_done:
                return "eos"
            return "length" if loop.length >= self._stop_length else None
        reason = self._finish[row]
        if reason is not None:
            return reason
        if self._done[row]:
            return "eos"
        if loop.length >= self._stop_length:
            return "length"
        return None

    # --- reading state --------------------------------------------------------------------------
    def get_next_tokens(self) -> np.ndarray:
        """The tokens chosen by the last step, int32 [batch]."""
        if not self._loop.generated:
            raise GenerationError("no tokens generated yet")
        return self._loop.array("next_tokens").copy()

    def get_sequence(self, index: int) -> np.ndarray:
        """Row ``index``: prompt (padding included) + generated tokens, int32. With beam
        search, index ``b * num_return_sequences + r`` is batch entry b's r-th best
        hypothesis (this finalizes the search, as the reference)."""
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
        return self._sequences[index, : self._loop.length].copy()

    def token_count(self) -> int:
        """Tokens in each sequence so far (prompt included)."""
        return int(self._loop.length)

    def get_logits(self) -> np.ndarray:
        """A copy of the logits the next token is chosen from, float32 [batch, 1, vocab]
        (runs the model on a pending token first, as the reference)."""
        loop = self._loop
        if not loop.logits_ready:
            self._check_terminated()
            if loop.length == 0:
                raise GenerationError("no logits yet: call append_tokens first")
            self._run_pending()
        return self._logits_rows[:, None, :].copy()

    def set_logits(self, logits: np.ndarray) -> None:
        """Replace the logits the next token is chosen from ([batch, vocab] or
        [batch, 1, vocab], float32)."""
        if self._sampler is not None:
            # Copies in and records block maxima on the way (the top-k then skips that pass).
            self._sampler.load_logits(logits, self._logits_rows)
        else:
            self._logits_rows[:] = sampling.check_logits(logits, self.rows, self.vocab_size)
        self._loop.set_logits_ready()

    def _external_value(self, name: str, kind: str) -> np.ndarray:
        """A host copy of the last run's ``kind`` ("input" or "output") ``name`` from the
        runner that feeds a windowed or pipeline model outside the native loop."""
        runner = self._windowed or self._pipeline
        if not runner.last_run_count:
            raise GenerationError("the model has not run yet")
        value = runner.read_output(name) if kind == "output" else runner.read_input(name)
        if value is None:
            raise KeyError(f"{name!r} is not an {kind} of the model")
        return value

    def get_output(self, name: str) -> np.ndarray:
        """A host copy of the last run's output ``name``: ``"logits"``, ``"present.0.key"``,
        or any other output the graph declares (e.g. ``"hidden_states"``)."""
        self._check_terminated()
        loop = self._loop
        if self._windowed is not None or self._pipeline is not None:
            return self._external_value(name, "output")
        if not loop.ran_once:
            raise GenerationError("the model has not run yet")
        if name == self._io.logits:
            if loop.last_run_count == 1:
                return loop.array("step_logits").copy()
            return self._session.get_output(name)
        if name in self._extra_outputs:
            return self._session.get_output(name)
        value = self._kv.read(name)
        if value is None:
            if name in self.model.extra_outputs:
                raise GenerationError(
                    f"output {name!r} is not produced while the generator replays a captured "
                    "graph (graph capture binds outputs at fixed addresses)"
                )
            raise TensorNotFoundError(f"{name!r} is not an output of the model")
        return value

    def get_input(self, name: str) -> np.ndarray:
        """A host copy of the last run's input ``name`` (also the inputs bound with
        `set_model_input` and preset inputs such as ``num_logits_to_keep``)."""
        self._check_terminated()
        io = self._io
        if self._windowed is not None or self._pipeline is not None:
            return self._external_value(name, "input")
        if name in self._model_inputs or name in self.model.preset_inputs:
            return self._session.input_value(name)
        for which, graph_name in (
            ("input_ids", io.input_ids),
            ("attention_mask", io.attention_mask),
            ("position_ids", io.position_ids),
        ):
            if graph_name is not None and name == graph_name:
                if not self._loop.ran_once:
                    raise GenerationError("the model has not run yet")
                return self._loop.input_view(which).copy()
        value = self._kv.read(name)
        if value is None:
            raise TensorNotFoundError(f"{name!r} is not an input of the model")
        return value

    # --- model inputs and run options -----------------------------------------------------------
    def set_model_input(self, name: str, value: np.ndarray) -> None:
        """Feed graph input ``name`` with ``value`` (a copy is bound) in this generator's runs
        from the next one on: an input the model takes beyond ids, mask, positions and KV
        (e.g. an extra input of an exported graph). As the reference, a name the graph does not
        take is ignored (with a warning here); the dtype must be the graph's."""
        if self._session is None or self._windowed is not None:
            raise NotImplementedError(
                "set_model_input on a pipeline or windowed model (inputs fed by its runner)"
            )
        if name in self.model.fed_inputs:
            raise ValueError(
                f"{name!r} is fed by the generator itself (ids, mask, positions, KV); "
                "set_model_input takes the model's other inputs"
            )
        array = np.array(value, order="C", copy=True)
        # As the reference: only the graph's inputs (an overridable initializer is set by an
        # adapter, not here).
        if name not in self._session.input_dtypes:
            what = (
                f"{name!r} is an initializer of the model (an adapter sets it)"
                if name in self._session.initializer_dtypes
                else f"the model has no input {name!r}"
            )
            warnings.warn(f"set_model_input: {what}; ignored (as the reference)", stacklevel=2)
            return
        self._session.bind_input(name, array)  # TypeError names a dtype the graph refuses
        self._model_inputs[name] = array

    def set_inputs(self, named_tensors: Any) -> None:
        """The reference's input path for multimodal and speech models; a decoder-only model
        takes its tokens through `append_tokens` (the reference raises the same)."""
        raise GenerationError(
            f"Please use generator.append_tokens for {self.model.type}. set_inputs is not "
            "supported for this model type."
        )

    def set_runtime_option(self, key: str, value: str) -> None:
        """A run option for this generator's runs (the reference's ``SetRuntimeOption``):
        ``terminate_session`` ``"1"`` makes every call that runs the model or reads its state
        raise until ``"0"``; any other key is an onnxruntime run config entry (e.g.
        ``memory.enable_memory_arena_shrinkage``) for this generator's runs."""
        key, value = str(key), str(value)
        if key == "terminate_session":
            if value not in ("0", "1"):
                raise GenerationError(f"terminate_session key value unexpected: {value}")
            self._terminated = value == "1"
            return
        if self._session is None:
            raise NotImplementedError("run options on a pipeline model (one session per stage)")
        self._session.set_run_config_entry(key, value)

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
        name = (self.model.config.decoder.get("inputs") or {}).get("hidden_states")
        if not name or self._session is None or name not in self._session.input_dtypes:
            return
        array = np.array(hidden_states, order="C", copy=True)
        self._session.bind_input(name, array)
        self._model_inputs[name] = array

    def get_speculative_stats(self) -> dict[str, Any]:
        """Speculative decoding statistics: not available until speculative decoding lands."""
        raise not_implemented("Generator.get_speculative_stats", "speculative")

    def rewind_to(self, length: int) -> None:
        """Drop tokens after the first ``length``; the next step continues from there."""
        current = self._loop.length
        if not 0 <= length <= current:
            raise ValueError(f"cannot rewind to {length}: the sequence has {current} tokens")
        if length and self.num_beams > 1:
            raise NotImplementedError("rewind_to(n > 0) needs num_beams 1")
        if self._windowed is not None:
            if length:  # as the reference: its windowed cache and inputs cannot rewind
                raise NotImplementedError(
                    "a windowed model (sliding_window.slide_key_value_cache) rewinds only to 0: "
                    "its cache dropped the positions slid out"
                )
            self._windowed.reset()
        self._loop.rewind(length)
        if self._pipeline is not None:
            self._pipeline.rewind(length)
        if self._kv is not None:
            self._kv.truncate(self._loop.computed)
        if self._python_stage:
            self._replay(length)
        else:
            self._gen_start = min(self._gen_start, length)
        self._stop_length = self.max_length
        if self.search.max_new_tokens:
            self._stop_length = min(self.max_length, self._gen_start + self.search.max_new_tokens)

    def snapshot(self) -> KVSnapshot:
        """The state after the tokens so far (tokens and their KV cache), to start other
        generators from (`restore`) without recomputing them: e.g. after a system prompt.
        Batch 1, beam 1."""
        if self.rows != 1:
            raise NotImplementedError("snapshot needs batch_size 1 and num_beams 1")
        if self._windowed is not None:
            raise NotImplementedError("snapshots of windowed models (slide_key_value_cache)")
        if self._pipeline is not None:
            raise NotImplementedError("snapshots of pipeline models (model.decoder.pipeline)")
        length = self._loop.length
        if length < 1:
            raise GenerationError("nothing to snapshot: append tokens first")
        return KVSnapshot(
            io=self._io,
            layout=type(self._kv).__name__,
            tokens=self._sequences[:, :length].copy(),
            kv=self._kv.export(length - 1),
        )

    def restore(self, snapshot: KVSnapshot) -> None:
        """Continue from ``snapshot`` (made by `snapshot` on a generator of the same model and
        KV layout): the same tokens follow as after appending those tokens here."""
        if self._loop.length:
            raise GenerationError("restore needs a fresh generator (no tokens appended)")
        if self.rows != 1:
            raise NotImplementedError("restore needs batch_size 1 and num_beams 1")
        if self._windowed is not None:
            raise NotImplementedError("snapshots of windowed models (slide_key_value_cache)")
        if self._pipeline is not None:
            raise NotImplementedError("snapshots of pipeline models (model.decoder.pipeline)")
        if snapshot.io != self._io or snapshot.layout != type(self._kv).__name__:
            raise ValueError("the snapshot comes from another model or KV layout")
        length = snapshot.tokens.shape[1]
        if length > self.max_length:
            raise ValueError(f"the snapshot's {length} tokens exceed max_length {self.max_length}")
        self._kv.load(snapshot.kv, length)
        self._loop.kv_capacity = self._kv.capacity
        self._loop.restore(snapshot.tokens)
        self._new_generation()

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes allocated for the KV cache."""
        if self._windowed is not None:
            return self._windowed.cache.nbytes
        if self._pipeline is not None:
            return self._pipeline.nbytes
        return self._kv.nbytes

    @property
    def kv_cache_used_bytes(self) -> int:
        """Bytes of the KV cache the tokens so far occupy (every layer, K and V; a
        sliding-window layer only its resident positions)."""
        if self._windowed is not None:
            return self._windowed.cache.used_bytes(self._windowed.computed)
        if self._pipeline is not None:
            return self._pipeline.used_bytes()
        return self._kv.used_bytes(self._loop.computed)
