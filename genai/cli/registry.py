"""The ``genai`` commands: each command module registers itself with `command`.

A command is a name, a one-line help and a function that fills its subparser (arguments and
``handler``, the function that runs it and returns the exit status). Only the command being
run is filled in, so that ``genai --help`` and ``genai generate`` import no builder (onnx) and
scan no plugins; plugins are scanned only for a command that is not here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["COMMANDS", "command", "command_parser"]

#: The built-in commands: name -> (one-line help, function that fills its subparser).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


def command(name: str, help: str):
    """Register the decorated function as the filler of command ``name``'s subparser."""

    def register(fill: Callable[[argparse.ArgumentParser], None]):
        COMMANDS[name] = (help, fill)
        return fill

    return register


def command_parser(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` (a command's, or a command's action's: ``genai adapter convert``) the one
    that reports its errors: a `genai.cli.common.UsageError` raised while it runs, and
    arguments it does not know. argparse hands a subparser's leftovers back to the parser
    above, whose error shows that parser's usage (``usage: genai [-h] ... COMMAND``), not the
    command's options."""
    parser.set_defaults(command_parser=parser)
    parse_known = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):  # type: ignore[no-untyped-def]
        namespace, extras = parse_known(args, namespace)
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]
