"""WebGPU execution provider (onnxruntime-ep-webgpu plugin) for genai.

Runs on GPUs through Dawn (Vulkan, D3D12, Metal). Graph capture: ``enableGraphCapture``. On a
machine without a GPU, Mesa's lavapipe (software Vulkan, Mesa >= 25) works when
``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from genai.hookspecs import hookimpl
from genai.providers import Capabilities, GraphCapture, Placement, PluginEPProvider

#: Set to 1 to let the EP use a software adapter (it then lists a CPU-typed device).
SOFTWARE_ADAPTER_ENV = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"

__all__ = ["WebGPUProvider"]


class WebGPUProvider(PluginEPProvider):
    """The WebGPU EP from its plugin package."""

    name = "WebGPU"
    ort_name = "WebGpuExecutionProvider"
    device = "webgpu"
    ep_module = "onnxruntime_ep_webgpu"
    requires = ("onnxruntime-ep-webgpu",)
    description = "GPUs through WebGPU (Dawn: Vulkan/D3D12/Metal), plugin package"
    # KV: the growing layout in device memory (ORT allocates each present on the GPU and the
    # engine hands it over as the next past, so the cache never crosses to the host). The
    # shared layout would need the engine's preallocated buffer on the device as well; it binds
    # host buffers, so ORT copies past and present to separate device buffers and the shared
    # layout breaks (measured on WebGPU): growing only. Graph capture needs the shared layout.
    # Inputs (a few ids) and logits stay on the host: sampling runs there, so the logits cross
    # once per step either way; ORT copies the ids in.
    capabilities = Capabilities(exact=False, logits_atol=5e-2, kv_layouts=frozenset({"growing"}))
    placement = Placement(kv_cache="webgpu", allocator="onnxruntime")
    graph_capture = GraphCapture(option="enableGraphCapture")
    device_types = ("GPU",)
    session_memory_device = "GPU"

    def allocate(
        self, shape: tuple[int, ...], dtype: np.dtype, *, zero: bool = True, role: str = "kv_cache"
    ) -> Any:
        """Host arrays for host roles; for the KV cache an onnxruntime ``OrtValue`` in WebGPU
        memory (zeroed when ``zero``)."""
        if getattr(self.placement, role) == "cpu":
            return super().allocate(shape, dtype, zero=zero, role=role)
        import onnxruntime as ort

        self._register_with_python_api(ort)
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, "webgpu", 0)
        if zero:
            value.update_inplace(np.zeros(shape, dtype))
        return value

    def _register_with_python_api(self, ort: Any) -> None:
        # onnxruntime's Python API keeps its own registry of plugin libraries.
        if getattr(type(self), "_python_registered", False):
            return
        ep_name, path = self.library()
        try:
            ort.register_execution_provider_library(ep_name, path)
        except Exception as exc:  # already registered by someone else: fine
            if "already" not in str(exc).lower():
                raise
        type(self)._python_registered = True

    def select_devices(self, devices: Sequence[Any], options: Mapping[str, str]) -> list[Any]:
        chosen = super().select_devices(devices, options)
        if not chosen and os.environ.get(SOFTWARE_ADAPTER_ENV) == "1":
            # A software adapter (e.g. Mesa lavapipe) shows up as the EP's CPU device; use it
            # only when asked to, never as a silent fallback.
            chosen = [d for d in devices if d.device_type == "CPU"][:1]
        return chosen


@hookimpl
def register_providers(register):
    register(WebGPUProvider)
