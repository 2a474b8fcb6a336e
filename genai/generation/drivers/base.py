"""The driver protocol: what runs a model kind's graphs for a `genai.Generator`.

A `Generator` keeps the API, the search (sampling, beam search, stop strings, guidance) and the
finish bookkeeping; a *driver* owns everything that depends on the kind of model: its sessions,
its KV cache and how the pending tokens reach the graphs. Every driver also holds the
generator's `DecoderLoop` (`Driver.loop`), the native per-step state the generator reads and
commits tokens through:

* ``sequences`` [rows, max_length] and ``length``: every token so far (prompt included);
* ``computed``: how many of them the model has run on;
* ``logits_rows`` [rows, vocab] and ``logits_ready``: the rows the next token is chosen from
  and whether they are current.

What a driver does for its generator:

* `Driver.prepare_prompt`: turn appended tokens into what the sequences hold (a windowed model
  pads a first prompt to whole windows);
* `Driver.run`: run the pending tokens ``sequences[:, computed:length]`` so the logits rows are
  current (``prompt``: they start the sequences);
* `Driver.step`: one step: make the logits current if they are not, choose, commit;
  `Driver.steps` makes many in one native call when `Driver.fused_steps` says it can;
* `Driver.rewind`, `Driver.reorder` (beam search), `Driver.snapshot_kv` / `Driver.restore`
  (prefix snapshots), `Driver.read_input` / `Driver.read_output` (a host copy of a run's
  tensors), the inputs and run options a caller sets, and the KV cache's size.
* ``set_inputs(named_tensors)`` (only drivers of multimodal kinds have it: the encoder-decoder
  and vision drivers): take a processor's output (`genai.multimodal`), run what runs once per
  input (an encoder, a vision graph) and return the token ids to append (int32 ``[rows, n]``,
  repeated per beam) or None; `genai.Generator.set_inputs` answers with the reference's error
  for a driver without it (a text-only kind).
* speculative decoding's runs (only `NativeDriver` has them; `genai.generation.speculative`
  asks with ``getattr``): ``verify_tokens`` (the most tokens one verify run takes; 0 when the
  graph returns the last position's logits only), ``verify`` / ``verify_sequentially``,
  ``run_as_steps`` (a draft's catch-up) and ``prepare_verify`` (the one-time work of a first
  verify run, done before the statistics time it).

What a driver cannot do it declares in `Driver.unsupported` (an operation name -> the reason,
the message of the `NotImplementedError` it raises), so a generator asks (`require`) instead
of checking the kind of model. Operations: ``"rewind"`` (to a length > 0), ``"reorder"``,
``"snapshot"``, ``"model_inputs"``, ``"run_options"``.

Implementations: `genai.generation.drivers.native.NativeDriver` (one graph, the loop runs it
without the GIL), `genai.generation.drivers.windowed.WindowedDriver` (QNN-style static
windows, `genai.generation.windowed_runner`) and
`genai.generation.drivers.pipeline.PipelineDriver` (several graphs,
`genai.generation.pipeline`); `genai.generation.drivers.make_driver` is the one place that
picks one by the kind of model.

The serving batch runners (`genai.serve.batch_runner`) are not drivers of this protocol: a
driver advances one batch of rows in lockstep (one length, one `DecoderLoop`, the generator
choosing every row's token), while a batch runner serves independent slots, each with its own
length, filled, emptied and compacted as requests come and go, and leaves the choice of tokens
to the scheduler. They take the same shape where it holds: the runs are the model side only,
and what one cannot do is declared in the same ``unsupported`` mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from genai._core.bookkeeping import NO_PAD
from genai._core.decoder_loop import DecoderLoop
from genai.errors import UnsupportedFeatureError

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai._core.sampling import Sampler
    from genai.runtime.model import DecoderIO

__all__ = ["Declares", "Driver", "LoopSettings", "new_loop", "require"]


@dataclass(frozen=True)
class LoopSettings:
    """What a generator's `DecoderLoop` is made with, whatever runs the model."""

    #: Rows the model runs: batch_size * num_beams.
    rows: int
    max_length: int
    pad_id: int
    #: EOS token ids, int32.
    eos: np.ndarray
    #: The logits-processing chain (None: greedy argmax).
    sampler: Sampler | None = None
    #: Top log-probabilities recorded per step (-1: no log-probabilities).
    logprobs: int = -1
    #: Whether a prompt's trailing ``pad_id`` tokens are padding (masked): with a batch size
    #: above 1; at batch size 1 (whatever the beams) they are tokens, as in the reference.
    padded: bool = True

    @property
    def prompt_pad(self) -> int:
        """The id a prompt's trailing padding has: ``pad_id``, or `NO_PAD` unless `padded`."""
        return self.pad_id if self.padded else NO_PAD


