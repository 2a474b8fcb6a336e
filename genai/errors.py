"""Exceptions raised by genai. Each subclasses the built-in that fits, so ``except ValueError``
keeps working for callers who don't know ours."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "GenerationError",
    "ProviderUnavailableError",
    "SearchOptionError",
    "TensorNotFoundError",
]


class ConfigError(ValueError):
    """A ``genai_config.json`` (or an overlay) is malformed or names something invalid."""


class SearchOptionError(ValueError):
    """A search option has an unknown name, a wrong type, or a value out of range."""


class GenerationError(RuntimeError):
    """The generator was used out of order (e.g. generating before any tokens were appended)."""


class ProviderUnavailableError(RuntimeError):
    """A requested execution provider cannot run here; the message says what is missing."""


class TensorNotFoundError(KeyError, RuntimeError):
    """A tensor name the model (`Generator.get_input` / `get_output`) or a `NamedTensors` does
    not have. A KeyError, and a RuntimeError as the reference raises."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
