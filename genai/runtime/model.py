"""`Model`: a validated config, an ORT session built by the chosen provider, and a description
of the decoder graph's inputs and outputs."""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from genai._core.native_session import NativeSession
from genai.compat import logging_options
from genai.errors import ConfigError, GenerationError, ModelError, UnsupportedFeatureError
from genai.kv.windowed_cache import engine_slides, static_shape_overrides
from genai.multimodal.processor import MultiModalProcessor
from genai.providers import ExecutionProvider, get_provider, plugins
from genai.providers.base import checked_options, checked_session_spec
from genai.runtime import chunked_attention, gated_silu, hugepages, lora_rows, row_quantization
from genai.runtime import onnx_wire as wire
from genai.runtime.chunked_attention import chunk_attention
from genai.runtime.config import Config, normalize_provider_name
from genai.runtime.draft import check_draft_config, load_draft
from genai.runtime.encoder import ENCODER_DECODER_TYPES, EncoderGraph, load_encoder
from genai.runtime.gated_silu import fuse_gated_silu
from genai.runtime.outlined_weights import outlined
from genai.runtime.pipeline_stages import (
    PIPELINE_TYPE,
    PipelineStage,
    check_stages,
    read_stages,
    stage_session_options,
)
from genai.runtime.row_quantization import fuse_row_quantization
from genai.runtime.run_length_split import split_by_run_length
from genai.runtime.trimmed_logits import TrimmedLogits, trim_logits
from genai.runtime.verify_rows import (
    StepRowsSession,
    linear_ops,
    step_rows_apply,
    step_rows_graph,
)
from genai.runtime.vision import (
    VISION_TYPES,
    EmbeddedDecoderIO,
    VisionGraphs,
    load_vision_graphs,
    refuse_unsupported_vision,
)

if TYPE_CHECKING:
    from genai.compat.streaming import StreamingProcessor

__all__ = ["AdapterInput", "DecoderIO", "LoraInput", "Model", "default_intra_op_threads"]

log = logging.getLogger(__name__)

_SUPPORTED_DTYPES = {np.dtype(t) for t in (np.float32, np.float16, np.int64, np.int32)}
#: KV caches may also be uint8: quantized static caches of windowed (QNN-style) models.
_KV_DTYPES = _SUPPORTED_DTYPES | {np.dtype(np.uint8)}

# ORT's GraphOptimizationLevel values.
_OPT_LEVELS = {
    "ORT_DISABLE_ALL": 0,
    "ORT_ENABLE_BASIC": 1,
    "ORT_ENABLE_EXTENDED": 2,
    "ORT_ENABLE_ALL": 99,
}

# session_options keys with a meaning of their own; any other key is an ORT config entry.
_SESSION_OPTION_KEYS = frozenset(
    [
        "log_id",
        "enable_profiling",
        "intra_op_num_threads",
        "inter_op_num_threads",
        "log_severity_level",
        "log_verbosity_level",
        "enable_cpu_mem_arena",
        "enable_mem_pattern",
        "graph_optimization_level",
        "custom_ops_library",
        "provider_options",
    ]
)

#: Model types whose decoder is a plain causal LM this engine runs.
DECODER_ONLY_TYPES = frozenset(
    [
        # The reference's LLM types (its ModelType::IsLLM, 0.18). Kinds whose graphs carry
        # more than a KV cache (lfm2's and qwen3_5's conv/recurrent states, gemma4's per-layer
        # inputs) say so in their config keys, and Model refuses those keys by name.
        "chatglm",
        "decoder",
        "ernie4_5",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gemma4_text",
        "gpt2",
        "gptoss",
        "granite",
        "hunyuandensev1",
        "internlm2",
        "lfm2",
        "llama",
        "mistral",
        "nemotron",
        "olmo",
        "phi",
        "phi3",
        "phi3small",
        "phimoe",
        "qwen2",
        "qwen3",
        "qwen3_5_moe_text",
        "qwen3_5_text",
        "smollm3",
        # the reference's wrapper type of a target with a draft (model.draft)
        "speculative",
    ]
)

#: Sequence lengths at which the reference re-runs a batch-1 sequence of these model types from
#: its start (its Phi-3 long-RoPE rewind: their graphs pick the rotary factors by the sequence's
#: length, so the KV of the shorter sequence is recomputed with the long factors), except on
#: providers without rewind (DirectML).
ROPE_REWIND_LENGTHS = {"phi3": 4097, "phimoe": 4097, "phi3small": 8193}

#: Decoder types whose first prompt the reference runs in chunks of ``search.chunk_size`` (its
#: decoder-only state; GPT-2 has a state of its own that runs a prompt whole).
PREFILL_CHUNK_TYPES = DECODER_ONLY_TYPES - {"gpt2"}


#: Graph inputs the reference feeds with a preset value when nothing else claims them
#: (``PresetExtraInputs``): ``num_logits_to_keep``, and its alias ``onnx::Neg_*`` (an exporter's
#: name for the same input): int64 ``[1]`` holding 0 (keep every position's logits).
_PRESET_INPUT_PREFIXES = ("onnx::Neg_",)
_PRESET_INPUT_NAMES = frozenset(["num_logits_to_keep"])

#: ORT's session config key for the folder of external-data files of a model loaded from memory.
_EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
#: The largest graph file read whole into memory to rewrite: graphs with their weights in an
#: external-data file are a few megabytes at most; a larger file's weights are left where they
#: lie (`genai.runtime.outlined_weights`), and what remains has to be below it too.
_TRIM_MAX_BYTES = 64 << 20
#: The largest head graph (`TrimmedLogits.head`) a model keeps: one whose weights are in an
#: external-data file is a few kilobytes; a larger one is rewritten again when needed.
_KEPT_HEAD_BYTES = 1 << 20


def refuse_unsupported_features(config: Config) -> None:
    """NotImplementedError naming the feature for a folder of a kind genai does not run yet:
    every feature key of the reference that genai accepts but does not run
    (`Config.check_supported`: speculative, paged-KV, Marian, Whisper, ... inputs), and the
    Marian model types (``model.type`` ``marian-*``) whatever their keys."""
    config.check_supported()
    model_type = str(config.get("model.type") or "")
    if model_type.startswith("marian"):
        raise UnsupportedFeatureError(
            f"{config.file}: Marian-style encoder-decoder models with recurrent decoder state "
            f"(model.type {model_type!r}) are not supported yet"
        )


