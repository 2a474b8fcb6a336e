"""WebGPU execution provider (onnxruntime-ep-webgpu plugin) for genai.

Runs on GPUs through Dawn (Vulkan, D3D12, Metal). Graph capture: ``enableGraphCapture``. On a
machine without a GPU, Mesa's lavapipe (software Vulkan, Mesa >= 25) works when
``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

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
    # Device EPs need the shared-buffer KV layout's buffer to live on the device (bound once
    # as past and present). This engine binds host buffers, so ORT copies past and present to
    # separate device buffers and the shared layout breaks (measured on WebGPU): growing only,
    # until the engine keeps KV on the device. Graph capture needs the shared layout too.
    capabilities = Capabilities(exact=False, logits_atol=5e-2, kv_layouts=frozenset({"growing"}))
    placement = Placement()
    graph_capture = GraphCapture(option="enableGraphCapture")
    device_types = ("GPU",)
    session_memory_device = "GPU"

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
