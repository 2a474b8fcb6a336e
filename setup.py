"""Build the Cython kernels in genai/_core (everything else is declared in pyproject.toml)."""

import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

# One .pyx + .pxd per kernel family.
MOD_NAMES = [
    "genai._core.bookkeeping",
    "genai._core.ort_api",
    "genai._core.native_session",
    "genai._core.sampling",
    "genai._core.decoder_loop",
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

extensions = [
    Extension(
        name,
        [name.replace(".", "/") + ".pyx"],
        include_dirs=[np.get_include(), "genai/_core"],  # the kernels' C headers
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
        libraries=LIBRARIES.get(name, []) if sys.platform.startswith("linux") else [],
    )
    for name in MOD_NAMES
]

setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES))
