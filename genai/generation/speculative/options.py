"""The reference's speculative-decoding options (``GeneratorParams.set_speculative_options``,
the ``speculative`` section of ``genai_config.json``), checked as the reference checks them.

* ``ngram_size`` (0 = off, else 2..16): prompt-lookup (n-gram) decoding proposes the tokens that
  followed the last ``ngram_size - 1`` tokens where they occurred before;
* ``max_draft_tokens`` (1..16, default 4): tokens proposed per round (K);
* ``ngram_chained_lookup``: keep looking up after a proposed token (across occurrences);
* ``min_adaptive_k`` (0 = off, else 1..16): adapt K between this and 16 by measured throughput;
* ``cooldown``: after three rounds in a row that accept nothing, one plain step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from genai.errors import SearchOptionError
from genai.runtime.config import speculative_range_error

if TYPE_CHECKING:
    from genai.runtime.config import Config

__all__ = ["SpeculativeOptionError", "SpeculativeOptions"]


class SpeculativeOptionError(SearchOptionError, RuntimeError):
    """A speculative option has an unknown name, a wrong type or a value out of range (also a
    RuntimeError, what the reference raises)."""


_BOOLS = ("ngram_chained_lookup", "cooldown")


@dataclass
class SpeculativeOptions:
    """Every speculative option with the reference's default."""

    max_draft_tokens: int = 4
    ngram_size: int = 0
    ngram_chained_lookup: bool = False
    min_adaptive_k: int = 0
    cooldown: bool = False

    @classmethod
    def from_config(cls, config: Config) -> SpeculativeOptions:
        """The options of a model's ``speculative`` section (checked when it loaded)."""
        options = cls()
        for field in fields(cls):
            value = config.get(f"speculative.{field.name}")
            if value is not None:
                setattr(options, field.name, bool(value) if field.name in _BOOLS else int(value))
        return options

    def update(self, **options: Any) -> None:
        """Set options by name, checked as the reference checks them; nothing changes when one
        is refused."""
        known = {field.name for field in fields(self)}
        checked: dict[str, Any] = {}
        for name, value in options.items():
            if name not in known:
                raise SpeculativeOptionError(f'Unknown value "{name}"')
            checked[name] = _checked(name, value)
        for name, value in checked.items():
            setattr(self, name, value)

    def as_reference_dict(self) -> dict[str, float | bool]:
        """The options as the reference returns them: numbers as floats."""
        return {
            field.name: getattr(self, field.name)
            if field.name in _BOOLS
            else float(getattr(self, field.name))
            for field in fields(self)
        }

    @property
    def ngram(self) -> bool:
        """True when prompt-lookup (n-gram) decoding is on."""
        return self.ngram_size > 0


def _checked(name: str, value: Any) -> bool | int:
    if not isinstance(value, bool | int | float):
        raise SpeculativeOptionError(
            f"Unknown speculative option type, must be bool, int, or float: {name}"
        )
    if name in _BOOLS:
        if not isinstance(value, bool):
            raise SpeculativeOptionError(f"{name} - Expected a bool but saw a number")
        return value
    if isinstance(value, bool):
        raise SpeculativeOptionError(f"{name} - Expected a number but saw a bool")
    if isinstance(value, float) and not value.is_integer():
        raise SpeculativeOptionError(f"Field '{name}' value {value} is not an integer")
    number = int(value)
    problem = speculative_range_error(name, number)
    if problem:
        raise SpeculativeOptionError(problem)
    return number