def default_intra_op_threads() -> int:
    """The reference's default: half the hardware threads, between 1 and 16."""
    return min(max(1, (os.cpu_count() or 2) // 2), 16)


@dataclass(frozen=True)
class DecoderIO:
    """Names, dtypes and KV layout of a decoder graph, resolved against the session."""

    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    id_dtype: np.dtype
    mask_dtype: np.dtype
    logits: str
    logits_dtype: np.dtype
    #: One name per layer; for combined K/V (GPT-2 ``past_%d``) only ``past_keys`` is used.
    past_keys: tuple[str, ...]
    past_values: tuple[str, ...]
    present_keys: tuple[str, ...]
    present_values: tuple[str, ...]
    combined_kv: bool
    kv_dtype: np.dtype
    num_layers: int
    kv_heads: int
    head_size: int
    vocab_size: int
    #: Sliding-window attention (``model.decoder.sliding_window``): the window W in positions
    #: (0: none). The graph's local layers attend to the last W positions and, built for a
    #: windowed cache (GroupQueryAttention ``sliding_window_cache=1``), keep a cache of a
    #: fixed capacity of at least W that the op compacts itself (see `genai.kv.kv_cache`).
    window_size: int = 0
    #: The layers with a windowed cache (``sliding_window.layers``; every layer when the config
    #: lists none, as the reference).
    window_layers: tuple[int, ...] = ()
    #: ``sliding_window.cache_slack``: positions kept beyond the window (0: the provider's
    #: default, 16 on the CPU).
    window_slack: int = 0
    #: A windowed model (``sliding_window.slide_*``) on a provider with static shapes: the
    #: model's session for each run length (`Model.shape_sessions`); empty otherwise.
    shape_sessions: dict[int, NativeSession] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )


#: A LoRA weight input: ``lora_A`` / ``lora_B`` as a name component (``...q_proj.lora_A.weight``).
_LORA_NAME = re.compile(r"(?:^|[./_])lora_([AB])(?=[./_]|$)")
_LORA_DTYPES = {np.dtype(np.float32), np.dtype(np.float16)}


@dataclass(frozen=True)
class LoraInput:
    """A LoRA weight input of the decoder graph: ``A`` ``[in, rank]`` or ``B`` ``[rank, out]``.

    Adapter files (`genai.Adapters`) override these by name; without an adapter each generator
    binds `base`, which has rank 0 (or zeros of the fixed rank), so the branch adds nothing.
    """

    name: str
    #: ``"A"`` or ``"B"``.
    kind: str
    dtype: np.dtype
    #: The declared shape; the rank dimension is ``rank_axis`` (1 for A, 0 for B).
    shape: tuple[int | str, ...]
    rank_axis: int
    #: The other input of the A/B pair.
    partner: str
    #: The declared rank when the graph fixes it (an int), else None (a dynamic dimension).
    max_rank: int | None
    #: The value bound when no adapter is active (read-only).
    base: np.ndarray = field(repr=False, compare=False)


@dataclass(frozen=True)
class AdapterInput:
    """A graph input (or an overridable initializer) that adapter files may set by name, as
    the reference binds an adapter's parameters (ORT's LoRA adapters): any input genai does
    not feed itself and that is not a ``lora_A`` / ``lora_B`` pair (`LoraInput`)."""

    name: str
    dtype: np.dtype | None
    #: The declared shape (a dynamic dimension is a str or -1).
    shape: tuple[int | str, ...]
    #: True for an overridable initializer: without an adapter the graph's own value is used;
    #: False for a plain input, which a run needs fed (an adapter active, or set_model_input).
    has_default: bool


class Model:
    """A generative model loaded from an onnxruntime-genai model folder.

    ``Model(path)`` or ``Model(Config(path))``. The session is created by the first provider of
    ``model.decoder.session_options.provider_options`` (CPU when the list is empty).

    A provider that wants static shapes (``static_shapes``, e.g. QNN) running a windowed model
    (``sliding_window.slide_*``, `genai.kv.windowed_cache`) gets one session per run length from
    the same file, each with the sequence and past dimensions fixed
    (`genai.kv.windowed_cache.static_shape_overrides`, on top of the provider's own
    ``free_dimension_overrides``): `shape_sessions` ``{W: ..., 1: ...}``; `session` is the
    one-token session. Each session holds its own copy of the weights.

    A multi-graph decoder (``model.type`` ``"decoder-pipeline"`` with
    ``model.decoder.pipeline``, `genai.generation.pipeline`) gets one session per stage
    (`stage_sessions`, in stage order, each made with the stage's merged session options and
    its own first provider); `pipeline` describes the stages, `io` their union, and `session`
    is the stage that writes the logits.
    """

    def __init__(self, config: str | os.PathLike[str] | Config) -> None:
        started = time.perf_counter()
        self.config = config if isinstance(config, Config) else Config(config)
        # the lm_head graph of a trimmed decoder (`full_logits`), loaded on first use
        self._head: NativeSession | None = None
        self._head_lock = threading.Lock()
        refuse_unsupported_features(self.config)
        if self.config.get("model.draft") is not None:
            check_draft_config(self.config)
        model_type = self.config.get("model.type")
        pipelined = model_type == PIPELINE_TYPE
        vision = model_type in VISION_TYPES
        encoder_decoder = model_type in ENCODER_DECODER_TYPES
        known = model_type in DECODER_ONLY_TYPES or vision or encoder_decoder
        if not pipelined and known and self.config.get("model.decoder") is None:
            raise ConfigError(
                f"{self.config.file} has no model.decoder section (model.type {model_type!r} "
                "needs one: its graph's filename, inputs, outputs and sizes)"
            )
        if not pipelined and not known:
            raise UnsupportedFeatureError(
                f"model.type {model_type!r} in {self.config.file} is not supported yet; "
                f"supported decoder-only types: {', '.join(sorted(DECODER_ONLY_TYPES))}, "
                f"vision-language types: {', '.join(sorted(VISION_TYPES))}, "
                f"encoder-decoder types: {', '.join(sorted(ENCODER_DECODER_TYPES))}, "
                f"and {PIPELINE_TYPE!r} (model.decoder.pipeline)"
            )
        if vision:
            refuse_unsupported_vision(self.config)
        if not pipelined and self.config.pipeline_stages():
            self._check_ignored_pipeline(str(model_type))
        #: The stages of a multi-graph decoder (`PipelineStage`, in run order),
        #: or None for a single-graph model.
        self.pipeline: tuple[PipelineStage, ...] | None = None
        #: One session per pipeline stage (empty for a single-graph model).
        self.stage_sessions: tuple[NativeSession, ...] = ()
        #: A vision-language model's vision and embedding graphs (`genai.runtime.vision`);
        #: None for other kinds.
        self.vision: VisionGraphs | None = None
        #: An encoder-decoder model's encoder (`genai.runtime.encoder`); None for other kinds.
        self.encoder: EncoderGraph | None = None
        providers = self.config.providers
        name, options = providers[0] if providers else ("cpu", {})
        # The provider decides everything hardware-specific; one that cannot run raises
        # ProviderUnavailableError naming what is missing (never a silent CPU fallback).
        self.provider: ExecutionProvider = get_provider(name)
        self._check_other_providers([other for other, _ in providers[1:]])
        self.provider_options = checked_options(
            self.provider, self.provider.validate_options(options)
        )
        #: The length at which a batch-1 generator re-runs its sequence (`ROPE_REWIND_LENGTHS`;
        #: 0: never).
        self.rope_rewind_length = (
            ROPE_REWIND_LENGTHS.get(str(model_type), 0) if self.provider.capabilities.rewind else 0
        )
        plugins.hook().provider_selected(
            provider=self.provider, options=dict(self.provider_options), config=self.config
        )
        #: Run length -> session, for a windowed model on a provider with static shapes
        #: (see above); empty otherwise.
        self.shape_sessions: dict[int, NativeSession] = {}
        if pipelined:
            self._load_pipeline()
            self._log_loaded(started, f"{len(self.stage_sessions)} pipeline sessions")
            return
        shapes = static_shape_overrides(self.config) if self.provider.static_shapes else {}
        # The session's weights (prepacked by ORT into anonymous memory) are backed by 2 MiB
        # pages where the OS allows: a decode step streams all of them (genai.runtime.hugepages).
        with hugepages.backing_new_memory() as report:
            if shapes:
                for count in sorted(shapes, reverse=True):  # W, then 1
                    self.shape_sessions[count] = self._create_session(shapes[count])
                self.session = self.shape_sessions[1]
            else:
                # a decoder run by the native loop, the vision runner or the server computes its
                # long runs' lm_head for the rows it reads (genai.runtime.trimmed_logits)
                trim = not (encoder_decoder or engine_slides(self.config))
                self.session = self._create_session(trim=trim, chunk=True)
            if vision:
                self.vision = load_vision_graphs(self.config, self._graph_session, self.session)
            if encoder_decoder:
                self.encoder = load_encoder(self.config, self._graph_session, self.session)
        #: What the huge-page backing of the session's host memory did (`HugePageReport`).
        self.huge_pages: hugepages.HugePageReport = report
        for session in self.shape_sessions.values() or [self.session]:
            self.provider.check_session(session)
        described = EmbeddedDecoderIO(self.session, self.vision) if self.vision else self.session
        self.io = _describe_io(self.config, described)
        if self.shape_sessions:
            self.io = replace(self.io, shape_sessions=dict(self.shape_sessions))
        #: The graph's LoRA weight inputs by name (empty for a model without adapters).
        self.lora_inputs: dict[str, LoraInput] = _describe_lora_inputs(self.config, self.session)
        #: Other inputs adapter files may set by name (`AdapterInput`), as the reference binds
        #: an adapter's parameters.
        self.adapter_inputs: dict[str, AdapterInput] = _describe_adapter_inputs(
            self.session, claimed=_claimed_inputs(self.io, self.lora_inputs)
        )
        #: Graph inputs fed a preset value (see `preset_input_values`): name -> value.
        self.preset_inputs: dict[str, np.ndarray] = preset_input_values(
            self.session, claimed=_claimed_inputs(self.io, self.lora_inputs)
        )
        #: Graph outputs beyond the logits and the KV cache (e.g. ``hidden_states``): bound on
        #: every generator's binding to memory ORT allocates at each run, so that
        #: `Generator.get_output` serves them as the reference does; empty for most models.
        self.extra_outputs: tuple[str, ...] = extra_output_names(self.io, self.session)
        if self.lora_inputs and self.shape_sessions:
            raise ConfigError(
                f"{self.config.file}: LoRA inputs in a windowed model with one session per run "
                f"length ({self.provider.name}'s static shapes) are not supported"
            )
        #: The draft model of draft-model speculative decoding (``model.draft``), or None.
        self.draft: Model | None = None
        if self.config.get("model.draft") is not None:
            shape = self.session.output_shapes.get(self.io.logits) or [None]
            vocab = shape[-1] if isinstance(shape[-1], int) and shape[-1] > 0 else None
            self.draft = load_draft(self.config, vocab or self.io.vocab_size, Model)
        self._log_loaded(started, f"{len(self.shape_sessions) or 1} session(s)")

    def _check_other_providers(self, names: list[str]) -> None:
        """Providers listed after the first: each must exist and be able to run, as the
        reference appends every one to its sessions; genai runs a model on one provider, so
        one other than the first (and the CPU, every session's fallback) is named unused."""
        first = type(self.provider)
        for other in names:
            provider = get_provider(other)  # unknown or unavailable: ProviderUnavailableError
            if type(provider) is not first and provider.name != "cpu":
                log.warning(
                    "%s: genai runs a model on one execution provider, the first listed (%s); "
                    "%s is not used",
                    self.config.file,
                    self.provider.name,
                    provider.name,
                )

    def _log_loaded(self, started: float, sessions: str) -> None:
        log.info(
            "loaded %s (model.type %s, %s) on %s in %.0f ms",
            self.config.path,
            self.config.get("model.type"),
            sessions,
            self.provider.name,
            1000 * (time.perf_counter() - started),
        )

    def _check_ignored_pipeline(self, model_type: str) -> None:
        """A pipeline section under another model type: the reference ignores it and loads
        ``decoder.filename``; so does genai, with a warning, when that file exists."""
        filename = self.config.decoder.get("filename", "model.onnx")
        path = self.config.resolve_file(filename, "model.decoder.filename", must_exist=False)
        if self.config.model_data(filename) is None and not path.is_file():
            raise ConfigError(
                f"{self.config.file} has model.decoder.pipeline stages but model.type "
                f"{model_type!r}: stages run only with model.type {PIPELINE_TYPE!r}, and "
                f"model.decoder.filename {filename!r} (loaded instead) does not exist"
            )
        warnings.warn(
            f"{self.config.file}: model.decoder.pipeline is ignored because model.type is "
            f"{model_type!r}, not {PIPELINE_TYPE!r}; loading {filename} (as the reference does)",
            stacklevel=3,
        )

    def _load_pipeline(self) -> None:
        """One session per stage of ``model.decoder.pipeline``, checked against the config."""
        config = self.config
        if config.decoder.get("sliding_window"):
            raise UnsupportedFeatureError(
                f"model.decoder.sliding_window with model.decoder.pipeline ({config.file}): "
                "windowed caches over pipeline stages (QNN-style static graphs per stage) are "
                "not supported"
            )
        stages = read_stages(config)
        sessions = []
        default_run = config.get("model.decoder.run_options")
        with hugepages.backing_new_memory() as report:
            for stage in stages:
                try:
                    config.resolve_file(stage.filename, f"{stage.path}.filename")
                except FileNotFoundError as exc:
                    raise ConfigError(str(exc)) from exc
                options = stage_session_options(config, stage)
                listed = options.get("provider_options") or []
                name, provider_opts = next(iter(listed[0].items())) if listed else ("cpu", {})
                provider = get_provider(normalize_provider_name(name))
                provider_opts = checked_options(provider, provider.validate_options(provider_opts))
                _check_stage_provider(stage, provider, provider_opts)
                session = self._create_session(
                    session_cfg=options,
                    filename=stage.filename,
                    what=f"{stage.path}.filename",
                    provider=provider,
                    provider_options=provider_opts,
                    run_options=stage.run_options if stage.run_options is not None else default_run,
                )
                provider.check_session(session)
                sessions.append(session)
        self.huge_pages = report
        self.stage_sessions = tuple(sessions)
        self.io = _describe_io(config, _StageUnion(stages, sessions), where="the pipeline stages")
        check_stages(config, stages, self.stage_sessions, self.io)
        self.lora_inputs = {}
        self.adapter_inputs = {}
        self.preset_inputs = {}
        self.extra_outputs = ()
        for stage, session in zip(stages, sessions, strict=True):
            if _describe_lora_inputs(config, session):
                raise UnsupportedFeatureError(
                    f"LoRA inputs in pipeline stage {stage.name!r} ({stage.filename}) are not "
                    "supported"
                )
        logits_stage = next(i for i, s in enumerate(stages) if self.io.logits in s.outputs)
        self.session = sessions[logits_stage]
        self.pipeline = stages

    @property
    def type(self) -> str:
        """``model.type`` from the config (e.g. ``"llama"``)."""
        return str(self.config.get("model.type"))

    @property
    def device_type(self) -> str:
        """The device the model runs on, spelled as the reference does: ``"CPU"``, ``"CUDA"``,
        ``"DirectML"``, ``"WebGPU"``, ``"OpenVINO"``, ``"NvTensorRtRtx"``, and for QNN
        ``"QnnWithSharedMemory"`` when its shared-memory allocator is on (HTP
        ``enable_htp_shared_memory_allocator=1`` or the GPU backend), else ``"CPU"``."""
        return self.provider.reference_device_type(self.provider_options)

    @property
    def path(self) -> Path:
        """The model folder."""
        return self.config.path

    def create_multimodal_processor(self) -> MultiModalProcessor:
        """The reference's processor for speech and vision model types
        (`genai.multimodal.kinds.PROCESSORS`); ModelError for the others, as the reference."""
        return MultiModalProcessor(self)

    def create_streaming_processor(self) -> StreamingProcessor:
        """The reference's streaming audio processor (Moonshine / Nemotron speech models);
        the model types genai runs have none (the reference raises the same for them)."""
        raise ModelError(
            f"CreateStreamingProcessor: unsupported model type {self.type!r}. "
            "StreamingProcessor supports 'streaming_enc_dec_asr' (Moonshine) and "
            "'nemotron_speech' (Nemotron), which genai does not run (docs/differences.md); "
            "Whisper runs through create_multimodal_processor (docs/speech.md)."
        )

    def _graph_session(
        self, options: dict[str, Any] | None, filename: str, what: str
    ) -> NativeSession:
        """The session of another graph of the folder (vision, embedding, encoder): its own
        session options and file, ``what`` naming its config key in errors."""
        return self._create_session(session_cfg=options, filename=filename, what=what)

    def _create_session(
        self,
        fixed: dict[str, int] | None = None,
        *,
        session_cfg: dict[str, Any] | None = None,
        filename: str | None = None,
        what: str = "model.decoder.filename",
        provider: ExecutionProvider | None = None,
        provider_options: dict[str, str] | None = None,
        run_options: dict[str, str] | None = None,
        trim: bool = False,
        chunk: bool = False,
        step_rows: bool = False,
    ) -> NativeSession:
        """The decoder's session; ``fixed``: symbolic dimensions to fix beyond the provider's
        (they take precedence). A pipeline stage passes its own session options, file,
        provider and run options (defaults: the decoder's). ``trim``: trim the logits of long
        runs where the graph allows it (`genai.runtime.trimmed_logits`). ``chunk``: run long
        prompts' attention in chunks of query rows where the provider and graph allow it
        (`genai.runtime.chunked_attention`). ``step_rows``: instead, the session a speculative
        verify run goes to (`genai.runtime.verify_rows.StepRowsSession`): the graph short runs
        run, with ``StepRowsMatMulNBits`` for its ``MatMulNBits``."""
        config = self.config
        if session_cfg is None:
            session_cfg = config.get("model.decoder.session_options", {}) or {}
            run_options = config.get("model.decoder.run_options")
        provider = provider or self.provider
        if provider_options is None:
            provider_options = self.provider_options
        level = session_cfg.get("graph_optimization_level", "ORT_ENABLE_ALL")
        if level not in _OPT_LEVELS:
            raise ConfigError(
                f"{what.rsplit('.', 1)[0]}.session_options.graph_optimization_level {level!r} "
                f"in {config.file} must be one of {', '.join(_OPT_LEVELS)}"
            )
        entries = {k: v for k, v in session_cfg.items() if k not in _SESSION_OPTION_KEYS}
        custom_ops = session_cfg.get("custom_ops_library")
        filename = filename or config.decoder.get("filename", "model.onnx")
        path = config.resolve_file(filename, what)
        spec = checked_session_spec(provider, provider.session_spec(provider_options, config))
        entries.update(spec.config_entries)
        overrides = {**spec.free_dimension_overrides, **(fixed or {})}
        run_entries = dict(run_options or {})
        if provider.graph_capture_enabled(provider_options):
            # No run is captured unless a generator asks for it with a graph id of its own
            # (DecoderLoop.use_graph_capture): onnxruntime would capture the first run under
            # the default id 0 and replay it for every later one.
            run_entries.setdefault("gpu_graph_id", "-1")
        model_bytes = config.model_data(filename)
        if model_bytes is not None:
            # ORT resolves a model's external-data files against the model's own path, which a
            # model given as bytes does not have: the model folder, as the reference (unless
            # the session options name another folder).
            entries.setdefault(_EXTERNAL_DATA_FOLDER, str(Path(config.path).resolve()))
        log.debug(
            "session for %s: provider %s, options %s, fixed dimensions %s",
            path,
            provider.name,
            dict(provider_options),
            overrides or None,
        )
        options: dict[str, Any] = {
            "intra_op_num_threads": int(
                session_cfg.get("intra_op_num_threads") or default_intra_op_threads()
            ),
            "inter_op_num_threads": int(session_cfg.get("inter_op_num_threads") or 0),
            "graph_optimization_level": _OPT_LEVELS[level],
            "providers": spec.providers,
            "free_dimension_overrides": overrides or None,
            "log_id": session_cfg.get("log_id", "genai"),
            "enable_cpu_mem_arena": session_cfg.get("enable_cpu_mem_arena"),
            "enable_mem_pattern": session_cfg.get("enable_mem_pattern"),
            "log_severity_level": session_cfg.get(
                "log_severity_level", logging_options.ort_log_severity()
            ),
            "custom_ops_library": (
                str(config.resolve_file(custom_ops, "custom_ops_library")) if custom_ops else None
            ),
            "run_config_entries": run_entries or None,
            "profile_file_prefix": session_cfg.get("enable_profiling") or None,
        }
        split = None
        if model_bytes is None and os.environ.get("GENAI_RUN_LENGTH_SPLIT", "1") != "0":
            split = split_by_run_length(path)
        graphs: list[bytes] = []
        if split is not None:
            # graphs rewritten in memory read their external data from the folder
            moved = in_memory_graphs(path.parent, [split.short_graph, split.long_graph])
            if moved is None:
                split = None
            else:
                graphs, entries[_EXTERNAL_DATA_FOLDER] = moved
        # The graph's bytes for the rewrites below, read once (None: the file is too large).
        data = model_bytes
        if data is None and split is None and (trim or chunk):
            data = _small_graph(path)
        trimmed = None
        if trim and data is not None and self._can_trim(provider, provider_options):
            trimmed = _trimmed(path, data, model_bytes is None, config)
            if trimmed is not None and trimmed.data_folder is not None:
                entries[_EXTERNAL_DATA_FOLDER] = trimmed.data_folder
        # The graph the session runs (None: the file), with genai's CPU ops where they apply:
        # in a split, the long branch's for prompts, and the short branch's attention (it
        # never runs a chunk, but speculative verify runs go there: `single_rows`).
        graph = trimmed.graph if trimmed else model_bytes
        branch_ops = [False, False]
        plain_ops = False
        threads = int(options["intra_op_num_threads"])
        if chunk and provider.host_ops:
            if split is not None:
                for index in (0, 1):
                    rewritten = _host_ops(graphs[index], _OPT_LEVELS[level], index == 1, threads)
                    if rewritten is not None:
                        graphs[index], branch_ops[index] = rewritten, True
            elif data is not None:
                # the file's own bytes need their external data placed; a trimmed graph's and
                # given bytes' already are
                from_file = trimmed is None and model_bytes is None
                found = _with_host_ops(
                    path, trimmed.graph if trimmed else data, from_file, _OPT_LEVELS[level], threads
                )
                if found is not None:
                    graph, folder = found
                    plain_ops = True
                    if folder is not None:
                        entries[_EXTERNAL_DATA_FOLDER] = folder
        if step_rows:
            return self._step_rows_session(
                path, graphs[0] if split else graph, data, entries, options
            )
        try:
            if split is None:
                session = NativeSession(
                    str(path),
                    model_bytes=graph,
                    config_entries=entries,
                    genai_ops=plain_ops,
                    **options,
                )
                # the linears that decide how verify runs compute attention (`verify_rows`)
                session.linear_ops = linear_ops(graph or data or b"")  # (no bytes: None)
                self._offer_step_rows(session, provider, fixed, trim, chunk)
                if trimmed is not None:
                    # keep no copy of the graph, nor of a head graph that holds its weights
                    # (`full_logits` rebuilds that one when asked)
                    small = len(trimmed.head) <= _KEPT_HEAD_BYTES
                    trimmed = replace(trimmed, graph=b"", head=trimmed.head if small else b"")
                session.trimmed = trimmed
                return session
            # One session per branch of the graph's run-length If, so that a decode step does
            # not pay for the If; the branches' own kernels, so the If graph's numbers.
            short, long = (
                NativeSession(
                    str(path), model_bytes=branch, config_entries=entries, genai_ops=ops, **options
                )
                for branch, ops in zip(graphs, branch_ops, strict=True)
            )
            short.route_long_runs(long, split.ids, split.above)
            short.linear_ops = linear_ops(graphs[0])  # (verify runs are short ones)
            self._offer_step_rows(short, provider, fixed, trim, chunk)
            return short
        except FileNotFoundError:
            raise
        except Exception as exc:  # ORT's own errors: name the file
            raise ModelError(f"onnxruntime could not load {path}: {exc}") from exc

    def _offer_step_rows(
        self,
        session: NativeSession,
        provider: ExecutionProvider,
        fixed: dict[str, int] | None,
        trim: bool,
        chunk: bool,
    ) -> None:
        """Let ``session``'s speculative verify runs go to a `StepRowsSession` (built on first
        use) where they would need it: the decoder's own session, on a provider that runs
        genai's CPU ops, with linears `step_rows_graph` rewrites."""
        if not (chunk and provider.host_ops and session.linear_ops):
            return
        if os.environ.get("GENAI_STEP_ROWS", "1") == "0":
            return
        if not step_rows_apply(session.linear_ops):
            return
        session.step_rows_session = StepRowsSession(
            functools.partial(self._create_session, fixed, trim=trim, chunk=True, step_rows=True)
        )

    def _step_rows_session(
        self,
        path: Path,
        graph: bytes | None,
        data: bytes | None,
        entries: dict[str, str],
        options: dict[str, Any],
    ) -> NativeSession | None:
        """The session of `_create_session` with ``step_rows``: ``graph`` (the bytes the
        decoder's short runs run; None: the file's, ``data``) with `step_rows_graph`'s op."""
        from_file = graph is None
        rewritten = step_rows_graph(graph if graph is not None else data or b"")
        if rewritten is None:
            return None
        entries = dict(entries)
        if from_file and data is not None and wire.external_locations(rewritten):
            moved = in_memory_graphs(path.parent, [rewritten])
            if moved is None:
                return None
            (rewritten,), entries[_EXTERNAL_DATA_FOLDER] = moved
        log.info("%s: speculative verify runs get one-token steps' numbers from a second "
                 "session (StepRowsMatMulNBits)", path)  # fmt: skip
        return NativeSession(
            str(path), model_bytes=rewritten, config_entries=entries, genai_ops=True, **options
        )

    @staticmethod
    def _can_trim(provider: ExecutionProvider, options: dict[str, str]) -> bool:
        """Whether a trimmed graph runs on ``provider``: not with static shapes, a KV cache
        the session keeps or graph capture (their outputs have fixed shapes)."""
        return not (
            provider.static_shapes
            or provider.session_kv is not None
            or provider.graph_capture_enabled(options)
        )

    def every_logits_row(
        self, session: NativeSession, logits: np.ndarray, run_count: int
    ) -> np.ndarray:
        """``logits`` as ``session`` returned them after a run of ``run_count`` tokens, with a
        row per token: a trimmed run's (fewer rows) recomputed from its hidden state
        (`full_logits`)."""
        trimmed = session.trimmed
        if trimmed is None or logits.shape[1] == run_count:
            return logits
        return self.full_logits(session.get_output(trimmed.hidden))

    def full_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Every row's logits of a trimmed run from its pre-head hidden state (the head graph
        of `genai.runtime.trimmed_logits`, loaded on first use)."""
        trimmed: TrimmedLogits | None = self.session.trimmed
        if trimmed is None:
            raise GenerationError("the model's logits are not trimmed")
        with self._head_lock:
            if self._head is None:
                path = self.config.resolve_file(
                    self.config.decoder.get("filename", "model.onnx"), "model.decoder.filename"
                )
                entries = {_EXTERNAL_DATA_FOLDER: trimmed.data_folder or str(self.config.path)}
                self._head = NativeSession(
                    str(path),
                    model_bytes=trimmed.head or self._rebuilt_head(path),
                    config_entries=entries,
                    intra_op_num_threads=default_intra_op_threads(),
                    providers=checked_session_spec(
                        self.provider,
                        self.provider.session_spec(self.provider_options, self.config),
                    ).providers,
                )
            head = self._head.new_binding()
        head.bind_input(trimmed.hidden, np.ascontiguousarray(hidden))
        head.bind_output_to_device(self.io.logits)
        head.run()
        return head.get_output(self.io.logits)

    def _rebuilt_head(self, path: Path) -> bytes:
        """The head graph of the decoder at ``path``, rewritten again from the file (a head
        graph with its weights inside is not kept)."""
        model_bytes = self.config.model_data(self.config.decoder.get("filename", "model.onnx"))
        data = model_bytes if model_bytes is not None else _small_graph(path)
        trimmed = None if data is None else _trimmed(path, data, model_bytes is None, self.config)
        if trimmed is None:
            raise GenerationError(f"{path} no longer has the graph the model loaded")
        return trimmed.head

    def bind_extra_inputs(self, session: NativeSession) -> None:
        """Bind the inputs a run needs beyond ids, mask, positions and KV on a new binding:
        each LoRA weight input gets its base value (rank 0: the model without adapters), each
        preset input its preset value (`preset_inputs`)."""
        for name, spec in self.lora_inputs.items():
            session.bind_input(name, spec.base)
        for name, value in self.preset_inputs.items():
            session.bind_input(name, value)

    @property
    def fed_inputs(self) -> frozenset[str]:
        """The graph inputs a generator feeds itself (ids, mask, positions, KV): not settable
        with `Generator.set_model_input`."""
        return _claimed_inputs(self.io, {})

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, type={self.type!r}, provider={self.provider.name!r})"


def _check_stage_provider(
    stage: PipelineStage, provider: ExecutionProvider, options: dict[str, str]
) -> None:
    """Refuse, naming the stage, what the pipeline runner (host buffers bound by name, one
    dynamic-shape session per stage) cannot do with a stage's provider."""
    where = f"pipeline stage {stage.name!r} on {provider.name}"
    if provider.static_shapes:
        raise UnsupportedFeatureError(
            f"{where}: a provider with static shapes (one fixed-shape session per run length) "
            "is not supported for pipeline stages"
        )
    if provider.session_kv is not None:
        raise UnsupportedFeatureError(
            f"{where}: a KV cache kept inside the session is not supported"
        )
    if provider.graph_capture_enabled(options):
        raise UnsupportedFeatureError(f"{where}: graph capture is not supported in pipeline stages")
    if provider.session_memory_device:
        raise UnsupportedFeatureError(
            f"{where}: the session wants some inputs or outputs in "
            f"{provider.session_memory_device} memory; the pipeline runner binds host memory"
        )


