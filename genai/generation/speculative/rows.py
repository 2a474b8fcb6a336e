"""Speculative decoding at batch > 1: every row runs its own rounds.

A verify run feeds several new tokens on top of a past. onnxruntime's GroupQueryAttention (the
attention of every folder both builders write) takes that only at batch 1 ("batch_size must be
1 when sequence_length > 1 and past context is given"), so a batch cannot verify its rows'
proposals in one run: each row needs a run of its own. Keeping the rows in lockstep (every row
commits the fewest tokens any row accepted) would then cost accepted tokens and save nothing,
so the rows run apart instead:

* `RowSpeculation` gives each row a batch-1 `genai.Generator` of its own (the same model,
  search options, logits processors, bias, stop strings, guidance, adapters and speculative
  options; the row's sampling stream), fed the row's prompt without its padding. Each row
  proposes from its own tokens (prompt lookup over its own history, or its own draft model),
  verifies, accepts and queues exactly as at batch 1 (`SpeculativeDecoder`);
* each `generate_next_token` takes one token from every unfinished row's generator (a round's
  next queued token, or a new round) and appends the column to the batch's sequences, as a
  plain batched step does: finished rows get the pad token, a row's EOS is in its sequence
  unless it finishes the last row, a stop string flags its row done.

Every row's tokens are its own generator's, which are batch-1 plain decoding's (greedy: the
argmax at every position; sampling: draws from the row's own stream, row b's stream of the
seed as in a plain batched run). The batch's own model binding is not run: its prompt run and
KV cache are left to the row generators (`take_tokens` takes the prompt).

**Going back to batched steps.** On a CPU a decode run streams every weight once whatever the
batch, so one plain batched step costs about what one row's plain step costs, and less than a
verify run. Every `CHECK_EVERY` columns the rows' model runs over those columns are counted
(a verify run as `VERIFY_COST` plain steps): at `LEAVE_AT` or more per column, rounds cost more
than plain batched decoding would, and the batch goes back to it for the rest of the
generation (`_leave`; when sampling, once no row has tokens queued: `_may_leave`): each row's
KV cache is copied into the batch's own (no model run), the batch's loop continues from there
(its mask follows the batch's columns, the prompt padding masked), each row's sampling stream
carries over, stop strings and guidance replay the tokens, and plain batched steps follow. Not
with presence or frequency penalties (they count from the loop's prompt length, which its
restore moves).
"""

from __future__ import annotations

import copy
import logging
import weakref
from types import SimpleNamespace
from typing import Any

import numpy as np

from genai.compat.engine_enums import FinishReason
from genai.errors import GenerationError
from genai.generation.speculative.stats import SpeculativeCounters
from genai.runtime.verify_rows import rows_like_steps

log = logging.getLogger(__name__)

__all__ = ["CHECK_EVERY", "LEAVE_AT", "VERIFY_COST", "RowSpeculation"]

#: Columns between two checks of the rows' model runs per column (see the module docstring).
CHECK_EVERY = 8
#: The batch goes back to plain batched steps at this many of the rows' runs per column
#: (in plain-step units: what one plain batched step costs on a CPU at a small batch).
LEAVE_AT = 1.0
#: What a verify run costs in plain steps (4-5 tokens on SmolLM2 int4 on a CPU: 1.65-1.8).
VERIFY_COST = 1.8


#: Per model: whether its attention keeps each row's KV compact (GroupQueryAttention).
_COMPACT: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _compact_kv(model: Any) -> bool:
    """True when ``model``'s graph attends with GroupQueryAttention (each row's KV at its first
    positions, whatever the mask's columns), False for attention that masks the batch's
    columns (KV column by column); read once per model from the graph (no weights)."""
    found = _COMPACT.get(model)
    if found is None:
        if model.io.combined_kv:
            found = False
        else:
            import onnx  # lazy: only going back to batched steps reads the graph

            config = model.config
            filename = config.decoder.get("filename", "model.onnx")
            data = config.model_data(filename)
            if data is not None:
                graph = onnx.load_model_from_string(data).graph
            else:
                path = config.resolve_file(filename, "model.decoder.filename")
                graph = onnx.load_model(str(path), load_external_data=False).graph
            found = any(node.op_type == "GroupQueryAttention" for node in graph.node)
        _COMPACT[model] = found
    return found


