"""``genai conformance``: the execution-provider conformance suite."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import genai
from genai.cli.common import key_values
from genai.cli.registry import command
from genai.errors import (
    ConfigError,
    InvalidArgumentError,
    MissingDependencyError,
    check_writable_file,
)
from genai.providers import ExecutionProvider, get_provider_class
from genai.runtime.config import normalize_provider_name

__all__: list[str] = []


@command("conformance", "run the provider conformance suite and print a pass/fail/skip table")
def _fill_conformance(conf: argparse.ArgumentParser) -> None:
    conf.description = (
        "Run the execution-provider conformance suite (tiny models it builds itself, or "
        "--model) against PROVIDER. Exit status 0 when nothing failed."
    )
    conf.add_argument("provider", help="provider name (as in genai_config.json)")
    conf.add_argument(
        "-m", "--model", metavar="DIR", help="model folder instead of the tiny models"
    )
    conf.add_argument("--report", metavar="FILE.json", help="write the results as JSON")
    conf.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="provider option (repeatable)",
    )
    conf.add_argument("--xfails", metavar="FILE", help="test names to mark xfail, one a line")
    conf.add_argument("-v", "--verbose", action="store_true", help="pytest's verbose output")
    conf.set_defaults(handler=_conformance)


def _conformance(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pytest") is None:
        raise MissingDependencyError(
            "genai conformance needs the 'conformance' extra "
            "(pip install 'genai-runtime[conformance]'): pytest is not installed"
        )
    try:  # lazy: pytest is the optional 'conformance' extra
        from genai.testing.conformance import run_conformance
    except ImportError as exc:
        raise MissingDependencyError(
            f"genai conformance needs the 'conformance' extra "
            f"(pip install 'genai-runtime[conformance]'): {exc}"
        ) from exc
    from genai.testing.conformance.plugin import (  # lazy: imports pytest
        read_xfails,
        unknown_test_names,
    )

    options = key_values(args.option, "--option", InvalidArgumentError)
    # What the arguments name is checked here, before the suite runs: a wrong one would
    # otherwise be a setup error in every test (or a pytest INTERNALERROR), or, for --report,
    # found only once the whole suite has run.
    # the registry names the known
    provider = get_provider_class(normalize_provider_name(args.provider))
    if options:
        _check_options(provider, options)
    if args.model is not None:
        genai.Config(args.model)  # raises, naming the folder, when it is not a model folder
    if args.xfails is not None:
        unknown = unknown_test_names(read_xfails(args.xfails))
        if unknown:
            print(
                f"genai: warning: --xfails {args.xfails}: {', '.join(map(repr, unknown))} name "
                "no conformance test (a typo, or a test since renamed); nothing is marked xfail "
                "for it",
                file=sys.stderr,
            )
    if args.report is not None:
        check_writable_file(args.report, f"--report {args.report}")
    code, results = run_conformance(
        args.provider,
        options=options,
        model=args.model,
        report=args.report,
        xfails=args.xfails,
        quiet=not args.verbose,
    )
    if not results:  # nothing ran (the plugin prints the table otherwise)
        print(f"genai conformance {args.provider}: no conformance test ran (pytest exit {code})")
    failed = any(r["outcome"] in ("fail", "error") for r in results)
    return 1 if failed or code not in (0, 5) or not results else 0


def _check_options(provider: type[ExecutionProvider], options: dict[str, str]) -> None:
    """Raise `InvalidArgumentError` when the provider's own `validate_options` (as a model load
    calls it) refuses ``options`` with a `ConfigError`. Anything else it raises is left to
    the suite, which reports it as the provider's failure."""
    try:
        provider().validate_options(options)
    except ConfigError as exc:
        raise InvalidArgumentError(f"--option: {exc}") from None
    except Exception:
        pass
