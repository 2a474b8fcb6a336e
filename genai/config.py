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

from .errors import ConfigError

__all__ = ["CONFIG_FILENAME", "Config", "normalize_provider_name"]

CONFIG_FILENAME = "genai_config.json"

# --- schema -------------------------------------------------------------------------------------
# A leaf is a tuple of accepted Python types. A dict is a nested object. ``ANY_STRINGS`` is an
# object whose keys are free but whose values must be strings (ORT config entries, provider
# options). ``OPAQUE`` is a section we accept without validating its contents (sections of model
# kinds this engine does not run yet: they still load, and `Model` refuses them clearly).
_STR = (str,)
_INT = (int,)
_NUM = (int, float)
_BOOL = (bool,)
_INT_OR_LIST = (int, list)
ANY_STRINGS = "any-strings"
OPAQUE = "opaque"
_PROVIDER_OPTIONS = "provider-options"
_PIPELINE = "pipeline"

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

_DECODER_INPUTS = dict.fromkeys(
    [
        "input_ids",
        "inputs_embeds",
        "attention_mask",
        "position_ids",
        "past_key_names",
        "past_value_names",
        "past_names",
        "past_sequence_length",
        "current_sequence_length",
        "total_sequence_length",
        "cache_indirection",
        "encoder_hidden_states",
        "encoder_attention_mask",
        "rnn_prev_states",
        "past_key_values_length",
        "seqlens_k",
    ],
    _STR,
)

_DECODER_OUTPUTS = dict.fromkeys(
    [
        "logits",
        "present_key_names",
        "present_value_names",
        "present_names",
        "output_cross_qk_names",
        "rnn_states",
        "hidden_states",
    ],
    _STR,
)

_SLIDING_WINDOW = {
    "window_size": _INT,
    "pad_value": _INT,
    "alignment": _STR,
    "slide_key_value_cache": _BOOL,
    "slide_inputs": _BOOL,
    "layers": (list,),
    "cache_slack": _INT,
}

_STRINGS = (list,)  # a list of strings: checked by _Validator._strings

#: One stage of ``model.decoder.pipeline`` (the reference's keys; see `genai.pipeline`).
_PIPELINE_STAGE: dict[str, Any] = {
    "filename": _STR,
    "session_options": _SESSION_OPTIONS,
    "run_options": ANY_STRINGS,
    "inputs": _STRINGS,
    "outputs": _STRINGS,
    "output_names_forwarder": ANY_STRINGS,
    "run_on_prompt": _BOOL,
    "run_on_token_gen": _BOOL,
    "is_lm_head": _BOOL,
    "inherit_session_options": _BOOL,
    "reset_session_idx": _INT,
}

_DECODER: dict[str, Any] = {
    "filename": _STR,
    "hidden_size": _INT,
    "num_attention_heads": _INT,
    "num_key_value_heads": _INT,
    "num_hidden_layers": _INT,
    "head_size": _INT,
    "session_options": _SESSION_OPTIONS,
    "run_options": ANY_STRINGS,
    "inputs": _DECODER_INPUTS,
    "outputs": _DECODER_OUTPUTS,
    "sliding_window": _SLIDING_WINDOW,
    "pipeline": _PIPELINE,
    "layer_types": (list,),
    "shared_initializers": (list,),
    "state_groups": OPAQUE,
}

_MODEL: dict[str, Any] = {
    "type": _STR,
    "context_length": _INT,
    "vocab_size": _INT,
    "bos_token_id": _INT,
    "pad_token_id": _INT,
    "eos_token_id": _INT_OR_LIST,
    "sep_token_id": _INT,
    "decoder_start_token_id": _INT,
    "image_token_id": _INT,
    "video_token_id": _INT,
    "vision_start_token_id": _INT,
    "decoder": _DECODER,
    "encoder": OPAQUE,
    "embedding": OPAQUE,
    "vision": OPAQUE,
    "speech": OPAQUE,
    "mtp": OPAQUE,
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
    "chunk_size": _INT,
}

