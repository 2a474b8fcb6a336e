"""Turning a prompt into tokens: `Generator` and `GeneratorParams`, the search options,
beam search, and the drivers that run a model kind's graphs (the native single-graph loop,
windowed static-shape models, multi-graph pipelines)."""
