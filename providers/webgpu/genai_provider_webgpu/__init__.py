"""WebGPU execution provider (onnxruntime-ep-webgpu plugin) for genai.

Runs on GPUs through Dawn (Vulkan, D3D12, Metal). Graph capture: ``enableGraphCapture=1``
(off by default, as the reference), for models whose attention-mask arithmetic runs on the
EP (the reference's builder with ``enable_webgpu_graph``). On a machine without a GPU, Mesa's
lavapipe (software Vulkan, Mesa >= 25) works when ``ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1``
is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from genai import hookimpl
from genai.providers import Capabilities, GraphCapture, Placement, PluginEPProvider

#: Set to 1 to let the EP use a software adapter (it then lists a CPU-typed device).
SOFTWARE_ADAPTER_ENV = "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER"

__all__ = ["WebGPUProvider"]


class WebGPUProvider(PluginEPProvider):
    """The WebGPU EP from its plugin package."""

    name = "WebGPU"
    reference_device = "WebGPU"
    ort_name = "WebGpuExecutionProvider"
    device = "webgpu"
    ep_module = "onnxruntime_ep_webgpu"
    requires = ("onnxruntime-ep-webgpu",)
    description = "GPUs through WebGPU (Dawn: Vulkan/D3D12/Metal), plugin package"
    # KV in WebGPU memory, both layouts: the shared layout's buffers are DeviceTensors the
    # session allocates on the device (bound as past and present); the growing layout's
    # presents are allocated by ORT on the device and handed over as the next pasts. Inputs
    # (a few ids) and logits stay on the host (sampling runs there) except under graph
    # capture, which binds them at fixed device addresses (see DecoderLoop.use_graph_capture).
    capabilities = Capabilities(
        exact=False, logits_atol=5e-2, kv_layouts=frozenset({"shared", "growing"})
    )
    placement = Placement(kv_cache="webgpu", allocator="session")
    # With graph capture on, the EP's GroupQueryAttention takes only the shared buffer, captured
    # run or not: "Graph capture requires past/present KV cache to share the same buffer (static
    # KV cache)"; with an empty past (the growing layout's first run) onnxruntime 1.32 with
    # onnxruntime-ep-webgpu 0.4.0 crashes (SIGSEGV).
    graph_capture = GraphCapture(option="enableGraphCapture", session_requires_shared_buffer=True)
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
