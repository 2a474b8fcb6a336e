"""OpenVINO execution provider for genai.

Two ways to get the EP: the monolithic onnxruntime-openvino build (the EP compiled into
onnxruntime; it replaces the onnxruntime package) or the onnxruntime-ep-openvino plugin package
(registered with ORT at run time; it lists devices on Intel hardware only). The provider uses
whichever is present, monolithic first. ``device_type`` (CPU, GPU, NPU, or e.g. ``GPU.1``,
``AUTO:GPU,CPU``) picks the device. ``enable_causallm=True`` is the EP's stateful mode: it keeps
the KV cache inside the session (`genai.providers.base.SessionKV`; the engine feeds empty pasts and
rewinds through the ``kvcache_rewind`` dynamic option). The EP recognises the KV pairs by name,
so the model's presents must be named ``present_<kind>_%d`` and its pasts must contain
``<kind>_%d`` (e.g. ``present_key_%d`` / ``past_key_%d``).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from genai import hookimpl
from genai.errors import ConfigError, ProviderUnavailableError
from genai.providers import (
    Capabilities,
    Placement,
    PluginEPProvider,
    SessionKV,
    SessionSpec,
    available_ort_providers,
)

__all__ = ["OpenVINOProvider"]

_DEVICES = ("CPU", "GPU", "NPU")
_META = ("AUTO", "HETERO", "MULTI")


def stateful_name_problem(config: Any) -> str | None:
    """Why the OpenVINO EP's stateful mode would not find ``config``'s KV pairs, or None.

    The EP takes every output named ``present_<kind>_<n>`` and pairs it with the input that
    contains ``<kind>_<n>``; other names fail inside OpenVINO with no detail."""
    decoder = config.decoder
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    for kind in ("key", "value"):
        present = outputs.get(f"present_{kind}_names", f"present.%d.{kind}")
        past = inputs.get(f"past_{kind}_names", f"past_key_values.%d.{kind}")
        match = re.fullmatch(r"present_(\w+)_%d", present)
        if match is None:
            return (
                f"model.decoder.outputs.present_{kind}_names is {present!r}; OpenVINO's stateful "
                f"mode (enable_causallm) recognises only outputs named 'present_<kind>_%d' "
                f"(e.g. 'present_{kind}_%d')"
            )
        if not past.endswith(f"{match.group(1)}_%d"):
            return (
                f"model.decoder.inputs.past_{kind}_names is {past!r}; with presents "
                f"{present!r} OpenVINO's stateful mode needs pasts ending in "
                f"'{match.group(1)}_%d'"
            )
    return None


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
    reference_device = "OpenVINO"
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
    # The keys onnxruntime-openvino 1.24 accepts (its ``valid_provider_keys``). The EP refuses
    # any other key too, but through the C API the caller sees only "Failed to load provider
    # OpenVINO" (the key is named in ORT's log alone): refusing it here names it.
    known_options: ClassVar[frozenset[str] | None] = frozenset(
        {
            "device_type",
            "device_id",
            "device_luid",
            "cache_dir",
            "precision",
            "load_config",
            "context",
            "num_of_threads",
            "model_priority",
            "num_streams",
            "enable_opencl_throttling",
            "enable_qdq_optimizer",
            "enable_causallm",
            "disable_dynamic_shapes",
            "reshape_input",
            "layout",
        }
    )

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
            self.session_kv = SessionKV(rewind_option="kvcache_rewind")
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
        if self.session_kv is not None and config is not None:
            problem = stateful_name_problem(config)
            if problem is not None:
                raise ConfigError(f"{problem} (in {config.file})")
        mode = self.mode()
        if mode == "monolithic":
            return SessionSpec(providers=[("OpenVINO", dict(options))])
        if mode is None:
            raise ProviderUnavailableError(self.unavailable_reason() or "OpenVINO is missing")
        return super().session_spec(options, config)


@hookimpl
def register_providers(register):
    register(OpenVINOProvider)
