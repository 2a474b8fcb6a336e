"""The stages of a multi-graph decoder (``model.decoder.pipeline``, ``model.type``
``"decoder-pipeline"``): `read_stages` parses them from the config, `stage_session_options`
gives each stage's session options, and `check_stages` checks them against their graphs when
`genai.Model` loads them. `genai.generation.pipeline.PipelineRunner` runs them (see there for
how a step feeds the stages).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genai.errors import ConfigError, UnsupportedFeatureError

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.runtime.config import Config
    from genai.runtime.model import DecoderIO

__all__ = [
    "PIPELINE_TYPE",
    "PipelineStage",
    "check_stages",
    "managed_names",
    "read_stages",
    "stage_session_options",
]

#: The ``model.type`` that makes a decoder run as a pipeline (the reference's only one).
PIPELINE_TYPE = "decoder-pipeline"

#: ``model.decoder.inputs`` keys the runner feeds; any other one a stage lists is refused.
_FED_INPUT_KEYS = frozenset(
    ["input_ids", "attention_mask", "position_ids", "past_key_names", "past_value_names"]
)


@dataclass(frozen=True)
class PipelineStage:
    """One stage of ``model.decoder.pipeline`` (the reference's keys)."""

    #: The stage's name (its key in the config).
    name: str
    #: Where the config holds it (``model.decoder.pipeline[0].embeddings``).
    path: str
    #: The ONNX file, relative to the model folder.
    filename: str
    #: Graph inputs, bound by name.
    inputs: tuple[str, ...]
    #: Graph outputs.
    outputs: tuple[str, ...]
    #: Whether the stage runs on prompt runs (several tokens per row).
    run_on_prompt: bool = True
    #: Whether the stage runs on token runs (one token per row).
    run_on_token_gen: bool = True
    #: ``is_lm_head`` (matters only to prompts fed in chunks, which genai's pipelines do not).
    is_lm_head: bool = False
    #: ``output_names_forwarder``: (graph output, the name later stages see it under).
    forwarded: tuple[tuple[str, str], ...] = ()
    #: The stage's own ``session_options`` (None: the decoder's).
    session_options: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    #: The stage's ``run_options`` (None: the decoder's).
    run_options: Mapping[str, str] | None = field(default=None, compare=False, repr=False)
    #: ``inherit_session_options``: the stage's options overlay the decoder's.
    inherit_session_options: bool = False
    #: ``reset_session_idx`` (-1: none): the reference frees that stage's session when this one
    #: runs, to save memory; genai keeps every session loaded.
    reset_session_idx: int = -1

    def stored_name(self, output: str) -> str:
        """The name later stages read ``output`` under."""
        return dict(self.forwarded).get(output, output)

    def runs(self, prompt: bool) -> bool:
        """Whether the stage runs on a prompt run (``prompt``) or a token run."""
        return self.run_on_prompt if prompt else self.run_on_token_gen


def read_stages(config: Config) -> tuple[PipelineStage, ...]:
    """The stages of ``model.decoder.pipeline`` (validated in shape by `genai.Config`)."""
    stages = []
    for path, name, raw in config.pipeline_stages():
        forwarder = raw.get("output_names_forwarder") or {}
        outputs = tuple(raw.get("outputs", ()))
        for key in forwarder:
            if key not in outputs:
                raise ConfigError(
                    f"{path}.output_names_forwarder names {key!r}, which is not in "
                    f"{path}.outputs {list(outputs)} ({config.file})"
                )
        stages.append(
            PipelineStage(
                name=name,
                path=path,
                filename=raw["filename"],
                inputs=tuple(raw.get("inputs", ())),
                outputs=outputs,
                run_on_prompt=bool(raw.get("run_on_prompt", True)),
                run_on_token_gen=bool(raw.get("run_on_token_gen", True)),
                is_lm_head=bool(raw.get("is_lm_head", False)),
                forwarded=tuple(forwarder.items()),
                session_options=raw.get("session_options"),
                run_options=raw.get("run_options"),
                inherit_session_options=bool(raw.get("inherit_session_options", False)),
                reset_session_idx=int(raw.get("reset_session_idx", -1)),
            )
        )
    if not stages:
        raise ConfigError(f"model.type {PIPELINE_TYPE!r} needs model.decoder.pipeline stages")
    for stage in stages:
        if not -1 <= stage.reset_session_idx < len(stages):
            raise ConfigError(
                f"{stage.path}.reset_session_idx = {stage.reset_session_idx} in {config.file} "
                f"is not a stage index in [0, {len(stages)})"
            )
    return tuple(stages)


def stage_session_options(config: Config, stage: PipelineStage) -> dict[str, Any]:
    """The session options a stage's session is made with, as the reference merges them: the
    decoder's when the stage has none; the stage's alone (an empty provider list: CPU) unless
    ``inherit_session_options``, which overlays them on the decoder's, a provider the stage
    lists taking the decoder's options for that provider that it does not set."""
    decoder = dict(config.decoder.get("session_options") or {})
    if stage.session_options is None:
        return decoder
    own = dict(stage.session_options)
    if not stage.inherit_session_options:
        return own
    merged = {**decoder, **own}
    providers = [
        {name: dict(options)}
        for entry in own.get("provider_options", [])
        for name, options in entry.items()
    ]
    for entry in decoder.get("provider_options", []):
        for name, options in entry.items():
            mine = next((p[name] for p in providers if name in p), None)
            if mine is None:
                providers.append({name: dict(options)})
            else:
                for key, value in options.items():
                    mine.setdefault(key, value)
    merged["provider_options"] = providers
    return merged


def managed_names(io: DecoderIO) -> tuple[set[str], set[str]]:
    """(inputs, outputs) the runner binds itself."""
    inputs = {io.input_ids, *io.past_keys, *io.past_values}
    inputs |= {name for name in (io.attention_mask, io.position_ids) if name}
    return inputs, {io.logits, *io.present_keys, *io.present_values}


def check_stages(
    config: Config,
    stages: tuple[PipelineStage, ...],
    sessions: tuple[NativeSession, ...],
    io: DecoderIO,
) -> None:
    """Check each stage's ``inputs`` / ``outputs`` against its graph and the stages before it:
    every listed name is a graph input / output, every graph input is listed, and each input
    is a model input the engine feeds or an output of an earlier stage. Raises `ConfigError`
    naming the key, or `NotImplementedError` for an input genai does not feed."""
    fed, written = managed_names(io)
    decoder_inputs = config.decoder.get("inputs", {})
    unfed = {v: k for k, v in decoder_inputs.items() if k not in _FED_INPUT_KEYS}
    produced: set[str] = set()
    for stage, session in zip(stages, sessions, strict=True):
        graph_in, graph_out = list(session.input_dtypes), list(session.output_dtypes)
        where = f"{stage.filename} (stage {stage.name!r})"
        for name in stage.inputs:
            if name not in graph_in:
                raise ConfigError(
                    f"{stage.path}.inputs lists {name!r}, which is not an input of {where}; "
                    f"its inputs are: {', '.join(graph_in)}"
                )
        for name in graph_in:
            if name not in stage.inputs:
                raise ConfigError(f"input {name!r} of {where} is not listed in {stage.path}.inputs")
        for name in stage.outputs:
            if name not in graph_out:
                raise ConfigError(
                    f"{stage.path}.outputs lists {name!r}, which is not an output of {where}; "
                    f"its outputs are: {', '.join(graph_out)}"
                )
            if name in fed:
                raise UnsupportedFeatureError(
                    f"{stage.path}.outputs lists {name!r}, a model input; genai does not run "
                    "stages that write the engine's inputs"
                )
        for name in stage.inputs:
            if name in fed or name in produced:
                continue
            if name in unfed:
                raise UnsupportedFeatureError(
                    f"{stage.path}.inputs lists {name!r} (model.decoder.inputs."
                    f"{unfed[name]}); genai's pipeline runner does not feed that input"
                )
            raise ConfigError(
                f"{stage.path}.inputs lists {name!r}, which is neither a model input "
                f"({', '.join(sorted(fed))}) nor an output of an earlier stage ({config.file})"
            )
        produced |= {stage.stored_name(name) for name in stage.outputs if name not in written}
    missing = [io.logits] if not any(io.logits in s.outputs for s in stages) else []
    missing += [
        name
        for name in (*io.present_keys, *io.present_values)
        if not any(name in s.outputs for s in stages)
    ]
    if missing:
        raise ConfigError(
            f"no stage of model.decoder.pipeline in {config.file} outputs {', '.join(missing)}"
        )
