"""`NativeDriver`: a single-graph decoder run by the native loop (`genai._core.decoder_loop`).

The loop feeds the pending tokens, runs the session and chooses the next tokens without the
GIL; the KV cache (`genai.kv.kv_cache`: shared, growing, device or session-kept) is bound to
the generator's own binding and handed over between runs by the loop.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from genai.errors import GenerationError, InvalidArgumentError, TensorNotFoundError
from genai.generation.drivers.base import LoopSettings, new_loop
from genai.generation.drivers.common import SessionInputs, bind_outputs
from genai.kv.kv_cache import make_kv_cache
from genai.runtime.model import PREFILL_CHUNK_TYPES
from genai.runtime.trimmed_logits import VERIFY_TOKENS
from genai.runtime.verify_rows import verify_rows

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.generation.search import SearchOptions
    from genai.runtime.model import Model

__all__ = ["NEW_TOKEN_LOGITS", "VERIFY_TOKENS", "NativeDriver", "verify_output"]

#: The output genai's builder writes beside last-token ``logits``: the logits of every new token
#: of a run on top of a past of at most `VERIFY_TOKENS` tokens.
NEW_TOKEN_LOGITS = "new_token_logits"


def verify_output(session: NativeSession, logits: str) -> tuple[str, int] | None:
    """The output of ``session`` with a logits row per token of a run, and the most tokens a
    run gets rows for: ``logits`` itself when it holds every position, the builder's
    `NEW_TOKEN_LOGITS`; None when the graph returns the last position's only."""
    if NEW_TOKEN_LOGITS in session.output_dtypes:
        return NEW_TOKEN_LOGITS, VERIFY_TOKENS
    if session.trimmed is not None:  # every row up to `above` tokens (genai.runtime.trimmed_logits)
        return logits, session.trimmed.above
    shape = session.output_shapes.get(logits) or []
    if len(shape) == 3 and shape[1] == 1:
        return None
    return logits, 1 << 30


