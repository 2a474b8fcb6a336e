"""CUDA execution provider (onnxruntime-gpu) for genai.

Policy owned here: the availability probe (the CUDA EP compiled into the loaded onnxruntime, its
provider library beside it, the NVIDIA driver), option checks, CUDA graphs
(``enable_cuda_graph``), and the check that the session really runs on the GPU (onnxruntime's
Python API silently falls back to CPU; through the C API an EP that cannot load is an error, and
`check_session` catches a session that put nothing on the GPU).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from genai import hookimpl
from genai.errors import ConfigError
from genai.providers import (
    Capabilities,
    ExecutionProvider,
    GraphCapture,
    Placement,
    available_ort_providers,
    ort_library_dir,
    probe_shared_library,
)

__all__ = ["CUDAProvider"]

_BOOL_OPTIONS = ("enable_cuda_graph", "use_tf32", "do_copy_in_default_stream",
                 "cudnn_conv_use_max_workspace", "enable_skip_layer_norm_strict_mode",
                 "prefer_nhwc", "use_ep_level_unified_stream")  # fmt: skip
_INT_OPTIONS = ("device_id", "gpu_mem_limit", "tunable_op_max_tuning_duration_ms")


def _driver_reason() -> str | None:
    reason = probe_shared_library("libcuda.so.1" if os.name != "nt" else "nvcuda.dll")
    return None if reason is None else f"no NVIDIA driver: {reason}"


class CUDAProvider(ExecutionProvider):
    """ONNX Runtime's CUDA EP."""

    name = "cuda"
    reference_device = "CUDA"
    ort_name = "CUDAExecutionProvider"
    device = "cuda"
    requires = ("onnxruntime-gpu",)
    description = "NVIDIA GPUs through onnxruntime-gpu's CUDA EP (CUDA graphs)"
    # fp32 kernels differ from the CPU's in summation order (and TF32 by default on Ampere+).
    # The shared-buffer KV layout needs its buffer on the device (bound once as past and
    # present); with host buffers ORT copies past and present to separate device buffers and
    # the layout breaks (measured on WebGPU). The engine can keep it there (DeviceTensor,
    # checked on WebGPU), but not yet checked on this EP: host KV, growing layout only. Graph
    # capture (enable_cuda_graph=1) therefore leaves generators uncaptured (gpu_graph_id=-1,
    # ExecutionProvider.graph_capture_blocker) until this provider declares
    # Placement(kv_cache="cuda", allocator="session") and the shared layout.
    capabilities = Capabilities(exact=False, logits_atol=5e-2, kv_layouts=frozenset({"growing"}))
    # This engine binds host buffers; ORT copies them to the GPU each run (the reference keeps
    # KV on the device and samples there: a planned engine change).
    placement = Placement()
    graph_capture = GraphCapture(option="enable_cuda_graph")
    session_memory_device = "GPU"
    # Sliding-window layers keep exactly W positions: the kernel needs a cache of exactly W
    # (the reference's default).
    kv_window_slack = 0

    def unavailable_reason(self) -> str | None:
        try:
            names = available_ort_providers()
        except Exception as exc:
            return f"onnxruntime cannot be loaded: {exc}"
        if self.ort_name not in names:
            return (
                f"the loaded onnxruntime has no {self.ort_name} (it has {', '.join(names)}); "
                "install onnxruntime-gpu in place of onnxruntime"
            )
        bridge = "onnxruntime_providers_cuda.dll" if os.name == "nt" else (
            "libonnxruntime_providers_cuda.so")  # fmt: skip
        folder = ort_library_dir()
        if not os.path.isfile(os.path.join(folder, bridge)):
            return f"{bridge} is missing from {folder}: reinstall onnxruntime-gpu"
        return _driver_reason()

    def validate_options(self, options: Mapping[str, str]) -> dict[str, str]:
        merged = super().validate_options(options)
        for key in _BOOL_OPTIONS:
            if key in merged and merged[key] not in ("0", "1"):
                raise ConfigError(
                    f"provider option cuda.{key} must be '0' or '1', got {merged[key]!r}"
                )
        for key in _INT_OPTIONS:
            if key in merged and not merged[key].isdigit():
                raise ConfigError(
                    f"provider option cuda.{key} must be a non-negative integer, got "
                    f"{merged[key]!r}"
                )
        return merged


@hookimpl
def register_providers(register):
    register(CUDAProvider)
