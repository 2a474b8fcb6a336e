"""How a broken third-party provider plugin is reported: wrong return types from provider
methods, a probe that raises, exceptions and misuse in the registration hooks, two plugins
claiming one name; and graph capture's host-KV blocker."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

import genai
from genai.errors import ArgumentTypeError, InvalidArgumentError, ProviderUnavailableError
from genai.providers import (
    ExecutionProvider,
    GraphCapture,
    Placement,
    SessionSpec,
    get_provider,
    list_providers,
    plugins,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "providers.md"

#: A plugin module: ``BREAK`` (replaced per test) picks what is broken.
ACME = """
from genai import hookimpl
from genai.providers import ExecutionProvider, SessionSpec

BREAK = {brk!r}


class AcmeProvider(ExecutionProvider):
    name = {name!r}
    ort_name = "CPUExecutionProvider"

    def unavailable_reason(self):
        if BREAK == "probe_raises":
            raise RuntimeError("acme driver exploded")
        return None

    def validate_options(self, options):
        if BREAK == "validate_none":
            return None
        if BREAK == "validate_int":
            return {{"turbo": 1}}
        return super().validate_options(options)

    def session_spec(self, options, config=None):
        if BREAK == "spec_dict":
            return {{"providers": []}}
        if BREAK == "spec_none":
            return None
        spec = SessionSpec(providers=[])
        if BREAK == "spec_mutated":
            spec.config_entries = {{"session.intra_op.allow_spinning": 0}}
        return spec


class NoName(AcmeProvider):
    name = ""


@hookimpl
def register_providers(register):
    if BREAK == "register_raises":
        raise RuntimeError("acme registration failed")
    if BREAK == "register_instance":
        register(AcmeProvider())
    elif BREAK == "register_object":
        register(object)
    elif BREAK == "no_name":
        register(NoName)
    elif BREAK == "alias_cpu":
        register(AcmeProvider, aliases=("cpu",))
    else:
        register(AcmeProvider)


@hookimpl
def register_commands(commands):
    if BREAK == "commands_raises":
        raise RuntimeError("acme cli broke")
    commands.add_parser("acme-info").set_defaults(handler=lambda args: 0)
    if BREAK == "commands_dup":
        commands.add_parser("generate")
"""


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``install(dist, brk="", name="acme")``: an installed-looking distribution ``dist`` with a
    ``genai.plugins`` entry point (named as its module) to the `ACME` plugin; only the
    distributions installed here load (``GENAI_LOAD_PLUGINS``)."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(plugins.ENV_DISABLE_AUTOLOAD, raising=False)
    monkeypatch.delenv(plugins.ENV_TRACE, raising=False)
    dists: list[str] = []

    def add(dist: str, brk: str = "", name: str = "acme") -> str:
        module = dist.replace("-", "_")
        (root / f"{module}.py").write_text(textwrap.dedent(ACME.format(brk=brk, name=name)))
        info = root / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(
            f"[{plugins.ENTRY_POINT_GROUP}]\n{module} = {module}\n"
        )
        (info / "top_level.txt").write_text(module + "\n")
        dists.append(dist)
        monkeypatch.setenv(plugins.ENV_LOAD_PLUGINS, ",".join(dists))
        plugins.reset()
        return module

    yield add
    for dist in dists:
        sys.modules.pop(dist.replace("-", "_"), None)
    monkeypatch.undo()
    plugins.reset()


def _config(folder: Path, provider: str = "acme") -> genai.Config:
    config = genai.Config(str(folder))
    config.clear_providers()
    config.append_provider(provider)
    return config


# --- wrong return types from provider methods -------------------------------------------------


@pytest.mark.parametrize(
    ("brk", "hook", "returned"),
    [
        ("validate_none", "validate_options", "returned None"),
        ("validate_int", "validate_options", "'turbo': int 1"),
        ("spec_dict", "session_spec", "returned dict {'providers': []}"),
        ("spec_none", "session_spec", "returned None"),
        ("spec_mutated", "session_spec", "'session.intra_op.allow_spinning' is int 0"),
    ],
)
def test_wrong_return_type_names_provider_hook_and_distribution(
    install, fixture_folders, brk, hook, returned
) -> None:
    install("genai-qa-acme", brk)
    with pytest.raises(plugins.PluginError) as info:
        genai.Model(_config(fixture_folders["gqa"]))
    message = str(info.value)
    assert f"AcmeProvider.{hook}" in message and returned in message
    assert "genai-qa-acme" in message and " must " in message


def test_session_spec_checks_its_field_types() -> None:
    with pytest.raises(ArgumentTypeError, match=r"config_entries .*set \{Ellipsis\}"):
        SessionSpec(providers=[], config_entries={...})  # the docs' placeholder, literally
    with pytest.raises(ArgumentTypeError, match="providers must be a list"):
        SessionSpec(providers={"CPUExecutionProvider": {}})  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="'x' is int 1"):
        SessionSpec(providers=[("CPUExecutionProvider", {"x": 1})])
    with pytest.raises(ArgumentTypeError, match="free_dimension_overrides"):
        SessionSpec(free_dimension_overrides={"batch_size": "1"})  # type: ignore[dict-item]
    spec = SessionSpec(
        providers=[("CPUExecutionProvider", {"a": "1"})],
        config_entries={"k": "v"},
        free_dimension_overrides={"batch_size": 1},
    )
    assert spec.problem() is None


def test_docs_example_provider_session_spec_runs() -> None:
    """The provider class of docs/providers.md, copied literally, makes its session spec."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
    (source,) = [b for b in blocks if "class ExampleProvider(ExecutionProvider)" in b]
    namespace: dict[str, object] = {}
    exec(compile(source, str(DOCS), "exec"), namespace)
    provider = namespace["ExampleProvider"]()
    spec = provider.session_spec(provider.validate_options({}))
    assert isinstance(spec, SessionSpec) and spec.problem() is None and spec.config_entries