class _StageUnion:
    """The inputs and outputs of every stage session, as `_describe_io` reads one session."""

    def __init__(self, stages: tuple[PipelineStage, ...], sessions: list[NativeSession]) -> None:
        self.input_dtypes: dict[str, Any] = {}
        self.output_dtypes: dict[str, Any] = {}
        self.output_shapes: dict[str, Any] = {}
        for stage, session in zip(stages, sessions, strict=True):
            for name, dtype in session.input_dtypes.items():
                seen = self.input_dtypes.setdefault(name, dtype)
                if seen != dtype:
                    raise ConfigError(
                        f"input {name!r} of pipeline stage {stage.name!r} has type {dtype}; "
                        f"an earlier stage takes it as {seen}"
                    )
            self.output_dtypes.update(session.output_dtypes)
            self.output_shapes.update(session.output_shapes)


def _check_graph_sizes(
    config: Config,
    shapes: dict[str, Any],
    where: str,
    layers: tuple[int, Any, dict[str, Any]],
    kv: tuple[int, int, str | None, tuple[str, ...]],
    vocab: tuple[int, Any],
) -> None:
    """Refuse a config whose sizes the graph contradicts (`ConfigError` naming both), before
    a run fails inside ORT: a graph with more layers than ``num_hidden_layers``, KV inputs
    whose fixed head count or head size differ from the config's, logits whose fixed width is
    not ``vocab_size``."""
    num_layers, past_keys, names_in = layers
    if past_keys is not None and num_layers:
        template = names_in.get("past_key_names", "past_key_values.%d.key")
        beyond = _layer_names(template, num_layers + 1)[-1]
        if beyond in shapes:
            raise ConfigError(
                f"model.decoder.num_hidden_layers is {num_layers} in {config.file}, but {where} "
                f"has more layers (input {beyond!r})"
            )
    kv_heads, head_size, past_key, past_values = kv
    # a windowed cache (model.decoder.sliding_window) puts the heads first (QNN's layout)
    windowed = config.decoder.get("sliding_window") is not None
    key_shape = shapes.get(past_key) if past_key and not windowed else None
    value_shape = shapes.get(past_values[0]) if past_values else None
    checks = (
        (key_shape, 1, kv_heads, "num_key_value_heads", "KV heads"),
        (value_shape, 3, head_size, "head_size", "head size"),
    )
    for shape, axis, expected, key, what in checks:
        if shape is None or len(shape) != 4 or not expected:
            continue
        dim = shape[axis]
        if isinstance(dim, int) and dim > 0 and dim != expected:
            raise ConfigError(
                f"model.decoder.{key} gives {expected} {what} in {config.file}, but {where} "
                f"has {dim} (KV input shape {list(shape)})"
            )
    expected_vocab, width = vocab
    if config.own_vocab_size and isinstance(width, int) and width > 0 and width != expected_vocab:
        raise ConfigError(
            f"model.vocab_size is {expected_vocab} in {config.file}, but the logits of {where} "
            f"are {width} wide"
        )


