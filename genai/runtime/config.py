"""`genai_config.json`: parsing, validation and the reference's provider-editing API.

The schema follows onnxruntime-genai's config (see ``docs/config.md``). Every key is checked
against it: an unknown key is an error naming its dotted path and the file, or a warning with
``strict=False``. Values keep their JSON types; :meth:`Config.get` reads them by dotted path.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from genai.compat.unsupported import FEATURES, Feature
from genai.errors import (
    ArgumentTypeError,
    ConfigError,
    ModelError,
    ModelFileNotFoundError,
    check_type,
)

__all__ = [
    "CONFIG_FILENAME",
    "REFERENCE_DEFAULTS",
    "SCHEMA",
    "SPECULATIVE_RANGES",
    "UNSUPPORTED_KEYS",
    "Config",
    "is_model_package",
    "normalize_provider_name",
    "speculative_range_error",
]

CONFIG_FILENAME = "genai_config.json"

# --- schema -------------------------------------------------------------------------------------
# The keys onnxruntime-genai 0.18 accepts, with its types (tests/test_config_schema.py checks each
# against the installed reference). A leaf is a tuple of accepted Python types. A dict is a
# nested object; its "*" entry, when present, is the schema of any other key. `ANY_STRINGS` is an
# object whose keys are free and whose values are strings (ORT config entries, run options).
# `OPAQUE` is accepted without looking inside. Others are the marker classes below.
_STR = (str,)
_INT = (int,)  # a JSON number with an integral value (the reference rejects 1.5 there)
_NUM = (int, float)
_BOOL = (bool,)
ANY_STRINGS = "any-strings"
OPAQUE = "opaque"


class _ListOf:
    """A JSON array whose items follow ``item``."""

    def __init__(self, item: Any) -> None:
        self.item = item


class _IntOrList:
    """An integer, or an array of integers (``eos_token_id``)."""


class _Stages:
    """The reference's pipeline: ``[{stage: {...}, ...}, ...]`` (stages in order, several per
    object allowed) or one ``{stage: {...}, ...}`` object; each stage follows ``stage``."""

    def __init__(self, stage: dict[str, Any], require_filename: bool) -> None:
        self.stage = stage
        self.require_filename = require_filename


class _ProviderOptions:
    """``[{provider name: {option: "value", ..., "device_filtering_options": {...}}}, ...]``."""


class _LayerIndices(_ListOf):
    """``sliding_window.layers``: a list whose items `Config` checks as layer indices."""

    def __init__(self) -> None:
        super().__init__(_INT)


_PROVIDER_OPTIONS = _ProviderOptions()
_INT_OR_LIST = _IntOrList()
_STRINGS = _ListOf(_STR)
_INTS = _ListOf(_INT)

#: ``device_filtering_options`` of one provider (how the reference picks an EP device).
_DEVICE_FILTERING: dict[str, Any] = {
    "hardware_device_type": _STR,  # "cpu", "gpu" or "npu", any case
    "hardware_device_id": _NUM,
    "hardware_vendor_id": _NUM,
}
_HARDWARE_DEVICE_TYPES = ("cpu", "gpu", "npu")

_SESSION_OPTIONS: dict[str, Any] = {
    "log_id": _STR,
    "enable_profiling": _STR,
    "intra_op_num_threads": _INT,
    "inter_op_num_threads": _INT,
    "log_severity_level": _INT,
    "log_verbosity_level": _INT,
    "enable_cpu_mem_arena": _BOOL,
    "enable_mem_pattern": _BOOL,
    "graph_optimization_level": _STR,
    "custom_ops_library": _STR,
    "provider_options": _PROVIDER_OPTIONS,
    # Any other string-valued key becomes an ORT session config entry.
    "*": _STR,
}

_SHARED_INITIALIZER: dict[str, Any] = {
    "name": _STR,
    "data_file": _STR,
    "offset": _STR,
    "length": _STR,
    "data_type": _INT,
    "shape": _INTS,
}


def _names(*keys: str) -> dict[str, Any]:
    """An ``inputs`` / ``outputs`` object: graph names (strings) by role."""
    return dict.fromkeys(keys, _STR)


def _graph(*, filename: bool = True, **fields: Any) -> dict[str, Any]:
    """A section that names one ONNX file with its own session and run options."""
    section: dict[str, Any] = {"session_options": _SESSION_OPTIONS, "run_options": ANY_STRINGS}
    if filename:
        section["filename"] = _STR
    section.update(fields)
    return section


_DECODER_INPUTS = _names(
    "input_ids",
    "inputs_embeds",
    "attention_mask",
    "position_ids",
    "past_key_names",
    "past_value_names",
    "past_names",
    "cross_past_key_names",
    "cross_past_value_names",
    "past_sequence_length",
    "current_sequence_length",
    "total_sequence_length",
    "encoder_hidden_states",
    "encoder_attention_mask",
    "rnn_states_prev",
    "past_key_values_length",
    "cache_indirection",
    "cumulative_sequence_lengths",
    "past_sequence_lengths",
    "block_table",
    "block_table_windowed",
    "attention_metadata",
    "logits_indices",
    "past_key_scale_names",
    "past_value_scale_names",
    "past_conv_names",
    "past_recurrent_names",
    "state_update_capture_count",
    "state_update_active",
    "hidden_states",
    "targets",
    "targets_length",
    "lstm_hidden_state",
    "lstm_cell_state",
    "per_layer_inputs",
)

_DECODER_OUTPUTS = _names(
    "logits",
    "present_key_names",
    "present_value_names",
    "present_names",
    "present_key_scale_names",
    "present_value_scale_names",
    "output_cross_qk_names",
    "rnn_states",
    "present_conv_names",
    "present_recurrent_names",
    "state_update_conv_value_names",
    "state_update_recurrent_capsule_names",
    "hidden_states",
    "aux_hidden_states",
    "outputs",
    "outputs_length",
    "lstm_hidden_state",
    "lstm_cell_state",
)

_SLIDING_WINDOW = {
    "window_size": _INT,
    "pad_value": _INT,
    "alignment": _STR,
    "slide_key_value_cache": _BOOL,
    "slide_inputs": _BOOL,
    "layers": _LayerIndices(),
    "cache_slack": _INT,
}

#: One stage of ``model.decoder.pipeline`` (see `genai.generation.pipeline`).
_PIPELINE_STAGE: dict[str, Any] = _graph(
    inputs=_STRINGS,
    outputs=_STRINGS,
    output_names_forwarder=ANY_STRINGS,
    run_on_prompt=_BOOL,
    run_on_token_gen=_BOOL,
    is_lm_head=_BOOL,
    inherit_session_options=_BOOL,
    reset_session_idx=_INT,
)

#: One entry of ``model.decoder.state_groups`` (the reference's paged / hybrid state layout:
#: ``kind`` is paged_kv, fixed_conv, fixed_recurrent or fixed).
_STATE_GROUP: dict[str, Any] = {
    "kind": _STR,
    "layer_ids": _INTS,
    "bindings": OPAQUE,
    "state_update": {"enabled": _BOOL, "capsule": _STR, "key_head_count": _INT},
}

_DECODER: dict[str, Any] = _graph(
    hidden_size=_INT,
    num_attention_heads=_INT,
    num_key_value_heads=_INT,
    num_hidden_layers=_INT,
    head_size=_INT,
    conv_cache_size=_INT,
    state_update_capacity=_INT,
    inputs=_DECODER_INPUTS,
    outputs=_DECODER_OUTPUTS,
    sliding_window=_SLIDING_WINDOW,
    pipeline=_Stages(_PIPELINE_STAGE, require_filename=True),
    layer_types=_STRINGS,
    shared_initializers=_ListOf(_SHARED_INITIALIZER),
    state_groups=_ListOf(_STATE_GROUP),
)

_ENCODER = _graph(
    hidden_size=_INT,
    num_attention_heads=_INT,
    num_hidden_layers=_INT,
    num_key_value_heads=_INT,
    head_size=_INT,
    inputs=_names(
        "input_ids",
        "inputs_embeds",
        "attention_mask",
        "position_ids",
        "audio_features",
        "input_lengths",
        "cache_last_channel",
        "cache_last_time",
        "cache_last_channel_len",
        "lang_id",
    ),
    outputs=_names(
        "encoder_hidden_states",
        "encoder_outputs",
        "output_lengths",
        "cache_last_channel_next",
        "cache_last_time_next",
        "cache_last_channel_len_next",
        "cross_present_key_names",
        "cross_present_value_names",
    ),
)

_VISION = _graph(
    config_filename=_STR,
    adapter_filename=_STR,
    spatial_merge_size=_INT,
    tokens_per_second=_NUM,
    patch_size=_INT,
    num_visual_tokens=_INT,
    max_num_patches=_INT,
    window_size=_INT,
    inputs=_names(
        "pixel_values", "pixel_position_ids", "image_sizes", "image_grid_thw", "attention_mask"
    ),
    outputs=_names("image_features"),
    pipeline=_Stages(
        _graph(inputs=_STRINGS, outputs=_STRINGS, run_on_cpu=_BOOL), require_filename=False
    ),
)

_SPEECH = _graph(
    config_filename=_STR,
    adapter_filename=_STR,
    inputs=_names(
        "audio_embeds", "attention_mask", "audio_sizes", "audio_lengths", "audio_projection_mode"
    ),
    outputs=_names("audio_features"),
)

_EMBEDDING = _graph(
    prefault=_BOOL,
    inputs=_names("input_ids", "image_features", "audio_features"),
    outputs=_names("inputs_embeds", "per_layer_inputs"),
)

_JOINER = _graph(
    inputs=_names("encoder_outputs", "decoder_outputs"),
    outputs=_names("logits"),
)

_VAD = _graph(threshold=_NUM, silence_duration_ms=_INT, prefix_padding_ms=_INT)

_MTP = _graph(
    shared_initializers=_ListOf(_SHARED_INITIALIZER),
    enabled=_BOOL,
    num_hidden_layers=_INT,
    num_key_value_heads=_INT,
    head_size=_INT,
    main_hidden_states=_STR,
    inputs=_names(
        "input_ids",
        "hidden_states",
        "attention_mask",
        "position_ids",
        "past_key_names",
        "past_value_names",
    ),
    outputs=_names("logits", "hidden_states", "present_key_names", "present_value_names"),
)

#: The reference's block drafters (``model.dflash2``, ``model.dspark``): the same keys.
_BLOCK_DRAFTER = _graph(
    shared_initializers=_ListOf(_SHARED_INITIALIZER),
    num_hidden_layers=_INT,
    num_key_value_heads=_INT,
    head_size=_INT,
    block_size=_INT,
    num_draft_tokens=_INT,
    mask_token_id=_INT,
    selector_top_k=_INT,
    sliding_window=_INT,
    independent_sampling=_BOOL,
    sampled_proposal=_STR,  # none, greedy_path, independent or lattice
    sampling_temperature=_NUM,
    sampling_top_p=_NUM,
    sampling_min_p=_NUM,
    main_aux_hidden_states=_STR,
    aux_hidden_state_layers=_INTS,
    inputs=_names(
        "input_ids",
        "inputs_embeds",
        "past_key_names",
        "past_value_names",
        "past_key_scale_names",
        "past_value_scale_names",
        "cumulative_sequence_lengths",
        "past_sequence_lengths",
        "block_table",
        "attention_metadata",
        "block_row_index",
        "q_row_map",
        "qkv_row_map",
        "aux_hidden_states",
    ),
    outputs=_names(
        "present_key_names",
        "present_value_names",
        "present_key_scale_names",
        "present_value_scale_names",
        "candidate_ids",
        "scores",
    ),
)

# Moonshine streaming ASR: the graphs' input and output names cannot all be read back from
# the reference (they are compared inline in its binary), so those objects take any names.
_MOONSHINE_GRAPH = {"inputs": ANY_STRINGS, "outputs": ANY_STRINGS}
_MOONSHINE: dict[str, Any] = {
    "frontend_filename": _STR,
    "encoder_filename": _STR,
    "adapter_filename": _STR,
    "cross_kv_filename": _STR,
    "decoder_kv_filename": _STR,
    "encoder": _MOONSHINE_GRAPH,
    "adapter": _MOONSHINE_GRAPH,
    "cross_kv": _MOONSHINE_GRAPH,
    "decoder_kv": _MOONSHINE_GRAPH,
    "max_seq_len": _NUM,
    "tokens_per_second": _NUM,
    "seconds_per_memory_frame": _NUM,
    "max_segment_memory_frames": _NUM,
    "min_segment_memory_frames": _NUM,
    "left_context_frames": _NUM,
    "total_lookahead": _NUM,
    "sample_buffer_size": _NUM,
    "conv1_buffer_size": _NUM,
    "conv2_buffer_size": _NUM,
}

_AUDIO_OUTPUT: dict[str, Any] = {
    "num_codebooks": _INT,
    "codebook_size": _INT,
    "audio_start_token_id": _INT,
    "text_end_token_id": _INT,
    "interleaved_n_text": _INT,
    "interleaved_n_audio": _INT,
    "depthformer": {"filename": _STR, "session_options": _SESSION_OPTIONS},
    "embedding": {"filename": _STR, "session_options": _SESSION_OPTIONS},
}

_MODEL: dict[str, Any] = {
    "type": _STR,
    "tokenizer_dir": _STR,
    "context_length": _INT,
    "vocab_size": _INT,
    "bos_token_id": _INT,
    "pad_token_id": _INT,
    "eos_token_id": _INT_OR_LIST,
    "sep_token_id": _INT,
    "decoder_start_token_id": _INT,
    "image_token_id": _INT,
    "audio_token_id": _INT,
    "boa_token_id": _INT,
    "video_token_id": _INT,
    "vision_start_token_id": _INT,
    # tool-call and reasoning delimiters (see Tokenizer.bot_token_id)
    "bot_token_id": _INT,
    "eot_token_id": _INT,
    "bor_token_id": _INT,
    "eor_token_id": _INT,
    # streaming speech recognition (RNNT / TDT models)
    "num_mels": _INT,
    "fft_size": _INT,
    "hop_length": _INT,
    "win_length": _INT,
    "preemph": _NUM,
    "log_eps": _NUM,
    "norm_eps": _NUM,
    "subsampling_factor": _INT,
    "left_context": _INT,
    "conv_context": _INT,
    "pre_encode_cache_size": _INT,
    "sample_rate": _INT,
    "chunk_samples": _INT,
    "blank_id": _INT,
    "max_symbols_per_step": _INT,
    "left_context_samples": _INT,
    "right_context_samples": _INT,
    "tdt_durations": _INTS,
    # the graphs
    "decoder": _DECODER,
    "draft": _DECODER,
    "encoder": _ENCODER,
    "vision": _VISION,
    "speech": _SPEECH,
    "embedding": _EMBEDDING,
    "joiner": _JOINER,
    "vad": _VAD,
    "mtp": _MTP,
    "dflash2": _BLOCK_DRAFTER,
    "dspark": _BLOCK_DRAFTER,
    "moonshine": _MOONSHINE,
    "audio_output": _AUDIO_OUTPUT,
}

_SEARCH = {
    "do_sample": _BOOL,
    "min_length": _INT,
    "max_length": _INT,
    "batch_size": _INT,
    "num_beams": _INT,
    "num_return_sequences": _INT,
    "top_k": _INT,
    "top_p": _NUM,
    "temperature": _NUM,
    "repetition_penalty": _NUM,
    "length_penalty": _NUM,
    "early_stopping": _BOOL,
    "no_repeat_ngram_size": _INT,
    "diversity_penalty": _NUM,
    "past_present_share_buffer": _BOOL,
    "random_seed": _INT,
    # The reference takes any number (> 0 enables chunked prefill); genai wants a whole one.
    "chunk_size": _INT,
    # options of speech and audio-output models
    "blank_penalty": _NUM,
    "audio_interleaved": _BOOL,
    "audio_temperature": _NUM,
    "audio_top_k": _INT,
}

_SPECULATIVE = {
    "max_draft_tokens": _INT,
    "ngram_size": _INT,
    "ngram_chained_lookup": _BOOL,
    "min_adaptive_k": _INT,
    "cooldown": _BOOL,
}

#: The integer ``speculative`` options' ranges, as the reference checks them: name -> (0 also
#: allowed (off), lowest, highest).
SPECULATIVE_RANGES: dict[str, tuple[bool, int, int]] = {
    "ngram_size": (True, 2, 16),
    "max_draft_tokens": (False, 1, 16),
    "min_adaptive_k": (True, 1, 16),
}


def speculative_range_error(name: str, value: Any) -> str | None:
    """The reference's message for ``speculative.<name>`` = ``value`` out of its range
    (`SPECULATIVE_RANGES`), or None when it is in range (or absent)."""
    if value is None or name not in SPECULATIVE_RANGES:
        return None
    zero_ok, low, high = SPECULATIVE_RANGES[name]
    if (zero_ok and value == 0) or low <= value <= high:
        return None
    if zero_ok:
        return f"speculative.{name} must be 0 or between {low} and {high}. Got: {value}."
    return f"speculative.{name} must be between {low} and {high} Got: {value}."


_ENGINE = {
    "dynamic_batching": {
        "block_size": _INT,
        "num_blocks": _INT,
        "gpu_utilization_factor": _NUM,
        "max_batch_size": _INT,
        "max_scheduled_tokens": _INT,
        "prefix_caching": _BOOL,
        "dflash2_max_snapshots": _INT,
    },
    "static_batching": {"max_batch_size": _INT},
}

_SECTIONS: dict[str, Any] = {
    "model": _MODEL,
    "search": _SEARCH,
    "speculative": _SPECULATIVE,
    "engine": _ENGINE,
}

#: One of the reference's ``runtime_profiles``: an overlay of the sections above, applied
#: when the device's memory is in the ``eligibility`` ranges (CUDA only).
_RUNTIME_PROFILE: dict[str, Any] = {
    "id": _STR,
    "eligibility": {
        "minimum_total_device_memory_bytes": _NUM,
        "maximum_total_device_memory_bytes": _NUM,
        "minimum_free_device_memory_bytes": _NUM,
        "maximum_free_device_memory_bytes": _NUM,
        "is_integrated": _BOOL,
    },
    "overlay": _SECTIONS,
}

#: The whole document. Scalars at the top level are ignored, as the reference ignores them.
SCHEMA: dict[str, Any] = {**_SECTIONS, "runtime_profiles": _ListOf(_RUNTIME_PROFILE)}

#: The reference's values for keys a folder leaves out (the ones with a value of their own;
#: any other number is 0, string "" and list []). ``search.max_length`` 0 means
#: ``model.context_length``; an empty ``model.eos_token_id`` means ``[pad_token_id]``.
#: ``model.bot_token_id`` and the other three delimiters have none (see
#: `genai.text.tokenizer.DELIMITER_TOKEN_DEFAULTS`).
REFERENCE_DEFAULTS: dict[str, Any] = {
    "search.do_sample": False,
    "search.min_length": 0,
    "search.max_length": 0,
    "search.batch_size": 1,
    "search.num_beams": 1,
    "search.num_return_sequences": 1,
    "search.top_k": 50,
    "search.top_p": 0.0,
    "search.temperature": 1.0,
    "search.repetition_penalty": 1.0,
    "search.length_penalty": 1.0,
    "search.early_stopping": True,
    "search.no_repeat_ngram_size": 0,
    "search.diversity_penalty": 0.0,
    "search.past_present_share_buffer": False,
    "search.random_seed": -1,
    "search.blank_penalty": 0.0,
    "speculative.max_draft_tokens": 4,
    "speculative.ngram_size": 0,
    "speculative.ngram_chained_lookup": False,
    "speculative.min_adaptive_k": 0,
    "speculative.cooldown": False,
    "engine.dynamic_batching.block_size": 256,
    "engine.dynamic_batching.max_batch_size": 16,
    "engine.dynamic_batching.max_scheduled_tokens": 2048,
    "engine.static_batching.max_batch_size": 4,
    "model.decoder.inputs.input_ids": "input_ids",
    "model.decoder.inputs.inputs_embeds": "inputs_embeds",
    "model.decoder.inputs.attention_mask": "attention_mask",
    "model.decoder.inputs.position_ids": "position_ids",
    "model.decoder.inputs.past_key_names": "past_key_values.%d.key",
    "model.decoder.inputs.past_value_names": "past_key_values.%d.value",
    "model.decoder.outputs.logits": "logits",
    "model.decoder.outputs.present_key_names": "present.%d.key",
    "model.decoder.outputs.present_value_names": "present.%d.value",
    "model.decoder.sliding_window.alignment": "right",
    "model.decoder.sliding_window.slide_key_value_cache": True,
    "model.decoder.sliding_window.slide_inputs": True,
    "model.decoder.sliding_window.cache_slack": 0,
    "model.decoder.pipeline.run_on_prompt": True,
    "model.decoder.pipeline.run_on_token_gen": True,
    "model.decoder.pipeline.is_lm_head": False,
    "model.decoder.pipeline.inherit_session_options": False,
    "model.decoder.pipeline.reset_session_idx": -1,
    "model.mtp.num_hidden_layers": 1,
    "model.mtp.main_hidden_states": "hidden_states",
    "model.vision.spatial_merge_size": 2,
    "model.vision.tokens_per_second": 2.0,
    "model.vision.patch_size": 14,
    "model.vision.config_filename": "processor_config.json",
    "model.speech.config_filename": "audio_processor_config.json",
    "model.vad.threshold": 0.5,
    "model.vad.silence_duration_ms": 500,
    "model.vad.prefix_padding_ms": 300,
}

# --- features genai does not run yet --------------------------------------------------------------
_SPECULATIVE_FEATURE = FEATURES["speculative"]
_PAGED = Feature(
    "paged-KV engine models (block tables, per-request lengths and state groups fed by the "
    "reference's Engine)",
    "not planned yet; og.Engine and `genai serve` batch over per-sequence caches",
)
_CROSS_ATTENTION = Feature(
    "cross-attention QK outputs of encoder-decoder models (Whisper alignment heads)",
    "not planned yet",
)
_MARIAN = Feature(
    "Marian-style encoder-decoder models with recurrent decoder state", "not planned yet"
)
_QUANTIZED_KV = Feature(
    "quantized KV caches (per-layer key/value scale tensors)", "not planned yet"
)
_HYBRID = Feature(
    "hybrid decoders with convolution or recurrent state (LFM2, Qwen3.5 linear attention)",
    "not planned yet",
)
_FED = Feature(
    "decoders fed by another graph (per-layer inputs, hidden-state inputs of MTP heads)",
    "not planned yet",
)
_TRANSDUCER = Feature(
    "transducer decoders (RNNT / TDT speech recognition)", FEATURES["speech"].plan
)
_SHARED_INITIALIZERS = Feature(
    "initializers shared between sessions (model.*.shared_initializers)", "not planned yet"
)
_RUNTIME_PROFILES = Feature(
    "runtime profiles (config overlays chosen by the device's memory, CUDA only)",
    "not planned yet",
)
_AUDIO_SEARCH = Feature("search options of speech and audio-output models", FEATURES["speech"].plan)

#: Keys the reference accepts whose presence changes what it runs, and genai does not run yet:
#: `Config.check_supported` refuses a folder that has one (a `Model` calls it when loading).
UNSUPPORTED_KEYS: dict[str, Feature] = {
    "runtime_profiles": _RUNTIME_PROFILES,
    "model.dflash2": _SPECULATIVE_FEATURE,
    "model.dspark": _SPECULATIVE_FEATURE,
    "model.decoder.shared_initializers": _SHARED_INITIALIZERS,
    "model.decoder.state_groups": _PAGED,
    "model.decoder.conv_cache_size": _HYBRID,
    "model.decoder.state_update_capacity": _HYBRID,
    **{
        f"model.decoder.inputs.{key}": feature
        for feature, keys in (
            (_PAGED, ["block_table", "block_table_windowed", "cumulative_sequence_lengths"]),
            (_PAGED, ["past_sequence_lengths", "attention_metadata", "logits_indices"]),
            (_MARIAN, ["rnn_states_prev"]),
            (_QUANTIZED_KV, ["past_key_scale_names", "past_value_scale_names"]),
            (_HYBRID, ["past_conv_names", "past_recurrent_names"]),
            (_HYBRID, ["state_update_capture_count", "state_update_active"]),
            (_FED, ["per_layer_inputs"]),
            (_TRANSDUCER, ["targets", "targets_length", "lstm_hidden_state", "lstm_cell_state"]),
        )
        for key in keys
    },
    **{
        f"model.decoder.outputs.{key}": feature
        for feature, keys in (
            (_CROSS_ATTENTION, ["output_cross_qk_names"]),
            (_MARIAN, ["rnn_states"]),
            (_QUANTIZED_KV, ["present_key_scale_names", "present_value_scale_names"]),
            (_HYBRID, ["present_conv_names", "present_recurrent_names"]),
            (_HYBRID, ["state_update_conv_value_names", "state_update_recurrent_capsule_names"]),
            (_TRANSDUCER, ["outputs", "outputs_length", "lstm_hidden_state", "lstm_cell_state"]),
        )
        for key in keys
    },
    **{
        f"search.{key}": _AUDIO_SEARCH
        for key in ("blank_penalty", "audio_interleaved", "audio_temperature", "audio_top_k")
    },
}

# Canonical provider names, as the reference normalises them (case-insensitive, with or
# without the "ExecutionProvider" suffix). Unknown names pass through unchanged.
_PROVIDER_ALIASES = {
    "cpu": "cpu",
    "cuda": "cuda",
    "qnn": "QNN",
    "webgpu": "WebGPU",
    "dml": "DML",
    "directml": "DML",
    "openvino": "OpenVINO",
    "vitisai": "VitisAI",
    "nvtensorrtrtx": "NvTensorRtRtx",
}


def normalize_provider_name(name: str) -> str:
    """Return the canonical spelling of an execution provider name (``"CUDAExecutionProvider"``
    -> ``"cuda"``, ``"dml"`` -> ``"DML"``); unknown names are returned unchanged."""
    lower = name.lower()
    suffix = "executionprovider"
    if lower.endswith(suffix) and len(lower) > len(suffix):
        lower = lower[: -len(suffix)]
    return _PROVIDER_ALIASES.get(lower, name)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in types)


class _Validator:
    """Walks a JSON document against `SCHEMA`, collecting problems with their dotted paths."""

    def __init__(self, source: str, strict: bool) -> None:
        self.source = source
        self.strict = strict

    def _unknown(self, path: str) -> None:
        message = f"unknown key {path!r} in {self.source}"
        if self.strict:
            raise ConfigError(message)
        warnings.warn(message, stacklevel=4)

    def document(self, value: Any) -> dict[str, Any]:
        """Check a whole document; return it without its top-level scalars (the reference
        ignores those)."""
        self._object(value, "")
        kept = {k: v for k, v in value.items() if isinstance(v, dict | list)}
        self.check(kept, SCHEMA, "")
        return kept

    def check(self, value: Any, schema: Any, path: str) -> None:
        if schema == OPAQUE:
            return
        if schema == ANY_STRINGS:
            self._object(value, path)
            for key, item in value.items():
                self._leaf(item, _STR, f"{path}.{key}")
        elif isinstance(schema, _ProviderOptions):
            self._provider_options(value, path)
        elif isinstance(schema, _Stages):
            self._stages(value, schema, path)
        elif isinstance(schema, _LayerIndices):
            if not isinstance(value, list):
                raise ConfigError(f"{path} in {self.source} must be a list, got {value!r}")
        elif isinstance(schema, _ListOf):
            items = (
                {_STR: "strings", _INT: "integers"}.get(schema.item, "objects")
                if isinstance(schema.item, tuple)
                else "objects"
            )
            if not isinstance(value, list):
                raise ConfigError(
                    f"{path} in {self.source} must be a list of {items}, got {value!r}"
                )
            for index, item in enumerate(value):
                if isinstance(schema.item, tuple):
                    try:
                        self._leaf(item, schema.item, f"{path}[{index}]")
                    except ConfigError:
                        raise ConfigError(
                            f"{path} in {self.source} must be a list of {items}, got {value!r}"
                        ) from None
                else:
                    self.check(item, schema.item, f"{path}[{index}]")
        elif isinstance(schema, _IntOrList):
            if isinstance(value, list):
                self.check(value, _INTS, path)
            else:
                self._leaf(value, _INT, path)
        elif isinstance(schema, tuple):
            self._leaf(value, schema, path)
        else:
            self._object(value, path)
            for key, item in value.items():
                child_path = f"{path}.{key}" if path else key
                if key in schema:
                    self.check(item, schema[key], child_path)
                elif "*" in schema:
                    self.check(item, schema["*"], child_path)
                else:
                    self._unknown(child_path)

    def _object(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise ConfigError(
                f"{path or 'the document'} in {self.source} must be an object, "
                f"got {type(value).__name__}"
            )

    def _leaf(self, value: Any, types: tuple[type, ...], path: str) -> None:
        # JSON has one number type: 2.0 is accepted where an int is expected; True is not a number.
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok and int in types and isinstance(value, float) and value.is_integer():
            ok = True
        if not ok:
            raise ConfigError(
                f"{path} in {self.source} must be {_type_names(types)}, "
                f"got {type(value).__name__} {value!r}"
            )

    def _stages(self, value: Any, schema: _Stages, path: str) -> None:
        """``[{stage: {...}, ...}, ...]`` or one ``{stage: {...}, ...}`` object, as the
        reference parses a pipeline; each stage checked against ``schema.stage``."""
        if not isinstance(value, list | dict):
            raise ConfigError(f"{path} in {self.source} must be a list of {{stage: {{...}}}}")
        groups = value if isinstance(value, list) else [value]
        seen: set[str] = set()
        for index, group in enumerate(groups):
            where = f"{path}[{index}]" if isinstance(value, list) else path
            self._object(group, where)
            for name, stage in group.items():
                stage_path = f"{where}.{name}"
                if name in seen:
                    raise ConfigError(f"{stage_path} in {self.source}: stage {name!r} twice")
                seen.add(name)
                self.check(stage, schema.stage, stage_path)
                if schema.require_filename and "filename" not in stage:
                    raise ConfigError(f"{stage_path}.filename is required in {self.source}")

    def _provider_options(self, value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise ConfigError(f"{path} in {self.source} must be a list of {{name: {{...}}}}")
        for index, entry in enumerate(value):
            item_path = f"{path}[{index}]"
            if not isinstance(entry, dict):
                raise ConfigError(
                    f"{item_path} in {self.source} must be an object of {{provider name: "
                    f"{{...}}}}, got {type(entry).__name__}"
                )
            for name, options in entry.items():
                self._provider_entry(name, options, f"{item_path}.{name}")
        # One entry per provider, as the reference keeps them: an object naming several
        # providers is split, one naming none dropped, a name given twice merged.
        merged: dict[str, dict[str, Any]] = {}
        for entry in value:
            for name, options in entry.items():
                merged.setdefault(name, {}).update(options)
        value[:] = [{name: options} for name, options in merged.items()]

    def _provider_entry(self, name: str, options: Any, where: str) -> None:
        self._object(options, where)
        for key, option in options.items():
            option_path = f"{where}.{key}"
            if key == _DEVICE_FILTERING_KEY and isinstance(option, dict):
                self.check(option, _DEVICE_FILTERING, option_path)
                kind = option.get("hardware_device_type")
                if kind is not None:
                    _hardware_device_type(kind, f"{option_path}.hardware_device_type")
                continue
            self._leaf(option, _STR, option_path)


_DEVICE_FILTERING_KEY = "device_filtering_options"


def _hardware_device_type(value: str, what: str) -> str:
    """``value`` checked as the reference's hardware device type (cpu, gpu, npu; any case)."""
    if not isinstance(value, str) or value.lower() not in _HARDWARE_DEVICE_TYPES:
        raise ConfigError(
            f"{what}: unsupported hardware device type {value!r}; expected one of "
            f"{', '.join(_HARDWARE_DEVICE_TYPES)} (any case)"
        )
    return value


