"""Parts the drivers share: a session binding's inputs and run options, graph capture and
extra outputs (native and windowed drivers), runs fed by a runner outside the native loop
(windowed, pipeline and vision drivers), and a runner that owns several sessions and the KV
(pipeline and vision drivers)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from genai.errors import GenerationError, InvalidArgumentError, UnsupportedFeatureError
from genai.generation.drivers.base import LoopSettings, require

if TYPE_CHECKING:
    from genai._core.decoder_loop import DecoderLoop
    from genai._core.native_session import NativeSession
    from genai.runtime.model import Model

__all__ = ["RunnerRuns", "RunnerSessions", "SessionInputs", "bind_outputs"]


def bind_outputs(
    model: Model, session: NativeSession, loop: DecoderLoop, rows: int, shared_kv: bool
) -> tuple[str, ...]:
    """Turn on graph capture where the provider's capture is on, and bind the outputs beyond
    logits and KV; returns the names of those outputs.

    A provider whose capture is on gets single-token steps bound at fixed addresses, replaying
    a graph captured for this loop; one that cannot (more rows, growing or host KV, a runner
    outside the loop) runs uncaptured and says so on every run (gpu_graph_id=-1), else
    onnxruntime would capture its first run. Outputs beyond logits and KV (e.g.
    hidden_states) are allocated by onnxruntime at every run so that they can be read (only
    models that have them pay for it); a captured graph needs every output at a fixed
    address, so they are not produced then."""
    graph = model.provider.graph_capture_id(
        model.provider_options, session, rows=rows, shared_kv=shared_kv
    )
    if graph:
        loop.use_graph_capture(graph)
    extra: tuple[str, ...] = () if graph else model.extra_outputs
    for name in extra:
        session.bind_output_to_device(name)
    return extra


class SessionInputs:
    """Inputs and run options set on a driver's one session binding."""

    model: Model
    session: NativeSession
    unsupported: dict[str, str]

    def _init_inputs(self) -> None:
        #: Inputs given with `set_model_input` (name -> the bound copy).
        self.model_inputs: dict[str, np.ndarray] = {}

    def set_model_input(self, name: str, value: np.ndarray) -> None:
        """See `genai.Generator.set_model_input`."""
        require(self, "model_inputs")  # type: ignore[arg-type]
        if name in self.model.fed_inputs:
            raise InvalidArgumentError(
                f"{name!r} is fed by the generator itself (ids, mask, positions, KV); "
                "set_model_input takes the model's other inputs"
            )
        array = np.array(value, order="C", copy=True)
        # As the reference: only the graph's inputs (an overridable initializer is set by an
        # adapter, not here).
        if name not in self.session.input_dtypes:
            what = (
                f"{name!r} is an initializer of the model (an adapter sets it)"
                if name in self.session.initializer_dtypes
                else f"the model has no input {name!r}"
            )
            # stacklevel 3: the caller of Generator.set_model_input
            warnings.warn(f"set_model_input: {what}; ignored (as the reference)", stacklevel=3)
            return
        self.session.bind_input(name, array)  # TypeError names a dtype the graph refuses
        self.model_inputs[name] = array

    def set_hidden_states(self, hidden_states: np.ndarray) -> None:
        """See `genai.Generator.set_hidden_states`."""
        name = (self.model.config.decoder.get("inputs") or {}).get("hidden_states")
        if not name or name not in self.session.input_dtypes:
            return
        array = np.array(hidden_states, order="C", copy=True)
        self.session.bind_input(name, array)
        self.model_inputs[name] = array

    def set_run_option(self, key: str, value: str) -> None:
        """An onnxruntime run config entry for this binding's runs."""
        self.session.set_run_config_entry(key, value)


class RunnerRuns:
    """Runs fed by a runner outside the native loop (`genai.generation.windowed_runner`,
    `genai.generation.pipeline`): the runner writes the logits rows, the loop chooses and
    commits."""

    loop: DecoderLoop
    runner: Any
    settings: LoopSettings
    #: Steps run one by one in Python: every run goes through the runner.
    fused_steps = False

    def _feed(self, prompt: bool) -> None:
        raise NotImplementedError

    def run(self, prompt: bool = False) -> None:
        """Feed the pending tokens through the runner; the logits rows are current."""
        self._feed(prompt)
        self._logits_written()

    def _logits_written(self) -> None:
        """The runner rewrote the loop's logits rows: they are current."""
        if self.settings.sampler is not None:
            self.settings.sampler.forget_logits()  # rows rewritten outside the loop
        self.loop.set_logits_ready()

    def step(self) -> None:
        """One step: the runner runs the pending tokens if the logits are stale, the loop
        chooses and commits."""
        if not self.loop.logits_ready:
            self.run()
        self.loop.step()

    def steps(self, count: int) -> int:
        """Not fused: a runner returns to Python after every run."""
        raise UnsupportedFeatureError("steps run one by one through the runner (fused_steps False)")

    def _last_value(self, name: str, kind: str) -> np.ndarray:
        """A host copy of the last run's ``kind`` ("input" or "output") ``name``."""
        runner = self.runner
        if not runner.last_run_count:
            raise GenerationError("the model has not run yet")
        value = runner.read_output(name) if kind == "output" else runner.read_input(name)
        if value is None:
            raise KeyError(f"{name!r} is not an {kind} of the model")
        return value

    def read_output(self, name: str) -> np.ndarray:
        """A host copy of the last run's output ``name``, from the runner."""
        return self._last_value(name, "output")

    def read_input(self, name: str) -> np.ndarray:
        """A host copy of what the last run fed as ``name``, from the runner."""
        return self._last_value(name, "input")


class RunnerSessions(RunnerRuns):
    """A runner that owns several sessions and the KV cache (`genai.generation.pipeline`'s
    stages, `genai.generation.vision_runner`'s graphs): it rewinds with the loop and feeds
    every session's inputs itself, so a caller's inputs and run options are refused
    (``unsupported["model_inputs"]``, ``["run_options"]``) and hidden states ignored."""

    def rewind(self, length: int, keep_last: bool = False) -> None:
        """Keep the first ``length`` tokens (the runner the KV of all but the last, whatever
        ``keep_last``)."""
        self.loop.rewind(length)
        self.runner.rewind(length)

    def set_model_input(self, name: str, value: np.ndarray) -> None:
        """Refused: the runner feeds every session's inputs."""
        require(self, "model_inputs")  # type: ignore[arg-type]

    def set_hidden_states(self, hidden_states: np.ndarray) -> None:
        """Ignored, as a model without that input (no single session to bind it to)."""

    def set_run_option(self, key: str, value: str) -> None:
        """Refused: one session per graph."""
        require(self, "run_options")  # type: ignore[arg-type]

    @property
    def kv_bytes(self) -> int:
        """Bytes of the runner's KV cache."""
        return self.runner.nbytes

    @property
    def kv_used_bytes(self) -> int:
        """Bytes the computed tokens occupy."""
        return self.runner.used_bytes()
