"""genai: run generative ONNX models with onnxruntime-genai's API (``import genai as og``)."""

from ._version import __version__
from .adapters import Adapters
from .config import Config
from .errors import (
    ConfigError,
    GenerationError,
    ProviderUnavailableError,
    SearchOptionError,
)
from .generator import Generator
from .generator_params import GeneratorParams
from .hookspecs import hookimpl
from .model import Model
from .providers import list_providers, register_execution_provider_library
from .tokenizer import Tokenizer, TokenizerStream

__all__ = [
    "Adapters",
    "Config",
    "ConfigError",
    "GenerationError",
    "Generator",
    "GeneratorParams",
    "Model",
    "ProviderUnavailableError",
    "SearchOptionError",
    "Tokenizer",
    "TokenizerStream",
    "__version__",
    "hookimpl",
    "list_providers",
    "register_execution_provider_library",
]
