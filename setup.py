"""Build the Cython kernels in genai/_core (everything else is declared in pyproject.toml)."""

import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

# One .pyx + .pxd per kernel family.
MOD_NAMES = [
    "genai._core.bookkeeping",
]

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
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
    for name in MOD_NAMES
]

setup(ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES))
