"""genai: run generative ONNX models with onnxruntime-genai's API (``import genai as og``)."""

from ._version import __version__
from .config import Config
from .errors import (
    ConfigError,
    GenerationError,
    ProviderUnavailableError,
    SearchOptionError,
)
from .generator import Generator
from .generator_params import GeneratorParams
from .model import Model
from .tokenizer import Tokenizer, TokenizerStream

__all__ = [
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
]
