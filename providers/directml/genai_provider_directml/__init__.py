"""DirectML execution provider (onnxruntime-directml, Windows) for genai.

The reference turns graph capture on by default for DirectML; here it is opt-in
(``enable_graph_capture=1``) until the engine keeps the KV cache on the device, which graph
capture needs. Continuous decoding is not supported, as in the reference.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from genai.errors import ConfigError
from genai.hookspecs import hookimpl
from genai.providers import (
    Capabilities,
    ExecutionProvider,
    GraphCapture,
    Placement,
    available_ort_providers,
)

__all__ = ["DirectMLProvider"]

_CHOICES = {
    "performance_preference": ("default", "high_performance", "minimum_power"),
    "device_filter": ("gpu", "npu", "any"),
    "enable_graph_capture": ("0", "1"),
}


class DirectMLProvider(ExecutionProvider):
    """ONNX Runtime's DirectML EP."""

    name = "DML"
    aliases = ("directml", "dml")
    ort_name = "DmlExecutionProvider"
    device = "dml"
    requires = ("onnxruntime-directml",)
    description = "DirectX 12 GPUs/NPUs on Windows through onnxruntime-directml"
    # Device EPs need the shared-buffer KV layout's buffer to live on the device (bound once
    # as past and present). This engine binds host buffers, so ORT copies past and present to
    # separate device buffers and the shared layout breaks (measured on WebGPU): growing only,
    # until the engine keeps KV on the device. Graph capture needs the shared layout too.
    capabilities = Capabilities(
        exact=False,
        logits_atol=5e-2,
        kv_layouts=frozenset({"growing"}),
        continuous_decoding=False,
        rewind=False,
    )
    placement = Placement()
    graph_capture = GraphCapture(option="enable_graph_capture")
    known_options = frozenset({"device_id", *_CHOICES})
    session_memory_device = "GPU"
    # Set while probing on a non-Windows host (unit tests patch it).
    platform = sys.platform

    def unavailable_reason(self) -> str | None:
        if self.platform != "win32":
            return f"DirectML runs on Windows only (this is {self.platform})"
        try:
            names = available_ort_providers()
        except Exception as exc:
            return f"onnxruntime cannot be loaded: {exc}"
        if self.ort_name not in names:
            return (
                f"the loaded onnxruntime has no {self.ort_name}; install onnxruntime-directml "
                "in place of onnxruntime"
            )
        return None

    def validate_options(self, options: Mapping[str, str]) -> dict[str, str]:
        merged = super().validate_options(options)
        for key, allowed in _CHOICES.items():
            if key in merged and merged[key] not in allowed:
                raise ConfigError(
                    f"provider option DML.{key} must be one of {', '.join(allowed)}, got "
                    f"{merged[key]!r}"
                )
        if "device_id" in merged and not merged["device_id"].isdigit():
            raise ConfigError(
                f"provider option DML.device_id must be an integer, got {merged['device_id']!r}"
            )
        return merged

    def session_providers(self, options: Mapping[str, str]) -> list:
        return [("DML", dict(options))]


@hookimpl
def register_providers(register):
    register(DirectMLProvider)
