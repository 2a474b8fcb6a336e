"""Static typing as users see it: `mypy --strict` passes scripts written the way the docs
show (tests/data/typing/), and stubtest finds the compiled modules' ``.pyi`` stubs complete.

mypy must see this checkout's genai: it cannot follow the import hook of an editable install,
so MYPYPATH names the checkout, and tests/data/typing/mypy.ini keeps the errors of genai's own
modules out of the report (as for an installed package; the stubs are still checked). mypy is
a test dependency: without it these fail under CI and skip elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, missing_in_ci

DATA = ROOT / "tests" / "data" / "typing"
CONFIG = DATA / "mypy.ini"
#: The compiled modules: each has its stub beside it.
COMPILED = sorted(path.stem for path in (ROOT / "genai" / "_core").glob("*.pyx"))


@pytest.fixture(scope="module")
def mypy_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a mypy run: this checkout first on its path, and a cache of its own
    (mypy.ini's ``cache_dir`` writes none)."""
    if importlib.util.find_spec("mypy") is None:
        missing_in_ci("mypy is not installed (the test extra pins it)")
    cache = tmp_path_factory.mktemp("mypy-cache")
    return {**os.environ, "MYPYPATH": str(ROOT), "MYPY_CACHE_DIR": str(cache)}


def run_module(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m ARGS`` in the checkout's root."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_doc_style_scripts_pass_mypy_strict(mypy_env):
    scripts = sorted(DATA.glob("*.py"))
    assert len(scripts) >= 4, scripts
    result = run_module(["mypy", "--config-file", str(CONFIG), *map(str, scripts)], mypy_env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_stubs_match_the_compiled_modules(mypy_env):
    assert len(COMPILED) >= 8, COMPILED
    stubless = [
        name for name in COMPILED if not (ROOT / "genai" / "_core" / f"{name}.pyi").is_file()
    ]
    assert stubless == []
    result = run_module(
        [
            "mypy.stubtest",
            "--mypy-config-file",
            str(CONFIG),
            "--allowlist",
            str(DATA / "stubtest_allowlist.txt"),
            "--ignore-disjoint-bases",
            "--concise",
            *(f"genai._core.{name}" for name in COMPILED),
        ],
        mypy_env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
