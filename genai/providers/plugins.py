"""The plugin manager: finds, loads and checks genai plugins.

Plugins are found through the ``genai.plugins`` entry-point group; in a plugin package's
``pyproject.toml``::

    [project.entry-points."genai.plugins"]
    myprovider = "myprovider_package"

The built-in default plugins (`DEFAULT_PLUGINS`: the cpu provider) load first through the same
path, always. Then, unless switched off, every installed plugin loads. Environment variables:

``GENAI_DISABLE_PLUGIN_AUTOLOAD``
    Any non-empty value: load no entry-point plugin (defaults still load).
``GENAI_LOAD_PLUGINS``
    A comma-separated allow-list of entry-point names or distribution names; only those load.
    Set but empty: load none.
``GENAI_TRACE_PLUGINS``
    Any non-empty value: print every hook call (plugins, arguments, result, time) to stderr.

After loading, ``check_pending`` runs: an implementation whose name is not a hook (a misspelled
hook) fails loudly with `PluginError`, as does a plugin that fails to import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from genai._version import __version__
from genai.boolean_words import parse_bool_word
from genai.errors import GenaiError
from genai.providers import hookspecs
from genai.providers.hookspecs import PROJECT, hookimpl
from genai.runtime.config import normalize_provider_name

log = logging.getLogger(__name__)
#: Hook-call tracing (``GENAI_TRACE_PLUGINS=1``).
_trace_log = logging.getLogger(f"{__name__}.trace")

__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "ENV_DISABLE_AUTOLOAD",
    "ENV_LOAD_PLUGINS",
    "ENV_TRACE",
    "KNOWN_PROVIDER_PACKAGES",
    "PROVIDER_FOLDERS",
    "PUBLISHED_PROVIDER_PACKAGES",
    "PluginError",
    "PluginInfo",
    "call_each",
    "conflict_hint",
    "describe_plugin",
    "distribution_of",
    "get_plugin_manager",
    "hook",
    "hookimpl",
    "list_plugins",
    "on_change",
    "provider_install_command",
    "provider_install_hint",
    "register_plugin",
    "reset",
    "unregister_plugin",
]

ENTRY_POINT_GROUP = "genai.plugins"
ENV_DISABLE_AUTOLOAD = "GENAI_DISABLE_PLUGIN_AUTOLOAD"
ENV_LOAD_PLUGINS = "GENAI_LOAD_PLUGINS"
ENV_TRACE = "GENAI_TRACE_PLUGINS"

#: How to keep a broken entry-point plugin from loading.
_EXCLUDE_HINT = (
    f"Uninstall it, or load only the plugins you want with {ENV_LOAD_PLUGINS}=a,b "
    f"(or none with {ENV_DISABLE_AUTOLOAD}=1)"
)

#: Built-in plugins: (plugin name, module). They load before any entry point, always.
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (("cpu", "genai.providers.cpu"),)

#: Where the first-party providers live, for "unknown provider" messages and listings: a hint
#: table only (what to install), no policy. Lower-cased canonical name -> (canonical name,
#: genai provider package, ONNX Runtime package).
KNOWN_PROVIDER_PACKAGES: dict[str, tuple[str, str, str]] = {
    "cuda": ("cuda", "genai-provider-cuda", "onnxruntime-gpu"),
    "dml": ("DML", "genai-provider-directml", "onnxruntime-directml"),
    "openvino": (
        "OpenVINO",
        "genai-provider-openvino",
        "onnxruntime-openvino or onnxruntime-ep-openvino",
    ),
    "qnn": ("QNN", "genai-provider-qnn", "onnxruntime-qnn"),
    "nvtensorrtrtx": (
        "NvTensorRtRtx",
        "genai-provider-tensorrt-rtx",
        "onnxruntime-ep-nv-tensorrt-rtx",
    ),
    "webgpu": ("WebGPU", "genai-provider-webgpu", "onnxruntime-ep-webgpu"),
}

#: The folder under ``providers/`` of each first-party provider package (same keys).
PROVIDER_FOLDERS: dict[str, str] = {
    "cuda": "cuda",
    "dml": "directml",
    "openvino": "openvino",
    "qnn": "qnn",
    "nvtensorrtrtx": "tensorrt_rtx",
    "webgpu": "webgpu",
}

#: First-party provider packages published on PyPI. None is yet: until one is, install hints
#: name its ``providers/<name>`` folder; add a package here when it is published.
PUBLISHED_PROVIDER_PACKAGES: frozenset[str] = frozenset()


class PluginError(GenaiError, RuntimeError):
    """A plugin failed to import, implements an unknown hook, or registers something that
    conflicts with another plugin."""


@dataclass(frozen=True)
class PluginInfo:
    """One loaded plugin: its name, where it comes from and the hooks it implements."""

    name: str
    module: str
    distribution: str
    version: str
    hooks: tuple[str, ...]
    builtin: bool


_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
_origins: dict[str, tuple[str, str, bool]] = {}  # plugin name -> (dist, version, builtin)
_extra: list[tuple[object, str]] = []  # plugins registered by hand, kept across reset()
_listeners: list[Callable[[], None]] = []  # called when the set of plugins changes


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` (with the plugin lock held) whenever the set of plugins changes:
    `reset`, `register_plugin`, `unregister_plugin`. Whatever was built from the hooks (the
    provider registry) forgets it there and asks the hooks again on next use."""
    with _lock:
        if listener not in _listeners:
            _listeners.append(listener)


