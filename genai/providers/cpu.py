"""The cpu provider, genai's built-in default plugin: ONNX Runtime's CPU execution provider.

It loads through the same ``register_providers`` hook as every other provider plugin
(`genai.providers.plugins.DEFAULT_PLUGINS`), first and always.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from genai._core import ort_api
from genai.providers.base import ExecutionProvider
from genai.providers.hookspecs import hookimpl

__all__ = ["CPUProvider", "register_providers"]


class CPUProvider(ExecutionProvider):
    """ONNX Runtime's CPU execution provider: host buffers, sampling on the host, every
    capability, and the reference the conformance suite compares other providers with."""

    name = "cpu"
    ort_name = "CPUExecutionProvider"
    device = "cpu"
    requires = ("onnxruntime",)
    description = "ONNX Runtime's CPU EP (built in; the default)"
    known_options = frozenset()
    # The CPU kernel scans the whole window cache, so a little slack amortises compaction
    # (the reference's default).
    kv_window_slack = 16
    host_ops = True

    def unavailable_reason(self) -> str | None:
        try:
            ort_api.load()
        except Exception as exc:
            return f"onnxruntime cannot be loaded: {exc}"
        return None

    def session_providers(self, options: Mapping[str, str]) -> list[tuple[Any, dict[str, str]]]:
        return []  # the CPU EP is always there


@hookimpl
def register_providers(register: Callable[..., Any]) -> None:
    """The built-in default plugin: the cpu provider."""
    register(CPUProvider)