def _describe_io(config: Config, session: Any, where: str | None = None) -> DecoderIO:
    inputs = session.input_dtypes
    outputs = session.output_dtypes
    output_shapes = session.output_shapes
    names_in = config.decoder.get("inputs", {})
    names_out = config.decoder.get("outputs", {})
    where = where or f"the graph {config.decoder.get('filename', 'model.onnx')}"

    def graph_input(key: str, default: str, required: bool) -> str | None:
        name = names_in.get(key, default)
        if name in inputs:
            return name
        if required or key in names_in:
            raise ConfigError(
                f"model.decoder.inputs.{key} = {name!r} is not an input of {where}; "
                f"inputs are: {', '.join(inputs)}"
            )
        return None

    def dtype_of(name: str, table: dict, what: str) -> np.dtype:
        dtype = table[name]
        allowed = _KV_DTYPES if what == "KV input" else _SUPPORTED_DTYPES
        if dtype is None or np.dtype(dtype) not in allowed:
            raise ConfigError(f"{what} {name!r} of {where} has unsupported type {dtype}")
        return np.dtype(dtype)

    input_ids = graph_input("input_ids", "input_ids", True)
    assert input_ids is not None
    mask = graph_input("attention_mask", "attention_mask", False)
    positions = graph_input("position_ids", "position_ids", False)
    logits = names_out.get("logits", "logits")
    if logits not in outputs:
        raise ConfigError(
            f"model.decoder.outputs.logits = {logits!r} is not an output of {where}; "
            f"outputs are: {', '.join(outputs)}"
        )
    num_layers = int(config.decoder.get("num_hidden_layers", 0))
    combined = "past_names" in names_in
    if combined:
        past_k = _layer_names(names_in["past_names"], num_layers)
        past_v: tuple[str, ...] = ()
        present_k = _layer_names(names_out.get("present_names", "present_%d"), num_layers)
        present_v: tuple[str, ...] = ()
    else:
        past_k = _layer_names(names_in.get("past_key_names", "past_key_values.%d.key"), num_layers)
        past_v = _layer_names(
            names_in.get("past_value_names", "past_key_values.%d.value"), num_layers
        )
        present_k = _layer_names(names_out.get("present_key_names", "present.%d.key"), num_layers)
        present_v = _layer_names(
            names_out.get("present_value_names", "present.%d.value"), num_layers
        )
    for name in (*past_k, *past_v):
        if name not in inputs:
            raise ConfigError(f"KV input {name!r} (from the config's name template) not in {where}")
    for name in (*present_k, *present_v):
        if name not in outputs:
            raise ConfigError(
                f"KV output {name!r} (from the config's name template) not in {where}"
            )
    kv_dtype = dtype_of(past_k[0], inputs, "KV input") if past_k else np.dtype(np.float32)
    kv_heads = int(
        config.decoder.get("num_key_value_heads") or config.decoder.get("num_attention_heads", 0)
    )
    head_size = int(config.decoder.get("head_size") or 0)
    if not head_size and config.decoder.get("hidden_size"):
        head_size = int(config.decoder["hidden_size"]) // int(
            config.decoder.get("num_attention_heads", 1)
        )
    logits_shape = output_shapes[logits]
    vocab = config.get("model.vocab_size")
    if vocab is None and isinstance(logits_shape[-1], int):
        vocab = logits_shape[-1]
    if vocab is None:
        raise ConfigError(f"model.vocab_size is missing in {config.file}")
    _check_graph_sizes(
        config,
        getattr(session, "input_shapes", {}),
        where,
        layers=(num_layers, None if combined else past_k, names_in),
        kv=(kv_heads, head_size, past_k[0] if past_k and not combined else None, past_v),
        vocab=(int(vocab), logits_shape[-1]),
    )
    id_dtype = dtype_of(input_ids, inputs, "input")
    mask_dtype = dtype_of(mask, inputs, "input") if mask else id_dtype
    window_size, window_layers, window_slack = _sliding_window(config, num_layers, present_k)
    return DecoderIO(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        id_dtype=id_dtype,
        mask_dtype=mask_dtype,
        logits=logits,
        logits_dtype=dtype_of(logits, outputs, "output"),
        past_keys=past_k,
        past_values=past_v,
        present_keys=present_k,
        present_values=present_v,
        combined_kv=combined,
        kv_dtype=kv_dtype,
        num_layers=num_layers,
        kv_heads=kv_heads,
        head_size=head_size,
        vocab_size=int(vocab),
        window_size=window_size,
        window_layers=window_layers,
        window_slack=window_slack,
    )


