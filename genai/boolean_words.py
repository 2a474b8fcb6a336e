"""The words genai reads as booleans in strings (environment variables, CLI ``--search``
values, tokenizer options): ``true/1/yes/on`` and ``false/0/no/off``, any case."""

from __future__ import annotations

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "parse_bool_word"]

TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def parse_bool_word(text: str) -> bool | None:
    """True or False for one of the words (surrounding spaces ignored), None for any other
    text (the caller decides whether that is an error)."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None
