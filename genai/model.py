"""`Model`: a validated config, an ORT session built by the chosen provider, and a description
of the decoder graph's inputs and outputs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .config import Config
from .errors import ConfigError
from .providers import ExecutionProvider, get_provider

__all__ = ["DecoderIO", "Model", "default_intra_op_threads"]

_ORT_TO_NUMPY = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
}

_OPT_LEVELS = {
    "ORT_DISABLE_ALL": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "ORT_ENABLE_BASIC": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "ORT_ENABLE_EXTENDED": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "ORT_ENABLE_ALL": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

#: Model types whose decoder is a plain causal LM this engine runs.
DECODER_ONLY_TYPES = frozenset(
    [
        "chatglm",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gpt2",
        "gptoss",
        "granite",
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
        "smollm3",
        "ernie4_5",
    ]
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


class Model:
    """A generative model loaded from an onnxruntime-genai model folder.

    ``Model(path)`` or ``Model(Config(path))``. The session is created by the first provider of
    ``model.decoder.session_options.provider_options`` (CPU when the list is empty).
    """

    def __init__(self, config: str | os.PathLike[str] | Config) -> None:
        self.config = config if isinstance(config, Config) else Config(config)
        model_type = self.config.get("model.type")
        if model_type not in DECODER_ONLY_TYPES or self.config.get("model.decoder") is None:
            raise NotImplementedError(
                f"model.type {model_type!r} in {self.config.file} is not supported yet; "
                f"supported decoder-only types: {', '.join(sorted(DECODER_ONLY_TYPES))}"
            )
        providers = self.config.providers
        name, options = providers[0] if providers else ("cpu", {})
        self.provider: ExecutionProvider = get_provider(name)
        self.provider_options = options
        self.session = self._create_session()
        self.io = _describe_io(self.config, self.session)

    @property
    def type(self) -> str:
        """``model.type`` from the config (e.g. ``"llama"``)."""
        return str(self.config.get("model.type"))

    @property
    def device_type(self) -> str:
        """The provider's device (``"cpu"``, ``"cuda"``, ...)."""
        return self.provider.device

    @property
    def path(self) -> Path:
        """The model folder."""
        return self.config.path

    def _create_session(self) -> ort.InferenceSession:
        config = self.config
        opts = ort.SessionOptions()
        session_cfg = config.get("model.decoder.session_options", {}) or {}
        opts.intra_op_num_threads = int(
            session_cfg.get("intra_op_num_threads") or default_intra_op_threads()
        )
        if session_cfg.get("inter_op_num_threads"):
            opts.inter_op_num_threads = int(session_cfg["inter_op_num_threads"])
        if "enable_cpu_mem_arena" in session_cfg:
            opts.enable_cpu_mem_arena = bool(session_cfg["enable_cpu_mem_arena"])
        if "enable_mem_pattern" in session_cfg:
            opts.enable_mem_pattern = bool(session_cfg["enable_mem_pattern"])
        if "log_id" in session_cfg:
            opts.logid = session_cfg["log_id"]
        if "log_severity_level" in session_cfg:
            opts.log_severity_level = int(session_cfg["log_severity_level"])
        level = session_cfg.get("graph_optimization_level")
        if level is not None:
            if level not in _OPT_LEVELS:
                raise ConfigError(
                    f"model.decoder.session_options.graph_optimization_level {level!r} in "
                    f"{config.file} must be one of {', '.join(_OPT_LEVELS)}"
                )
            opts.graph_optimization_level = _OPT_LEVELS[level]
        if "custom_ops_library" in session_cfg:
            opts.register_custom_ops_library(
                str(config.resolve_file(session_cfg["custom_ops_library"], "custom_ops_library"))
            )
        known = {
            "log_id", "enable_profiling", "intra_op_num_threads", "inter_op_num_threads",
            "log_severity_level", "log_verbosity_level", "enable_cpu_mem_arena",
            "enable_mem_pattern", "graph_optimization_level", "custom_ops_library",
            "provider_options",
        }  # fmt: skip
        for key, value in session_cfg.items():
            if key not in known:
                opts.add_session_config_entry(key, value)
        ort_providers = self.provider.configure(opts, self.provider_options)
        filename = config.decoder.get("filename", "model.onnx")
        path = config.resolve_file(filename, "model.decoder.filename")
        source: str | bytes = config.model_data(filename) or str(path)
        try:
            session = ort.InferenceSession(source, sess_options=opts, providers=ort_providers)
        except Exception as exc:  # ORT raises its own exception types; name the file
            raise RuntimeError(f"onnxruntime could not load {path}: {exc}") from exc
        self.provider.check_session(session)
        return session

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, type={self.type!r}, provider={self.provider.name!r})"


def _describe_io(config: Config, session: ort.InferenceSession) -> DecoderIO:
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    names_in = config.decoder.get("inputs", {})
    names_out = config.decoder.get("outputs", {})
    where = f"the graph {config.decoder.get('filename', 'model.onnx')}"

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

    def dtype_of(info: ort.NodeArg, what: str) -> np.dtype:
        if info.type not in _ORT_TO_NUMPY:
            raise ConfigError(f"{what} {info.name!r} of {where} has unsupported type {info.type}")
        return _ORT_TO_NUMPY[info.type]

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
    kv_dtype = dtype_of(inputs[past_k[0]], "KV input") if past_k else np.dtype(np.float32)
    kv_heads = int(
        config.decoder.get("num_key_value_heads") or config.decoder.get("num_attention_heads", 0)
    )
    head_size = int(config.decoder.get("head_size") or 0)
    if not head_size and config.decoder.get("hidden_size"):
        head_size = int(config.decoder["hidden_size"]) // int(
            config.decoder.get("num_attention_heads", 1)
        )
    logits_shape = outputs[logits].shape
    vocab = config.get("model.vocab_size")
    if vocab is None and isinstance(logits_shape[-1], int):
        vocab = logits_shape[-1]
    if vocab is None:
        raise ConfigError(f"model.vocab_size is missing in {config.file}")
    id_dtype = dtype_of(inputs[input_ids], "input")
    mask_dtype = dtype_of(inputs[mask], "input") if mask else id_dtype
    return DecoderIO(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        id_dtype=id_dtype,
        mask_dtype=mask_dtype,
        logits=logits,
        logits_dtype=dtype_of(outputs[logits], "output"),
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
    )


def _layer_names(template: str, num_layers: int) -> tuple[str, ...]:
    if "%d" not in template:
        raise ConfigError(f"name template {template!r} must contain %d (the layer index)")
    return tuple(template.replace("%d", str(i)) for i in range(num_layers))
