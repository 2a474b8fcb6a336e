"""Packaging: what the sdist and the wheel carry, the extension cache key, the wheel plan.

The sdist is built from a copy of the checkout (its git-tracked files plus planted build
leftovers) by setuptools' PEP 517 backend at the version [build-system] asks for (the test
extra installs it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import missing_in_ci

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
yaml = pytest.importorskip("yaml")
pytest.importorskip("Cython")  # setup.py imports it (a build requirement)

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Folders README.md links or the tests need: the sdist carries every tracked file in them.
SHIPPED_FOLDERS = ("docs", "examples", "providers", "benchmarks", "scripts", "tests")
# What builds and installs leave in a working tree; none of it belongs in the sdist.
LEFTOVERS = (
    "genai/_core/sampling.c",
    "genai/_core/sampling.cpython-311-x86_64-linux-gnu.so",
    "build/ext-cache/sampling.cpython-311-x86_64-linux-gnu.so.0123456789abcdef01234567",
    "examples/genai-provider-example/build/lib/genai_provider_example/__init__.py",
    "examples/genai-provider-example/genai_provider_example.egg-info/PKG-INFO",
    "providers/cpu/build/lib/genai_provider_cpu/__init__.py",
    "providers/cpu/genai_provider_cpu.egg-info/PKG-INFO",
    "tests/__pycache__/conftest.cpython-311.pyc",
)


def _tracked_files() -> list[str]:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs the git checkout (the sdist is built from its tracked files)")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in out.split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def build_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for PYTHONPATH when building: empty, since the setuptools that [build-system]
    requires comes with the test extra (tests download nothing)."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    (requirement,) = [r for r in PYPROJECT["build-system"]["requires"] if "setuptools" in r]
    installed = version("setuptools")
    if installed not in Requirement(requirement).specifier:
        missing_in_ci(
            f"setuptools {installed} is installed; building the sdist needs {requirement} "
            "(pip install -e '.[test]' installs it)"
        )
    return tmp_path_factory.mktemp("build-tools")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout's tracked files, with build leftovers planted in it."""
    tree = tmp_path_factory.mktemp("tree")
    for name in _tracked_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    for name in LEFTOVERS:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("left over by a build\n")
    return tree