def new_loop(
    io: DecoderIO,
    session: NativeSession | None,
    settings: LoopSettings,
    loop_class: type[DecoderLoop] = DecoderLoop,
    **kv: Any,
) -> DecoderLoop:
    """The native loop (``loop_class``, a `DecoderLoop` or a subclass) over ``session``
    (None: the model runs outside the loop) for ``settings``, with the KV handover ``kv``
    (``kv_pairs``, ``grow_kv``, ``kv_capacity``)."""
    loop = loop_class(
        session,
        input_ids=io.input_ids,
        attention_mask=io.attention_mask,
        position_ids=io.position_ids,
        logits=io.logits,
        batch=settings.rows,
        vocab=io.vocab_size,
        max_length=settings.max_length,
        pad_id=settings.pad_id,
        eos_ids=settings.eos,
        id_dtype=io.id_dtype,
        mask_dtype=io.mask_dtype,
        logits_dtype=io.logits_dtype,
        sampler=settings.sampler,
        logprobs=settings.logprobs,
        **kv,
    )
    loop.prompt_pad = settings.prompt_pad
    return loop


@runtime_checkable
class Driver(Protocol):
    """Runs a model kind's graphs for one `genai.Generator` (see the module docstring)."""

    #: The generator's per-step state: sequences, logits rows, the choice and its commit.
    loop: DecoderLoop
    #: The binding runs go through (None: one per stage, none a caller may use).
    session: NativeSession | None
    #: The KV cache object a caller may inspect (None: the runner keeps its own).
    kv: Any
    #: True when `steps` runs many steps in one native call.
    fused_steps: bool
    #: Operation -> why this driver cannot do it (see the module docstring).
    unsupported: Mapping[str, str]

    def prepare_prompt(self, tokens: np.ndarray, length: int) -> np.ndarray:
        """The tokens [rows, n] appended at ``length`` as the sequences hold them."""
        ...

    def run(self, prompt: bool = False) -> None:
        """Run the pending tokens so the logits rows are current (``prompt``: they start the
        sequences)."""
        ...

    def step(self) -> None:
        """One step: make the logits current if they are not, choose every row's token and
        commit it."""
        ...

    def steps(self, count: int) -> int:
        """Up to ``count`` steps; the number made (only when `fused_steps`)."""
        ...

    def rewind(self, length: int, keep_last: bool = False) -> None:
        """Keep the first ``length`` tokens; the next run continues from there, recomputing
        the last of them (``keep_last``: a hint that the caller appends tokens before the next
        run, which may then feed only those; a driver may ignore it)."""
        ...

    def reorder(self, order: np.ndarray) -> None:
        """Beam search: row ``r`` continues from row ``order[r]`` (KV and run state)."""
        ...

    @property
    def kv_layout(self) -> str:
        """The KV layout's name (a snapshot restores only into the same one)."""
        ...

    def snapshot_kv(self, length: int) -> list[np.ndarray]:
        """Copies of the KV cache of the first ``length - 1`` tokens (batch 1)."""
        ...

    def restore(self, tokens: np.ndarray, kv: list[np.ndarray]) -> None:
        """Start from ``tokens`` [1, n] whose first n - 1 have the KV cache ``kv``."""
        ...

    def read_output(self, name: str) -> np.ndarray:
        """A host copy of the last run's output ``name``."""
        ...

    def read_input(self, name: str) -> np.ndarray:
        """A host copy of the last run's input ``name``."""
        ...

    def set_model_input(self, name: str, value: np.ndarray) -> None:
        """Feed graph input ``name`` with a copy of ``value`` from the next run on."""
        ...

    def set_hidden_states(self, hidden_states: np.ndarray) -> None:
        """Bind ``hidden_states`` to the model's hidden-states input, if it has one."""
        ...

    def set_run_option(self, key: str, value: str) -> None:
        """An onnxruntime run config entry for the runs."""
        ...

    @property
    def kv_bytes(self) -> int:
        """Bytes allocated for the KV cache."""
        ...

    @property
    def kv_used_bytes(self) -> int:
        """Bytes of the KV cache the tokens so far occupy."""
        ...


class Declares(Protocol):
    """Anything that declares what it cannot do: a `Driver`, a serving batch runner."""

    unsupported: Mapping[str, str]


def require(driver: Declares, operation: str) -> None:
    """Raise `NotImplementedError` with the driver's reason when it declares ``operation``
    unsupported."""
    reason = driver.unsupported.get(operation)
    if reason is not None:
        raise UnsupportedFeatureError(reason)