# --- a probe that raises -----------------------------------------------------------------------


def test_probe_that_raises_is_unavailable_naming_the_plugin(install, fixture_folders) -> None:
    install("genai-qa-acme", "probe_raises")
    with pytest.raises(ProviderUnavailableError) as info:
        genai.Model(_config(fixture_folders["gqa"]))
    message = str(info.value)
    assert "acme driver exploded" in message and "AcmeProvider.unavailable_reason" in message
    assert "genai-qa-acme" in message
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(ProviderUnavailableError, match="acme driver exploded"):
        get_provider("acme")
    (row,) = [r for r in list_providers() if r.name == "acme"]
    assert not row.available and "acme driver exploded" in row.reason


# --- graph capture ---------------------------------------------------------------------------


def test_host_kv_blocks_graph_capture_whatever_the_shared_buffer_requirement() -> None:
    class HostKV(ExecutionProvider):
        name = "qa-host-kv"
        graph_capture = GraphCapture(option="capture", requires_shared_buffer=False)

    class DeviceKV(HostKV):
        device = "qadev"
        placement = Placement(kv_cache="qadev", allocator="session")

    for shared_kv in (True, False):
        assert "host memory" in HostKV().graph_capture_blocker(rows=1, shared_kv=shared_kv)
        assert DeviceKV().graph_capture_blocker(rows=1, shared_kv=shared_kv) is None


# --- registration hooks ------------------------------------------------------------------------


def test_register_providers_that_raises_is_a_plugin_error(install) -> None:
    install("genai-qa-acme", "register_raises")
    with pytest.raises(plugins.PluginError) as info:
        get_provider("cpu")
    message = str(info.value)
    assert "genai_qa_acme" in message and "genai-qa-acme" in message
    assert "register_providers" in message and "acme registration failed" in message
    assert plugins.ENV_LOAD_PLUGINS in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_genai_providers_reports_a_raising_plugin_in_one_line(install, capsys) -> None:
    from genai.cli import main

    install("genai-qa-acme", "register_raises")
    assert main(["providers"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("genai: error: plugin 'genai_qa_acme' (genai-qa-acme 0.1)")
    assert plugins.ENV_LOAD_PLUGINS in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("brk", "said"),
    [("commands_raises", "acme cli broke"), ("commands_dup", "conflicting subparser: generate")],
)
def test_register_commands_errors_name_the_plugin(install, capsys, brk, said) -> None:
    from genai.cli import main

    install("genai-qa-acme", brk)
    assert main(["acme-info"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("genai: error: plugin 'genai_qa_acme' (genai-qa-acme 0.1)")
    assert "register_commands" in err and said in err and plugins.ENV_LOAD_PLUGINS in err


@pytest.mark.parametrize(
    ("brk", "error", "said"),
    [
        ("register_instance", ArgumentTypeError, "got <AcmeProvider 'acme'"),
        ("register_object", ArgumentTypeError, "got <class 'object'>"),
        ("no_name", InvalidArgumentError, "NoName has no name"),
        ("alias_cpu", plugins.PluginError, "alias 'cpu' of execution provider 'acme'"),
    ],
)
def test_register_misuse_names_the_plugin(install, brk, error, said) -> None:
    install("genai-qa-acme", brk)
    with pytest.raises(error) as info:
        get_provider("cpu")
    message = str(info.value)
    assert said in message and "plugin 'genai_qa_acme' (genai-qa-acme 0.1)" in message


def test_two_distributions_claiming_one_name_name_both(install) -> None:
    install("genai-qa-acme")
    install("genai-qa-other", name="ACME")
    with pytest.raises(plugins.PluginError) as info:
        get_provider("acme")
    message = str(info.value)
    assert "registered twice" in message
    assert "genai-qa-acme" in message and "genai-qa-other" in message
    assert f"{plugins.ENV_LOAD_PLUGINS}=genai-qa-acme" in message
    assert f"{plugins.ENV_LOAD_PLUGINS}=genai-qa-other" in message
