"""The reference's module-level provider questions: ``is_cuda_available()`` and its siblings.

Each asks the provider registry by the reference's provider name; the provider plugin that
answers to that name says whether it can run here (`genai.providers.base.is_provider_available`).
The answer is about this machine, not about how genai was built: with no installed plugin for
a provider it is False (the reference answers whether its build could load the provider:
always True for OpenVINO, QNN and WebGPU; see docs/differences.md).
"""

from __future__ import annotations

from genai.providers.base import is_provider_available

__all__ = [
    "is_cuda_available",
    "is_dml_available",
    "is_openvino_available",
    "is_qnn_available",
    "is_webgpu_available",
]


def is_cuda_available() -> bool:
    """Whether an installed provider plugin answers to ``"cuda"`` and can run here."""
    return is_provider_available("cuda")


def is_dml_available() -> bool:
    """Whether an installed provider plugin answers to ``"dml"`` (DirectML) and can run here."""
    return is_provider_available("dml")


def is_openvino_available() -> bool:
    """Whether an installed provider plugin answers to ``"openvino"`` and can run here."""
    return is_provider_available("openvino")


def is_qnn_available() -> bool:
    """Whether an installed provider plugin answers to ``"qnn"`` and can run here."""
    return is_provider_available("qnn")


def is_webgpu_available() -> bool:
    """Whether an installed provider plugin answers to ``"webgpu"`` and can run here."""
    return is_provider_available("webgpu")