def _hardware_id(value: int, what: str) -> int:
    """``value`` checked as a hardware device or vendor id (an unsigned 32-bit integer)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise ConfigError(f"{what} must be an integer in [0, 2**32), got {value!r}")
    return value


def is_model_package(path: Path) -> bool:
    """A model package as the reference tells one: a folder with ``manifest.json`` and no
    ``genai_config.json`` at its root."""
    return (
        path.is_dir()
        and (path / "manifest.json").is_file()
        and not (path / CONFIG_FILENAME).exists()
    )


def _package_error(path: Path) -> NotImplementedError:
    return NotImplementedError(
        f"{str(path)!r} is a model package (manifest.json with a variant per execution "
        "provider): model packages are not supported by genai yet; load a variant's folder "
        f"(the one holding its {CONFIG_FILENAME}) with Config(path) instead"
    )


def _link_roots(folder: Path) -> list[Path]:
    """Where a model file in ``folder`` (resolved) may live once its symlinks are followed: the
    folder itself, plus ``<repo>/blobs`` when the folder lies in a Hugging Face hub cache
    snapshot (``models--org--name/snapshots/<rev>/...``, every file a link into blobs/)."""
    for ancestor in (folder, *folder.parents):
        snapshots = ancestor.parent
        if snapshots.name == "snapshots" and snapshots.parent.name.startswith("models--"):
            return [folder, snapshots.parent / "blobs"]
    return [folder]


def window_slides(window: Mapping[str, Any] | None) -> bool:
    """Whether a ``model.decoder.sliding_window`` block asks the engine to slide the cache or
    the inputs (``slide_key_value_cache`` / ``slide_inputs``; each true when absent, as in
    the reference): else its windows are GroupQueryAttention's own (``layers``)."""
    if not window:
        return False
    return bool(window.get("slide_key_value_cache", True) or window.get("slide_inputs", True))


