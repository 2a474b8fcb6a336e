"""The cpu provider as a package.

The provider class ships inside genai-runtime (`genai.providers.CPUProvider`): it is the default
and must work with nothing else installed, so genai loads it as a built-in plugin named "cpu".
This package's entry point has the same name, so genai skips it when the built-in is loaded;
installing the package (``genai-runtime[cpu]``) pins ONNX Runtime's CPU wheel. Loaded by hand,
it registers the same class through the public hook (registering a class twice is a no-op).
"""

from genai import hookimpl
from genai.providers import CPUProvider

__all__ = ["CPUProvider"]


@hookimpl
def register_providers(register):
    register(CPUProvider)
