"""`run_conformance`: the suite run in-process by pytest, for ``genai conformance``."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["run_conformance"]

PLUGIN = "genai.testing.conformance.plugin"
#: Seconds one test may take by default (pytest-timeout): a hang becomes a failure.
TIMEOUT = 600.0


def run_conformance(
    provider: str,
    *,
    options: Mapping[str, str] | None = None,
    model: str | os.PathLike[str] | None = None,
    report: str | os.PathLike[str] | None = None,
    xfails: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    quiet: bool = True,
    timeout: float | None = TIMEOUT,
) -> tuple[int, list[dict[str, Any]]]:
    """Run the whole suite for ``provider``; returns (pytest exit code, results).

    Runs in this process with pytest's plugin autoloading off (only the conformance plugin,
    pytest-timeout and pytest's own), in a scratch root directory so that no project
    configuration applies. With pytest-timeout installed, a test running over ``timeout``
    seconds (None: no limit) fails (a hung probe or session), in the main thread by a signal;
    elsewhere pytest-timeout's thread method ends the process, stacks dumped. Without it there
    is no limit.
    """
    try:
        import pytest  # lazy: pytest is the optional 'conformance' extra
    except ImportError as exc:  # pragma: no cover - pytest is a test dependency
        raise RuntimeError("the conformance suite needs pytest: pip install pytest") from exc
    suite_file = Path(__file__).with_name("_collect_suite.py")
    with tempfile.TemporaryDirectory(prefix="genai-conformance-") as scratch:
        ini = Path(scratch) / "pytest.ini"
        ini.write_text("[pytest]\naddopts =\npython_files = *.py\n")
        args = [
            "-c", str(ini), "--rootdir", scratch, "-p", "no:cacheprovider",
            "-p", "no:randomly", "--basetemp", str(Path(scratch) / "tmp"),
            "--genai-provider", provider,
        ]  # fmt: skip
        args += ["-q"] if quiet else ["-v"]
        # Registered as objects, not by -p NAME: -p marks a module for assertion rewriting and
        # warns when it was imported already (the CLI imports the plugin to read --xfails).
        plugins: list[Any] = [importlib.import_module(PLUGIN)]
        if timeout and importlib.util.find_spec("pytest_timeout") is not None:
            plugins.append(importlib.import_module("pytest_timeout"))
            in_main = threading.current_thread() is threading.main_thread()
            method = "signal" if in_main and hasattr(signal, "SIGALRM") else "thread"
            args += ["--timeout", f"{timeout:g}", "--timeout-method", method]
        for key, value in (options or {}).items():
            args += ["--genai-provider-option", f"{key}={value}"]
        if model is not None:
            args += ["--genai-model", os.fspath(model)]
        report_path = Path(report) if report is not None else Path(scratch) / "report.json"
        args += ["--genai-report", os.fspath(report_path)]
        if xfails is not None:
            args += ["--genai-xfails", os.fspath(xfails)]
        args += [*extra_args, str(suite_file)]
        saved = os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        try:
            code = int(pytest.main(args, plugins=plugins))
        finally:
            if saved is None:
                os.environ.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
            else:
                os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = saved
        results = json.loads(report_path.read_text())["results"] if report_path.is_file() else []
    return code, results
