"""Every python block of README.md and docs/*.md runs as written.

Each block runs in a fresh interpreter (``python -c``), in a temporary working directory, and
must exit 0; a block that asks "the capital of France" must print Paris. Blocks that open
``og.default_model()`` use the pulled default model (the ``default_model_path`` fixture: a
failure under CI when it is absent, a skip elsewhere).

Markers, an HTML comment on the line just before a block's opening fence:

- ``<!-- continues -->``: the block continues the previous python block of the same file (the
  text says so too); it runs after that block, in the same interpreter.
- ``<!-- serve -->``: the block talks to a running ``genai serve`` at ``http://127.0.0.1:8000``;
  the test serves the default model on loopback (a free port, substituted for 8000) and runs it.
- ``<!-- no-test: REASON -->``: the block needs hardware or a cluster the tests do not have
  (CUDA, a Ray cluster) or downloads; it is skipped with REASON. Only for that.

Listings that are not code (API summaries) are fenced as ``text``, not ``python``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M
)
MARKER = re.compile(r"<!--\s*(continues|serve|no-test:[^>]*?)\s*-->\s*$")
#: Where the docs' server examples expect `genai serve`.
DOCS_SERVER = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Block:
    """One python block: where it is, its code with the blocks it continues, and its skip."""

    path: Path
    line: int
    code: str
    skip: str | None
    #: Talks to a running ``genai serve`` (`DOCS_SERVER`).
    serve: bool = False

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """The python blocks of ``path``, each with the code it runs (continuations joined)."""
    text = path.read_text(encoding="utf-8")
    blocks: list[Block] = []
    for match in FENCE.finditer(text):
        if match.group("lang").strip() != "python":
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        code = _dedent(match.group("body"), len(match.group("indent")))
        skip, serve = None, False
        if marker and marker.group(1) == "serve":
            serve = True
        elif marker and marker.group(1) == "continues":
            if not blocks:
                raise AssertionError(
                    f"{path.name}:{line} continues, but no python block precedes it"
                )
            previous = blocks[-1]
            code = previous.code + "\n" + code
            skip, serve = previous.skip, previous.serve
        elif marker:
            skip = marker.group(1).split(":", 1)[1].strip() or "no reason given"
        blocks.append(Block(path, line, code, skip, serve))
    return blocks


def _dedent(body: str, indent: int) -> str:
    return "\n".join(line[indent:] for line in body.splitlines()) + "\n"


BLOCKS = [block for path in DOCS for block in python_blocks(path)]


def test_the_docs_have_python_blocks_to_run():
    """The extraction finds the README's examples (a broken fence pattern would find none)."""
    readme = [block for block in BLOCKS if block.path.name == "README.md"]
    assert len(readme) >= 2
    assert all("og.default_model()" in block.code for block in readme)


def test_no_example_opens_the_shared_folder():
    """Examples use what a user has: ``og.default_model()``, never ``../shared``."""
    offenders = [block.id for block in BLOCKS if "../shared" in block.code]
    assert offenders == []


@pytest.fixture(scope="module")
def docs_server(default_model_path: Path):
    """`genai serve` on the default model, on loopback: the base URL."""
    pytest.importorskip("fastapi")
    from genai.serve.app import ServeEngine  # lazy: the serve extra
    from genai.serve.server import BackgroundServer

    with BackgroundServer(ServeEngine.from_path(default_model_path, max_slots=4)) as srv:
        yield srv.url


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_python_block_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path):
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip} (marked no-test in the doc)")
    if "default_model()" in block.code or block.serve:
        request.getfixturevalue("default_model_path")
    if block.serve:
        server = request.getfixturevalue("docs_server")
        block = Block(block.path, block.line, block.code.replace(DOCS_SERVER, server), None)
    result = subprocess.run(
        [sys.executable, "-c", block.code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{block.id} failed:\n{result.stderr[-4000:]}"
    if "capital of France" in block.code:  # the greedy examples answer what they ask
        assert "Paris" in result.stdout, result.stdout
