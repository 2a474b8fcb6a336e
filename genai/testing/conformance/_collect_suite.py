"""The module `genai conformance` hands to pytest: the whole suite, for the provider named by
``--genai-provider``."""

from genai.testing.conformance.suite import ProviderConformanceTests


class TestConformance(ProviderConformanceTests):
    """The aggregate, collected once."""