def _changed() -> None:
    for listener in list(_listeners):
        listener()


def _truthy(value: str | None) -> bool:
    """An environment switch is on when set to anything but an empty string or a false word."""
    return bool(value) and parse_bool_word(value) is not False


def _allow_list() -> set[str] | None:
    raw = os.environ.get(ENV_LOAD_PLUGINS)
    if raw is None:
        return None
    return {_canonical_dist(item) for item in raw.split(",") if item.strip()}


def _canonical_dist(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _register(pm: pluggy.PluginManager, plugin: object, name: str, origin: str) -> None:
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name!r} ({origin}) is invalid: {exc}") from exc
    except ValueError as exc:  # already registered under another name, or name taken
        raise PluginError(f"plugin {name!r} ({origin}) cannot be registered: {exc}") from exc
    log.debug("plugin %r loaded (%s)", name, origin)


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    if _truthy(os.environ.get(ENV_DISABLE_AUTOLOAD)):
        return
    allow = _allow_list()
    seen: set[str] = set()
    for ep in sorted(
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name
    ):
        dist = ep.dist.name if ep.dist is not None else "?"
        version = ep.dist.version if ep.dist is not None else "?"
        names = {_canonical_dist(ep.name), _canonical_dist(dist)}
        if allow is not None and not names & allow:
            continue
        seen |= names
        if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
            continue  # e.g. a package that names a built-in plugin again
        origin = f"entry point {ep.value!r} of {dist} {version}"
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginError(
                f"plugin {ep.name!r} ({origin}) failed to import: {type(exc).__name__}: {exc}. "
                f"{_EXCLUDE_HINT}"
            ) from exc
        if pm.is_registered(plugin):
            continue  # the same module under a second entry-point name
        _register(pm, plugin, ep.name, origin)
        _origins[ep.name] = (dist, version, False)
    if allow:
        missing = sorted(allow - seen)
        if missing:
            warnings.warn(
                f"{ENV_LOAD_PLUGINS} names {', '.join(missing)}, which no installed "
                f"{ENTRY_POINT_GROUP!r} plugin provides",
                RuntimeWarning,
                stacklevel=3,
            )


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record (pytest's capture swaps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("genai-trace: %(message)s"))

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _trace(pm: pluggy.PluginManager) -> None:
    """Log every hook call to the ``genai.providers.plugins.trace`` logger at DEBUG; the environment
    variable asked for it, so with no handler configured it goes to stderr."""
    starts: list[float] = []
    if not _trace_log.handlers:
        _trace_log.addHandler(_StderrHandler())
        _trace_log.setLevel(logging.DEBUG)

    def before(hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
        starts.append(time.perf_counter())
        plugins = ", ".join(impl.plugin_name for impl in impls)
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        _trace_log.debug("%s(%s) -> [%s]", hook_name, args, plugins)

    def after(outcome: Any, hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
        ms = 1000 * (time.perf_counter() - starts.pop()) if starts else 0.0
        error = outcome.exception
        result = f"raised {error!r}" if error is not None else f"returned {outcome.get_result()!r}"
        _trace_log.debug("%s %s in %.2f ms", hook_name, result, ms)

    pm.add_hookcall_monitoring(before, after)


def _create() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    _origins.clear()
    for name, module_name in DEFAULT_PLUGINS:
        module = importlib.import_module(module_name)
        _register(pm, module, name, f"built-in {module_name}")
        _origins[name] = (_own_distribution(), _own_version(), True)
    _load_entry_points(pm)
    for plugin, name in _extra:
        _register_by_hand(pm, plugin, name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(
            f"{exc} (known hooks: {', '.join(sorted(_hook_names()))}); fix the name or mark "
            "the function @hookimpl(optionalhook=True)"
        ) from exc
    if _truthy(os.environ.get(ENV_TRACE)):
        _trace(pm)
    return pm


def _register_by_hand(pm: pluggy.PluginManager, plugin: object, name: str) -> bool:
    """Register a plugin given to `register_plugin` unless it is; True when it was added."""
    if pm.is_registered(plugin):
        return False
    _register(pm, plugin, name, "registered by hand")
    _origins[name] = (distribution_of(getattr(plugin, "__module__", "") or ""), "", False)
    return True


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, loading plugins on first use."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = _create()
        return _manager


def hook() -> Any:
    """The hook relay: ``genai.providers.plugins.hook().register_providers(register=...)``."""
    return get_plugin_manager().hook


def reset() -> None:
    """Forget the loaded plugins and registered providers; the next use loads them again
    (e.g. after changing the environment variables). Plugins registered by hand stay."""
    global _manager
    with _lock:
        _manager = None
        _changed()


def register_plugin(plugin: object, name: str | None = None) -> str:
    """Register a plugin object or module by hand (kept across `reset`); returns its name.
    Checks its hooks at once."""
    name = name or getattr(plugin, "__name__", None) or f"plugin-{id(plugin)}"
    with _lock:
        if any(p is plugin for p, _ in _extra):
            return name
        _extra.append((plugin, name))
        pm = get_plugin_manager()
        if _register_by_hand(pm, plugin, name):
            try:
                pm.check_pending()
            except pluggy.PluginValidationError as exc:
                pm.unregister(plugin)
                _extra.pop()
                raise PluginError(str(exc)) from exc
        _changed()
    return name


def unregister_plugin(name_or_plugin: object) -> None:
    """Remove a plugin registered by hand (or any loaded plugin, by name, until `reset`)."""
    with _lock:
        _extra[:] = [(p, n) for p, n in _extra if p is not name_or_plugin and n != name_or_plugin]
        pm = get_plugin_manager()
        plugin = (
            pm.get_plugin(name_or_plugin) if isinstance(name_or_plugin, str) else name_or_plugin
        )
        if plugin is not None and pm.is_registered(plugin):
            pm.unregister(plugin)
        _changed()


def list_plugins() -> list[PluginInfo]:
    """Every loaded plugin, built-in defaults first."""
    pm = get_plugin_manager()
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist, version, builtin = _origins.get(name, ("?", "", False))
        hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or ()))
        module = getattr(plugin, "__name__", None) or type(plugin).__module__
        rows.append(PluginInfo(name, module, dist, version, hooks, builtin))
    rows.sort(key=lambda r: (not r.builtin, r.name))
    return rows


def describe_plugin(name: str) -> str:
    """``plugin 'x' (its-distribution 1.0)`` for messages; ``registered by hand`` for
    `register_provider`'s ``"<manual>"``."""
    if name == "<manual>":
        return "register_provider() (by hand)"
    dist, version, builtin = _origins.get(name, ("?", "", False))
    if builtin:
        return f"built-in plugin {name!r} ({dist})"
    if dist in ("?", ""):
        return f"plugin {name!r}"
    return f"plugin {name!r} ({f'{dist} {version}'.strip()})"


def _from_entry_point(name: str) -> bool:
    origin = _origins.get(name)
    return origin is not None and not origin[2] and all(n != name for _, n in _extra)


def _exclude_hint(name: str) -> str:
    """How to keep plugin ``name`` from loading ("" for a built-in or one given by hand)."""
    return f" {_EXCLUDE_HINT}" if _from_entry_point(name) else ""


def conflict_hint(*names: str) -> str:
    """How to load only one of the plugins ``names`` that claim the same thing ("" when none
    of them is an entry-point plugin)."""
    dists = [_origins[n][0] for n in names if _from_entry_point(n)]
    if not dists:
        return ""
    if len(dists) == 1:
        return (
            f"; uninstall {dists[0]}, or leave it out by listing the plugins to load in "
            f"{ENV_LOAD_PLUGINS}=a,b (built-in plugins always load)"
        )
    choices = " or ".join(f"{ENV_LOAD_PLUGINS}={d}" for d in dists)
    return f"; uninstall one, or load only one with {choices} (plus any other plugins you want)"


def call_each(
    hook_name: str,
    kwargs: Mapping[str, Any] | Callable[[str], Mapping[str, Any]],
    *,
    passthrough: Callable[[BaseException], bool] | None = None,
) -> None:
    """Call hook ``hook_name`` one plugin at a time (registration order: defaults first), each
    through the hook machinery (tracing sees it), with ``kwargs`` (or ``kwargs(plugin name)``).
    An exception a plugin raises becomes `PluginError` naming the plugin, its distribution and
    how to leave it out (the original as ``__cause__``); a `PluginError`, or one
    ``passthrough`` accepts, passes as it is."""
    pm = get_plugin_manager()
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        name = impl.plugin_name
        caller = pm.subset_hook_caller(
            hook_name, remove_plugins=[p for p in pm.get_plugins() if p is not impl.plugin]
        )
        try:
            caller(**(kwargs(name) if callable(kwargs) else kwargs))
        except PluginError:
            raise
        except Exception as exc:
            if passthrough is not None and passthrough(exc):
                raise
            raise PluginError(
                f"{describe_plugin(name)} failed in its {hook_name} hook: "
                f"{type(exc).__name__}: {exc}.{_exclude_hint(name)}"
            ) from exc


def call_register_providers(add: Callable[..., Any]) -> None:
    """Call the ``register_providers`` hook; ``add(cls, aliases, plugin)`` records each
    registration with the name of the plugin that made it. Errors ``add`` raises (misuse of
    ``register``, already naming the plugin) pass as they are; anything else the plugin
    raises is a `PluginError` naming it."""
    raised: list[BaseException] = []

    def registrar(plugin_name: str) -> dict[str, Any]:
        def register(cls: Any, aliases: Any = ()) -> Any:
            try:
                return add(cls, tuple(aliases), plugin_name)
            except Exception as exc:
                raised.append(exc)
                raise

        return {"register": register}

    call_each(
        "register_providers", registrar, passthrough=lambda exc: any(exc is e for e in raised)
    )


def provider_install_command(key: str) -> str:
    """The pip command that installs first-party provider ``key``'s genai package (a key of
    `KNOWN_PROVIDER_PACKAGES`): the published name once it is in
    `PUBLISHED_PROVIDER_PACKAGES`, else its ``providers/<folder>`` in this checkout (relative
    to the working directory when under it), else where to find it in a clone."""
    _, package, _ = KNOWN_PROVIDER_PACKAGES[key]
    if package in PUBLISHED_PROVIDER_PACKAGES:
        return f"pip install {package}"
    folder = PROVIDER_FOLDERS[key]
    checkout = Path(__file__).resolve().parents[2] / "providers" / folder
    if (checkout / "pyproject.toml").is_file():
        try:
            shown = "./" + checkout.relative_to(Path.cwd().resolve()).as_posix()
        except ValueError:
            shown = str(checkout)
        return f"pip install {shown}"
    return (
        f"pip install ./providers/{folder} in a clone of genai-runtime "
        f"({package} is not on PyPI yet)"
    )


def provider_install_hint(name: str) -> str:
    """ "; install X: pip install ... (...)" for a first-party provider name, else ""."""
    key = normalize_provider_name(name).lower()
    if key.endswith("executionprovider"):
        key = key[: -len("executionprovider")]
    known = KNOWN_PROVIDER_PACKAGES.get(key)
    if known is None:
        return ""
    _, package, runtime = known
    command = provider_install_command(key)
    return f"; install {package}: {command} (with {runtime}; see docs/providers.md)"


def _hook_names() -> list[str]:
    return [name for name in dir(hookspecs) if hasattr(getattr(hookspecs, name), "genai_spec")]


def _own_distribution() -> str:
    return distribution_of(__name__)


def _own_version() -> str:
    return str(__version__)


_DISTS: dict[str, list[str]] | None = None


def distribution_of(module: str) -> str:
    """The installed distribution that ships ``module`` (its top-level package), or the
    top-level name when none does (e.g. run from a source tree)."""
    global _DISTS
    top = module.split(".")[0]
    if not top:
        return "?"
    if _DISTS is None:
        try:
            _DISTS = dict(importlib.metadata.packages_distributions())
        except Exception:
            _DISTS = {}
    dists = _DISTS.get(top)
    if dists:
        return dists[0]
    return "genai-runtime" if top == "genai" else top