def _sliding_window(
    config: Config, num_layers: int, present_keys: tuple[str, ...]
) -> tuple[int, tuple[int, ...], int]:
    """(window, windowed layers, slack) from ``model.decoder.sliding_window`` (validated by
    `Config`); (0, (), 0) without one.

    A listed layer keeps a window-sized cache only if its GroupQueryAttention evicts by
    itself (``sliding_window_cache=1``); one exported without it (e.g. for TensorRT-RTX, which
    evicts inside the provider) keeps a full-length cache, with a warning. A listed layer's
    ``local_window_size`` must be the config's ``window_size``. Windows slid by the engine over
    the inputs and a static cache (QNN-style ``slide_inputs`` / ``slide_key_value_cache``) are
    another graph contract, run by `genai.kv.windowed_cache`: (0, (), 0) here."""
    block = config.decoder.get("sliding_window")
    if not block:
        return 0, (), 0
    if engine_slides(config):
        return 0, (), 0  # a static cache slid by the engine: genai.kv.windowed_cache
    window = int(block["window_size"])
    layers = tuple(sorted(int(i) for i in block.get("layers") or ())) or tuple(range(num_layers))
    ops = _attention_attributes(config, present_keys)
    kept, full = [], []
    for layer in layers:
        attrs = ops.get(layer)
        if attrs is None:  # no GroupQueryAttention found for it: trust the config (reference)
            kept.append(layer)
            continue
        op_window = attrs.get("local_window_size", -1)
        if op_window != window:
            raise ConfigError(
                f"model.decoder.sliding_window.window_size = {window} in {config.file}, but "
                f"layer {layer}'s GroupQueryAttention has local_window_size {op_window}"
            )
        (kept if attrs.get("sliding_window_cache", 0) == 1 else full).append(layer)
    if full:
        warnings.warn(
            f"sliding_window lists layers {full} whose GroupQueryAttention lacks "
            f"sliding_window_cache=1 ({config.file}): they keep full-length KV caches",
            stacklevel=4,
        )
    return window, tuple(kept), int(block.get("cache_slack", 0))


