"""Build the Cython kernels in genai/_core (everything else is declared in pyproject.toml).

A build translates the ``.pyx`` files with Cython in parallel processes, compiles the C in
parallel threads, and reuses a module from ``build/ext-cache/`` when everything that goes into it
(its C source and headers, the compiler and its flags, Python, NumPy) is unchanged, so installing
again (``pip install -e ".[test]"`` after ``pip install -e .``) copies instead of compiling.

Environment variables:

- ``GENAI_BUILD_JOBS=N``: Cython and C jobs (default: the CPUs this process may run on;
  ``build_ext -j N`` sets it too).
- ``GENAI_BUILD_CACHE=0``: compile every module, neither reading nor filling the cache.
- ``GENAI_CYTHON_DEBUG=1``: bounds, wraparound and initialisation checks on, C debug info kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import sysconfig
import threading
from pathlib import Path

import Cython
import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CACHE_DIR = ROOT / "build" / "ext-cache"
CACHE_SCHEMA = 1  # bump when the cache key changes meaning
CACHE_KEEP = 4  # builds kept per module

# One .pyx + .pxd per kernel family, longest compile first (the parallel build starts them in
# this order, so the slowest module never starts last).
MOD_NAMES = [
    "genai._core.native_session",
    "genai._core.sampling",
    "genai._core.decoder_loop",
    "genai._core.decode_ahead",
    "genai._core.vision_loop",
    "genai._core.bookkeeping",
    "genai._core.custom_ops",
    "genai._core.ort_api",
]
# The ORT C API is loaded at run time with dlopen (no link to onnxruntime at build time).
LIBRARIES = {"genai._core.ort_api": ["dl"], "genai._core.native_session": ["dl"]}

DEBUG = os.environ.get("GENAI_CYTHON_DEBUG") == "1"
DIRECTIVES = {
    "language_level": "3",
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "cdivision": not DEBUG,
    "initializedcheck": DEBUG,
}
# -O2, not -O3: the sampling kernels and the decode loop run as fast (docs/benchmarks.md,
# "Install time"), the C compiles in ~17% less time. Python's CFLAGS carry -g; debug information
# nobody reads makes the compile ~35% longer and the modules ~7x larger.
UNIX_FLAGS = ["-O2", "-g"] if DEBUG else ["-O2", "-g0"]
MSVC_FLAGS = ["/O2", "/Zi"] if DEBUG else ["/O2"]
# The comment block at the top of a Cython .c file that records the build's paths.
CYTHON_METADATA = re.compile(rb"/\* BEGIN: Cython Metadata.*?END: Cython Metadata \*/", re.S)
HEADERS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "genai" / "_core").glob("*.h"))


def default_jobs() -> int:
    """Parallel build jobs: ``GENAI_BUILD_JOBS``, else the CPUs this process may use."""
    value = os.environ.get("GENAI_BUILD_JOBS", "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"GENAI_BUILD_JOBS must be a whole number >= 1, not {value!r}")
        return int(value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def module_key(facts: dict, files: list[str]) -> str:
    """Cache key of a compiled module: ``facts`` (compiler, flags, versions) and the contents of
    ``files`` (paths relative to the project), less the comment block atop a Cython .c file that
    records the build environment's paths, so a build-isolated rebuild keys the same."""
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=repr).encode())
    for path in files:
        text = Path(ROOT, path).read_bytes()
        if path.endswith(".c"):
            text = CYTHON_METADATA.sub(b"", text, count=1)
        digest.update(f"\n{path}\n".encode())
        digest.update(text)
    return digest.hexdigest()[:24]


