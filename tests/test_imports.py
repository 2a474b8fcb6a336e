"""Import hygiene of the genai package, read from the source (AST), not by importing it.

* No function-level import of genai's own modules, except deliberate lazy imports, each
  marked with a ``# lazy: <reason>`` comment (an optional heavy dependency behind the module,
  e.g. fastapi, ray, pytest, onnx), and the entries of `ALLOWED_FUNCTION_LEVEL` (files whose
  owners have not untangled them yet; shrink it, never grow it).
* No import cycle among genai's modules, counting the imports that run when a module is
  imported (module level, class bodies, ``try``/``if`` blocks; not ``if TYPE_CHECKING:``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "genai"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: The comment that makes a function-level import of a genai module deliberate.
LAZY_MARK = "# lazy:"

#: Function-level imports of genai modules that are known and not yet untangled:
#: (file relative to the repository root, imported module) -> why it stays. Shrink it, never
#: grow it; `test_allow_list_has_no_stale_entries` says when an entry can go.
ALLOWED_FUNCTION_LEVEL: dict[tuple[str, str], str] = {}

#: A Cython import statement at the start of a line (``cimport`` is compile time: ignored).
_PYX_IMPORT = re.compile(r"^(\s*)(?:from\s+([\w.]+)\s+import\s+([\w, ()]+)|import\s+([\w.]+))")


def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package (Python sources and
    the Cython sources of the compiled modules)."""
    found = {}
    for path in sorted([*ROOT.rglob("*.py"), *ROOT.rglob("*.pyx")]):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    """The absolute name ``from ... import`` refers to (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The genai modules an import statement loads itself (a ``from pkg import sub`` names
    the submodule ``pkg.sub``; otherwise the module named)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _absolute(module, node)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            names.append(sub if sub in MODULES else base)
    return [n for n in dict.fromkeys(names) if n == PACKAGE or n.startswith(PACKAGE + ".")]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_Found = Iterator[tuple[ast.Import | ast.ImportFrom, bool]]


def _imports(tree: ast.AST) -> _Found:
    """Every import statement with whether it runs when the module is imported (the body of
    ``if TYPE_CHECKING:`` never runs: skipped)."""

    def walk(node: ast.AST, at_import: bool) -> _Found:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, at_import
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), at_import)
            else:
                yield from walk(child, at_import)

    yield from walk(tree, True)


def _has_lazy_mark(lines: list[str], node: ast.stmt) -> bool:
    """A ``# lazy:`` comment on the import's lines or on the lines right above it that are
    comments, imports, blank or ``try:`` (one mark covers a block of lazy imports)."""
    end = getattr(node, "end_lineno", node.lineno) or node.lineno
    if any(LAZY_MARK in line for line in lines[node.lineno - 1 : end]):
        return True
    row = node.lineno - 2
    while row >= 0:
        text = lines[row].strip()
        if LAZY_MARK in text:
            return True
        if text and not (text.startswith(("#", "import ", "from ", "try:")) or text == ")"):
            return False
        row -= 1
    return False


def _pyx_imports(module: str, lines: list[str]) -> Iterator[tuple[int, list[str], bool]]:
    """(line, genai modules, runs at import) for each Python import of a Cython source: an
    indented one is inside a function (Cython sources here have no class-level imports)."""
    for number, line in enumerate(lines, 1):
        match = _PYX_IMPORT.match(line)
        if match is None:
            continue
        indent, base, names, plain = match.groups()
        if plain:
            node: ast.Import | ast.ImportFrom = ast.Import(names=[ast.alias(name=plain)])
        else:
            aliases = [n.strip() for n in names.strip("() ").split(",") if n.strip()]
            node = ast.ImportFrom(
                module=base, names=[ast.alias(name=n.split()[0]) for n in aliases], level=0
            )
        yield number, _targets(module, node), not indent


def _scan() -> tuple[dict[str, set[str]], list[tuple[str, int, str, bool]]]:
    """The import graph (what runs at import) and every function-level genai import:
    (file, line, imported module, has the lazy mark)."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    function_level = []
    for module, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        rel = path.relative_to(ROOT.parent).as_posix()
        if path.suffix == ".pyx":
            found = list(_pyx_imports(module, lines))
            marks = {number: LAZY_MARK in lines[number - 1] for number, _, _ in found}
        else:
            found, marks = [], {}
            for node, at_import in _imports(ast.parse(text, filename=str(path))):
                found.append((node.lineno, _targets(module, node), at_import))
                marks[node.lineno] = _has_lazy_mark(lines, node)
        for number, targets, at_import in found:
            if at_import:
                graph[module].update(t for t in targets if t in MODULES and t != module)
            else:
                function_level.extend((rel, number, t, marks[number]) for t in targets)
    return graph, function_level


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle inside a strongly connected component, for the message."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in members)
        back = [w for w in nxt if w in seen]
        if back:
            return [*path[path.index(back[0]) :], back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


GRAPH, FUNCTION_LEVEL = _scan()


def test_the_scan_sees_the_package() -> None:
    # The graph must hold known edges, or the other tests pass vacuously.
    assert "genai.runtime.model" in MODULES
    assert "genai.runtime.config" in GRAPH["genai.runtime.model"]
    assert "genai.generation.generator" in GRAPH["genai"]


def test_no_unmarked_function_level_imports_of_genai_modules() -> None:
    offenders = [
        f"{file}:{line}: imports {target} inside a function"
        for file, line, target, marked in FUNCTION_LEVEL
        if not marked and (file, target) not in ALLOWED_FUNCTION_LEVEL
    ]
    assert not offenders, (
        "move these imports to module level (untangle the cycle), or mark a deliberate lazy "
        f"import of an optional heavy dependency with '{LAZY_MARK} <reason>':\n"
        + "\n".join(offenders)
    )


def test_allow_list_has_no_stale_entries() -> None:
    present = {(file, target) for file, _, target, marked in FUNCTION_LEVEL if not marked}
    stale = sorted(set(ALLOWED_FUNCTION_LEVEL) - present)
    assert not stale, f"these allow-list entries are gone from the code, remove them: {stale}"


def test_no_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles among genai's modules:\n" + "\n".join(
        " -> ".join(_cycle_path(GRAPH, c)) for c in cycles
    )


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_cycle_finder(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert sorted(_cycles(graph)) == expected


def test_a_back_edge_into_the_real_graph_is_a_cycle() -> None:
    # genai.runtime.model imports genai.errors (through its imports); an edge back closes a cycle.
    graph = {name: set(edges) for name, edges in GRAPH.items()}
    graph["genai.errors"].add("genai.runtime.model")
    assert any({"genai.errors", "genai.runtime.model"} <= set(c) for c in _cycles(graph))


def test_function_level_imports_and_lazy_marks_are_recognised() -> None:
    source = """\
import genai.errors
if TYPE_CHECKING:
    from genai.runtime.model import Model


class A:
    from genai import kv


def f():
    from genai.text import tokenizer
    try:  # lazy: fastapi is optional
        import fastapi

        from genai.serve import app
    except ImportError:
        pass
    import genai.runtime.model  # lazy: reason on the line
"""
    lines = source.splitlines()
    found = [
        (node.lineno, at_import, _has_lazy_mark(lines, node))
        for node, at_import in _imports(ast.parse(source))
    ]
    assert found == [
        (1, True, False),
        (7, True, False),
        (11, False, False),
        (13, False, True),
        (15, False, True),
        (18, False, True),
    ]


#: The layers of docs/architecture.md: a package may import the ones below it, never above.
#: (genai itself, cli, serve, builder and testing sit on top; errors and _core at the bottom.)
LOWER_LAYERS = {
    "genai.generation": {"genai.serve"},
    "genai.runtime": {"genai.generation", "genai.serve"},
    "genai.kv": {"genai.generation", "genai.serve"},
    "genai.providers": {"genai.generation", "genai.serve", "genai.kv"},
    "genai.constraints": {"genai.generation", "genai.serve", "genai.runtime", "genai.kv"},
    "genai.text": {"genai.generation", "genai.serve", "genai.constraints", "genai.kv"},
    "genai.compat": {"genai.generation", "genai.serve", "genai.runtime", "genai.kv"},
}


def test_the_layers_import_one_way() -> None:
    """No package imports (at import time) one that sits above it in docs/architecture.md."""
    wrong = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for package, above in LOWER_LAYERS.items()
        if module == package or module.startswith(package + ".")
        for target in targets
        if any(target == a or target.startswith(a + ".") for a in above)
    ]
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))
