"""The execution-provider seam: the provider base class and what a provider declares
(`base`), the registry the core asks for providers by name, the pluggy hook specifications
(`hookspecs`) and plugin manager (`plugins`), and the reference's availability questions
(`queries`). Providers themselves are plugins; the cpu provider is the built-in default."""

from genai.providers.base import (
    REQUIREMENTS,
    Capabilities,
    ExecutionProvider,
    GraphCapture,
    Placement,
    PluginEPProvider,
    ProviderInfo,
    SessionKV,
    SessionSpec,
    available_ort_providers,
    available_providers,
    get_current_gpu_device_id,
    get_ep_devices,
    get_provider,
    get_provider_class,
    is_provider_available,
    list_providers,
    ort_library_dir,
    probe_shared_library,
    register_execution_provider_library,
    register_provider,
    set_current_gpu_device_id,
    unregister_execution_provider_library,
)
from genai.providers.cpu import CPUProvider
from genai.providers.hookspecs import hookimpl

__all__ = [
    "REQUIREMENTS",
    "CPUProvider",
    "Capabilities",
    "ExecutionProvider",
    "GraphCapture",
    "Placement",
    "PluginEPProvider",
    "ProviderInfo",
    "SessionKV",
    "SessionSpec",
    "available_ort_providers",
    "available_providers",
    "get_current_gpu_device_id",
    "get_ep_devices",
    "get_provider",
    "get_provider_class",
    "hookimpl",
    "is_provider_available",
    "list_providers",
    "ort_library_dir",
    "probe_shared_library",
    "register_execution_provider_library",
    "register_provider",
    "set_current_gpu_device_id",
    "unregister_execution_provider_library",
]