class _NoProposer:
    """What `genai.Generator` asks of a decoder's proposer (the rows keep their own)."""

    def invalidate(self) -> None:
        """Nothing to do: each row's generator rewinds its own."""


class _PaddedIds:
    """A custom logits processor of row ``row`` called with the row's tokens as the batch holds
    them (its prompt padding included), as plain batched decoding calls it."""

    def __init__(self, owner: RowSpeculation, row: int, processor: Any) -> None:
        self.owner, self.row, self.processor = owner, row, processor

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> Any:
        owner, row = self.owner, self.row
        pads = int(owner.pads[row])
        if pads:
            prompt = int(owner.prompts[row])
            filler = np.full(pads, owner.pad_id, tokens.dtype)
            tokens = np.concatenate([tokens[:prompt], filler, tokens[prompt:]])
            tokens.flags.writeable = False
        return self.processor(tokens, logits)


class RowSpeculation:
    """Speculative decoding for a batch of ``generator.rows`` rows, one batch-1 generator per
    row (see the module docstring); ``params``: the batch's `genai.GeneratorParams`."""

    #: A generator's rounds never leave tokens queued here: every step emits a whole column.
    pending = False
    visible = 0

    def __init__(self, generator: Any, params: Any) -> None:
        self.g = weakref.proxy(generator)  # the generator owns this: no cycle keeps it
        self.pad_id = int(generator.model.config.get("model.pad_token_id", 0))
        self.proposer = _NoProposer()
        seed = int(params.search.random_seed)
        #: One batch-1 generator per row (its class: no import of the generator module here).
        self.rows: list[Any] = []
        #: per row: the trailing pad tokens of its first prompt (its generator has none), and
        #: that prompt's length without them
        self.pads = np.zeros(generator.rows, np.int64)
        self.prompts = np.zeros(generator.rows, np.int64)
        #: the first prompt's width (padding included)
        self.width = 0
        #: True once the batch went back to plain batched steps (`_leave`)
        self.batched = False
        #: the batch goes back to batched steps (`_may_leave` says when)
        self.leaving = False
        self._deadline = 0
        #: columns emitted by the rows since the prompt, plain batched steps since `_leave`
        self.columns = 0
        self.fallback = 0
        #: `_runs` at the last check
        self._checked_runs = 0.0
        #: whether the rows run apart: not where a row's own runs are known to give it other
        #: numbers than the batch's steps, i.e. on a provider running onnxruntime's CPU
        #: kernels, the graph's int4 linears give a row other bits alone than in a run of rows
        #: (AVX2; asked of onnxruntime once per process). Rows apart would make batch-1
        #: decoding's tokens there, not the batch's: the batch makes plain batched steps from
        #: the start (the faster choice there anyway).
        session = getattr(generator._driver, "session", None)
        ops = getattr(session, "linear_ops", None)
        host = bool(getattr(generator.model.provider, "host_ops", False))  # (CPU kernels)
        self.apart = not host or ops is None or rows_like_steps(ops)
        if not self.apart:
            self.batched = True
            log.info(
                "speculative decoding at batch %d makes plain batched steps: this CPU's int4 "
                "linears give a row other numbers alone than in a batch",
                generator.rows,
            )
        for row in range(generator.rows if self.apart else 0):
            row_params = copy.copy(params)
            row_params.search = copy.deepcopy(params.search)
            row_params.search.batch_size = 1
            # one token per step, as a batch's guided steps (no fast-forward at batch > 1)
            row_params.guidance_ff_tokens = False
            row_params.logits_processors = [
                _PaddedIds(self, row, p) for p in params.logits_processors
            ]
            sub = type(generator)(generator.model, row_params)
            chain = sub._chain
            if seed != -1 and chain.sampler is not None:
                chain.seed(seed, row=0, stream=row)  # row b's stream, as in a batched run
                if getattr(sub._spec, "_stream", None) is not None:
                    sub._spec.reseed(seed + row)  # the rows' speculative sampling differs too
            self.rows.append(sub)

    # --- what the generator asks ----------------------------------------------------------------
    def take_tokens(self, tokens: np.ndarray, length: int) -> bool:
        """The batch appended ``tokens`` [rows, n] after ``length`` tokens: each row's generator
        appends its row (the first prompt without its trailing pad tokens, as the batched prompt
        run masks them) and runs it. True: the batch's own binding has nothing to run."""
        g = self.g
        min_length = g.search.min_length
        if length == 0:
            self.batched, self.leaving = not self.apart, False
            self.columns, self.width, self._checked_runs = 0, tokens.shape[1], 0.0
            if self.batched:
                return False  # the batch's own loop runs it (plain batched decoding)
            for row, sub in enumerate(self.rows):
                values = tokens[row]
                kept = values.shape[0]
                while kept > 1 and values[kept - 1] == self.pad_id:
                    kept -= 1
                pads = values.shape[0] - kept
                self.pads[row], self.prompts[row] = pads, kept
                if sub.token_count():
                    sub.rewind_to(0)
                # the row's lengths count its padding in the batch: it reaches max_length and
                # min_length when the batch does
                sub.max_length = g.max_length - pads
                if min_length:
                    sub._chain.configure(0, min_length=max(min_length - pads, 0))
                sub.append_tokens(np.ascontiguousarray(values[None, :kept]))
            return True
        if self.batched:
            return False  # the batch's own loop runs them
        for row, sub in enumerate(self.rows):
            sub.append_tokens(np.ascontiguousarray(tokens[row : row + 1]))
        return True

    def appended(self) -> None:
        """Nothing to run: the batch's own loop ran the tokens (the rows' proposers catch up
        at their next round)."""

    def drain(self) -> bool:
        """Nothing is queued at the batch's level: every step is a `step`."""
        return False

    def step(self) -> None:
        """One token of every unfinished row (see the module docstring)."""
        g = self.g
        loop = g._loop
        if self.leaving and self._may_leave():
            self.leaving = False
            self._leave()
        if self.batched:
            self.fallback += 1
            if g._python_stage:
                g._guided_step()
            else:
                g._driver.step()
            return
        if g._all_finished or loop.all_done:
            raise GenerationError("every row has finished")
        done = g._done
        column = np.full(g.rows, self.pad_id, np.int32)
        finished_eos = np.array(done, bool)
        stopped: list[int] = []
        for row, sub in enumerate(self.rows):
            if done[row]:
                continue
            sub.generate_next_token()
            token = int(sub.get_next_tokens()[0])
            column[row] = token
            if not sub.is_done():
                continue
            reason = sub.finish_reason(0)
            if reason is FinishReason.EOS:
                finished_eos[row] = True
            elif reason is FinishReason.STOP_STRING:
                stopped.append(row)
        length = loop.length
        if finished_eos.all():
            # as a plain step that finishes the last row: the tokens are reported, not added
            loop.push_tokens(column, True)
            loop.rewind(length)  # the sequences keep `length` tokens (the KV is not the loop's)
            done[:] = 1
            g._all_finished = True
            return
        loop.push_tokens(column, False)
        done[finished_eos] = 1
        for row in stopped:
            g._finish[row] = FinishReason.STOP_STRING
            done[row] = 1
        g._all_finished = bool(done.all())
        self.columns += 1
        if not g._all_finished and self.columns % CHECK_EVERY == 0:
            runs = self._runs()
            if (runs - self._checked_runs) / CHECK_EVERY >= LEAVE_AT:
                self.leaving = True
                self._deadline = self.columns + CHECK_EVERY
            self._checked_runs = runs

    def _may_leave(self) -> bool:
        """Whether to go back to batched steps now: at once when greedy (the tokens the rows
        queued are discarded and recomputed: the same tokens); when sampling, once no row has
        tokens queued (their draws are then the batch's next ones, the same seed giving the
        same tokens), or after `CHECK_EVERY` columns of waiting (skipped draws leave every
        token distributed as before)."""
        if not any(sub._spec.queue for sub in self.rows) or self.columns >= self._deadline:
            return True
        chain = self.g._chain
        if chain.sampler is None:
            return True
        return not any(chain.options(row).get("do_sample") for row in range(self.g.rows))

    def _runs(self) -> float:
        """The rows' model runs so far, in plain-step units (a verify run `VERIFY_COST`)."""
        runs = 0.0
        for sub in self.rows:
            counters = sub._spec.counters
            runs += VERIFY_COST * counters.target_verify_forward_passes
            runs += counters.standard_fallback_steps + counters.target_reanchor_forward_passes
        return runs

    def _leave(self) -> bool:
        """Go back to plain batched steps (see the module docstring); False when the batch
        cannot (presence or frequency penalties count from the loop's prompt length, which
        the loop's restore moves)."""
        g = self.g
        loop, driver = g._loop, g._driver
        if g._chain.sampler is not None:
            for row in range(g.rows):
                options = g._chain.options(row)
                if options.get("presence_penalty") or options.get("frequency_penalty"):
                    return False
        length = loop.length
        held = g._sequences[:, :length].copy()
        done = g._done.copy()
        # Each row's cached tokens (all but its pending one) are its generator's: its prompt,
        # then what it generated. The mask follows the batch's columns (the prompt padding
        # masked), as the loop's rewinds expect; the KV follows the attention: compact rows
        # for GroupQueryAttention (it reads a row's first seqlens_k + 1 positions), the
        # batch's columns for attention that masks them.
        cached = length - 1
        real = np.ones((g.rows, cached), bool)
        parts: list[list[np.ndarray]] = []
        for row, sub in enumerate(self.rows):
            sub._spec.settle()  # (nothing queued: `step` waits for that)
            real[row, self.prompts[row] : self.width] = False
            # (a finished row's generator holds fewer: its KV is never read again)
            held_kv = min(int(real[row].sum()), sub._loop.computed)
            parts.append(sub._driver.kv.export(held_kv))
        compact = _compact_kv(g.model)
        axis, batch_axis = (3, 1) if g._io.combined_kv else (2, 0)
        arrays = []
        for tensors in zip(*parts, strict=True):
            rows = []
            for row, tensor in enumerate(tensors):
                shape = list(tensor.shape)
                shape[axis] = cached
                full = np.zeros(shape, tensor.dtype)
                where = [slice(None)] * tensor.ndim
                where[axis] = (
                    slice(0, tensor.shape[axis])
                    if compact
                    else np.flatnonzero(real[row])[: tensor.shape[axis]]
                )
                full[tuple(where)] = tensor
                rows.append(full)
            arrays.append(np.ascontiguousarray(np.concatenate(rows, axis=batch_axis)))
        driver.restore(held, arrays)  # every row's `cached` positions, all real...
        mask = loop.array("attention_mask")[: g.rows * cached].reshape(g.rows, cached)
        mask[:] = real  # ...but the padding
        loop.array("next_position")[:] = real.sum(axis=1)
        sampler = g._chain.sampler
        if sampler is not None:  # each row's stream goes on where its generator left it
            state = sampler.rng.get_state()
            for row, sub in enumerate(self.rows):
                state[row] = sub._chain.sampler.rng.get_state()[0]
            sampler.rng.set_state(state)
        g._done[:] = 0
        if g._python_stage:
            g._replay(length)  # stop strings and guidance see the tokens again
        g._done[:] |= done
        self.batched = True
        return True

    def settle(self) -> None:
        """Nothing queued at the batch's level (each row's generator settles its own when it
        is rewound or appended to)."""

    def reset(self) -> None:
        """A new sequence: the rows' generators start over at their next prompt."""

    def logits(self) -> np.ndarray | None:
        """`Generator.get_logits`: each unfinished row's, float32 [rows, 1, vocab] (a finished
        row's are zeros: its generator ran no pad token); None after `_leave` (the batch's)."""
        if self.batched:
            return None
        out = np.zeros((self.g.rows, 1, self.g.vocab_size), np.float32)
        for row, sub in enumerate(self.rows):
            if not self.g._done[row]:
                out[row] = sub.get_logits()[0]
        return out

    def forward(self, name: str, *args: Any) -> None:
        """Do what the batch's generator was asked (``name``: its method) on the rows'
        generators: adapters, model inputs, run options for every row; a row's search options,
        logits and rewinds for that row."""
        if self.batched and name in ("set_logits", "truncate"):
            return  # the batch's own loop holds the tokens now
        if not self.rows:
            return  # (rows never run apart here: the batch's own generator has it all)
        if name == "set_logits":
            logits = np.asarray(args[0], np.float32).reshape(self.g.rows, -1)
            for row, sub in enumerate(self.rows):
                sub.set_logits(logits[row : row + 1])
        elif name == "set_row_search_options":
            row, options = args
            self.rows[row].set_row_search_options(0, **options)
        elif name == "truncate":
            (length,) = args
            prompt = self.g._loop.prompt_length
            for row, sub in enumerate(self.rows):
                pads = int(self.pads[row])
                kept = length - pads if length >= prompt else min(length, prompt - pads)
                if kept < sub.token_count():
                    sub.truncate(max(kept, 0))
        else:
            for sub in self.rows:
                getattr(sub, name)(*args)

    def stats(self) -> dict[str, Any]:
        """`Generator.get_speculative_stats`: the rows' counters added up (a round is one
        row's round); ``effective_k`` the largest row's."""
        total = SpeculativeCounters()
        names = [n for n in vars(total) if n != "k_counts"]
        adaptive = SimpleNamespace(increases=0, decreases=0, observations=0, probes=0)
        cooldown = SimpleNamespace(entries=0, steps=0, remaining=0)
        backoff = SimpleNamespace(entries=0, steps=0, enabled=False)
        buffered = effective_k = 0
        throughput: list[float] = []
        for sub in self.rows:
            spec = sub._spec
            counters = spec.counters
            for name in names:
                setattr(total, name, getattr(total, name) + getattr(counters, name))
            for k, count in counters.k_counts.items():
                total.k_counts[k] = total.k_counts.get(k, 0) + count
            for name in vars(adaptive):
                setattr(adaptive, name, getattr(adaptive, name) + getattr(spec.adaptive, name))
            for name in vars(cooldown):
                setattr(cooldown, name, getattr(cooldown, name) + getattr(spec.cooldown, name))
            for name in ("entries", "steps"):
                setattr(backoff, name, getattr(backoff, name) + getattr(spec.backoff, name))
            backoff.enabled = backoff.enabled or spec.backoff.enabled
            throughput.append(spec.adaptive.throughput)
            buffered += len(spec.queue)
            effective_k = max(effective_k, spec.adaptive.k)
        adaptive.throughput = float(np.mean(throughput)) if throughput else 0.0
        total.standard_fallback_steps += self.fallback
        return total.as_reference_dict(
            buffered=buffered,
            effective_k=effective_k,
            adaptive=adaptive,
            cooldown=cooldown,
            backoff=backoff,
        )