def _say(message: str) -> None:
    """One line on stdout (the build threads print at once; one write keeps lines whole)."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError:
        pass  # a read-only tree: the next build translates again


class BuildExt(build_ext):
    """build_ext with parallel Cython and C steps and a content-addressed module cache."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:  # `build_ext -j N` wins over the default
            self.parallel = default_jobs()

    def build_extensions(self) -> None:
        self._cythonize()
        flags = MSVC_FLAGS if self.compiler.compiler_type == "msvc" else UNIX_FLAGS
        for ext in self.extensions:
            ext.extra_compile_args = [*flags, *ext.extra_compile_args]
        super().build_extensions()

    def _cythonize(self) -> None:
        """Translate the .pyx files whose translation is stale, in parallel processes.

        Cython's own check compares timestamps with every dependency, including its and NumPy's
        .pxd files, which a build-isolated environment installs fresh each time: every install
        would translate again. A translation is instead kept while a digest of what goes into
        it (the module's .pyx, the package's .pxd/.h, Cython and NumPy versions, directives)
        matches the one recorded beside the cache.
        """
        ours = sorted((ROOT / "genai" / "_core").glob("*.pxd")) + [ROOT / h for h in HEADERS]
        shared = hashlib.sha256(
            json.dumps([Cython.__version__, np.__version__, DIRECTIVES]).encode()
        )
        for path in ours:
            shared.update(path.name.encode() + b"\0" + path.read_bytes())
        stale, keys = [], {}
        for ext in self.extensions:
            pyx = Path(ROOT, ext.sources[0])
            digest = shared.copy()
            digest.update(pyx.read_bytes())
            keys[ext.name] = digest.hexdigest()
            stamp = CACHE_DIR / f"{ext.name}.cython"
            c_file = pyx.with_suffix(".c")
            if self.force or not c_file.is_file() or _read(stamp) != keys[ext.name]:
                stale.append(ext)
            ext.sources = [str(c_file.relative_to(ROOT)), *ext.sources[1:]]
        if not stale:
            return
        jobs = self.parallel if isinstance(self.parallel, int) else default_jobs()
        for ext in stale:  # back to the .pyx for Cython
            ext.sources[0] = ext.sources[0][: -len(".c")] + ".pyx"
        translated = cythonize(
            stale, compiler_directives=DIRECTIVES, nthreads=jobs if jobs > 1 else 0, force=True
        )
        # cythonize returns new Extension objects; setuptools keeps state on the originals.
        sources = {ext.name: ext.sources for ext in translated}
        for ext in stale:
            ext.sources = sources[ext.name]
            _write(CACHE_DIR / f"{ext.name}.cython", keys[ext.name])

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name))
        if os.environ.get("GENAI_BUILD_CACHE", "1") == "0" or self.force:
            super().build_extension(ext)
            return
        cached = CACHE_DIR / f"{target.name}.{self._cache_key(ext, target.name)}"
        if cached.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cached, target)
            os.utime(cached)  # recently used: pruned last
            _say(f"genai: {ext.name} is unchanged, reusing {cached.relative_to(ROOT)}")
            return
        super().build_extension(ext)
        self._store(target, cached)

    def _cache_key(self, ext: Extension, filename: str) -> str:
        """Digest of everything that goes into the module: its C source and headers, the
        compiler (path, size, mtime) and its flags, the extension's settings, Python, NumPy."""
        compiler = self.compiler
        command = getattr(compiler, "compiler_so", None) or [compiler.compiler_type]
        executable = shutil.which(command[0])
        stat = os.stat(executable) if executable else None
        numpy_include = np.get_include()
        facts = {
            "schema": CACHE_SCHEMA,
            "file": filename,
            "python": sys.version,
            "platform": sysconfig.get_platform(),
            "numpy": np.__version__,
            "compiler": [
                compiler.compiler_type,
                command,
                getattr(compiler, "linker_so", None),
                getattr(compiler, "compile_options", None),
                executable,
                stat and (stat.st_size, stat.st_mtime_ns),
            ],
            "ext": [
                ext.extra_compile_args,
                ext.extra_link_args,
                ext.define_macros,
                ext.undef_macros,
                ext.libraries,
                ext.library_dirs,
                [d for d in ext.include_dirs if d != numpy_include],
            ],
        }
        return module_key(facts, sorted({*ext.sources, *ext.depends}))

    @staticmethod
    def _store(built: Path, cached: Path) -> None:
        """Keep a copy of the module just built and this module's CACHE_KEEP - 1 most
        recently used other builds (switching branches back and forth reuses them)."""
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_name(f"{cached.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            shutil.copyfile(built, partial)
            os.replace(partial, cached)
            stem = cached.name.rsplit(".", 1)[0]
            others = [p for p in cached.parent.glob(stem + ".*") if p.suffix != ".tmp"]
            others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
            for old in others[CACHE_KEEP:]:
                old.unlink(missing_ok=True)
        except OSError as exc:
            _say(f"genai: not caching {built.name}: {exc}")


def extensions() -> list[Extension]:
    """The kernel modules (`MOD_NAMES`), from their .pyx (BuildExt translates them)."""
    return [
        Extension(
            name,
            [name.replace(".", "/") + ".pyx"],
            include_dirs=[np.get_include(), "genai/_core"],  # the kernels' C headers
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
            depends=HEADERS,
            libraries=LIBRARIES.get(name, []) if sys.platform.startswith("linux") else [],
        )
        for name in MOD_NAMES
    ]


# setuptools runs this file as __main__ (python setup.py, PEP 517 backends); tests import it.
if __name__ == "__main__":
    setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
