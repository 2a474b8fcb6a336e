"""Every hookspec is documented (docstring and docs/providers.md) and tested (a
``test_hook_<name>`` in tests/test_plugins.py)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pluggy
import pytest

import genai.providers.hookspecs as hookspecs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "providers.md"
PLUGIN_TESTS = ROOT / "tests" / "test_plugins.py"


def _hookspecs() -> list[str]:
    return sorted(
        name
        for name, value in vars(hookspecs).items()
        if callable(value) and hasattr(value, f"{hookspecs.PROJECT}_spec")
    )


HOOKS = _hookspecs()


def _signature(name: str) -> str:
    params = inspect.signature(getattr(hookspecs, name)).parameters
    return f"{name}({', '.join(params)})"


def test_there_are_hooks_and_markers() -> None:
    assert HOOKS, "no hookspecs found"
    assert isinstance(hookspecs.hookimpl, pluggy.HookimplMarker)
    assert hookspecs.hookimpl.project_name == hookspecs.hookspec.project_name == "genai"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_has_a_docstring_saying_when_and_what(name: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    assert "Called" in doc, f"{name}: the docstring must say when the hook is called"
    assert "Return" in doc or "return" in doc, f"{name}: the docstring must say what it returns"


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_documented_with_its_signature(name: str) -> None:
    assert f"`{_signature(name)}`" in DOCS.read_text(), (
        f"docs/providers.md must document `{_signature(name)}`"
    )


@pytest.mark.parametrize("name", HOOKS)
def test_hook_has_a_test(name: str) -> None:
    tree = ast.parse(PLUGIN_TESTS.read_text())
    tests = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert f"test_hook_{name}" in tests, f"tests/test_plugins.py needs test_hook_{name}"


def test_docs_document_no_hook_that_does_not_exist() -> None:
    import re

    documented = set(re.findall(r"^### `(\w+)\(", DOCS.read_text(), flags=re.MULTILINE))
    assert documented == set(HOOKS)
