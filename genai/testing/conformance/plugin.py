"""The conformance suite's pytest plugin (entry point ``pytest11``: ``genai_conformance``).

Options:

``--genai-provider NAME``
    The provider the suite's classes test (when the class does not pin ``provider_name``).
``--genai-provider-option KEY=VALUE``
    A provider option (repeatable).
``--genai-model DIR``
    A model folder to test with instead of the tiny models the suite writes.
``--genai-xfails FILE``
    Test names (function names or node-id suffixes), one a line, ``#`` comments: marked xfail
    (a comment on the name's line is the reason shown).
``--genai-report FILE.json``
    Write every conformance result (and the provider's description) as JSON.

When conformance tests ran, the terminal summary ends with a pass/fail/skip table for each
provider tested (a section headed ``genai conformance: NAME``, with its options when it has any).
A result belongs to the provider and options its test's fixtures resolved
(``genai_provider_name`` and ``genai_provider_options``: the class's ``provider_name`` and
``provider_options``, then ``--genai-provider`` / ``--genai-provider-option``, then cpu). The
report has ``provider`` (the provider's description) and ``provider_options`` when one provider
was tested, both null when several were (one session may collect classes for several: the
results are never labelled with one of them); ``providers`` lists each, with its options and
summary, and each result names its ``provider`` and ``provider_options``.

The suite module (`genai.testing.conformance.suite`) is not imported here: it is marked for
assertion rewriting at ``pytest_configure`` and imported by the test modules that use it.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import genai
from genai._core import ort_api
from genai.errors import GenaiError, InvalidArgumentError
from genai.providers import get_provider_class

#: The suite's module: imported lazily, so that pytest can rewrite its asserts.
SUITE = "genai.testing.conformance.suite"


def suite_test_names() -> frozenset[str]:
    """The names of the suite's tests (every area's), which xfails lists must name."""
    from genai.testing.conformance.suite import (  # lazy: after assertion rewriting is on
        ProviderConformanceTests,
    )

    return frozenset(n for n in dir(ProviderConformanceTests) if n.startswith("test_"))


def __getattr__(name: str) -> Any:
    if name == "SUITE_TESTS":  # the former constant
        return suite_test_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unknown_test_names(names: Iterable[str]) -> list[str]:
    """The names (function names or node-id suffixes, as in an xfails file or a provider's
    ``known_failures``) that name none of the suite's tests: typos, or tests since renamed."""
    known = suite_test_names()
    return [n for n in names if n.split("::")[-1].split("[")[0] not in known]