def _run_setuptools(tree: Path, tools: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(tools), SETUPTOOLS_USE_DISTUTILS="local")
    proc = subprocess.run(
        [sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def sdist_names(tree: Path, build_tools: Path, tmp_path_factory) -> set[str]:
    """The paths in the sdist, relative to its top folder."""
    out = tmp_path_factory.mktemp("sdist")
    code = (
        "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    )
    filename = _run_setuptools(tree, build_tools, "-c", code, str(out)).strip().splitlines()[-1]
    with tarfile.open(out / filename) as archive:
        names = [m.name for m in archive.getmembers() if m.isfile()]
    return {name.split("/", 1)[1] for name in names}


def test_sdist_carries_the_folders_readme_links(sdist_names):
    tracked = _tracked_files()
    wanted = [n for n in tracked if n.split("/", 1)[0] in SHIPPED_FOLDERS]
    assert {"docs", "examples", "providers"} <= {n.split("/", 1)[0] for n in wanted}
    missing = sorted(set(wanted) - sdist_names)
    assert not missing, f"tracked files missing from the sdist: {missing}"
    for name in ("README.md", "pyproject.toml", "setup.py", "MANIFEST.in"):
        assert name in sdist_names
    sources = [n for n in tracked if re.fullmatch(r"genai/_core/[^/]+\.(pyx|pxd|h)", n)]
    # every module setup.py compiles ships its .pyx and .pxd (one pair per kernel family)
    modules = re.findall(r'"genai\._core\.(\w+)"', (ROOT / "setup.py").read_text())
    assert modules
    for module in modules:
        assert {f"genai/_core/{module}.pyx", f"genai/_core/{module}.pxd"} <= set(sources), module
    assert set(sources) <= sdist_names


def test_every_path_readme_names_is_in_the_sdist(sdist_names):
    readme = (ROOT / "README.md").read_text()
    paths = set(re.findall(r"`((?:docs|examples|providers|benchmarks)/[^`<>\s]*)`", readme))
    assert paths, "README.md names no docs/ examples/ providers/ benchmarks/ path"
    for path in sorted(paths):
        stem = path.rstrip("/")
        assert stem in sdist_names or any(n.startswith(stem + "/") for n in sdist_names), path


def test_sdist_leaves_out_generated_c_and_build_leftovers(sdist_names):
    assert not set(LEFTOVERS) & sdist_names
    generated = [n for n in sdist_names if n.endswith((".c", ".so", ".pyc", ".pyd"))]
    assert not generated
    assert not [n for n in sdist_names if "/build/" in n or n.startswith("build/")]


def test_wheel_package_files_leave_out_generated_c(tree, build_tools, tmp_path):
    """build_py is the wheel's pure part (build_ext adds the compiled modules): the Cython
    sources and headers, not the C that Cython generated."""
    _run_setuptools(tree, build_tools, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path))
    core = {p.name for p in (tmp_path / "genai" / "_core").iterdir()}
    assert not [n for n in core if n.endswith(".c")]
    for module in ("sampling", "native_session", "decoder_loop", "bookkeeping", "ort_api"):
        assert {f"{module}.pyx", f"{module}.pxd"} <= core
    assert {"sampling_kernels.h", "ort_opaque_types.h"} <= core
    assert (tmp_path / "genai" / "py.typed").is_file()
    assert not (tmp_path / "docs").exists() and not (tmp_path / "tests").exists()


def _load_setup_module():
    spec = importlib.util.spec_from_file_location("genai_setup_under_test", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: defines, does not call setup()
    return module


def test_cache_key_ignores_the_build_paths_cython_records(tmp_path):
    """A rebuild in a fresh isolated environment reuses the module: Cython's metadata block
    names that environment's numpy path, which must not change the key; the code must."""
    setup_module = _load_setup_module()
    c_file = tmp_path / "m.c"

    def key_of(numpy_dir: str, body: str, flags: tuple[str, ...] = ("-O2",)) -> str:
        c_file.write_text(
            "/* BEGIN: Cython Metadata\n"
            f'{{"distutils": {{"include_dirs": ["{numpy_dir}/numpy/_core/include"]}}}}\n'
            f"END: Cython Metadata */\n{body}\n"
        )
        return setup_module.module_key({"flags": list(flags)}, [str(c_file)])

    base = key_of("/tmp/pip-build-env-aaaa/site-packages", "int f(void) { return 1; }")
    assert key_of("/tmp/pip-build-env-bbbb/site-packages", "int f(void) { return 1; }") == base
    assert key_of("/tmp/pip-build-env-aaaa/site-packages", "int f(void) { return 2; }") != base
    assert (
        key_of("/tmp/pip-build-env-aaaa/site-packages", "int f(void) { return 1; }", ("-O3",))
        != base
    )


def test_extensions_match_the_kernel_sources():
    setup_module = _load_setup_module()
    names = {ext.name for ext in setup_module.extensions()}
    on_disk = {f"genai._core.{p.stem}" for p in (ROOT / "genai" / "_core").glob("*.pyx")}
    assert names == on_disk


# GitHub-hosted runner labels: (OS, architecture) of each.
RUNNERS = {
    "ubuntu-24.04": ("linux", "x86_64"),
    "ubuntu-24.04-arm": ("linux", "arm64"),
    "macos-15-intel": ("macos", "x86_64"),
    "macos-14": ("macos", "arm64"),
    "macos-15": ("macos", "arm64"),
    "windows-2022": ("windows", "x86_64"),
    "windows-11-arm": ("windows", "arm64"),
}


def test_wheel_plan_covers_each_os_and_architecture():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "wheels.yml").read_text())
    job = workflow["jobs"]["wheels"]
    platforms = {RUNNERS[label] for label in job["strategy"]["matrix"]["os"]}
    wanted = {(o, a) for o in ("linux", "macos", "windows") for a in ("x86_64", "arm64")}
    assert platforms == wanted
    assert any(str(step.get("uses", "")).startswith("pypa/cibuildwheel@") for step in job["steps"])


def test_cibuildwheel_builds_every_supported_python_and_tests_the_wheel():
    config = PYPROJECT["tool"]["cibuildwheel"]
    lowest = int(re.fullmatch(r">=3\.(\d+)", PYPROJECT["project"]["requires-python"]).group(1))
    built = {int(m) for m in re.findall(r"cp3(\d+)-\*", " ".join(config["build"]))}
    assert lowest in built and built == set(range(lowest, max(built) + 1))
    sources = config["test-sources"]
    assert sources and all((ROOT / s).is_file() for s in sources)
    command = " ".join(config["test-command"])
    assert all(s in command for s in sources)
