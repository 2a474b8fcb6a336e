"""The ``.pyi`` stubs of the compiled modules (genai/_core) against the modules themselves.

Every public name of a compiled module is in its stub and every name of the stub is in the
module; the same for the public members of each class; a stub property is a data attribute of
the class and a stub method is callable; and where the compiled function exposes its signature
(Cython ``def`` functions and methods do; slot wrappers such as ``__init__`` and ``__len__``,
and ``cpdef`` methods, do not), the stub has the
same parameters, of the same kinds, with the same literal defaults.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import tomllib

CORE = Path(__file__).resolve().parent.parent / "genai" / "_core"
#: Every compiled module (tests/test_typing.py runs mypy's stubtest over them too).
MODULES = sorted(path.stem for path in CORE.glob("*.pyx"))

#: Stub attributes that only instances have (set in ``__init__``), checked on an instance.
INSTANCE_ATTRIBUTES = {("ort_api", "OrtError", "code"): lambda mod: mod.OrtError("message")}

_KINDS = {
    "posonlyargs": inspect.Parameter.POSITIONAL_ONLY,
    "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "kwonlyargs": inspect.Parameter.KEYWORD_ONLY,
}


def _stub(name: str) -> ast.Module:
    return ast.parse((CORE / f"{name}.pyi").read_text(encoding="utf-8"))


def _defined(tree: ast.Module | ast.ClassDef) -> dict[str, ast.AST]:
    """Names a stub (or a stub class) defines: functions, classes, annotated or assigned names;
    not imports, not ``_private`` helpers such as type aliases."""
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
    return {name: node for name, node in found.items() if not name.startswith("_")}


def _public_names(module: types.ModuleType) -> set[str]:
    """What the compiled module defines itself: no modules, nothing imported from elsewhere."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        owner = getattr(value, "__module__", None) if callable(value) else None
        if owner is not None and owner != module.__name__:
            continue  # e.g. aligned_zeros, imported from genai.runtime.buffers
        names.add(name)
    return names


def _class_members(cls: type) -> set[str]:
    """Public members the class defines (or inherits from a class of the same module)."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base.__module__ == cls.__module__:
            names |= {n for n in vars(base) if not n.startswith("_")}
    return names


def _is_property(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
    )


def _stub_parameters(node: ast.FunctionDef) -> list[tuple[str, Any, object]]:
    """(name, kind, literal default or `inspect.Parameter.empty`/``...``) per parameter."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    out: list[tuple[str, Any, object]] = []
    for arg, default in zip(positional, defaults, strict=True):
        kind = _KINDS["posonlyargs" if arg in args.posonlyargs else "args"]
        out.append((arg.arg, kind, _literal(default)))
    if args.vararg is not None:
        out.append((args.vararg.arg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append((arg.arg, _KINDS["kwonlyargs"], _literal(default)))
    if args.kwarg is not None:
        out.append((args.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return out


def _literal(node: ast.expr | None) -> object:
    if node is None:
        return inspect.Parameter.empty
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...


def _check_signature(where: str, runtime: Any, stub: ast.FunctionDef) -> list[str]:
    if not hasattr(runtime, "__code__"):
        return []  # a slot wrapper (``__init__``, ``__len__``...) or a cpdef method: no signature
    try:
        signature = inspect.signature(runtime)
    except (TypeError, ValueError):
        return []
    expected = _stub_parameters(stub)
    actual = [(p.name, p.kind, p.default) for p in signature.parameters.values()]
    problems = []
    names = [(n, k) for n, k, _ in expected]
    if names != [(n, k) for n, k, _ in actual]:
        problems.append(f"{where}: stub parameters {names} != compiled {actual}")
        return problems
    for (name, _, want), (_, _, have) in zip(expected, actual, strict=True):
        if want is ... or (want is inspect.Parameter.empty) == (have is inspect.Parameter.empty):
            if want is not ... and want is not inspect.Parameter.empty and want != have:
                problems.append(f"{where}: default of {name} is {have!r}, the stub says {want!r}")
        else:
            problems.append(f"{where}: {name} default {have!r} in the module, {want!r} in the stub")
    return problems


@pytest.mark.parametrize("name", MODULES)
def test_stub_names_match_the_module(name: str) -> None:
    module = importlib.import_module(f"genai._core.{name}")
    stub = _defined(_stub(name))
    public = _public_names(module)
    assert public, f"genai._core.{name} shows no public names: the comparison would be empty"
    assert sorted(public - set(stub)) == [], f"{name}.pyi lacks these public names"
    assert sorted(set(stub) - public) == [], f"{name}.pyi names what the module lacks"


@pytest.mark.parametrize("name", MODULES)
def test_stub_classes_and_signatures_match(name: str) -> None:
    module = importlib.import_module(f"genai._core.{name}")
    problems: list[str] = []
    checked = 0
    for item, node in _defined(_stub(name)).items():
        runtime = getattr(module, item, None)
        if isinstance(node, ast.FunctionDef):
            problems += _check_signature(item, runtime, node)
            checked += 1
        if not isinstance(node, ast.ClassDef) or not isinstance(runtime, type):
            continue
        members = {
            **_defined(node),
            **{n.name: n for n in node.body if isinstance(n, ast.FunctionDef)},
        }
        own = _class_members(runtime)
        missing = sorted(own - set(members))
        if missing:
            problems.append(f"{item}: the stub lacks {missing}")
        for member, member_node in members.items():
            where = f"{item}.{member}"
            key = (name, item, member)
            if key in INSTANCE_ATTRIBUTES:
                if not hasattr(INSTANCE_ATTRIBUTES[key](module), member):
                    problems.append(f"{where}: instances have no such attribute")
                continue
            if not hasattr(runtime, member):
                problems.append(f"{where}: the class has no such member")
                continue
            value = inspect.getattr_static(runtime, member)
            if _is_property(member_node) or isinstance(member_node, ast.AnnAssign):
                if not inspect.isdatadescriptor(value):
                    problems.append(f"{where}: a data attribute in the stub, not in the class")
            elif isinstance(member_node, ast.FunctionDef):
                if inspect.isdatadescriptor(value) or not callable(getattr(runtime, member)):
                    problems.append(f"{where}: a method in the stub, not in the class")
                else:
                    problems += _check_signature(where, getattr(runtime, member), member_node)
                    checked += 1
    assert checked, f"{name}.pyi: no function compared"
    assert not problems, "\n".join(problems)


def test_a_wrong_stub_signature_is_reported() -> None:
    # The checker itself: a stub with a renamed parameter and a wrong default must be caught.
    from genai._core import bookkeeping

    wrong = ast.parse("def move_rows(rows, order, scratch, chunks=2, size=-1) -> int: ...")
    node = wrong.body[0]
    assert isinstance(node, ast.FunctionDef)
    assert _check_signature("move_rows", bookkeeping.move_rows, node)
    right = ast.parse("def move_rows(rows, order, scratch, chunks=1, chunk_bytes=-1): ...")
    assert _check_signature("move_rows", bookkeeping.move_rows, right.body[0]) == []  # type: ignore[arg-type]


def test_stubs_ship_in_the_package_data() -> None:
    pyproject = tomllib.loads((CORE.parent.parent / "pyproject.toml").read_text("utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["genai"]
    for name in MODULES:
        relative = f"_core/{name}.pyi"
        assert any(fnmatch(relative, p) for p in patterns), f"{relative} is not package data"
