"""genai: run generative ONNX models with onnxruntime-genai's API (``import genai as og``)."""

from typing import TYPE_CHECKING

from genai._version import __version__
from genai.compat.engine_enums import EngineErrorCode, EngineEventFlags, FinishReason
from genai.compat.logging_options import set_log_callback, set_log_options
from genai.compat.streaming import StreamingProcessor
from genai.compat.telemetry import disable_telemetry_events, enable_telemetry_events
from genai.compat.tensors import NamedTensors, Tensor
from genai.engine import (
    Engine,
    EngineCapabilities,
    EngineEvent,
    EngineEventBuffer,
    Request,
    RequestOptions,
    TurnOptions,
    TurnUsage,
)
from genai.errors import (
    ArgumentTypeError,
    ConfigError,
    DownloadError,
    GenaiError,
    GenerationError,
    InvalidArgumentError,
    LengthLimitError,
    MissingDependencyError,
    ModelError,
    ModelFileNotFoundError,
    NonFiniteLogitsError,
    ProviderUnavailableError,
    SearchOptionError,
    TensorNotFoundError,
    UnsupportedFeatureError,
)
from genai.generation.generator import Generator
from genai.generation.generator_params import GeneratorParams
from genai.generation.mtp import MtpGenerator
from genai.multimodal import Audios, Images, MultiModalProcessor
from genai.providers import (
    get_current_gpu_device_id,
    list_providers,
    register_execution_provider_library,
    set_current_gpu_device_id,
    unregister_execution_provider_library,
)
from genai.providers.hookspecs import hookimpl
from genai.providers.queries import (
    is_cuda_available,
    is_dml_available,
    is_openvino_available,
    is_qnn_available,
    is_webgpu_available,
)
from genai.runtime.adapters import Adapters
from genai.runtime.config import Config
from genai.runtime.model import Model
from genai.text.tokenizer import Tokenizer, TokenizerStream

if TYPE_CHECKING:  # served lazily by __getattr__ below; checkers see its real signature
    from genai.builder.pull import default_model as default_model

__all__ = [
    "Adapters",
    "ArgumentTypeError",
    "Audios",
    "Config",
    "ConfigError",
    "DownloadError",
    "Engine",
    "EngineCapabilities",
    "EngineErrorCode",
    "EngineEvent",
    "EngineEventBuffer",
    "EngineEventFlags",
    "FinishReason",
    "GenaiError",
    "GenerationError",
    "Generator",
    "GeneratorParams",
    "Images",
    "InvalidArgumentError",
    "LengthLimitError",
    "MissingDependencyError",
    "Model",
    "ModelError",
    "ModelFileNotFoundError",
    "MtpGenerator",
    "MultiModalProcessor",
    "NamedTensors",
    "NonFiniteLogitsError",
    "ProviderUnavailableError",
    "Request",
    "RequestOptions",
    "SearchOptionError",
    "StreamingProcessor",
    "Tensor",
    "TensorNotFoundError",
    "Tokenizer",
    "TokenizerStream",
    "TurnOptions",
    "TurnUsage",
    "UnsupportedFeatureError",
    "__version__",
    "default_model",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_current_gpu_device_id",
    "hookimpl",
    "is_cuda_available",
    "is_dml_available",
    "is_openvino_available",
    "is_qnn_available",
    "is_webgpu_available",
    "list_providers",
    "register_execution_provider_library",
    "set_current_gpu_device_id",
    "set_log_callback",
    "set_log_options",
    "unregister_execution_provider_library",
]


def __getattr__(name: str) -> object:
    """``genai.default_model`` loads the builder (and onnx) only when it is first used."""
    if name == "default_model":
        from genai.builder.pull import default_model  # lazy: the builder imports onnx

        return default_model
    raise AttributeError(f"module 'genai' has no attribute {name!r}")
