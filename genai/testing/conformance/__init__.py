"""The execution-provider conformance suite, versioned with the engine.

Run it with ``genai conformance PROVIDER [--model DIR] [--report FILE.json]``, or from pytest::

    # test_myprovider.py, in the provider package's tests
    from genai.testing.conformance import ProviderConformanceTests

    class TestMyProvider(ProviderConformanceTests):
        provider_name = "myep"

The areas are importable one by one (`SessionCreationTests`, `GreedyParityTests`,
`KVLayoutTests`, `BatchTests`, `RewindContinuousTests`, `GraphCaptureTests`,
`SeededSamplingTests`, `SpeechTests`, `VisionTests`, `BufferPlacementTests`, `ErrorTests`);
`ProviderConformanceTests` is all of them. The pytest plugin
(`genai.testing.conformance.plugin`, loaded through the ``pytest11`` entry point) adds
``--genai-provider``, ``--genai-provider-option``, ``--genai-model``, ``--genai-xfails`` and
``--genai-report``.

The suite's names are imported on first use (`genai.testing.conformance.suite`, which needs
pytest): under pytest, after the plugin has marked the suite for assertion rewriting.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from genai.testing.conformance.runner import run_conformance

if TYPE_CHECKING:
    from genai.testing.conformance.suite import (
        BatchTests,
        BufferPlacementTests,
        ConformanceFixtures,
        ErrorTests,
        GraphCaptureTests,
        GreedyParityTests,
        KVLayoutTests,
        ProviderConformanceTests,
        RewindContinuousTests,
        SeededSamplingTests,
        SessionCreationTests,
        SpeechTests,
        VisionTests,
        requires,
    )

__all__ = [
    "BatchTests",
    "BufferPlacementTests",
    "ConformanceFixtures",
    "ErrorTests",
    "GraphCaptureTests",
    "GreedyParityTests",
    "KVLayoutTests",
    "ProviderConformanceTests",
    "RewindContinuousTests",
    "SeededSamplingTests",
    "SessionCreationTests",
    "SpeechTests",
    "VisionTests",
    "requires",
    "run_conformance",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("genai.testing.conformance.suite"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
