"""NVIDIA TensorRT-RTX execution provider (onnxruntime-ep-nv-tensorrt-rtx plugin) for genai.

Policy owned here: the probe (plugin package, plugin-EP API, NVIDIA driver), CUDA graphs
(``enable_cuda_graph``), and the shape profiles TensorRT-RTX builds engines for: unless the
options give ``nv_profile_min_shapes`` / ``nv_profile_opt_shapes`` / ``nv_profile_max_shapes``,
they are derived from the model's config (batch 1..``max_batch_size``, sequence 1..context).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from genai import hookimpl
from genai.errors import ConfigError
from genai.providers import (
    Capabilities,
    GraphCapture,
    Placement,
    PluginEPProvider,
    SessionSpec,
    probe_shared_library,
)

__all__ = ["TensorRTRTXProvider", "shape_profiles"]

_PROFILE_KEYS = ("nv_profile_min_shapes", "nv_profile_opt_shapes", "nv_profile_max_shapes")


def _layer_names(template: str, layers: int) -> list[str]:
    return [template.replace("%d", str(i)) for i in range(layers)]


def shape_profiles(config: Any, max_batch_size: int = 1) -> dict[str, str]:
    """The three ``nv_profile_*_shapes`` options for a genai config (a `genai.Config` or its
    ``model`` dict): ``"name:d0xd1,..."`` for the ids, mask, positions (when the config names
    them) and every past KV input."""
    model = config.get("model") or {}
    decoder = model.get("decoder", {})
    inputs = decoder.get("inputs", {})
    context = int(model.get("context_length") or 0)
    layers = int(decoder.get("num_hidden_layers") or 0)
    heads = int(decoder.get("num_key_value_heads") or decoder.get("num_attention_heads") or 0)
    head = int(decoder.get("head_size") or 0)
    if not head and decoder.get("hidden_size") and decoder.get("num_attention_heads"):
        head = int(decoder["hidden_size"]) // int(decoder["num_attention_heads"])
    if not (context and layers and heads and head):
        raise ConfigError(
            "TensorRT-RTX shape profiles need model.context_length and model.decoder."
            "num_hidden_layers / num_key_value_heads / head_size in genai_config.json, or the "
            "nv_profile_*_shapes options"
        )
    batch = max(1, int(max_batch_size))
    opt_len = max(1, context // 2)
    rows: dict[str, tuple[str, str, str]] = {}
    rows[inputs.get("input_ids", "input_ids")] = ("1x1", "1x1", f"{batch}x{context}")
    rows[inputs.get("attention_mask", "attention_mask")] = (
        "1x1",
        f"1x{opt_len}",
        f"{batch}x{context}",
    )
    if "position_ids" in inputs:
        rows[inputs["position_ids"]] = ("1x1", "1x1", f"{batch}x{context}")
    if "past_names" in inputs:
        names = _layer_names(inputs["past_names"], layers)
        kv = (f"2x1x{heads}x0x{head}", f"2x1x{heads}x{opt_len}x{head}",
              f"2x{batch}x{heads}x{context}x{head}")  # fmt: skip
    else:
        names = _layer_names(inputs.get("past_key_names", "past_key_values.%d.key"), layers)
        names += _layer_names(inputs.get("past_value_names", "past_key_values.%d.value"), layers)
        kv = (f"1x{heads}x0x{head}", f"1x{heads}x{opt_len}x{head}",
              f"{batch}x{heads}x{context}x{head}")  # fmt: skip
    for name in names:
        rows[name] = kv
    return {
        key: ",".join(f"{name}:{shapes[i]}" for name, shapes in rows.items())
        for i, key in enumerate(_PROFILE_KEYS)
    }


class TensorRTRTXProvider(PluginEPProvider):
    """The NV TensorRT-RTX EP from its plugin package."""

    name = "NvTensorRtRtx"
    reference_device = "NvTensorRtRtx"
    aliases = ("tensorrt_rtx", "trt_rtx", "nv_tensorrt_rtx", "NvTensorRTRTX")
    ort_name = "NvTensorRTRTXExecutionProvider"
    device = "cuda"
    ep_module = "onnxruntime_ep_nv_tensorrt_rtx"
    requires = ("onnxruntime-ep-nv-tensorrt-rtx",)
    description = "NVIDIA RTX GPUs through the TensorRT-RTX plugin (CUDA graphs, shape profiles)"
    # The shared-buffer KV layout needs its buffer on the device (bound once as past and
    # present); with host buffers ORT copies past and present to separate device buffers and
    # the layout breaks (measured on WebGPU). The engine can keep it there (DeviceTensor,
    # checked on WebGPU), but not yet checked on this EP: host KV, growing layout only. Graph
    # capture (enable_cuda_graph=1) therefore leaves generators uncaptured (gpu_graph_id=-1,
    # ExecutionProvider.graph_capture_blocker) until this provider declares
    # Placement(kv_cache="cuda", allocator="session") and the shared layout.
    capabilities = Capabilities(exact=False, logits_atol=5e-2, kv_layouts=frozenset({"growing"}))
    placement = Placement()
    graph_capture = GraphCapture(option="enable_cuda_graph")
    device_types = ("GPU",)
    session_memory_device = "GPU"
    # Sliding-window layers keep exactly W positions: the provider evicts inside its own
    # kernels (the reference's default).
    kv_window_slack = 0

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        if reason is not None:
            return reason
        driver = probe_shared_library("libcuda.so.1" if os.name != "nt" else "nvcuda.dll")
        return None if driver is None else f"no NVIDIA driver: {driver}"

    def validate_options(self, options: Mapping[str, str]) -> dict[str, str]:
        merged = super().validate_options(options)
        given = [k for k in _PROFILE_KEYS if k in merged]
        if given and len(given) != len(_PROFILE_KEYS):
            raise ConfigError(
                f"TensorRT-RTX needs all of {', '.join(_PROFILE_KEYS)} or none; "
                f"got {', '.join(given)}"
            )
        if merged.get("enable_cuda_graph", "0") not in ("0", "1"):
            raise ConfigError("provider option NvTensorRtRtx.enable_cuda_graph must be '0' or '1'")
        return merged

    def session_spec(self, options: Mapping[str, str], config: Any = None) -> SessionSpec:
        if config is not None and not any(k in options for k in _PROFILE_KEYS):
            batch = int(config.get("search.batch_size", 1) or 1) if hasattr(config, "get") else 1
            options = {**options, **shape_profiles(config, max_batch_size=batch)}
        return super().session_spec(options, config)


@hookimpl
def register_providers(register):
    register(TensorRTRTXProvider)
