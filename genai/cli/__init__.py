"""The ``genai`` command line (also ``python -m genai``).

genai [-v | -vv] COMMAND ...   (before the command: log genai's INFO / DEBUG records to stderr)
genai generate [-m MODEL_DIR] "prompt" [--chat] [--max-length N] [--threads N] [--image FILE]...
               [-v]
genai chat [-m MODEL_DIR] [--system TEXT] [--max-new-tokens N] [--threads N] [--image FILE]... [-v]
genai build INPUT -o OUT [--precision int4|fp16|fp32] [--all-logits]
genai pull [--force] [-q]  |  genai pull REPO_ID[:SUBFOLDER] [--include PATTERN]... [--revision REV]
genai list [--json]  |  genai rm NAME...
genai providers [--json] [--devices] [--plugins]
genai conformance PROVIDER [-m DIR] [--report FILE.json] [-o KEY=VALUE]... [--xfails FILE]
genai serve [-m MODEL_DIR] [--host 127.0.0.1] [--port 8000] [--max-slots N] [--threads N] ...
genai transcribe FILE -m WHISPER_DIR [--language en] [--timestamps] [--format text|srt|vtt|json]

Plugins add subcommands through the ``register_commands`` hook.

The top-level ``-v``/``--verbose`` (given before the command) configures the standard-library
``genai`` logger: its INFO records (``-vv``: DEBUG too) go to stderr while the command runs.
It is not the subcommands' own ``-v`` (after the command): ``generate -v`` and ``chat -v``
print speeds, ``conformance -v`` makes pytest verbose.

Each command lives in a module of this package and registers itself (`genai.cli.registry`);
a new command is a new module imported below. What several commands share is in
`genai.cli.common`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import sys
from collections.abc import Iterator, Sequence

from genai._version import __version__
from genai.cli import (  # noqa: F401  (they register)
    build,
    chat,
    conformance,
    generate,
    hub,
    providers,
    pull,
    serve,
    transcribe,
)
from genai.cli.common import UsageError
from genai.cli.registry import COMMANDS, command_parser
from genai.errors import GenaiError
from genai.providers import plugins

__all__ = ["main"]

log = logging.getLogger(__name__)

#: Format of the records ``genai -v`` writes to stderr.
LOG_FORMAT = "genai: %(levelname)s %(name)s: %(message)s"


def _command_name(argv: Sequence[str] | None) -> str | None:
    """The command word of ``argv``: its first argument that is not an option."""
    for arg in argv or ():
        if not arg.startswith("-"):
            return arg
    return None


def _build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``genai`` parser, with the command of ``argv`` (none: no command) filled in."""
    selected = _command_name(argv)
    parser = argparse.ArgumentParser(
        prog="genai",
        description="Run generative ONNX models (onnxruntime-genai model folders).",
        epilog="Plugins may add commands: `genai providers --plugins` lists the plugins; "
        "`genai COMMAND --help` describes a command.",
    )
    parser.add_argument("--version", action="version", version=f"genai {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        dest="log_verbosity",
        help="log genai's INFO records to stderr (-vv: DEBUG too); give it before COMMAND "
        "(a command's own -v, after it, is that command's option)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, fill) in sorted(COMMANDS.items()):
        sub = commands.add_parser(name, help=help_text)
        command_parser(sub)
        if name == selected:
            fill(sub)
    if selected is not None and selected not in COMMANDS:
        # one plugin at a time: an error (a command name taken) names the plugin
        plugins.call_each("register_commands", {"commands": commands})
    return parser


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record (tests swap it)."""

    @property
    def stream(self) -> object:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def _leading_verbosity(argv: Sequence[str]) -> int:
    """The count of top-level ``-v`` / ``--verbose`` flags: those before the command."""
    count = 0
    for arg in argv:
        if not arg.startswith("-"):
            break
        if arg == "--verbose":
            count += 1
        elif len(arg) > 1 and arg[1] != "-" and set(arg[1:]) == {"v"}:
            count += len(arg) - 1
    return count


@contextlib.contextmanager
def _logging_to_stderr(verbosity: int) -> Iterator[None]:
    """With ``verbosity`` 1 (2 or more), the ``genai`` logger's INFO (DEBUG) records go to
    stderr until the block ends; the logger's level and handlers are restored after."""
    if verbosity <= 0:
        yield
        return
    logger = logging.getLogger("genai")
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbosity == 1 else logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader went away (another broken pipe, e.g. a network
    connection, is an error like any other)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real file, or no poll()
        return False


def _stdout_closed() -> int:
    """The reader of stdout went away (``genai generate ... | head``): stop quietly, as
    command-line tools do, with the status a SIGPIPE death gives (128 + 13)."""
    with contextlib.suppress(OSError, ValueError):  # no flush error at interpreter exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 141


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``genai`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Configured before the parser is built: building it loads the plugins, which log.
    with _logging_to_stderr(_leading_verbosity(argv)):
        try:
            parser = _build_parser(argv)  # (loads the plugins: a Ctrl-C may come here too)
            args = parser.parse_args(argv)
        except KeyboardInterrupt:
            return 130
        except GenaiError as exc:  # a plugin that fails to load or to add its commands
            log.debug("building the command line failed", exc_info=True)
            print(f"genai: error: {exc}", file=sys.stderr)
            return 1
        try:
            return int(args.handler(args))
        except KeyboardInterrupt:
            return 130
        except UsageError as exc:  # as argparse reports its own: usage line, exit status 2
            command_parser = getattr(args, "command_parser", parser)
            command_parser.print_usage(sys.stderr)
            print(f"{command_parser.prog}: error: {exc}", file=sys.stderr)
            return 2
        except (GenaiError, OSError) as exc:
            if isinstance(exc, BrokenPipeError) and _stdout_gone():
                return _stdout_closed()
            # What genai reports about its input (GenaiError) or a file it could not read or
            # write: one line. Anything else is a bug and keeps its traceback.
            log.debug("%s failed", args.command, exc_info=True)
            print(f"genai: error: {exc}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