def _attention_attributes(config: Config, present_keys: tuple[str, ...]) -> dict[int, dict]:
    """Integer attributes of the GroupQueryAttention node writing each layer's present key, by
    layer (read from the graph without its external weights)."""
    import onnx  # lazy: `import genai` does not load onnx; only this graph reading needs it

    filename = config.decoder.get("filename", "model.onnx")
    data = config.model_data(filename)
    try:
        if data is not None:
            graph = onnx.load_model_from_string(data).graph
        else:
            path = config.resolve_file(filename, "model.decoder.filename")
            graph = onnx.load_model(str(path), load_external_data=False).graph
    except Exception:  # an unreadable graph: ORT reports it when it loads the session
        return {}
    layer_of = {name: i for i, name in enumerate(present_keys)}
    found: dict[int, dict] = {}
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or len(node.output) < 2:
            continue
        layer = layer_of.get(node.output[1])
        if layer is not None:
            found[layer] = {a.name: a.i for a in node.attribute if a.type == a.INT}
    return found


def _describe_lora_inputs(config: Config, session: NativeSession) -> dict[str, LoraInput]:
    """The graph inputs named ``...lora_A...`` / ``...lora_B...``, checked to be 2-D float
    A/B pairs whose only dynamic dimension (if any) is the rank."""
    where = f"the graph {config.decoder.get('filename', 'model.onnx')}"
    dtypes = session.input_dtypes
    shapes = session.input_shapes
    found: dict[str, LoraInput] = {}
    for name, shape in shapes.items():
        match = _LORA_NAME.search(name)
        if match is None:
            continue
        kind = match.group(1)
        partner = name[: match.start(1)] + ("B" if kind == "A" else "A") + name[match.end(1) :]
        dtype = dtypes[name]
        if dtype is None or np.dtype(dtype) not in _LORA_DTYPES:
            raise ConfigError(
                f"LoRA input {name!r} of {where} has type {dtype}; float32 or float16 expected"
            )
        if partner not in shapes:
            raise ConfigError(f"LoRA input {name!r} of {where} has no partner input {partner!r}")
        rank_axis = 1 if kind == "A" else 0
        if len(shape) != 2 or not isinstance(shape[1 - rank_axis], int) or shape[1 - rank_axis] < 0:
            layout = "[in, rank]" if kind == "A" else "[rank, out]"
            raise ConfigError(
                f"LoRA input {name!r} of {where} has shape {list(shape)}; expected {layout} "
                "with a fixed in/out size"
            )
        declared = shape[rank_axis]
        max_rank = declared if isinstance(declared, int) and declared >= 0 else None
        base_shape = list(shape)
        base_shape[rank_axis] = max_rank or 0
        base = np.zeros(base_shape, np.dtype(dtype))
        base.flags.writeable = False
        found[name] = LoraInput(
            name, kind, np.dtype(dtype), tuple(shape), rank_axis, partner, max_rank, base
        )
    return found


