"""The plugin manager: default plugins, entry points, loading controls, loud failures, tracing,
and one ``test_hook_<name>`` per hookspec (tests/test_hookspecs_documented.py checks that)."""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import genai
from genai.errors import ConfigError, ProviderUnavailableError
from genai.providers import plugins
from genai.providers.base import (
    ExecutionProvider,
    get_provider,
    get_provider_class,
)
from genai.providers.cpu import CPUProvider
from genai.providers.hookspecs import hookimpl


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch):
    """A plugin manager with only the built-in defaults, rebuilt after the test."""
    for var in (plugins.ENV_LOAD_PLUGINS, plugins.ENV_TRACE):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(plugins.ENV_DISABLE_AUTOLOAD, "1")
    plugins.reset()
    added: list[object] = []

    def register(plugin: object, name: str | None = None) -> str:
        added.append(plugin)
        return plugins.register_plugin(plugin, name)

    yield register
    for plugin in added:
        plugins.unregister_plugin(plugin)
    monkeypatch.undo()
    plugins.reset()


def _plugin(name: str, **hooks) -> types.ModuleType:
    """A plugin module whose attributes are hook implementations."""
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, hookimpl(function))
    return module


def _provider(name: str, **attrs) -> type[ExecutionProvider]:
    body = {"name": name, "ort_name": "CPUExecutionProvider", "session_providers": lambda s, o: []}
    body.update(attrs)
    return type(f"Provider_{name.replace('-', '_')}", (ExecutionProvider,), body)


def _fake_distribution(root: Path, dist: str, module: str, source: str, ep_name: str) -> None:
    """An installed-looking distribution on ``root`` with a genai.providers.plugins entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n{ep_name} = {module}\n")
    (info / "top_level.txt").write_text(module + "\n")


FAKE_PLUGIN = """
from genai.providers.hookspecs import hookimpl
from genai.providers import ExecutionProvider

class FakeEP(ExecutionProvider):
    name = "fake-ep"
    ort_name = "CPUExecutionProvider"
    def session_providers(self, options):
        return []

@hookimpl
def register_providers(register):
    register(FakeEP, aliases=("fake-alias",))
