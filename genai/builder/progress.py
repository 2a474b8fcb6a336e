"""A dependency-free progress bar on stderr, one line per stage."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["StderrProgress"]


class StderrProgress:
    """``stage(name, total)`` returns ``update(done, total)``; redraws in place on a terminal,
    prints one line per finished stage otherwise."""

    def __init__(self, stream: TextIO | None = None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def stage(self, name: str, total: int) -> Callable[[int, int], None]:
        started = time.perf_counter()
        finished = False

        def update(done: int, total_now: int = total) -> None:
            nonlocal finished
            if finished:
                return
            total_now = max(total_now, 1)
            frac = min(max(done / total_now, 0.0), 1.0)
            filled = round(frac * self.width)
            bar = "#" * filled + "-" * (self.width - filled)
            line = f"{name:<10} [{bar}] {done}/{total_now} {time.perf_counter() - started:5.1f}s"
            if done >= total_now:
                finished = True
                self.stream.write(("\r" if self.tty else "") + line + "\n")
            elif self.tty:
                self.stream.write("\r" + line)
            self.stream.flush()

        return update

    def message(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
