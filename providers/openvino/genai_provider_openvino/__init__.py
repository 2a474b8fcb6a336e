"""OpenVINO execution provider for genai.

Two ways to get the EP: the monolithic onnxruntime-openvino build (the EP compiled into
onnxruntime; it replaces the onnxruntime package) or the onnxruntime-ep-openvino plugin package
(registered with ORT at run time; it lists devices on Intel hardware only). The provider uses
whichever is present, monolithic first. ``device_type`` (CPU, GPU, NPU, or e.g. ``GPU.1``,
``AUTO:GPU,CPU``) picks the device. ``enable_causallm=True`` (stateful mode: the EP keeps the KV
cache itself) is refused with a clear error: this engine binds the KV cache itself.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any, ClassVar

from genai.errors import ConfigError, ProviderUnavailableError
from genai.hookspecs import hookimpl
from genai.providers import (
    Capabilities,
    Placement,
    PluginEPProvider,
    SessionSpec,
    available_ort_providers,
)

__all__ = ["OpenVINOProvider"]

_DEVICES = ("CPU", "GPU", "NPU")
_META = ("AUTO", "HETERO", "MULTI")


def device_kind(device_type: str) -> str:
    """ "CPU"/"GPU"/"NPU" for a device_type value ("GPU.1" -> "GPU"; "AUTO:GPU,CPU" -> "GPU")."""
    value = device_type.strip().upper()
    if ":" in value:
        meta, _, rest = value.partition(":")
        if meta not in _META:
            raise ConfigError(f"OpenVINO device_type {device_type!r}: unknown prefix {meta!r}")
        value = rest.split(",")[0]
    kind = value.split(".")[0]
    if kind not in _DEVICES:
        raise ConfigError(
            f"OpenVINO device_type {device_type!r} must name {', '.join(_DEVICES)} (optionally "
            f"GPU.N, or {'/'.join(_META)}:...)"
        )
    return kind


class OpenVINOProvider(PluginEPProvider):
    """ONNX Runtime's OpenVINO EP (monolithic build or plugin package)."""

    name = "OpenVINO"
    ort_name = "OpenVINOExecutionProvider"
    device = "openvino"
    ep_module = "onnxruntime_ep_openvino"
    requires = ("onnxruntime-openvino", "onnxruntime-ep-openvino")
    description = "Intel CPUs/GPUs/NPUs through OpenVINO (monolithic build or plugin)"
    # Nodes OpenVINO cannot take (GroupQueryAttention) stay on the CPU EP; the rest may use
    # other kernels and precisions.
    capabilities = Capabilities(exact=False, logits_atol=1e-3)
    placement = Placement()
    default_options: ClassVar[dict[str, str]] = {"device_type": "CPU"}

    def mode(self) -> str | None:
        """ "monolithic" (EP compiled into onnxruntime), "plugin" (package present), or None."""
        try:
            if self.ort_name in available_ort_providers():
                return "monolithic"
        except Exception:
            return None
        if importlib.util.find_spec(self.ep_module) is not None:
            return "plugin"
        return None

    def unavailable_reason(self) -> str | None:
        mode = self.mode()
        if mode == "monolithic":
            return None
        if mode == "plugin":
            return super().unavailable_reason()
        return (
            "neither onnxruntime-openvino (the monolithic build, in place of onnxruntime) nor "
            "the onnxruntime-ep-openvino plugin is installed"
        )

    def validate_options(self, options: Mapping[str, str]) -> dict[str, str]:
        merged = super().validate_options(options)
        device_kind(merged["device_type"])
        if merged.get("enable_causallm", "false").strip().lower() in ("true", "1"):
            raise ConfigError(
                "OpenVINO enable_causallm=True (stateful mode, the EP keeps the KV cache) is "
                "not supported by this engine yet: it binds the KV cache itself; leave it off"
            )
        return merged

    def device_types_for(self, options: Mapping[str, str]) -> tuple[str, ...]:
        return (device_kind(options.get("device_type", "CPU")),)

    def select_devices(self, devices: Any, options: Mapping[str, str]) -> list[Any]:
        kind = self.device_types_for(options)[0]
        return [d for d in devices if d.device_type == kind][:1]

    def ep_options(self, options: Mapping[str, str]) -> dict[str, str]:
        # With a plugin device the device is chosen by the EpDevice; keep the rest.
        return {k: v for k, v in options.items() if k != "device_type"}

    def session_spec(self, options: Mapping[str, str], config: Any = None) -> SessionSpec:
        mode = self.mode()
        if mode == "monolithic":
            return SessionSpec(providers=[("OpenVINO", dict(options))])
        if mode is None:
            raise ProviderUnavailableError(self.unavailable_reason() or "OpenVINO is missing")
        return super().session_spec(options, config)


@hookimpl
def register_providers(register):
    register(OpenVINOProvider)
