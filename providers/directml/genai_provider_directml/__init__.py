"""DirectML execution provider (onnxruntime-directml, Windows) for genai.

Graph capture is on by default, as in the reference (``enable_graph_capture=0`` opts out):
the session is created with it, and a generator captures its single-token steps when it can
(`ExecutionProvider.graph_capture_blocker`: batch 1, the shared-buffer KV layout in device
memory). This provider still places the KV cache in host memory (its device path, the same
code WebGPU runs, has not been checked on DirectML hardware), so until it declares
``Placement(kv_cache="dml", allocator="session")`` and the shared layout, generators run
uncaptured (``gpu_graph_id=-1``) on a capture-enabled session. Continuous decoding is not
supported, as in the reference.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from genai import hookimpl
from genai.errors import ConfigError
from genai.providers import (
    Capabilities,
    ExecutionProvider,
    GraphCapture,
    Placement,
    SessionSpec,
    available_ort_providers,
)

if TYPE_CHECKING:
    from genai.runtime.config import Config

__all__ = ["GRAPH_CAPTURE_CONFIG_KEY", "DirectMLProvider"]

#: The session config entry through which the DML EP switches graph capture.
GRAPH_CAPTURE_CONFIG_KEY = "ep.dml.enable_graph_capture"

_CHOICES = {
    "performance_preference": ("default", "high_performance", "minimum_power"),
    "device_filter": ("gpu", "npu", "any"),
    "enable_graph_capture": ("0", "1"),
}


class DirectMLProvider(ExecutionProvider):
    """ONNX Runtime's DirectML EP."""

    name = "DML"
    reference_device = "DirectML"
    aliases = ("directml", "dml")
    ort_name = "DmlExecutionProvider"
    device = "dml"
    requires = ("onnxruntime-directml",)
    description = "DirectX 12 GPUs/NPUs on Windows through onnxruntime-directml"
    # The shared-buffer KV layout needs its buffer on the device (bound once as past and
    # present); with host buffers ORT copies past and present to separate device buffers and
    # the layout breaks (measured on WebGPU). The engine can keep it there (DeviceTensor,
    # checked on WebGPU), but not yet checked on DirectML: host KV, growing layout only.
    capabilities = Capabilities(
        exact=False,
        logits_atol=5e-2,
        kv_layouts=frozenset({"growing"}),
        continuous_decoding=False,
        rewind=False,
    )
    placement = Placement()
    graph_capture = GraphCapture(option="enable_graph_capture", default=True)
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
        # enable_graph_capture is not a DML EP option: session_spec turns it into the session
        # config entry the EP reads.
        return [("DML", {k: v for k, v in options.items() if k != "enable_graph_capture"})]

    def session_spec(self, options: Mapping[str, str], config: Config | None = None) -> SessionSpec:
        """The DML EP with its options; graph capture as the session config entry
        ``ep.dml.enable_graph_capture`` (on unless ``enable_graph_capture=0``, as the
        reference)."""
        enabled = self.graph_capture_enabled(options)
        return SessionSpec(
            providers=self.session_providers(options),
            config_entries={GRAPH_CAPTURE_CONFIG_KEY: "1" if enabled else "0"},
        )


@hookimpl
def register_providers(register):
    register(DirectMLProvider)