"""


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    _fake_distribution(root, "genai-fake-plugin", "genai_fake_plugin", FAKE_PLUGIN, "fake")
    monkeypatch.syspath_prepend(str(root))
    yield root
    sys.modules.pop("genai_fake_plugin", None)


# --- loading ---------------------------------------------------------------------------------


def test_default_cpu_plugin_loads_without_autoload(isolated) -> None:
    rows = plugins.list_plugins()
    assert rows[0].name == "cpu" and rows[0].builtin
    assert rows[0].hooks == ("register_providers",)
    assert get_provider_class("cpu") is CPUProvider
    assert isinstance(get_provider("CPUExecutionProvider"), CPUProvider)


def test_entry_point_plugins_autoload(fake_dist, monkeypatch, isolated) -> None:
    monkeypatch.delenv(plugins.ENV_DISABLE_AUTOLOAD)
    plugins.reset()
    assert get_provider_class("fake-ep").name == "fake-ep"
    assert get_provider_class("FAKE-ALIAS").name == "fake-ep"
    info = {p.name: p for p in plugins.list_plugins()}["fake"]
    assert info.distribution == "genai-fake-plugin" and info.version == "0.1"
    assert not info.builtin


@pytest.mark.parametrize(
    ("allow", "loaded"),
    [("", False), ("fake", True), ("genai-fake-plugin", True), ("GENAI_FAKE_PLUGIN", True)],
)
def test_allow_list_restricts_autoload(fake_dist, monkeypatch, isolated, allow, loaded) -> None:
    monkeypatch.delenv(plugins.ENV_DISABLE_AUTOLOAD)
    monkeypatch.setenv(plugins.ENV_LOAD_PLUGINS, allow)
    plugins.reset()
    names = {p.name for p in plugins.list_plugins()}
    assert ("fake" in names) is loaded
    assert "cpu" in names  # defaults always load


def test_allow_list_naming_nothing_installed_warns(fake_dist, monkeypatch, isolated) -> None:
    monkeypatch.delenv(plugins.ENV_DISABLE_AUTOLOAD)
    monkeypatch.setenv(plugins.ENV_LOAD_PLUGINS, "no-such-plugin")
    plugins.reset()
    with pytest.warns(RuntimeWarning, match="no-such-plugin"):
        plugins.get_plugin_manager()
    assert "fake" not in {p.name for p in plugins.list_plugins()}


def test_kill_switch_disables_autoload(fake_dist, isolated) -> None:
    assert "fake" not in {p.name for p in plugins.list_plugins()}
    with pytest.raises(ProviderUnavailableError, match="no installed plugin provides it"):
        get_provider("fake-ep")


def test_plugin_that_fails_to_import_fails_loudly(tmp_path, monkeypatch, isolated) -> None:
    root = tmp_path / "site"
    root.mkdir()
    _fake_distribution(
        root, "genai-broken", "genai_broken_plugin", "raise ImportError('boom')\n", "b"
    )
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(plugins.ENV_DISABLE_AUTOLOAD)
    plugins.reset()
    with pytest.raises(plugins.PluginError) as info:
        plugins.get_plugin_manager()
    message = str(info.value)
    assert "'b'" in message and "genai-broken" in message and "boom" in message
    assert plugins.ENV_LOAD_PLUGINS in message


def test_misspelled_hook_fails_loudly(isolated) -> None:
    typo = _plugin("typo", register_provider=lambda register: None)
    with pytest.raises(plugins.PluginError, match="register_provider"):
        isolated(typo)


def test_hookimpl_with_unknown_argument_fails_loudly(isolated) -> None:
    bad = _plugin("bad-args", register_providers=lambda register, extra: None)
    with pytest.raises(plugins.PluginError, match="extra"):
        isolated(bad)


def test_tracing_prints_every_hook_call(isolated, monkeypatch, capsys) -> None:
    monkeypatch.setenv(plugins.ENV_TRACE, "1")
    plugins.reset()
    get_provider_class("cpu")
    err = capsys.readouterr().err
    assert "genai-trace: register_providers(" in err
    assert "returned" in err and " ms" in err


# --- one test per hook -----------------------------------------------------------------------


def test_hook_register_providers(isolated) -> None:
    first = _provider("hook-one", aliases=("hook-1",))
    second = _provider("hook-one")
    isolated(_plugin("p1", register_providers=lambda register: register(first)))
    assert get_provider_class("Hook-One") is first
    assert get_provider_class("hook-1") is first
    # the same class twice is a no-op
    isolated(_plugin("p1-again", register_providers=lambda register: register(first)))
    assert get_provider_class("hook-one") is first
    # another class under a taken name names both plugins
    isolated(_plugin("p2", register_providers=lambda register: register(second)))
    with pytest.raises(plugins.PluginError) as info:
        get_provider_class("hook-one")
    assert "p1" in str(info.value) and "p2" in str(info.value)


def test_register_rejects_non_providers_and_alias_clashes(isolated) -> None:
    isolated(_plugin("junk", register_providers=lambda register: register(object)))
    with pytest.raises(TypeError, match="ExecutionProvider subclass"):
        get_provider_class("cpu")
    plugins.unregister_plugin("junk")
    clash = _provider("clash", aliases=("cpu",))
    isolated(_plugin("clash", register_providers=lambda register: register(clash)))
    with pytest.raises(plugins.PluginError, match="alias 'cpu'"):
        get_provider_class("clash")


def test_hook_register_commands(isolated, capsys) -> None:
    from genai.cli import main

    def add(commands):
        cmd = commands.add_parser("hello-plugin", help="say hello")
        cmd.add_argument("--name", default="world")
        cmd.set_defaults(handler=lambda args: print(f"hello {args.name}") or 0)

    isolated(_plugin("hello", register_commands=add))
    assert main(["hello-plugin", "--name", "genai"]) == 0
    assert capsys.readouterr().out == "hello genai\n"


def test_hook_provider_selected(isolated, fixture_folders) -> None:
    seen = []

    def selected(provider, options, config):
        seen.append((provider.name, dict(options), config.path))

    isolated(_plugin("observer", provider_selected=selected))
    model = genai.Model(fixture_folders["gqa"])
    assert seen == [("cpu", {}, model.config.path)]

    def veto(provider):
        raise RuntimeError(f"policy: {provider.name} is not allowed here")

    isolated(_plugin("veto", provider_selected=veto))
    with pytest.raises(RuntimeError, match="policy: cpu is not allowed"):
        genai.Model(fixture_folders["gqa"])


# --- selection through the config ------------------------------------------------------------


def test_provider_options_reach_the_provider(isolated, fixture_folders) -> None:
    seen = {}

    class Recording(ExecutionProvider):
        name = "recording"
        ort_name = "CPUExecutionProvider"
        known_options = frozenset({"level"})
        default_options = {"level": "1"}  # noqa: RUF012

        def session_spec(self, options, config=None):
            seen.update(options)
            return super().session_spec(options, config)

        def session_providers(self, options):
            return []

    isolated(_plugin("rec", register_providers=lambda register: register(Recording)))
    config = genai.Config(str(fixture_folders["gqa"]))
    config.clear_providers()
    config.set_provider_option("recording", "level", "3")
    model = genai.Model(config)
    assert isinstance(model.provider, Recording) and seen == {"level": "3"}
    assert model.provider_options == {"level": "3"}
    config.set_provider_option("recording", "nope", "1")
    with pytest.raises(ConfigError, match="nope"):
        genai.Model(config)


def test_requested_provider_that_cannot_run_is_an_error(isolated, fixture_folders) -> None:
    missing = _provider("missing-hw", unavailable_reason=lambda self: "no widget attached")
    isolated(_plugin("missing", register_providers=lambda register: register(missing)))
    config = genai.Config(str(fixture_folders["gqa"]))
    config.append_provider("missing-hw")
    with pytest.raises(ProviderUnavailableError) as info:
        genai.Model(config)
    assert "missing-hw" in str(info.value) and "no widget attached" in str(info.value)


def test_unknown_first_party_provider_says_what_to_install(isolated, fixture_folders) -> None:
    config = genai.Config(str(fixture_folders["gqa"]))
    config.append_provider("CUDAExecutionProvider")
    with pytest.raises(ProviderUnavailableError) as info:
        genai.Model(config)
    assert "'cuda'" in str(info.value)
    assert "genai-provider-cuda" in str(info.value) and "onnxruntime-gpu" in str(info.value)


def test_session_spec_config_entries_and_free_dimensions(isolated, fixture_folders) -> None:
    from genai.providers import SessionSpec

    class Fixed(ExecutionProvider):
        name = "fixed-batch"
        ort_name = "CPUExecutionProvider"

        def session_spec(self, options, config=None):
            return SessionSpec(
                providers=[],
                config_entries={"session.intra_op.allow_spinning": "0"},
                free_dimension_overrides={"batch_size": 1},
            )

    isolated(_plugin("fixed", register_providers=lambda register: register(Fixed)))
    config = genai.Config(str(fixture_folders["gqa"]))
    config.append_provider("fixed-batch")
    model = genai.Model(config)
    assert model.session.input_shapes["input_ids"][0] == 1
    params = genai.GeneratorParams(model)
    params.set_search_options(max_length=12)
    gen = genai.Generator(model, params)
    gen.append_tokens(np.array([5, 6, 7], dtype=np.int32))
    gen.generate_next_token()