def _warn_unknown(names: Iterable[str], where: str) -> None:
    unknown = unknown_test_names(names)
    if unknown:
        warnings.warn(
            pytest.PytestConfigWarning(
                f"{where} names no conformance test: {', '.join(map(repr, unknown))} "
                "(a typo, or a test since renamed: nothing is marked xfail for it)"
            ),
            stacklevel=2,
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("genai", "genai provider conformance")
    group.addoption(
        "--genai-provider",
        dest="genai_provider",
        metavar="NAME",
        default=None,
        help="execution provider the conformance suite tests (default: cpu)",
    )
    group.addoption(
        "--genai-provider-option",
        dest="genai_provider_option",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="provider option (repeatable)",
    )
    group.addoption(
        "--genai-model",
        dest="genai_model",
        metavar="DIR",
        default=None,
        help="model folder to use instead of the suite's tiny models",
    )
    group.addoption(
        "--genai-xfails",
        dest="genai_xfails",
        metavar="FILE",
        default=None,
        help="file of conformance test names to mark xfail",
    )
    group.addoption("--genai-report", dest="genai_report", metavar="FILE", default=None,
                    help="write the conformance results as JSON")  # fmt: skip


def _is_conformance(item: pytest.Item) -> bool:
    suite = sys.modules.get(SUITE)  # not imported: no conformance test was collected
    cls = getattr(item, "cls", None)
    return suite is not None and cls is not None and issubclass(cls, suite.ConformanceFixtures)


_PROVIDER = pytest.StashKey[tuple[str, dict[str, str]]]()


def _provider_under_test(item: pytest.Item) -> tuple[str, dict[str, str]]:
    """(provider name, options) a conformance item tests: what its fixtures resolved (a vendor
    may override them), else what its class says."""
    found = item.stash.get(_PROVIDER, None)
    if found is not None:
        return found
    funcargs = getattr(item, "funcargs", {})
    name, options = funcargs.get("genai_provider_name"), funcargs.get("genai_provider_options")
    if name is not None and options is not None:
        item.stash[_PROVIDER] = (str(name), {str(k): str(v) for k, v in options.items()})
        return item.stash[_PROVIDER]
    return item.cls.provider_under_test(item.config)  # type: ignore[attr-defined]


def read_xfails(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``--genai-xfails`` file ``path``: {test name: reason (its line's comment, or "")}.

    One name a line (a function name, or a node-id suffix such as ``TestX::test_y[p]``);
    ``#`` starts a comment; blank lines are skipped. Raises `InvalidArgumentError` with a
    one-line message naming the file when it cannot be read, is not UTF-8 text, or has a line
    with more than one name (whitespace is allowed only inside a ``[...]`` parameter id).
    """
    shown = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InvalidArgumentError(f"xfails file {shown!r} does not exist") from None
    except IsADirectoryError:
        raise InvalidArgumentError(
            f"xfails file {shown!r} is a folder, not a file of test names"
        ) from None
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read xfails file {shown!r}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidArgumentError(
            f"xfails file {shown!r} is not UTF-8 text (line {line}): expected test names, "
            "one a line"
        ) from None
    names: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        name, _, comment = line.partition("#")
        name = name.strip()
        if not name:
            continue
        if "\0" in name or any(c.isspace() for c in name.split("[", 1)[0]):
            raise InvalidArgumentError(
                f"xfails file {shown!r} line {number}: expected one test name, got {name!r} "
                "(one name a line; a reason goes after '#')"
            )
        names[name] = comment.strip()
    return names


_XFAILS = pytest.StashKey[dict[str, str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_known_failures(config, items)
    names = config.stash.get(_XFAILS, None)
    if not names:
        return
    path = config.getoption("genai_xfails", None)
    for item in items:
        if not _is_conformance(item):
            continue
        base = getattr(item, "originalname", item.name)
        for n, why in names.items():
            if n in (base, item.name) or item.nodeid.endswith(n):
                reason = f"listed in {path}" + (f": {why}" if why else "")
                item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
                break


def _check_known_failures(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Warn about a tested provider's ``known_failures`` that name no conformance test."""
    providers = set()
    for item in items:
        if _is_conformance(item):
            providers.add(_provider_under_test(item)[0])
    for name in sorted(providers):
        try:
            provider = get_provider_class(name)
        except GenaiError:
            continue  # the tests themselves report an unknown provider
        _warn_unknown(provider.known_failures or {}, f"provider {name!r}: known_failures")


def _area(item: pytest.Item) -> str:
    function = getattr(item, "function", None)
    qualname = getattr(function, "__qualname__", item.name)
    return qualname.split(".")[0] if "." in qualname else ""


def _reason(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail)
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        return message.splitlines()[0] if message else "failed"
    return ""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if _is_conformance(item):
        report.genai_area = _area(item)  # type: ignore[attr-defined]
        report.genai_name = item.name  # type: ignore[attr-defined]
        report.genai_provider = _provider_under_test(item)  # type: ignore[attr-defined]
    return report


class _Collector:
    """Keeps this session's conformance results (one per test, in run order)."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        area = getattr(report, "genai_area", None)
        if area is None:
            return
        outcome = None
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if hasattr(report, "wasxfail"):
                outcome = "xfail" if report.skipped else "xpass"
            elif report.passed:
                outcome = "pass"
            elif report.skipped:
                outcome = "skip"
            else:
                outcome = "fail" if report.when == "call" else "error"
        elif report.when == "teardown" and report.failed:
            outcome = "error"
        if outcome is not None:
            name, options = report.genai_provider  # type: ignore[attr-defined]
            self.results.append(
                {
                    "test": report.genai_name,  # type: ignore[attr-defined]
                    "area": area,
                    "outcome": outcome,
                    "reason": _reason(report),
                    "nodeid": report.nodeid,
                    "provider": name,
                    "provider_options": dict(options),
                }
            )


_COLLECTOR = pytest.StashKey[_Collector]()


def pytest_configure(config: pytest.Config) -> None:
    if SUITE not in sys.modules:  # imported later, by a test module: with assertion rewriting
        pytest.register_assert_rewrite(SUITE)
    path = config.getoption("genai_xfails", None)
    if path:  # read now: a missing or malformed file is a usage error, before anything runs
        try:
            config.stash[_XFAILS] = read_xfails(path)
        except InvalidArgumentError as exc:
            raise pytest.UsageError(f"--genai-xfails: {exc}") from None
        unknown = unknown_test_names(config.stash[_XFAILS])
        if unknown:
            config.issue_config_time_warning(
                pytest.PytestConfigWarning(
                    f"--genai-xfails {path}: {', '.join(map(repr, unknown))} name no "
                    "conformance test (a typo, or a test since renamed: nothing is marked xfail "
                    "for it)"
                ),
                stacklevel=2,
            )
    collector = _Collector()
    config.stash[_COLLECTOR] = collector
    config.pluginmanager.register(collector, "genai-conformance-collector")


def collected_results(config: pytest.Config) -> list[dict[str, Any]]:
    """The conformance results of ``config``'s session so far."""
    collector = config.stash.get(_COLLECTOR, None)
    return list(collector.results) if collector is not None else []


def _provider_description(config: pytest.Config, name: str) -> dict[str, Any]:
    """Provider ``name``'s description, with its probe's answer (the one the tests had, when
    they probed it: a probe is not called again after the run)."""
    try:
        cls = get_provider_class(name)
    except Exception as exc:
        return {"name": name, "error": str(exc)}
    description = cls().describe()
    suite = sys.modules.get(SUITE)
    probed = suite.probed(config, cls) if suite is not None else None
    if probed is not None:
        failure = probed.failure()
        description["unavailable_reason"] = probed.reason if failure is None else failure
        return description
    try:
        description["unavailable_reason"] = cls().unavailable_reason()
    except Exception as exc:  # pragma: no cover - reported, not raised
        description["unavailable_reason"] = f"probe raised {exc!r}"
    return description


def by_provider(
    results: list[dict[str, Any]],
) -> list[tuple[str, dict[str, str], list[dict[str, Any]]]]:
    """``results`` grouped by the provider and options tested, in run order:
    [(name, options, results)]."""
    groups: dict[tuple[str, str], tuple[str, dict[str, str], list[dict[str, Any]]]] = {}
    for r in results:
        name, options = r.get("provider", ""), r.get("provider_options") or {}
        key = (name, json.dumps(options, sort_keys=True))
        groups.setdefault(key, (name, dict(options), []))[2].append(r)
    return list(groups.values())


def _title(name: str, options: dict[str, str]) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    return f"{name} ({shown})" if shown else name


def environment() -> dict[str, str]:
    """Versions that matter for a conformance result."""
    info = {"genai": genai.__version__, "python": platform.python_version(),
            "platform": platform.platform()}  # fmt: skip
    try:
        info["onnxruntime"] = str(ort_api.version())
        info["onnxruntime_library"] = str(ort_api.library_path())
    except Exception as exc:
        info["onnxruntime"] = f"unavailable ({exc})"
    return info


def format_table(results: list[dict[str, Any]]) -> str:
    """The pass/fail/skip table (plain text)."""
    if not results:
        return "no conformance tests ran"
    width = max(len(f"{r['area']}::{r['test']}") for r in results)
    lines = [f"{'test':<{width}}  result  reason", f"{'-' * width}  ------  ------"]
    for r in results:
        reason = r["reason"].replace("\n", " ")
        if len(reason) > 110:
            reason = reason[:107] + "..."
        lines.append(f"{r['area'] + '::' + r['test']:<{width}}  {r['outcome']:<6}  {reason}")
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    lines.append(", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    results = collected_results(config)
    if not results:
        return
    env = environment()
    for name, options, group in by_provider(results):
        terminalreporter.section(f"genai conformance: {_title(name, options)}")
        terminalreporter.write_line(
            f"genai {env['genai']}, onnxruntime {env['onnxruntime']}, python {env['python']}"
        )
        terminalreporter.write_line(format_table(group))
    path = config.getoption("genai_report", None)
    if path:
        write_report(path, config, results)
        terminalreporter.write_line(f"report written to {path}")


def _counts(results: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return counts


def write_report(path: str, config: pytest.Config, results: list[dict[str, Any]]) -> None:
    """Write the JSON report of ``results`` (see the module's docstring)."""
    providers = [
        {
            "provider": _provider_description(config, name),
            "provider_options": options,
            "summary": _counts(group),
        }
        for name, options, group in by_provider(results)
    ]
    one = providers[0] if len(providers) == 1 else None
    document = {
        "provider": one["provider"] if one else None,
        "provider_options": one["provider_options"] if one else None,
        "providers": providers,
        "model": config.getoption("genai_model", None),
        "environment": environment(),
        "summary": _counts(results),
        "results": results,
    }
    Path(path).write_text(json.dumps(document, indent=2) + "\n")
