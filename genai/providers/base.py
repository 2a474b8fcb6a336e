"""Execution providers: the objects that own everything hardware-specific.

A provider is a subclass of `ExecutionProvider` registered by a plugin through the
``register_providers`` hook (see `genai.providers.hookspecs`). It answers, for its hardware:

* whether it can run here (`ExecutionProvider.unavailable_reason`: a cheap probe that returns
  the reason when it cannot; imports lazily);
* how the ORT session is built (`ExecutionProvider.session_spec`: EP name and options, or a
  plugin EP library registered with ORT and the devices it lists, plus session config entries
  and fixed shapes);
* where each buffer lives and how it is allocated (`Placement`, `ExecutionProvider.allocate`);
* graph capture: whether it exists, how it is switched on and what it needs (`GraphCapture`);
* what it can do (`Capabilities`: exactness against the cpu provider, KV layouts, batching,
  continuous decoding, rewind, seeded sampling).

The core asks the provider and never switches on provider names. A requested provider that
cannot run raises `ProviderUnavailableError` naming what is missing: there is no silent fallback
to CPU.

The cpu provider is the built-in default plugin (`genai.providers.cpu`, listed in
`genai.providers.plugins.DEFAULT_PLUGINS`): it registers through the same hook as every other
plugin. The registry here is built from that hook on first use and forgotten whenever the set
of plugins changes (`genai.providers.plugins.on_change`).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import logging
import os
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from genai._core import ort_api
from genai._core.native_session import DeviceTensor
from genai.compat.logging_options import log_event
from genai.errors import (
    ArgumentTypeError,
    ConfigError,
    InvalidArgumentError,
    ProviderUnavailableError,
)
from genai.providers import plugins
from genai.runtime.buffers import aligned_empty, aligned_zeros
from genai.runtime.config import normalize_provider_name

if TYPE_CHECKING:
    from genai._core.native_session import NativeSession
    from genai.runtime.config import Config

log = logging.getLogger(__name__)

__all__ = [
    "REQUIREMENTS",
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
    "is_provider_available",
    "list_providers",
    "ort_library_dir",
    "probe_shared_library",
    "register_execution_provider_library",
    "register_provider",
    "set_current_gpu_device_id",
    "unregister_execution_provider_library",
]

#: Names a conformance test may require (`Capabilities` fields; see
#: `genai.testing.conformance.requires`).
REQUIREMENTS = frozenset(
    [
        "exact",
        "kv_shared",
        "kv_growing",
        "batch",
        "continuous_decoding",
        "rewind",
        "graph_capture",
        "seeded_sampling",
        "speech",
        "vision",
    ]
)


@dataclass(frozen=True)
class Capabilities:
    """What a provider can do; the conformance suite skips what it declares unsupported.

    ``exact``: greedy tokens equal the cpu provider's token for token. When False,
    ``logits_atol`` is the largest absolute logit difference from the cpu provider the provider
    promises (checked with the cpu provider's tokens fed to both).
    ``kv_layouts``: ``"shared"`` (``past_present_share_buffer`` true: one preallocated buffer
    bound as past and present) and/or ``"growing"`` (past/present handed over each step).
    ``speech``: runs encoder-decoder speech models (Whisper: the encoder once, the decoder with
    cross-attention KV); ``vision``: runs vision-language models (vision, embedding and
    decoder graphs, the decoder fed ``inputs_embeds``).
    """

    exact: bool = True
    logits_atol: float = 0.0
    kv_layouts: frozenset[str] = frozenset({"shared", "growing"})
    batch: bool = True
    continuous_decoding: bool = True
    rewind: bool = True
    seeded_sampling: bool = True
    speech: bool = True
    vision: bool = True

    def __post_init__(self) -> None:
        layouts = frozenset(self.kv_layouts)
        object.__setattr__(self, "kv_layouts", layouts)
        if not layouts or not layouts <= {"shared", "growing"}:
            raise InvalidArgumentError(
                f"kv_layouts must be a non-empty subset of shared/growing: {layouts}"
            )
        if self.logits_atol < 0:
            raise InvalidArgumentError(f"logits_atol must be >= 0, got {self.logits_atol}")

    @property
    def shared_buffer_required(self) -> bool:
        """True when only the shared-buffer KV layout works."""
        return self.kv_layouts == {"shared"}

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kv_layouts"] = sorted(self.kv_layouts)
        data["shared_buffer_required"] = self.shared_buffer_required
        return data


@dataclass(frozen=True)
class Placement:
    """Where the engine's buffers live with this provider, as device names (``"cpu"`` for host
    memory; otherwise the provider's ``device``) and how they are allocated.

    ``kv_cache``: the KV buffers (shared layout: allocated by `ExecutionProvider.allocate`;
    growing layout: allocated by ORT at each run). ``inputs``: input ids, attention mask,
    positions. ``logits``: the logits the engine reads. ``sampling``: where the next token is
    chosen. ``allocator``: how `ExecutionProvider.allocate` gets memory for the roles placed on
    the device (``"numpy"``: host arrays; ``"session"``: a
    `genai._core.native_session.DeviceTensor`, given its memory by the session it is first
    bound to -- where that session wants the input or output -- and read and written through
    the host).
    """

    kv_cache: str = "cpu"
    inputs: str = "cpu"
    logits: str = "cpu"
    sampling: str = "cpu"
    allocator: str = "numpy"


@dataclass(frozen=True)
class GraphCapture:
    """How a provider's graph capture (CUDA graphs, DirectML/WebGPU capture) is switched.

    ``option``/``on``/``off``: the EP option and its values; ``default``: whether it is on when
    the option is absent. What it needs from the engine: the KV cache in device memory (always:
    the provider places ``kv_cache`` on its device, since a replay reads the device addresses it
    captured and copies nothing from the host), the shared-buffer KV layout
    (``requires_shared_buffer``), input buffers at fixed addresses (the attention mask
    allocated once for ``max_length`` and updated in place) and at most ``max_batch_size`` rows
    (batch x beams). A generator that cannot meet that runs uncaptured
    (`ExecutionProvider.graph_capture_id`).

    ``session_requires_shared_buffer``: the EP refuses every other KV layout on a session made
    with graph capture on, captured run or not (WebGPU's GroupQueryAttention), so a model or
    generator asking for another layout is an error, not an uncaptured run.

    The model must take the total length from the mask's contents, as the reference's builder
    emits graphs for graph capture (e.g. WebGPU: ``ReduceMax(ReduceSum(mask))`` in place of
    ``Shape(mask)[1]``; `genai.testing.models.write_gqa_decoder(static_mask=True)`).
    """

    option: str
    on: str = "1"
    off: str = "0"
    default: bool = False
    requires_shared_buffer: bool = True
    max_batch_size: int | None = 1
    session_requires_shared_buffer: bool = False


@dataclass(frozen=True)
class SessionKV:
    """The KV cache lives inside the session (OpenVINO's stateful ``enable_causallm`` mode):
    the engine binds empty pasts, reads no presents, and moves the EP's cache through the
    dynamic option ``rewind_option`` (set to the number of positions to keep; 0 starts a new
    sequence). Runs one sequence at a time (batch 1, one live generator per model)."""

    rewind_option: str


@dataclass
class SessionSpec:
    """What `genai.Model` hands to the session: execution providers in order, each
    ``(EP name, options)`` or ``([EpDevice, ...], options)`` for a plugin EP's devices; ORT
    session config entries to add; symbolic dimensions to fix (static shapes)."""

    providers: list[tuple[Any, dict[str, str]]] = field(default_factory=list)
    config_entries: dict[str, str] = field(default_factory=dict)
    free_dimension_overrides: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise ArgumentTypeError(f"SessionSpec: {problem}")

    def problem(self) -> str | None:
        """What is wrong with the fields' types (a phrase starting with the field's name), or
        None when nothing is."""
        providers = self.providers
        if not isinstance(providers, (list, tuple)):
            return (
                "providers must be a list of (EP name or [EpDevice, ...], {option: value}) "
                f"pairs, not {_shown(providers)}"
            )
        for item in providers:
            if not (isinstance(item, (list, tuple)) and len(item) == 2):
                return (
                    "providers must hold (EP name or [EpDevice, ...], {option: value}) pairs, "
                    f"not {_shown(item)}"
                )
            ep, options = item
            if not (isinstance(ep, (str, list, tuple)) or hasattr(ep, "ep_name")):
                return (  # (an EpDevice on its own, with its ep_name, is taken too)
                    f"providers entry {_shown(ep)} must name the EP (str) or list its devices "
                    "([EpDevice, ...])"
                )
            problem = _str_mapping_problem(options, str, "str")
            if problem is not None:
                return f"providers options of {reprlib.repr(ep)} must be {problem}"
        problem = _str_mapping_problem(self.config_entries, str, "str")
        if problem is not None:
            return f"config_entries must be {problem}"
        problem = _str_mapping_problem(self.free_dimension_overrides, int, "int")
        if problem is not None:
            return f"free_dimension_overrides must be {problem}"
        return None


def _shown(value: Any) -> str:
    """``int 1``, ``dict {...}``: a value's type and (short) repr; ``None`` for None."""
    return "None" if value is None else f"{type(value).__name__} {reprlib.repr(value)}"


def _str_mapping_problem(value: Any, kind: type, kind_name: str) -> str | None:
    """None when ``value`` is a mapping of str to ``kind`` (no bool), else what it must be and
    what it is."""
    expected = f"a dict of str to {kind_name}"
    if not isinstance(value, Mapping):
        hint = " (`{...}` is a set, not a dict)" if isinstance(value, (set, frozenset)) else ""
        return f"{expected}, not {_shown(value)}{hint}"
    for key, item in value.items():
        if not isinstance(key, str):
            return f"{expected}; key {_shown(key)}"
        if not isinstance(item, kind) or isinstance(item, bool):
            return f"{expected}; {key!r} is {_shown(item)}"
    return None


class ExecutionProvider:
    """Base class of every provider. Subclasses set the class attributes and override what
    differs; the defaults describe ORT's CPU EP in this engine (host buffers, host sampling).

    Instances are made per model load (`get_provider`); keep them cheap to create.
    """

    #: Canonical name, as the config writes it after the reference's normalisation ("cuda",
    #: "DML", "QNN", "WebGPU", "OpenVINO", "NvTensorRtRtx", ...).
    name: ClassVar[str] = ""
    #: Other names it answers to (matched case-insensitively after normalisation).
    aliases: ClassVar[tuple[str, ...]] = ()
    #: ORT's name for the EP ("CUDAExecutionProvider").
    ort_name: ClassVar[str] = ""
    #: Device name of the provider's memory ("cpu", "cuda", "dml", "webgpu", ...).
    device: ClassVar[str] = "cpu"
    #: ``Model.device_type`` as the reference spells this EP's device (its
    #: ``to_string(DeviceType)``: "CUDA", "DirectML", "WebGPU", ...); "CPU", the default, is
    #: the reference's for EPs whose buffers go through the host.
    reference_device: ClassVar[str] = "CPU"
    #: pip packages that provide the EP (for messages and listings).
    requires: ClassVar[tuple[str, ...]] = ()
    #: One line for listings.
    description: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    placement: ClassVar[Placement] = Placement()
    #: None when the EP has no graph capture.
    graph_capture: ClassVar[GraphCapture | None] = None
    #: Option keys the provider accepts; None passes every key through to ORT.
    known_options: ClassVar[frozenset[str] | None] = None
    #: Options applied unless the config sets them.
    default_options: ClassVar[Mapping[str, str]] = {}
    #: Memory device type ("GPU", "NPU") some session input or output must use once the session
    #: exists; None skips the check (see `check_session`).
    session_memory_device: ClassVar[str | None] = None
    #: Positions a sliding-window layer's cache keeps beyond its window (W + slack, see
    #: `genai.kv.kv_cache.window_capacity`); None keeps those layers at full length, as the
    #: reference does for providers without a windowed cache.
    kv_window_slack: ClassVar[int | None] = None
    #: Set (on the instance, by `validate_options`) when the options make the EP keep the KV
    #: cache inside the session; None: the engine owns the cache (see `SessionKV`).
    session_kv: SessionKV | None = None
    #: The EP compiles graphs with fixed shapes (QNN's HTP): a model run at several shapes (a
    #: windowed model's S = W and S = 1) gets one session per shape (see `genai.Model`).
    static_shapes: ClassVar[bool] = False
    #: The EP is onnxruntime's CPU EP, where genai may run a decoder graph's GroupQueryAttention
    #: in chunks of a long prompt's rows and fuse its per-row quantisations: custom ops of
    #: genai's (`genai._core.custom_ops`) that run on the CPU EP only.
    host_ops: ClassVar[bool] = False
    #: Conformance tests known to fail, {test function name: reason}: reported as xfail.
    known_failures: ClassVar[Mapping[str, str]] = {}

    # --- availability ------------------------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        """None when the provider can run here, else a sentence saying what is missing.

        Must be cheap and must not raise: probe files and module specs, import lazily. The
        default checks that the loaded onnxruntime library lists ``ort_name``."""
        try:
            names = available_ort_providers()
        except Exception as exc:  # the ORT library itself cannot be loaded
            return f"onnxruntime cannot be loaded: {exc}"
        if self.ort_name not in names:
            return (
                f"onnxruntime {_ort_version()} has no {self.ort_name} (it has "
                f"{', '.join(names)}){_install_hint(self.requires)}"
            )
        return None

    def is_available(self) -> bool:
        """Whether the provider can run here (`unavailable_reason` is None). Never raises: a
        probe that raises counts as unavailable."""
        try:
            return self.unavailable_reason() is None
        except Exception:
            return False

    def reference_device_type(self, options: Mapping[str, str]) -> str:
        """``Model.device_type`` for this provider with ``options``: `reference_device`
        unless the options change the device (QNN's shared-memory allocator)."""
        return self.reference_device

    # --- current GPU device (the reference's get/set_current_gpu_device_id) ---------------
    def current_gpu_device_id(self) -> int | None:
        """The GPU device this provider's sessions use when the options name none, for a
        provider that has such a process-wide current device; None (the default) when it has
        none, so the question goes to another provider."""
        return None

    def set_current_gpu_device_id(self, device_id: int) -> bool:
        """Make ``device_id`` the current GPU device of this provider. Returns False (the
        default) when the provider has no current GPU device to set; True when it took it.
        Raises ValueError for a device it does not have."""
        return False

    # --- session -----------------------------------------------------------------------------
    def validate_options(self, options: Mapping[str, str]) -> dict[str, str]:
        """The options to use: ``default_options`` overlaid with ``options``. Unknown keys (when
        ``known_options`` is set) and non-string values raise `ConfigError` naming them."""
        for key, value in options.items():
            if not isinstance(value, str):
                raise ConfigError(
                    f"provider option {self.name}.{key} must be a string, got "
                    f"{type(value).__name__}"
                )
        if self.known_options is not None:
            unknown = sorted(set(options) - self.known_options)
            if unknown:
                known = ", ".join(sorted(self.known_options)) or "none"
                raise ConfigError(
                    f"unknown option(s) {', '.join(unknown)} for execution provider "
                    f"{self.name!r}; it accepts: {known}"
                )
        return {**self.default_options, **options}

    def session_providers(self, options: Mapping[str, str]) -> list[tuple[Any, dict[str, str]]]:
        """Execution providers to append to the session, in order, as (ORT name, options)."""
        return [(self.ort_name, dict(options))]

    def session_spec(self, options: Mapping[str, str], config: Config | None = None) -> SessionSpec:
        """How to build the session for ``options`` (already validated) and the model's
        ``config``. Raises `ProviderUnavailableError` when the EP cannot be set up."""
        self.check_graph_capture_config(options, config)
        return SessionSpec(providers=self.session_providers(options))

    def check_graph_capture_config(
        self, options: Mapping[str, str], config: Config | None = None
    ) -> None:
        """Raise `ConfigError` when ``options`` turn graph capture on for a model whose
        ``config`` asks for a KV layout the EP then refuses
        (``GraphCapture.session_requires_shared_buffer`` and ``past_present_share_buffer``
        false): better than the EP's failure at the first run."""
        capture = self.graph_capture
        if capture is None or not capture.session_requires_shared_buffer or config is None:
            return
        if self.graph_capture_enabled(options) and not config.get(
            "search.past_present_share_buffer", False
        ):
            raise ConfigError(self._shared_buffer_message())

    def _shared_buffer_message(self) -> str:
        capture = self.graph_capture
        assert capture is not None
        return (
            f"{self.name} with graph capture on ({capture.option}={capture.on}) runs only the "
            "shared-buffer KV layout: set search.past_present_share_buffer to true, or "
            f"{capture.option}={capture.off}"
        )

    def check_session(self, session: NativeSession) -> None:
        """Raise `ProviderUnavailableError` when the created session does not really use the
        EP (e.g. every node fell back to the CPU EP). The default checks, when
        ``session_memory_device`` is set and ORT can tell (>= 1.23), that some input or output
        lives in that kind of memory."""
        wanted = self.session_memory_device
        if wanted is None:
            return
        try:
            infos = {**session.input_memory_info(), **session.output_memory_info()}
        except Exception:  # ORT < 1.23 cannot report it
            return
        kinds = {info["device_type"] for info in infos.values() if info}
        if wanted not in kinds:
            raise ProviderUnavailableError(
                f"execution provider {self.name!r} was requested, but the session keeps every "
                f"input and output in {', '.join(sorted(kinds)) or 'no'} memory, none in "
                f"{wanted} memory: {self.ort_name} took no part of the graph"
            )

    # --- buffers -----------------------------------------------------------------------------
    def allocate(
        self, shape: tuple[int, ...], dtype: np.dtype, *, zero: bool = True, role: str = "kv_cache"
    ) -> Any:
        """A buffer of ``shape`` and ``dtype`` for ``role`` ("kv_cache", "inputs", "logits"),
        where `placement` says that role lives. The default: a host array; for a role placed
        on the device with ``placement.allocator == "session"``, a
        `genai._core.native_session.DeviceTensor` (zero-filled) that takes its device memory
        from the session it is first bound to."""
        if getattr(self.placement, role) != "cpu" and self.placement.allocator == "session":
            return DeviceTensor(tuple(shape), np.dtype(dtype), device=self.device)
        return aligned_zeros(shape, dtype) if zero else aligned_empty(shape, dtype)

    def buffer_device(self, buffer: Any) -> str:
        """The device name a buffer made by `allocate` lives on ("cpu" for host arrays)."""
        if isinstance(buffer, np.ndarray):
            return "cpu"
        device = getattr(buffer, "device_name", None)
        return str(device() if callable(device) else device or "unknown")

    # --- graph capture -----------------------------------------------------------------------
    def graph_capture_options(self, enabled: bool) -> dict[str, str]:
        """The EP options that switch graph capture on or off."""
        capture = self.graph_capture
        if capture is None:
            raise ProviderUnavailableError(f"execution provider {self.name!r} has no graph capture")
        return {capture.option: capture.on if enabled else capture.off}

    def graph_capture_enabled(self, options: Mapping[str, str]) -> bool:
        """Whether ``options`` leave graph capture on."""
        capture = self.graph_capture
        if capture is None:
            return False
        value = options.get(capture.option)
        return capture.default if value is None else value == capture.on

    def graph_capture_blocker(self, *, rows: int, shared_kv: bool) -> str | None:
        """Why a generator of ``rows`` rows (batch x beams) with (``shared_kv``) or without
        the shared-buffer KV layout cannot use graph capture; None when it can. A KV cache in
        host memory blocks it whatever ``requires_shared_buffer`` says: a replayed graph reads
        the device copies made when it was captured, not the host buffers again."""
        capture = self.graph_capture
        if capture is None:
            return f"{self.name} has no graph capture"
        if capture.max_batch_size is not None and rows > capture.max_batch_size:
            return f"{rows} rows (batch x beams); graph capture takes {capture.max_batch_size}"
        if capture.requires_shared_buffer and not shared_kv:
            return "graph capture needs the shared-buffer KV layout (past_present_share_buffer)"
        if self.placement.kv_cache == "cpu":
            return (
                f"{self.name} keeps the KV cache in host memory, which a captured graph would "
                "not read again"
            )
        return None

    def graph_capture_id(
        self, options: Mapping[str, str], session: NativeSession, *, rows: int, shared_kv: bool
    ) -> int:
        """What a generator on ``session`` (a model made with ``options``) does about graph
        capture: 0 when the provider's graph capture is off (or it has none); -1 when it is on
        but this generator cannot use it (`graph_capture_blocker`: its runs then say
        ``gpu_graph_id=-1``, else onnxruntime would capture its first run under the default
        id); else a graph id of its own for `DecoderLoop.use_graph_capture` (each generator
        binds its own buffers, so each captures its own graph). Raises `ConfigError` for a
        generator without the shared buffer when the EP refuses other layouts on such a
        session (``GraphCapture.session_requires_shared_buffer``)."""
        if not self.graph_capture_enabled(options):
            return 0
        capture = self.graph_capture
        if capture is not None and capture.session_requires_shared_buffer and not shared_kv:
            raise ConfigError(self._shared_buffer_message())
        if self.graph_capture_blocker(rows=rows, shared_kv=shared_kv) is not None:
            return -1
        return int(session.next_graph_id())

    # --- description -------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Everything a listing or a conformance report shows about this provider."""
        capture = self.graph_capture
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "ort_name": self.ort_name,
            "device": self.device,
            "requires": list(self.requires),
            "description": self.description,
            "capabilities": self.capabilities.as_dict(),
            "placement": asdict(self.placement),
            "graph_capture": asdict(capture) if capture else None,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ({self.ort_name})>"


class PluginEPProvider(ExecutionProvider):
    """A provider whose EP ships as an ORT plugin package (onnxruntime-ep-webgpu, onnxruntime-qnn,
    onnxruntime-ep-openvino, onnxruntime-ep-nv-tensorrt-rtx, ...): the package's
    ``get_library_path()`` is registered with ORT once per process, then the session uses the
    devices ORT lists for the package's ``get_ep_name()`` (filtered by `select_devices`).
    """

    #: Importable module of the plugin package (exposes get_library_path / get_ep_name).
    ep_module: ClassVar[str] = ""
    #: Hardware device types to use ("GPU", "NPU", "CPU"); empty accepts any.
    device_types: ClassVar[tuple[str, ...]] = ()

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec(self.ep_module.split(".")[0]) is None:
            return f"the module {self.ep_module} is not installed{_install_hint(self.requires)}"
        try:
            if not ort_api.has_plugin_ep_api():
                return (
                    f"onnxruntime {ort_api.version()} has no plugin execution-provider API "
                    "(needs onnxruntime >= 1.22)"
                )
        except Exception as exc:
            return f"onnxruntime cannot be loaded: {exc}"
        return None

    def library(self) -> tuple[str, str]:
        """(EP name, library path) from the plugin package (imports it)."""
        module = importlib.import_module(self.ep_module)
        return str(module.get_ep_name()), os.fspath(module.get_library_path())

    def registration_name(self) -> str:
        """The name the library is registered under with ORT."""
        return self.library()[0]

    def ensure_registered(self) -> str:
        """Register the plugin library (once per process); returns the EP name."""
        ep_name, path = self.library()
        try:
            register_execution_provider_library(self.registration_name(), path)
        except Exception as exc:
            raise ProviderUnavailableError(
                f"execution provider {self.name!r}: registering {path} with onnxruntime "
                f"failed: {exc}"
            ) from exc
        return ep_name

    def select_devices(self, devices: Sequence[Any], options: Mapping[str, str]) -> list[Any]:
        """The devices (EpDevice objects of this EP) the session should use. The default keeps
        the devices of an accepted type (`device_types`) and takes the one at index
        ``device_id`` (option; default 0) among them."""
        wanted = [d for d in devices if not self.device_types or d.device_type in self.device_types]
        raw = options.get("device_id", "0")
        if not str(raw).isdigit():
            raise ConfigError(
                f"provider option {self.name}.device_id must be an integer, got {raw!r}"
            )
        index = int(raw)
        return wanted[index : index + 1]

    def ep_options(self, options: Mapping[str, str]) -> dict[str, str]:
        """The options passed to ORT for the selected devices: all but ``device_id`` (which
        chose the device)."""
        return {k: v for k, v in options.items() if k != "device_id"}

    def probe_devices(self) -> list[Any]:
        """Register the library and list this EP's devices (not cheap: loads the library)."""
        ep_name = self.ensure_registered()
        return [d for d in get_ep_devices() if d.ep_name == ep_name]

    def session_spec(self, options: Mapping[str, str], config: Config | None = None) -> SessionSpec:
        self.check_graph_capture_config(options, config)
        ep_name = self.ensure_registered()
        everything = get_ep_devices()
        mine = [d for d in everything if d.ep_name == ep_name]
        chosen = self.select_devices(mine, options)
        if not chosen:
            listed = ", ".join(f"{d.ep_name}/{d.device_type}/{d.vendor}" for d in everything)
            wanted = "/".join(self.device_types) or "any"
            raise ProviderUnavailableError(
                f"execution provider {self.name!r}: {ep_name} is registered but offers no "
                f"{wanted} device here ({len(mine)} device(s) of its own; onnxruntime lists: "
                f"{listed or 'nothing'})"
            )
        return SessionSpec(providers=[(chosen, self.ep_options(options))])


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProviderInfo:
    """One row of `list_providers`."""

    name: str
    aliases: tuple[str, ...]
    ort_name: str
    package: str
    plugin: str
    requires: tuple[str, ...]
    available: bool
    reason: str | None
    description: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(name: str) -> str:
    return normalize_provider_name(name).lower()


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def provider_origin(provider: ExecutionProvider | type[ExecutionProvider], hook: str) -> str:
    """``"AcmeProvider.session_spec (module.AcmeProvider, plugin 'acme' (dist 1.0))"``: where a
    provider's method comes from, for messages about a broken plugin."""
    cls = provider if isinstance(provider, type) else type(provider)
    where = [_qualname(cls)]
    plugin = _REGISTRY.plugins.get(_key(cls.name)) if cls.name else None
    if plugin is not None and _REGISTRY.classes.get(_key(cls.name)) is cls:
        where.append(plugins.describe_plugin(plugin))
    else:
        where.append(f"distribution {plugins.distribution_of(cls.__module__)}")
    return f"{cls.__name__}.{hook} ({', '.join(where)})"


def check_hook_result(
    provider: ExecutionProvider, hook: str, value: Any, expected: type, what: str
) -> Any:
    """``value`` when it is an ``expected`` instance, else `PluginError` naming the provider's
    class, the method ``hook``, ``what`` it should return and what it returned."""
    if isinstance(value, expected):
        return value
    raise plugins.PluginError(
        f"{provider_origin(provider, hook)} returned {_shown(value)}; it must return {what}"
    )


def checked_options(provider: ExecutionProvider, options: Any) -> dict[str, str]:
    """What ``provider.validate_options`` returned (``options``), checked: a mapping of str to
    str, as a dict; else `PluginError` naming the provider."""
    what = "a dict of option name (str) to value (str)"
    check_hook_result(provider, "validate_options", options, Mapping, what)
    bad = [(k, v) for k, v in options.items() if not (isinstance(k, str) and isinstance(v, str))]
    if bad:
        key, value = bad[0]
        raise plugins.PluginError(
            f"{provider_origin(provider, 'validate_options')} returned option {key!r}: "
            f"{_shown(value)}; it must return {what}"
        )
    return dict(options)


def checked_session_spec(provider: ExecutionProvider, spec: Any) -> SessionSpec:
    """What ``provider.session_spec`` returned (``spec``), checked: a `SessionSpec` whose
    fields have the right types (they may change after it is made); else `PluginError` naming
    the provider."""
    check_hook_result(provider, "session_spec", spec, SessionSpec, "a genai.providers.SessionSpec")
    problem = spec.problem()
    if problem is not None:
        raise plugins.PluginError(
            f"{provider_origin(provider, 'session_spec')} returned a SessionSpec whose {problem}"
        )
    return spec


class _Registry:
    """Provider classes by lower-cased canonical name; filled by the ``register_providers``
    hook the first time it is needed, and rebuilt when plugins change."""

    def __init__(self) -> None:
        self.classes: dict[str, type[ExecutionProvider]] = {}
        self.aliases: dict[str, str] = {}
        self.plugins: dict[str, str] = {}  # canonical key -> plugin name
        self.manual: list[tuple[type[ExecutionProvider], tuple[str, ...]]] = []
        self.built = False
        self.building = False

    def add(
        self, cls: type[ExecutionProvider], aliases: Iterable[str] = (), plugin: str = "<manual>"
    ) -> type[ExecutionProvider]:
        who = plugins.describe_plugin(plugin)
        if not (isinstance(cls, type) and issubclass(cls, ExecutionProvider)):
            raise ArgumentTypeError(
                f"{who}: register() expects an ExecutionProvider subclass, got {cls!r}"
                + (" (an instance: pass the class)" if isinstance(cls, ExecutionProvider) else "")
            )
        if not cls.name:
            raise InvalidArgumentError(
                f"{who}: {cls.__module__}.{cls.__qualname__} has no name (set its class "
                "attribute name)"
            )
        key = _key(cls.name)
        existing = self.classes.get(key)
        if existing is not None and existing is not cls:
            first = self.plugins.get(key, "<manual>")
            raise plugins.PluginError(
                f"execution provider {cls.name!r} is registered twice: by "
                f"{plugins.describe_plugin(first)}, class {_qualname(existing)}, and by {who}, "
                f"class {_qualname(cls)}{plugins.conflict_hint(first, plugin)}"
            )
        owner = self.aliases.get(key)
        if owner is not None and owner != key:
            first = self.plugins.get(owner, "<manual>")
            raise plugins.PluginError(
                f"execution provider name {cls.name!r} ({who}) is already an alias of "
                f"{self.classes[owner].name!r} ({plugins.describe_plugin(first)})"
                f"{plugins.conflict_hint(first, plugin)}"
            )
        for alias in (*cls.aliases, *aliases):  # checked before anything is recorded
            alias_key = _key(alias)
            taken = self.aliases.get(alias_key) or (
                alias_key if alias_key in self.classes else None
            )
            if alias_key != key and taken is not None and taken != key:
                first = self.plugins.get(taken, "<manual>")
                raise plugins.PluginError(
                    f"alias {alias!r} of execution provider {cls.name!r} ({who}) is already "
                    f"taken by {self.classes[taken].name!r} ({plugins.describe_plugin(first)})"
                    f"{plugins.conflict_hint(first, plugin)}"
                )
        self.classes[key] = cls
        self.plugins.setdefault(key, plugin)
        for alias in (*cls.aliases, *aliases):
            alias_key = _key(alias)
            if alias_key != key:
                self.aliases[alias_key] = key
        return cls

    def build(self) -> None:
        """Ask every plugin again (``register_providers``); the registry is complete (and
        `built`) only once every plugin has registered."""
        self.classes.clear()
        self.aliases.clear()
        self.plugins.clear()
        self.building = True
        try:
            plugins.call_register_providers(self.add)
            for cls, aliases in self.manual:
                self.add(cls, aliases)
            self.built = True
            log.debug(
                "execution providers registered: %s",
                ", ".join(
                    f"{c.name} ({self.plugins.get(k, '<manual>')})" for k, c in self.classes.items()
                ),
            )
        finally:
            self.building = False

    def ensure(self) -> None:
        if self.built:
            return
        with plugins._lock:  # re-entrant: a lookup from inside a plugin's hook sees `building`
            if not self.built and not self.building:
                self.build()

    def lookup(self, name: str) -> type[ExecutionProvider] | None:
        self.ensure()
        key = _key(name)
        key = self.aliases.get(key, key)
        return self.classes.get(key)


_REGISTRY = _Registry()


def _invalidate() -> None:
    """Forget the registry (plugins changed); the next lookup calls the hook again."""
    _REGISTRY.built = False


plugins.on_change(_invalidate)


def register_provider(
    provider: type[ExecutionProvider], *, aliases: Iterable[str] = ()
) -> type[ExecutionProvider]:
    """Register ``provider`` by hand (outside any plugin); usable as a class decorator. Plugins
    use the ``register_providers`` hook instead."""
    _REGISTRY.manual.append((provider, tuple(aliases)))
    if _REGISTRY.built:
        _REGISTRY.add(provider, aliases)
    return provider


def get_provider_class(name: str) -> type[ExecutionProvider]:
    """The class registered under ``name`` (any spelling the reference accepts, or an alias).
    Raises `ProviderUnavailableError` for a name no plugin provides, saying which package
    would."""
    cls = _REGISTRY.lookup(name)
    if cls is None:
        registered = ", ".join(sorted(c.name for c in _REGISTRY.classes.values()))
        raise ProviderUnavailableError(
            f"unknown execution provider {name!r}: no installed plugin provides it"
            f"{plugins.provider_install_hint(name)}; registered: {registered}"
        )
    return cls


def get_provider(name: str) -> ExecutionProvider:
    """A ready-to-use instance of the provider registered under ``name``.

    Raises `ProviderUnavailableError` naming what is missing; never falls back to CPU.
    """
    cls = get_provider_class(name)
    provider = cls()
    try:
        reason = provider.unavailable_reason()
    except Exception as exc:  # a probe must not raise; as `list_providers`, it cannot run
        raise ProviderUnavailableError(
            f"execution provider {cls.name!r} cannot run here: its availability probe "
            f"{provider_origin(cls, 'unavailable_reason')} raised {type(exc).__name__}: {exc} "
            "(a probe must return the reason, not raise)"
        ) from exc
    if reason is not None:
        raise ProviderUnavailableError(f"execution provider {cls.name!r} cannot run here: {reason}")
    return provider


def list_providers() -> list[ProviderInfo]:
    """Every registered provider with its package, and whether it can run here or why not
    (cheap probes only), sorted with cpu first."""
    _REGISTRY.ensure()
    rows = []
    for key, cls in _REGISTRY.classes.items():
        try:
            reason = cls().unavailable_reason()
        except Exception as exc:  # a probe must not raise; report it instead
            reason = f"the availability probe raised {type(exc).__name__}: {exc}"
        rows.append(
            ProviderInfo(
                name=cls.name,
                aliases=tuple(cls.aliases)
                + tuple(
                    a for a, k in _REGISTRY.aliases.items() if k == key and a not in cls.aliases
                ),
                ort_name=cls.ort_name,
                package=plugins.distribution_of(cls.__module__),
                plugin=_REGISTRY.plugins.get(key, "<manual>"),
                requires=tuple(cls.requires),
                available=reason is None,
                reason=reason,
                description=cls.description,
            )
        )
    rows.sort(key=lambda r: (r.name != "cpu", r.name.lower()))
    return rows


def is_provider_available(name: str) -> bool:
    """Whether a registered provider answers to ``name`` (any spelling the reference accepts:
    ``"cuda"``, ``"dml"``, ``"webgpu"``...) and can run here. False when no installed plugin
    provides it. Never raises for an unknown name."""
    cls = _REGISTRY.lookup(name)
    return cls is not None and cls().is_available()


def available_providers() -> list[ExecutionProvider]:
    """An instance of every registered provider that can run here, cpu first."""
    _REGISTRY.ensure()
    found = [cls() for cls in _REGISTRY.classes.values()]
    found = [provider for provider in found if provider.is_available()]
    found.sort(key=lambda p: (p.name != "cpu", p.name.lower()))
    return found


def _no_gpu_device_error(what: str) -> ProviderUnavailableError:
    names = ", ".join(p.name for p in available_providers()) or "none"
    return ProviderUnavailableError(
        f"{what}: no execution provider that can run here has a current GPU device (available "
        f"providers: {names}); install a GPU provider plugin and its onnxruntime package (see "
        "`genai providers` and docs/providers.md)"
    )


def get_current_gpu_device_id() -> int:
    """The current GPU device id (the reference's ``og.get_current_gpu_device_id``), asked of
    the first available provider that has one. Raises `ProviderUnavailableError` when none
    has (a CPU-only machine)."""
    for provider in available_providers():
        device_id = provider.current_gpu_device_id()
        if device_id is not None:
            return int(device_id)
    raise _no_gpu_device_error("get_current_gpu_device_id")


def set_current_gpu_device_id(device_id: int) -> None:
    """Make ``device_id`` the current GPU device (the reference's
    ``og.set_current_gpu_device_id``) of every available provider that has one. Raises
    `ProviderUnavailableError` when none has (a CPU-only machine)."""
    if isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)):
        raise ArgumentTypeError(f"device_id must be an int, not {type(device_id).__name__}")
    if device_id < 0:
        raise InvalidArgumentError(f"device_id must be >= 0, got {device_id}")
    taken = [p for p in available_providers() if p.set_current_gpu_device_id(int(device_id))]
    if not taken:
        raise _no_gpu_device_error("set_current_gpu_device_id")


# ---------------------------------------------------------------------------------------------
# ORT plumbing (`genai._core.ort_api` loads the onnxruntime library on first use)
# ---------------------------------------------------------------------------------------------


def available_ort_providers() -> list[str]:
    """EP names the loaded onnxruntime library was built with (GetAvailableProviders)."""
    return list(ort_api.available_providers())


def get_ep_devices() -> list[Any]:
    """Every (EP, device) pair ORT lists, plugin libraries included (``EpDevice`` objects with
    ``ep_name``, ``device_type``, ``vendor``, ``device_id``, metadata dicts)."""
    return list(ort_api.get_ep_devices())


def register_execution_provider_library(
    registration_name: str, path: str | os.PathLike[str]
) -> None:
    """Register a plugin EP library with the engine's ORT environment (the reference's
    ``og.register_execution_provider_library``); repeated calls with the same arguments are
    no-ops."""
    log_event("ort_lib", f"RegisterExecutionProviderLibrary({registration_name}, {path})")
    ort_api.register_execution_provider_library(registration_name, os.fspath(path))


def unregister_execution_provider_library(registration_name: str) -> None:
    """Unload a library registered with `register_execution_provider_library` (the reference's
    ``og.unregister_execution_provider_library``). Raises RuntimeError for a name that is not
    registered, as the reference does."""
    log_event("ort_lib", f"UnregisterExecutionProviderLibrary({registration_name})")
    ort_api.unregister_execution_provider_library(registration_name)


def probe_shared_library(name: str) -> str | None:
    """None when the shared library ``name`` (e.g. ``"libcuda.so.1"``) can be loaded, else the
    loader's reason. Loads it into the process when it can (providers probe drivers with it)."""
    try:
        ctypes.CDLL(name)
    except OSError as exc:
        return str(exc) or f"{name} cannot be loaded"
    return None


def ort_library_dir() -> str:
    """The folder of the onnxruntime library the engine loads (provider bridge libraries such as
    libonnxruntime_providers_cuda.so sit beside it)."""
    return os.path.dirname(str(ort_api.find_library()))


def _ort_version() -> str:
    return str(ort_api.version())


def _install_hint(packages: Sequence[str]) -> str:
    return f"; install {' or '.join(packages)}" if packages else ""
