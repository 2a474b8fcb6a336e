"""Stop strings matched on decoded text, across token boundaries.

`StopStringMatcher` is fed the text of each new token as it is decoded (complete characters
only: `genai.TokenizerStream` never returns half of a multi-byte character) and returns the part
that is safe to show now: text that can no longer become the start of a stop string. When a
stop string completes, it returns the text before it and reports the stop; the stop string
itself is never emitted.
"""

from __future__ import annotations

from collections.abc import Sequence

from genai.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["StopStringMatcher", "check_stop_strings"]


def check_stop_strings(stops: str | Sequence[str]) -> tuple[str, ...]:
    """Normalise stop strings: one str or a sequence of str, none empty (duplicates dropped,
    order kept). Raises `ValueError` / `TypeError` otherwise."""
    if isinstance(stops, str):
        stops = [stops]
    if not isinstance(stops, Sequence):
        raise ArgumentTypeError(f"stop must be a str or a list of str, got {type(stops).__name__}")
    checked: list[str] = []
    for stop in stops:
        if not isinstance(stop, str):
            raise ArgumentTypeError(f"stop strings must be str, got {type(stop).__name__} {stop!r}")
        if not stop:
            raise InvalidArgumentError("stop strings must not be empty")
        if stop not in checked:
            checked.append(stop)
    return tuple(checked)


class StopStringMatcher:
    """Finds the first occurrence of any of ``stops`` in text that arrives in pieces.

    ``push`` returns ``(text safe to emit now, stopped)``: it holds back the longest tail of
    the text so far that is a proper prefix of some stop string (it could still grow into
    one), and once a stop string completes returns the text before it with ``stopped`` True.
    After a stop, further pushes return ``("", True)``. ``flush`` returns the held-back text
    at the end of generation. The concatenation of everything returned is exactly the text
    up to the earliest stop string (or the whole text when none occurs).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = check_stop_strings(stops)
        if not self.stops:
            raise InvalidArgumentError("StopStringMatcher needs at least one stop string")
        self._held = ""
        self.stopped = False
        #: the stop string that matched (None until one does)
        self.matched: str | None = None
        self._longest = max(len(s) for s in self.stops)

    def push(self, text: str) -> tuple[str, bool]:
        """Feed newly decoded text; return (text safe to emit now, stopped)."""
        if self.stopped:
            return "", True
        if not text:
            return "", False
        buffer = self._held + text
        # earliest start wins; a stop cannot start inside the already-emitted text, and the
        # held text holds no complete stop, so searching the buffer is enough
        first, matched = -1, None
        for stop in self.stops:
            at = buffer.find(stop)
            if at >= 0 and (first < 0 or at < first):
                first, matched = at, stop
        if matched is not None:
            self.stopped, self.matched, self._held = True, matched, ""
            return buffer[:first], True
        keep = self._partial_tail(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest tail of ``buffer`` that is a proper prefix of a stop string."""
        best = 0
        limit = min(self._longest - 1, len(buffer))
        for stop in self.stops:
            for size in range(min(len(stop) - 1, limit), best, -1):
                if buffer.endswith(stop[:size]):
                    best = size
                    break
        return best

    def flush(self) -> str:
        """The held-back text, at the end of generation (empty after a stop)."""
        held, self._held = self._held, ""
        return held

    def reset(self) -> None:
        """Forget the text so far (a new generation)."""
        self._held = ""
        self.stopped = False
        self.matched = None