class NativeDriver(SessionInputs):
    """One graph, run by the native loop over ``session`` (a binding of the model's session
    for this generator); see `genai.generation.drivers.base.Driver`."""

    #: `steps` runs many steps in one GIL-free native call.
    fused_steps = True
    #: Everything the protocol names is supported.
    unsupported = MappingProxyType({})

    def __init__(
        self, model: Model, session: NativeSession, settings: LoopSettings, search: SearchOptions
    ) -> None:
        self.model, self.session, self.settings = model, session, settings
        io = self.io = model.io
        self.kv = kv = make_kv_cache(
            io,
            model.provider,
            session,
            settings.rows,
            settings.max_length,
            search.past_present_share_buffer,
            initial_capacity=search.kv_initial_capacity,
            growth_factor=search.kv_growth_factor,
        )
        self.loop = loop = new_loop(
            io,
            session,
            settings,
            kv_pairs=kv.handover,
            grow_kv=kv.ensure,
            kv_capacity=kv.capacity,
        )
        #: Outputs beyond logits and KV produced at every run (see `bind_outputs`).
        self.extra_outputs = bind_outputs(
            model, session, loop, settings.rows, shared_kv=not kv.handover
        )
        #: the reference's ``search.chunk_size``: a longer first batch-1 prompt runs in chunks
        self.chunk_size = search.chunk_size if model.type in PREFILL_CHUNK_TYPES else 0
        #: `verify_output` of the session (read once: speculative steps ask at every step)
        self._verify_found = verify_output(session, io.logits)
        self._init_inputs()

    # --- runs -----------------------------------------------------------------------------------
    def prepare_prompt(self, tokens: np.ndarray, length: int) -> np.ndarray:
        """The tokens as given."""
        return tokens

    def run(self, prompt: bool = False) -> None:
        """The loop runs the pending tokens (GIL released); the first batch-1 prompt longer
        than ``chunk_size`` (> 0) in runs of ``chunk_size`` tokens, as the reference: each run's
        attention covers its own tokens and the ones before them only, so a long prompt
        computes less of attention's square (on ORT's CPU kernels the logits and KV come out
        bit-identical to one run's)."""
        self.loop.run(prompt, self.chunk_size)

    def step(self) -> None:
        """One native step: run if the logits are stale, choose, commit."""
        self.loop.step()

    def steps(self, count: int) -> int:
        """Up to ``count`` steps in one GIL-free native call."""
        return self.loop.steps(count)

    def rewind(self, length: int, keep_last: bool = False) -> None:
        """Keep the first ``length`` tokens and the KV of all but the last of them (of all of
        them with ``keep_last``, for a caller that appends tokens next)."""
        self.loop.rewind(length, keep_last)
        self.kv.truncate(self.loop.computed)

    def reorder(self, order: np.ndarray) -> None:
        """Beam search: the KV rows follow ``order``."""
        self.kv.reorder(order)

    # --- speculative decoding -------------------------------------------------------------------
    @property
    def verify_tokens(self) -> int:
        """The most tokens `verify` runs at once (0: it cannot, the model returns the last
        position's logits only)."""
        found = self._verify_found
        return found[1] if found else 0

    def run_as_steps(self) -> None:
        """`run` the pending tokens (not a prompt) with each row's numbers those of the
        one-token step it stands for, where `verify` gets them: a draft model's catch-up, so
        its next proposal is the one its plain decoding would make."""
        with verify_rows(self.session):
            self.loop.run(False)

    def prepare_verify(self) -> None:
        """Make what a first verify run needs once (`verify_rows`' per-process probes of the
        graph's linears, a second session with genai's step-rows op), so that the timed runs
        of the speculative statistics and adaptive K do not count it."""
        verify_rows(self.session)  # made, not entered: the probes and the build run now

    def verify(self, tokens: np.ndarray) -> np.ndarray:
        """Append ``tokens`` (int32 [rows, n]) after the sequences and run them with the
        pending tokens in one run; returns the logits of every token run, float32
        [rows, count, vocab] (count: pending + n). The tokens stay in the sequences and the
        KV cache; `rewind` keeps what a caller accepts."""
        loop = self.loop
        found = self._verify_found
        if found is None:
            raise GenerationError("the model returns the last position's logits only")
        name, most = found
        count = loop.length - loop.computed + tokens.shape[1]
        if count > most:
            raise InvalidArgumentError(f"verify runs at most {most} tokens at once, not {count}")
        for column in np.asarray(tokens, np.int32).T:
            loop.push_tokens(column, False)
        with verify_rows(self.session):  # where it gives one-token steps' numbers
            loop.run(False)
        logits = self.session.get_output(name)
        if logits.ndim != 3 or logits.shape[1] != count:
            raise GenerationError(
                f"the model returned logits of shape {list(logits.shape)} for a run of {count} "
                "tokens: verifying proposed tokens needs one row per token"
            )
        return np.asarray(logits, np.float32)

    def verify_sequentially(self, tokens: np.ndarray) -> np.ndarray:
        """`verify` for a graph that returns the last position's logits only (the reference's
        fallback for a draft model's target): the pending tokens must have run; each token
        of ``tokens`` (int32 [1, n]) then runs alone. Returns the n rows after them, float32
        [1, n, vocab]."""
        loop = self.loop
        if loop.length != loop.computed:
            raise GenerationError("verifying one token at a time needs the pending tokens run")
        rows = []
        for token in np.asarray(tokens, np.int32)[0]:
            loop.push_tokens(np.array([token], np.int32), False)
            loop.run(False)
            rows.append(np.array(loop.array("logits_rows")[0], np.float32))
        return np.stack(rows)[None]

    # --- snapshots ------------------------------------------------------------------------------
    @property
    def kv_layout(self) -> str:
        """The KV cache class's name."""
        return type(self.kv).__name__

    def snapshot_kv(self, length: int) -> list[np.ndarray]:
        """Copies of the KV of the first ``length - 1`` tokens."""
        return self.kv.export(length - 1)

    def restore(self, tokens: np.ndarray, kv: list[np.ndarray]) -> None:
        """Load ``kv`` and continue after ``tokens`` (the last one runs next)."""
        self.kv.load(kv, tokens.shape[1])
        self.loop.kv_capacity = self.kv.capacity
        self.loop.restore(tokens)

    # --- reading --------------------------------------------------------------------------------
    def read_output(self, name: str) -> np.ndarray:
        """The logits, an extra output (e.g. hidden_states) or a present."""
        loop = self.loop
        if not loop.ran_once:
            raise GenerationError("the model has not run yet")
        if name == self.io.logits:
            if loop.last_run_count == 1:
                return loop.array("step_logits").copy()
            logits = self.session.get_output(name)
            return self.model.every_logits_row(self.session, logits, loop.last_run_count)
        if name in self.extra_outputs:
            return self.session.get_output(name)
        value = self.kv.read(name)
        if value is None:
            if name in self.model.extra_outputs:
                raise GenerationError(
                    f"output {name!r} is not produced while the generator replays a captured "
                    "graph (graph capture binds outputs at fixed addresses)"
                )
            raise TensorNotFoundError(f"output {name!r} was not found: not an output of the model")
        return value

    def read_input(self, name: str) -> np.ndarray:
        """Ids, mask, positions, a past, or an input set with `set_model_input` (or preset)."""
        io = self.io
        if name in self.model_inputs or name in self.model.preset_inputs:
            return self.session.input_value(name)
        for which, graph_name in (
            ("input_ids", io.input_ids),
            ("attention_mask", io.attention_mask),
            ("position_ids", io.position_ids),
        ):
            if graph_name is not None and name == graph_name:
                if not self.loop.ran_once:
                    raise GenerationError("the model has not run yet")
                return self.loop.input_view(which).copy()
        value = self.kv.read(name)
        if value is None:
            raise TensorNotFoundError(f"input {name!r} was not found: not an input of the model")
        return value

    # --- memory ---------------------------------------------------------------------------------
    @property
    def kv_bytes(self) -> int:
        """Bytes allocated for the KV cache."""
        return self.kv.nbytes

    @property
    def kv_used_bytes(self) -> int:
        """Bytes the computed tokens occupy."""
        return self.kv.used_bytes(self.loop.computed)
