"""Errors raised by the model builder."""

from __future__ import annotations

__all__ = ["BuildError"]


class BuildError(ValueError):
    """The input checkpoint cannot be built (bad file, unsupported type or architecture)."""
