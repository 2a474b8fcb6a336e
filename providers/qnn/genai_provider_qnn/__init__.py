"""Qualcomm QNN execution provider (onnxruntime-qnn plugin) for genai.

The plugin library is registered with ORT under "QNNExecutionProvider". The HTP backend is used
unless ``backend_type``/``backend_path`` says otherwise (on x86 the wheel's libQnnHtp.so is a
simulator). QNN wants static shapes: the batch is fixed to 1, and the genai-level option
``free_dimensions`` (``"name=value;name=value"``, not passed to ORT) fixes more symbolic
dimensions.

Windowed static-cache exports (``sliding_window.slide_key_value_cache`` / ``slide_inputs``) run
through `genai.kv.windowed_cache`, chosen by the config and the graph, not by this provider. Their
sequence and past dimensions change between prompt windows (S = W) and generated tokens
(S = 1); this provider declares ``static_shapes``, so `genai.Model` builds one session per run
length from the same file, each with those dimensions fixed on top of the batch fixed here (a
value ``free_dimensions`` gives for them is overridden). On the HTP simulator every node of the
windowed test fixture then runs on QNN (see docs/providers.md, "QNN and windowed models").
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from genai import hookimpl
from genai.errors import ConfigError
from genai.providers import Capabilities, Placement, PluginEPProvider, SessionSpec

__all__ = ["QNNProvider", "parse_free_dimensions"]


def parse_free_dimensions(text: str) -> dict[str, int]:
    """``"batch_size=1;sequence_length=1"`` -> ``{"batch_size": 1, "sequence_length": 1}``."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.replace(",", ";").split(";"))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
            raise ConfigError(f"QNN free_dimensions item {item!r} must be NAME=POSITIVE_INT")
        out[name.strip()] = int(value)
    return out


class QNNProvider(PluginEPProvider):
    """ONNX Runtime's QNN EP from the onnxruntime-qnn plugin package."""

    name = "QNN"
    ort_name = "QNNExecutionProvider"
    device = "qnn"
    ep_module = "onnxruntime_qnn"
    requires = ("onnxruntime-qnn",)
    description = "Qualcomm NPUs (HTP) through the onnxruntime-qnn plugin"
    # HTP computes in fp16 (enable_htp_fp16_precision); static shapes: batch 1.
    capabilities = Capabilities(exact=False, logits_atol=0.5, batch=False)
    placement = Placement()
    #: The HTP compiles graphs with fixed shapes: a model run at several shapes (a windowed
    #: model's S = W and S = 1) gets one session per shape (`genai.Model`).
    static_shapes = True

    def reference_device_type(self, options: Mapping[str, str]) -> str:
        """The reference's device type: "QnnWithSharedMemory" with the HTP shared-memory
        allocator or the GPU backend, else "CPU" (host buffers)."""
        shared = options.get("enable_htp_shared_memory_allocator") == "1"
        gpu = options.get("backend_type") == "gpu"
        return "QnnWithSharedMemory" if shared or gpu else "CPU"

    def validate_options(self, options: Mapping[str, str]) -> dict[str, str]:
        merged = super().validate_options(options)
        parse_free_dimensions(merged.get("free_dimensions", ""))
        return merged

    def ep_options(self, options: Mapping[str, str]) -> dict[str, str]:
        out = {k: v for k, v in options.items() if k not in ("device_id", "free_dimensions")}
        if "backend_type" not in out and "backend_path" not in out:
            module = importlib.import_module(self.ep_module)
            out["backend_path"] = str(module.get_qnn_htp_path())
        return out

    def session_spec(self, options: Mapping[str, str], config: Any = None) -> SessionSpec:
        spec = super().session_spec(options, config)
        spec.free_dimension_overrides = {
            "batch_size": 1,
            **parse_free_dimensions(options.get("free_dimensions", "")),
        }
        return spec


@hookimpl
def register_providers(register):
    register(QNNProvider)
