"""Native (Cython) hot paths: bookkeeping and sampling kernels."""
