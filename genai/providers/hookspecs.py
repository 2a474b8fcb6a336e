"""Every hook a genai plugin can implement, in one module.

A plugin is a module (or object) with functions decorated ``@genai.hookimpl`` whose names and
arguments match the specifications below. It is found through the ``genai.plugins`` entry-point
group (see `genai.providers.plugins`) or registered by hand with
``genai.providers.plugins.register_plugin``.
Arguments may be left out of an implementation (pluggy passes only the ones it names).

Execution providers are the main thing plugins add; a provider is a subclass of
`genai.providers.base.ExecutionProvider` that owns everything hardware-specific (see
``docs/providers.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import argparse

    from genai.providers.base import ExecutionProvider
    from genai.runtime.config import Config

__all__ = ["PROJECT", "hookimpl", "hookspec"]

#: The pluggy project name: markers, entry points and the plugin manager share it.
PROJECT = "genai"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorator for plugin functions: ``@genai.hookimpl def register_providers(register): ...``.
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------


@hookspec
def register_providers(register: Callable[..., Any]) -> None:
    """Register execution providers.

    Called once per process, the first time providers are needed (``genai.Model``,
    ``genai providers``, ``genai.providers.base.get_provider``), after every plugin is loaded.
    Call ``register(ProviderClass, aliases=())`` for each `ExecutionProvider` subclass the
    plugin offers; ``aliases`` are extra names the provider answers to (matched
    case-insensitively, after the reference's name normalisation). Registering the same class
    twice is a no-op; a different class under a name that is taken is an error naming both.
    Returns nothing.
    """


@hookspec
def register_commands(commands: argparse._SubParsersAction) -> None:
    """Add subcommands to the ``genai`` command line.

    Called while the ``genai`` argument parser is built, with its subparsers object: call
    ``commands.add_parser(name, help=...)`` and ``set_defaults(handler=fn)`` where ``fn(args)``
    returns the exit status. Returns nothing.
    """


# ---------------------------------------------------------------------------------------------
# Model loading
# ---------------------------------------------------------------------------------------------


@hookspec
def provider_selected(provider: ExecutionProvider, options: dict[str, str], config: Config) -> None:
    """Observe (or veto) the provider a model is about to be loaded with.

    Called by ``genai.Model`` after the provider named by the config is found available and
    its options validated, before the session is created. ``options`` are the provider options
    from the config (strings). Raise to refuse the load (the error reaches the caller); the
    return value is ignored.
    """