#: Token ids and positions are int32 in the graphs.
INT32_MAX = 2**31 - 1

#: The decoder's size keys, none of them negative.
_DECODER_SIZES = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_size",
    "hidden_size",
)


class Config:
    """A model folder's ``genai_config.json``, validated.

    ``Config(path)`` takes the model folder (or the json file itself). ``strict=False`` turns
    unknown keys into warnings. The provider-editing methods mirror onnxruntime-genai's.
    """

    #: Whether ``model.vocab_size`` describes the decoder's own graph (False in a draft's
    #: config, which inherits its target's: the draft's width is checked against the target).
    own_vocab_size: bool = True

    def __init__(self, path: str | os.PathLike[str], *, strict: bool = True) -> None:
        given = Path(path)
        if is_model_package(given):
            raise _package_error(given)
        if given.is_dir():
            folder, file = given, given / CONFIG_FILENAME
        elif given.name == CONFIG_FILENAME and given.exists():
            folder, file = given.parent, given
        elif not given.exists():
            raise ModelFileNotFoundError(f"model folder {str(given)!r} does not exist")
        else:
            raise ConfigError(f"{str(given)!r} is neither a model folder nor a {CONFIG_FILENAME}")
        if not file.is_file():
            raise ModelFileNotFoundError(
                f"{CONFIG_FILENAME} not found in model folder {str(folder)!r}"
            )
        self.path: Path = folder.resolve()
        self.file: Path = file.parent.resolve() / file.name  # a hub-cache file links to a blob
        self.strict = strict
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{file} is not valid JSON: {exc}") from exc
        self._data: dict[str, Any] = _Validator(str(file), strict).document(data)
        self._overlay_model_data: dict[str, bytes] = {}
        self._check_required()

    # --- reading -------------------------------------------------------------------------------
    def get(self, dotted_key: str, default: Any = None) -> Any:
        """The value at ``dotted_key`` (e.g. ``"model.decoder.filename"``), or ``default``."""
        node: Any = self._data
        for part in dotted_key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the validated document."""
        return copy.deepcopy(self._data)

    @property
    def decoder(self) -> dict[str, Any]:
        """The ``model.decoder`` section."""
        return self._data["model"]["decoder"]

    def pipeline_stages(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The stages of ``model.decoder.pipeline`` in order, as (dotted path, name, stage
        object). Empty without a pipeline."""
        value = (self._data.get("model", {}).get("decoder") or {}).get("pipeline")
        if not value:
            return []
        path = "model.decoder.pipeline"
        if isinstance(value, dict):
            return [(f"{path}.{name}", name, stage) for name, stage in value.items()]
        return [
            (f"{path}[{index}].{name}", name, stage)
            for index, group in enumerate(value)
            for name, stage in group.items()
        ]

    @property
    def context_length(self) -> int:
        """``model.context_length``: the longest sequence the model supports."""
        return int(self._data["model"]["context_length"])

    @property
    def max_length(self) -> int:
        """The longest sequence a generator makes unless told otherwise: ``search.max_length``
        when set below the context length, else ``model.context_length`` (what the Python
        API, the Engine, the CLI and `genai serve` stop at)."""
        context = self.context_length
        search = int(self.get("search.max_length", 0) or 0)
        return search if 0 < search < context else context

    @property
    def eos_token_ids(self) -> list[int]:
        """``model.eos_token_id`` as a list; empty means ``[pad_token_id]``, as the reference."""
        eos = self.get("model.eos_token_id", [])
        ids = [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]
        return ids or [int(self.get("model.pad_token_id", 0))]

    def resolve_file(self, name: str, what: str = "file", *, must_exist: bool = True) -> Path:
        """``name`` inside the model folder; error if it is absolute, escapes the folder, or
        (with ``must_exist``) is missing and was not given to `add_model_data`."""
        candidate = Path(name)
        if candidate.is_absolute() or ".." in candidate.parts:
            raise ConfigError(
                f"{what} {name!r} in {self.file} must be a relative path inside the model folder"
            )
        # The name is checked lexically above; the file is then opened where it is named (not at
        # its link target), so onnxruntime finds external data beside it. A symlink may point
        # only inside the folder or, in the Hugging Face hub cache, into the repo's blobs/.
        path = self.path / candidate
        resolved = path.resolve()
        if not any(resolved.is_relative_to(root) for root in _link_roots(self.path)):
            raise ConfigError(
                f"{what} {name!r} in {self.file} escapes the model folder: {path} is a "
                f"symbolic link to {resolved} (genai follows links only within the folder, or "
                "into a Hugging Face hub cache's blobs/; copy the file into the folder)"
            )
        if must_exist and name not in self._overlay_model_data and not resolved.is_file():
            raise ModelFileNotFoundError(
                f"{what} {name!r} named in {self.file} not found at {path}"
            )
        return path

    def _check_required(self) -> None:
        model = self._data.get("model")
        if not isinstance(model, dict):
            raise ConfigError(f"'model' section missing in {self.file}")
        for key in ("type", "context_length"):
            if key not in model:
                raise ConfigError(f"model.{key} is required in {self.file}")
        if not 0 < model["context_length"] <= INT32_MAX:
            raise ConfigError(
                f"model.context_length must be in [1, {INT32_MAX}] in {self.file}, "
                f"got {model['context_length']}"
            )
        vocab = model.get("vocab_size")
        if vocab is not None and not 0 < vocab <= INT32_MAX:
            raise ConfigError(
                f"model.vocab_size must be in [1, {INT32_MAX}] in {self.file}, got {vocab}"
            )
        decoder = model.get("decoder")
        for key in _DECODER_SIZES:
            value = (decoder or {}).get(key)
            if value is not None and value < 0:
                raise ConfigError(f"model.decoder.{key} must be >= 0 in {self.file}, got {value}")
        if decoder is not None and "filename" in decoder:
            self.resolve_file(decoder["filename"], "model.decoder.filename", must_exist=False)
        if decoder is not None and decoder.get("sliding_window") is not None:
            self._check_sliding_window(decoder)
        for path, _, stage in self.pipeline_stages():
            self.resolve_file(stage["filename"], f"{path}.filename", must_exist=False)
        for name in SPECULATIVE_RANGES:
            problem = speculative_range_error(name, self.get(f"speculative.{name}"))
            if problem:
                raise ConfigError(f"{problem} in {self.file}")
        # (search.max_length above the context length is refused when a generator is made,
        # as the reference does: an overlay may lower the context and the caller max_length)

    def _check_sliding_window(self, decoder: dict[str, Any]) -> None:
        """``model.decoder.sliding_window``: a positive ``window_size``, a non-negative
        ``cache_slack``, and ``layers`` naming distinct decoder layers."""
        where = f"model.decoder.sliding_window in {self.file}"
        window = decoder["sliding_window"]
        size = window.get("window_size")
        if size is None:
            raise ConfigError(f"{where} needs window_size")
        if size <= 0:
            raise ConfigError(f"{where}: window_size must be > 0, got {size}")
        slack = window.get("cache_slack", 0)
        if slack < 0:
            raise ConfigError(f"{where}: cache_slack must be >= 0, got {slack}")
        layers = window.get("layers", [])
        num_layers = decoder.get("num_hidden_layers")
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int | float) or layer != int(layer):
                raise ConfigError(f"{where}: layers must be layer indices, got {layer!r}")
            if layer < 0 or (num_layers is not None and layer >= num_layers):
                limit = f"[0, {num_layers})" if num_layers is not None else ">= 0"
                raise ConfigError(
                    f"{where}: layer {int(layer)} is outside the decoder's layers {limit}"
                )
        if len({int(layer) for layer in layers}) != len(layers):
            raise ConfigError(f"{where}: layers {layers} lists a layer twice")
        if window_slides(window):
            self._check_slid_window(where, window, size, layers)

    def _check_slid_window(
        self, where: str, window: dict[str, Any], size: int, layers: list[Any]
    ) -> None:
        """A window slid by the engine (QNN-style, `genai.kv.windowed_cache`): both slides,
        ``window_size`` > 1 and at most half the context (as the reference), a known
        ``alignment``, no ``layers`` (the slid cache covers every layer)."""
        if not (window.get("slide_key_value_cache", True) and window.get("slide_inputs", True)):
            raise ConfigError(
                f"{where}: slide_key_value_cache and slide_inputs must both be true (a slid "
                "cache is fed slid inputs); genai runs no other combination"
            )
        if size <= 1:
            raise ConfigError(f"{where}: window_size must be > 1 to slide windows, got {size}")
        context = self._data["model"]["context_length"]
        if context < 2 * size:
            raise ConfigError(
                f"{where}: model.context_length ({context}) must be >= 2 * window_size "
                f"(2 * {size} = {2 * size}) to slide windows"
            )
        alignment = window.get("alignment", "right")
        if alignment not in ("right", "left"):
            raise ConfigError(f"{where}: alignment must be 'right' or 'left', got {alignment!r}")
        if layers:
            raise ConfigError(
                f"{where}: layers {layers} selects GroupQueryAttention window layers; a cache "
                "slid by the engine (slide_key_value_cache) covers every layer"
            )

    # --- editing (the reference's API) ------------------------------------------------------------
    def overlay(self, json_text: str | Mapping[str, Any]) -> None:
        """Merge a JSON document (string or mapping) over this config, validated like the file."""
        if isinstance(json_text, Mapping):
            patch = copy.deepcopy(dict(json_text))
        else:
            try:
                patch = json.loads(json_text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"overlay is not valid JSON: {exc}") from exc
        patch = _Validator("the overlay", self.strict).document(patch)
        merged = copy.deepcopy(self._data)
        _deep_merge(merged, patch)
        old = self._data
        self._data = merged
        try:
            self._check_required()
        except Exception:
            self._data = old
            raise

    @property
    def provider_options(self) -> list[dict[str, dict[str, str]]]:
        """The active provider list (``model.decoder.session_options.provider_options``)."""
        decoder = self._data["model"].setdefault("decoder", {})
        session = decoder.setdefault("session_options", {})
        return session.setdefault("provider_options", [])

    @property
    def providers(self) -> list[tuple[str, dict[str, str]]]:
        """``(canonical name, options)`` for each requested provider, in order of preference."""
        result = []
        for entry in self.provider_options:
            ((name, options),) = entry.items()
            plain = {k: v for k, v in options.items() if not isinstance(v, dict)}
            result.append((normalize_provider_name(name), plain))
        return result

    def device_filtering_options(self, provider: str) -> dict[str, Any]:
        """The ``device_filtering_options`` of ``provider`` (how the reference picks the
        provider's device: ``hardware_device_type``, ``hardware_device_id``,
        ``hardware_vendor_id``); empty when none are set."""
        canonical = normalize_provider_name(provider)
        for entry in self.provider_options:
            ((name, options),) = entry.items()
            found = options.get(_DEVICE_FILTERING_KEY)
            if normalize_provider_name(name) == canonical and isinstance(found, dict):
                return dict(found)
        return {}

    def clear_providers(self) -> None:
        """Empty the provider list (an empty list means CPU)."""
        self.provider_options.clear()

    def append_provider(self, name: str) -> None:
        """Add provider ``name`` to the list (no-op if it is already there)."""
        canonical = normalize_provider_name(check_type(name, str, "provider name"))
        for entry in self.provider_options:
            if normalize_provider_name(next(iter(entry))) == canonical:
                return
        self.provider_options.append({canonical: {}})

    def select_provider(self, name: str, options: Mapping[str, str] | None = None) -> None:
        """Run on provider ``name`` alone, with ``options`` (beyond the reference: its
        `clear_providers`, `append_provider` and `set_provider_option` in one call)."""
        self.clear_providers()
        self.append_provider(name)
        for key, value in (options or {}).items():
            self.set_provider_option(name, key, value)

    def set_provider_option(self, provider: str, key: str, value: str) -> None:
        """Set one option of a provider, adding the provider if absent."""
        check_type(provider, str, "provider name")
        check_type(key, str, "provider option name")
        if not isinstance(value, str):
            raise ArgumentTypeError(
                f"provider option {key!r} must be a string, got {type(value).__name__}"
            )
        self.append_provider(provider)
        canonical = normalize_provider_name(provider)
        for entry in self.provider_options:
            ((name, options),) = entry.items()
            if normalize_provider_name(name) == canonical:
                options[key] = value

    def _set_device_filter(self, provider: str, key: str, value: Any | None) -> None:
        """Set (``value`` not None) or clear one device-filtering field of every entry of
        ``provider`` in the provider list; a provider not in the list is left alone, as the
        reference does."""
        canonical = normalize_provider_name(provider)
        for entry in self.provider_options:
            ((name, options),) = entry.items()
            if normalize_provider_name(name) != canonical:
                continue
            current = options.get(_DEVICE_FILTERING_KEY)
            if not isinstance(current, dict):
                if value is None:
                    continue
                current = options[_DEVICE_FILTERING_KEY] = {}
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value

    def set_decoder_provider_options_hardware_device_type(
        self, provider: str, hardware_device_type: str
    ) -> None:
        """Pick ``provider``'s device by type: ``"cpu"``, ``"gpu"`` or ``"npu"`` (any case).
        Only a provider already in the list is changed (as the reference)."""
        what = f"hardware device type for provider {provider!r}"
        self._set_device_filter(
            provider, "hardware_device_type", _hardware_device_type(hardware_device_type, what)
        )

    def set_decoder_provider_options_hardware_device_id(
        self, provider: str, hardware_device_id: int
    ) -> None:
        """Pick ``provider``'s device by its hardware device id (a provider in the list)."""
        what = f"hardware_device_id for provider {provider!r}"
        self._set_device_filter(
            provider, "hardware_device_id", _hardware_id(hardware_device_id, what)
        )

    def set_decoder_provider_options_hardware_vendor_id(
        self, provider: str, hardware_vendor_id: int
    ) -> None:
        """Pick ``provider``'s device by its hardware vendor id (a provider in the list)."""
        what = f"hardware_vendor_id for provider {provider!r}"
        self._set_device_filter(
            provider, "hardware_vendor_id", _hardware_id(hardware_vendor_id, what)
        )

    def clear_decoder_provider_options_hardware_device_type(self, provider: str) -> None:
        """Forget the device type set for ``provider``."""
        self._set_device_filter(provider, "hardware_device_type", None)

    def clear_decoder_provider_options_hardware_device_id(self, provider: str) -> None:
        """Forget the hardware device id set for ``provider``."""
        self._set_device_filter(provider, "hardware_device_id", None)

    def clear_decoder_provider_options_hardware_vendor_id(self, provider: str) -> None:
        """Forget the hardware vendor id set for ``provider``."""
        self._set_device_filter(provider, "hardware_vendor_id", None)

    @staticmethod
    def from_package_ep(config_path: str | os.PathLike[str], ep: str) -> Config:
        """The reference's loader for a model package (a folder with ``manifest.json`` and a
        variant per execution provider), picking the variant for ``ep``. A plain model folder
        is refused as the reference refuses it; packages themselves are not supported yet."""
        path = Path(config_path)
        if not is_model_package(path):
            raise ConfigError(
                f"{str(path)!r} is not a model package (a folder with manifest.json and no "
                f"{CONFIG_FILENAME} at its root); use Config(path) for a model folder"
            )
        raise _package_error(path)

    # --- features ---------------------------------------------------------------------------------
    def unsupported_features(self) -> list[tuple[str, Feature]]:
        """``(dotted key, feature)`` for each key of this config that asks for a feature genai
        does not run yet (`UNSUPPORTED_KEYS`), in the table's order."""
        found = []
        for key, feature in UNSUPPORTED_KEYS.items():
            value = self.get(key)
            if value is None or value == []:
                continue  # absent, or an empty list: asks for nothing
            found.append((key, feature))
        return found

    def check_supported(self) -> None:
        """Raise NotImplementedError naming the feature (and the key asking for it) when the
        config asks for one genai does not run yet; `Model` calls it when loading."""
        found = self.unsupported_features()
        if found:
            key, feature = found[0]
            others = [k for k, _ in found[1:]]
            also = f" (also: {', '.join(others)})" if others else ""
            raise feature.error(f"{key} in {self.file}{also}")

    # --- tokenizer-related keys -----------------------------------------------------------------
    @property
    def tokenizer_folder(self) -> Path:
        """Where the tokenizer files are: ``model.tokenizer_dir`` when set, a path relative to
        the model folder that may leave it (``../tokenizer``, as the reference allows), else
        the model folder."""
        name = self.get("model.tokenizer_dir") or ""
        if not name:
            return self.path
        if Path(name).is_absolute():
            raise ConfigError(
                f"model.tokenizer_dir {name!r} in {self.file} must be relative to the model "
                "folder (the reference joins it to the folder)"
            )
        folder = (self.path / name).resolve()
        if not folder.is_dir():
            raise ModelFileNotFoundError(
                f"model.tokenizer_dir {name!r} of {self.file}: no {folder}"
            )
        return folder

    def add_model_data(self, name: str, data: bytes) -> None:
        """Supply a model file's bytes in memory instead of from the folder."""
        check_type(name, str, "model data name")
        if isinstance(data, str):  # bytes(str) would need an encoding: say what is wanted
            raise ArgumentTypeError("model data must be bytes (a buffer), not str")
        try:
            self._overlay_model_data[name] = bytes(memoryview(data))
        except TypeError:
            raise ArgumentTypeError(
                f"model data must be bytes (a buffer), not {type(data).__name__}"
            ) from None

    def remove_model_data(self, name: str) -> None:
        """Forget bytes given to `add_model_data` (`ModelError` when none were, as in the
        reference)."""
        if self._overlay_model_data.pop(name, None) is None:
            raise ModelError(f"Model data for '{name}' was not found.")

    def model_data(self, name: str) -> bytes | None:
        """Bytes given to `add_model_data` for ``name``, if any."""
        return self._overlay_model_data.get(name)

    def __repr__(self) -> str:
        return f"Config({str(self.path)!r})"


def _deep_merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
