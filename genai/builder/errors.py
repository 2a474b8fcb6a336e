"""Errors raised by the model builder."""

from __future__ import annotations

from genai.errors import GenaiError

__all__ = ["BuildError"]


class BuildError(GenaiError, ValueError):
    """The input checkpoint cannot be built (bad file, unsupported type or architecture)."""