def _claimed_inputs(io: DecoderIO, lora: dict[str, LoraInput]) -> frozenset[str]:
    """The graph inputs genai feeds itself: ids, mask, positions, KV and LoRA weights."""
    names = {io.input_ids, io.attention_mask, io.position_ids, *io.past_keys, *io.past_values}
    return frozenset(n for n in (*names, *lora) if n is not None)


def _describe_adapter_inputs(session: Any, claimed: frozenset[str]) -> dict[str, AdapterInput]:
    """Every input and overridable initializer of ``session`` outside ``claimed``."""
    found: dict[str, AdapterInput] = {}
    for table, has_default in (
        ((session.input_dtypes, session.input_shapes), False),
        ((session.initializer_dtypes, session.initializer_shapes), True),
    ):
        dtypes, shapes = table
        for name, dtype in dtypes.items():
            if name in claimed:
                continue
            kind = np.dtype(dtype) if dtype is not None else None
            found[name] = AdapterInput(name, kind, tuple(shapes[name]), has_default)
    return found


def preset_input_values(session: Any, claimed: frozenset[str]) -> dict[str, np.ndarray]:
    """The reference's preset extra inputs of ``session``: a graph input named
    ``num_logits_to_keep`` (or ``onnx::Neg_*``, an exporter's name for it) that genai does not
    feed otherwise gets int64 ``[1]`` = 0, as the reference feeds it (in the declared integer
    type when the graph declares another). Every other unclaimed input is left unbound: ORT
    then reports it missing, as with the reference."""
    found: dict[str, np.ndarray] = {}
    for name, dtype in session.input_dtypes.items():
        if name in claimed:
            continue
        if name not in _PRESET_INPUT_NAMES and not name.startswith(_PRESET_INPUT_PREFIXES):
            continue
        kind = np.dtype(dtype) if dtype is not None else np.dtype(np.int64)
        value = np.zeros([1], kind if kind.kind in "iu" else np.int64)
        value.flags.writeable = False
        found[name] = value
    return found


