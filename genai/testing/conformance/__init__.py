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
"""

from genai.testing.conformance.runner import run_conformance
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
