"""The ``genai`` commands: each command module registers itself with `command`.

A command is a name, a one-line help and a function that fills its subparser (arguments and
``handler``, the function that runs it and returns the exit status). Only the command being
run is filled in, so that ``genai --help`` and ``genai generate`` import no builder (onnx) and
scan no plugins; plugins are scanned only for a command that is not here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["COMMANDS", "command"]

#: The built-in commands: name -> (one-line help, function that fills its subparser).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


def command(name: str, help: str):
    """Register the decorated function as the filler of command ``name``'s subparser."""

    def register(fill: Callable[[argparse.ArgumentParser], None]):
        COMMANDS[name] = (help, fill)
        return fill

    return register
