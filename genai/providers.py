"""The execution-provider seam.

A provider owns everything hardware-specific: whether it can run here, how ORT session options
are built for it, and where buffers live. The core asks the provider and never switches on
provider names. The CPU provider is the default (an empty provider list means CPU).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import onnxruntime as ort

from .errors import ProviderUnavailableError

__all__ = ["CPUProvider", "ExecutionProvider", "get_provider", "register_provider"]


class ExecutionProvider:
    """Base class for providers. Subclasses set ``name`` (the canonical name the config uses)
    and ``ort_name`` (ORT's EP name), and override what differs from the CPU behaviour."""

    name: ClassVar[str] = ""
    ort_name: ClassVar[str] = ""
    #: ORT device name for OrtValues and IOBinding ("cpu", "cuda", ...).
    device: ClassVar[str] = "cpu"

    def unavailable_reason(self) -> str | None:
        """None when the provider can run here, else a sentence saying what is missing."""
        if self.ort_name not in ort.get_available_providers():
            return (
                f"onnxruntime {ort.__version__} has no {self.ort_name}; "
                f"available: {', '.join(ort.get_available_providers())}"
            )
        return None

    def session_providers(self, options: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
        """Execution providers to append to the session, in order, as (ORT name, options)."""
        return [(self.ort_name, dict(options))]

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype, *, zero: bool = True) -> Any:
        """A buffer for a model input/output of ``shape`` and ``dtype`` on this device."""
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)


class CPUProvider(ExecutionProvider):
    """ONNX Runtime's CPU execution provider: host buffers, sampling on the host."""

    name = "cpu"
    ort_name = "CPUExecutionProvider"
    device = "cpu"

    def unavailable_reason(self) -> str | None:
        return None

    def session_providers(self, options: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
        if options:
            raise ProviderUnavailableError(
                f"the cpu provider takes no options, got {', '.join(sorted(options))}"
            )
        return []  # the CPU EP is always there


_REGISTRY: dict[str, type[ExecutionProvider]] = {CPUProvider.name: CPUProvider}


def register_provider(provider: type[ExecutionProvider]) -> type[ExecutionProvider]:
    """Make ``provider`` selectable by its canonical (lower-cased) name."""
    _REGISTRY[provider.name.lower()] = provider
    return provider


def get_provider(name: str) -> ExecutionProvider:
    """The provider registered under ``name`` (canonical, case-insensitive), ready to use.

    Raises `ProviderUnavailableError` naming what is missing; never falls back to CPU.
    """
    cls = _REGISTRY.get(name.lower())
    if cls is None:
        raise ProviderUnavailableError(
            f"unknown execution provider {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
        )
    provider = cls()
    reason = provider.unavailable_reason()
    if reason is not None:
        raise ProviderUnavailableError(f"execution provider {name!r} cannot run here: {reason}")
    return provider
