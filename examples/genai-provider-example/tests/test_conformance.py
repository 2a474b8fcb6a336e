"""The genai conformance suite, run against the example provider: what a vendor's test module
looks like."""

from typing import ClassVar

from genai.testing.conformance import ProviderConformanceTests


class TestExampleProvider(ProviderConformanceTests):
    provider_name = "example"
    provider_options: ClassVar[dict[str, str]] = {"spin": "1"}