SCHEMA: dict[str, Any] = {
    "model": _MODEL,
    "search": _SEARCH,
    "speculative": OPAQUE,
    "engine": OPAQUE,
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

    def check(self, value: Any, schema: Any, path: str) -> None:
        if schema == OPAQUE:
            return
        if schema == ANY_STRINGS:
            self._object(value, path)
            for key, item in value.items():
                self._leaf(item, _STR, f"{path}.{key}")
            return
        if schema == _PROVIDER_OPTIONS:
            self._provider_options(value, path)
            return
        if schema == _PIPELINE:
            self._pipeline(value, path)
            return
        if schema is _STRINGS:
            self._strings(value, path)
            return
        if isinstance(schema, tuple):
            self._leaf(value, schema, path)
            return
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

    def _strings(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path} in {self.source} must be a list of strings, got {value!r}")

    def _pipeline(self, value: Any, path: str) -> None:
        """``[{stage: {...}, ...}, ...]`` (stages in order; several per object allowed) or one
        ``{stage: {...}, ...}`` object, as the reference parses it; each stage needs
        ``filename``."""
        groups = value if isinstance(value, list) else [value]
        if not isinstance(value, list | dict):
            raise ConfigError(f"{path} in {self.source} must be a list of {{stage: {{...}}}}")
        seen: set[str] = set()
        for index, group in enumerate(groups):
            where = f"{path}[{index}]" if isinstance(value, list) else path
            self._object(group, where)
            for name, stage in group.items():
                stage_path = f"{where}.{name}"
                if name in seen:
                    raise ConfigError(f"{stage_path} in {self.source}: stage {name!r} twice")
                seen.add(name)
                self.check(stage, _PIPELINE_STAGE, stage_path)
                if "filename" not in stage:
                    raise ConfigError(f"{stage_path}.filename is required in {self.source}")

    def _provider_options(self, value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise ConfigError(f"{path} in {self.source} must be a list of {{name: {{...}}}}")
        for index, entry in enumerate(value):
            item_path = f"{path}[{index}]"
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ConfigError(
                    f"{item_path} in {self.source} must be an object with one provider name"
                )
            ((name, options),) = entry.items()
            self._object(options, f"{item_path}.{name}")
            for key, option in options.items():
                if key == "device_filtering_options":
                    self._object(option, f"{item_path}.{name}.{key}")
                    continue
                self._leaf(option, _STR, f"{item_path}.{name}.{key}")


class Config:
    """A model folder's ``genai_config.json``, validated.

    ``Config(path)`` takes the model folder (or the json file itself). ``strict=False`` turns
    unknown keys into warnings. The provider-editing methods mirror onnxruntime-genai's.
    """

    def __init__(self, path: str | os.PathLike[str], *, strict: bool = True) -> None:
        given = Path(path)
        if given.is_dir():
            folder, file = given, given / CONFIG_FILENAME
        elif given.name == CONFIG_FILENAME and given.exists():
            folder, file = given.parent, given
        elif not given.exists():
            raise FileNotFoundError(f"model folder {str(given)!r} does not exist")
        else:
            raise ConfigError(f"{str(given)!r} is neither a model folder nor a {CONFIG_FILENAME}")
        if not file.is_file():
            raise FileNotFoundError(f"{CONFIG_FILENAME} not found in model folder {str(folder)!r}")
        self.path: Path = folder.resolve()
        self.file: Path = file.resolve()
        self.strict = strict
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{file} is not valid JSON: {exc}") from exc
        _Validator(str(file), strict).check(data, SCHEMA, "")
        self._data: dict[str, Any] = data
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
        resolved = (self.path / candidate).resolve()
        if self.path not in resolved.parents and resolved != self.path:
            raise ConfigError(f"{what} {name!r} in {self.file} escapes the model folder")
        if must_exist and name not in self._overlay_model_data and not resolved.is_file():
            raise FileNotFoundError(f"{what} {name!r} named in {self.file} not found at {resolved}")
        return resolved

    def _check_required(self) -> None:
        model = self._data.get("model")
        if not isinstance(model, dict):
            raise ConfigError(f"'model' section missing in {self.file}")
        for key in ("type", "context_length"):
            if key not in model:
                raise ConfigError(f"model.{key} is required in {self.file}")
        if model["context_length"] <= 0:
            raise ConfigError(f"model.context_length must be positive in {self.file}")
        decoder = model.get("decoder")
        if decoder is not None and "filename" in decoder:
            self.resolve_file(decoder["filename"], "model.decoder.filename", must_exist=False)
        if decoder is not None and decoder.get("sliding_window") is not None:
            self._check_sliding_window(decoder)
        for path, _, stage in self.pipeline_stages():
            self.resolve_file(stage["filename"], f"{path}.filename", must_exist=False)
        max_length = self.get("search.max_length", 0)
        if max_length and max_length > model["context_length"]:
            raise ConfigError(
                f"search.max_length ({max_length}) exceeds model.context_length "
                f"({model['context_length']}) in {self.file}"
            )

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
        slides = (window.get("slide_key_value_cache"), window.get("slide_inputs"))
        if any(slides):
            self._check_slid_window(where, window, size, layers)

    def _check_slid_window(
        self, where: str, window: dict[str, Any], size: int, layers: list[Any]
    ) -> None:
        """A window slid by the engine (QNN-style, `genai.windowed_cache`): both slides,
        ``window_size`` > 1 and at most half the context (as the reference), a known
        ``alignment``, no ``layers`` (the slid cache covers every layer)."""
        if not (window.get("slide_key_value_cache") and window.get("slide_inputs")):
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
        _Validator("the overlay", self.strict).check(patch, SCHEMA, "")
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
            result.append((normalize_provider_name(name), dict(options)))
        return result

    def clear_providers(self) -> None:
        """Empty the provider list (an empty list means CPU)."""
        self.provider_options.clear()

    def append_provider(self, name: str) -> None:
        """Add provider ``name`` to the list (no-op if it is already there)."""
        canonical = normalize_provider_name(name)
        for entry in self.provider_options:
            if normalize_provider_name(next(iter(entry))) == canonical:
                return
        self.provider_options.append({canonical: {}})

    def set_provider_option(self, provider: str, key: str, value: str) -> None:
        """Set one option of a provider, adding the provider if absent."""
        if not isinstance(value, str):
            raise TypeError(f"provider option {key!r} must be a string, got {type(value).__name__}")
        self.append_provider(provider)
        canonical = normalize_provider_name(provider)
        for entry in self.provider_options:
            ((name, options),) = entry.items()
            if normalize_provider_name(name) == canonical:
                options[key] = value

    def add_model_data(self, name: str, data: bytes) -> None:
        """Supply a model file's bytes in memory instead of from the folder."""
        self._overlay_model_data[name] = bytes(data)

    def remove_model_data(self, name: str) -> None:
        """Forget bytes given to `add_model_data`."""
        self._overlay_model_data.pop(name, None)

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