def in_memory_graphs(folder: Path, graphs: list[bytes]) -> tuple[list[bytes], str] | None:
    """``graphs`` (serialized models of the folder's files, rewritten in memory) and the folder
    onnxruntime reads their external data from: the model folder, or, where its files link out
    of it (a Hugging Face cache's snapshot links into ``blobs/``, which onnxruntime refuses for
    a model given as bytes), the one folder every linked file is in, with each initializer's
    ``location`` renamed to its file there. None when the files are in several folders or
    missing."""
    inside = folder.resolve()
    locations = set().union(*(wire.external_locations(graph) for graph in graphs))
    targets = {name: (folder / name).resolve() for name in locations}
    if all(target.is_relative_to(inside) for target in targets.values()):
        return graphs, str(inside)
    parents = {target.parent for target in targets.values()}
    if len(parents) != 1 or not all(target.is_file() for target in targets.values()):
        log.debug("%s: external data in several folders; graphs not rewritten", folder)
        return None
    renamed = {name: target.name for name, target in targets.items()}
    return [wire.relocated(graph, renamed) for graph in graphs], str(parents.pop())


def _host_ops(
    graph: bytes, level: int, prompts_only: bool = False, threads: int = 0
) -> bytes | None:
    """``graph`` with genai's CPU ops in place of what they replace: long prompts' attention in
    chunks (`genai.runtime.chunked_attention`), per-row quantisations fused
    (`genai.runtime.row_quantization`), LoRA branches' MatMuls that verify runs can run row by
    row (`genai.runtime.lora_rows`) and, in a graph that only runs prompts
    (``prompts_only``: a run-length split's long branch), the MLP's gated SiLU products fused
    (`genai.runtime.gated_silu`; at graph optimisation ``level`` 2 and above, where onnxruntime
    makes the QuickGelu it keeps): it saves memory passes over many rows and costs a decode
    step a few percent. None when none applies (or all are turned off). ``threads``: the
    session's intra-op threads (where given, single attention rows may run genai's kernel:
    `genai.runtime.decode_attention`)."""
    rewritten = None
    if chunked_attention.enabled():
        rewritten = chunk_attention(graph, threads=threads)
    if row_quantization.enabled():
        rewritten = fuse_row_quantization(rewritten or graph) or rewritten
    if lora_rows.enabled():
        rewritten = lora_rows.single_rows_lora(rewritten or graph) or rewritten
    if prompts_only and gated_silu.enabled() and level >= _OPT_LEVELS["ORT_ENABLE_EXTENDED"]:
        rewritten = fuse_gated_silu(rewritten or graph) or rewritten
    return rewritten


def _small_graph(path: Path) -> bytes | None:
    """The bytes of the graph file at ``path`` to rewrite in memory: a large file's (weights
    inside it) with its weights read from the file in place (`outlined_weights.outlined`);
    None when even that is too large or the file cannot be read."""
    try:
        if path.stat().st_size > _TRIM_MAX_BYTES:
            return outlined(path, _TRIM_MAX_BYTES)
        return path.read_bytes()
    except OSError:
        return None


def _with_host_ops(
    path: Path, graph: bytes, from_file: bool, level: int, threads: int = 0
) -> tuple[bytes, str | None] | None:
    """``graph`` with genai's CPU ops (`_host_ops` at optimisation ``level``) and, for the
    bytes of the file at ``path`` (``from_file``), the folder its external data is read from
    (`in_memory_graphs`; else None: where the given graph's already is); None when no rewrite
    applies."""
    rewritten = _host_ops(graph, level, threads=threads)
    if rewritten is None or not from_file:
        return None if rewritten is None else (rewritten, None)
    moved = in_memory_graphs(path.parent, [rewritten])
    if moved is None:
        return None
    (rewritten,), folder = moved
    return rewritten, folder


def _trimmed(path: Path, data: bytes, from_file: bool, config: Config) -> TrimmedLogits | None:
    """The trimmed graph (`genai.runtime.trimmed_logits`) of the decoder ``data``: the bytes of
    the file at ``path`` (``from_file``: its external data then placed by `in_memory_graphs`) or
    of a model given as bytes (its external data in the model folder); or None: turned off
    (``GENAI_TRIM_LOGITS=0``), a graph the rewrite does not apply to, or external data in
    several folders."""
    if os.environ.get("GENAI_TRIM_LOGITS", "1") == "0":
        return None
    names_in = config.decoder.get("inputs", {})
    names_out = config.decoder.get("outputs", {})
    trimmed = trim_logits(
        data,
        logits=names_out.get("logits", "logits"),
        mask=names_in.get("attention_mask", "attention_mask"),
    )
    if trimmed is not None and from_file:
        moved = in_memory_graphs(path.parent, [trimmed.graph, trimmed.head])
        if moved is None:
            return None
        (graph, head), folder = moved
        trimmed = replace(trimmed, graph=graph, head=head, data_folder=folder)
    if trimmed is not None:
        log.debug("%s: runs of more than %d tokens compute their last two rows' logits", path,
                  trimmed.above)  # fmt: skip
    return trimmed


def extra_output_names(io: DecoderIO, session: Any) -> tuple[str, ...]:
    """The outputs of ``session`` that are neither the logits nor a KV present."""
    known = {io.logits, *io.present_keys, *io.present_values}
    return tuple(name for name in session.output_dtypes if name not in known)


def _layer_names(template: str, num_layers: int) -> tuple[str, ...]:
    if "%d" not in template:
        raise ConfigError(f"name template {template!r} must contain %d (the layer index)")
    return tuple(template.replace("%d", str(i)) for i in range(num_layers))
