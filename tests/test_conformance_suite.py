"""The conformance suite: run for cpu and the example plugin here, and tested against
deliberately broken fake providers (pytester), and through ``genai conformance``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from genai.providers import plugins
from genai.testing.conformance import ProviderConformanceTests, requires
from genai.testing.conformance.plugin import format_table

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "genai-provider-example"


def _load_example() -> types.ModuleType:
    if importlib.util.find_spec("genai_provider_example") is not None:  # installed (CI)
        import genai_provider_example

        return genai_provider_example
    path = EXAMPLE / "genai_provider_example" / "__init__.py"
    spec = importlib.util.spec_from_file_location("genai_provider_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def example_plugin():
    """The example plugin, registered by hand when it is not installed."""
    module = _load_example()
    plugins.register_plugin(module, "example-under-test")
    yield module
    plugins.unregister_plugin(module)
    plugins.reset()


class TestCPUConformance(ProviderConformanceTests):
    provider_name = "cpu"


class TestExampleConformance(ProviderConformanceTests):
    provider_name = "example"
    provider_options = {"spin": "1"}  # noqa: RUF012


def test_requires_rejects_unknown_capabilities() -> None:
    with pytest.raises(ValueError, match="unknown requirement"):
        requires("teleportation")


def test_format_table_counts_outcomes() -> None:
    table = format_table(
        [
            {"area": "A", "test": "t1", "outcome": "pass", "reason": ""},
            {"area": "A", "test": "t2", "outcome": "skip", "reason": "x" * 200},
        ]
    )
    assert "A::t1" in table and "1 pass, 1 skip" in table and "..." in table
    assert format_table([]) == "no conformance tests ran"


BROKEN_PLUGIN = '''
import sys
import time

import numpy as np
from genai.providers.hookspecs import hookimpl
from genai.providers import Capabilities, ExecutionProvider, GraphCapture, Placement


class CPUBased(ExecutionProvider):
    ort_name = "CPUExecutionProvider"

    def session_providers(self, options):
        return []


class SharedKVBuffer(CPUBased):
    """An allocator bug: every KV buffer is the same memory."""
    name = "fake-shared-kv"
    _cache = {}

    def allocate(self, shape, dtype, *, zero=True, role="kv_cache"):
        key = (tuple(shape), np.dtype(dtype).str)
        if key not in self._cache:
            self._cache[key] = np.zeros(shape, dtype)
        return self._cache[key]


class LyingPlacement(CPUBased):
    """Claims device-resident KV; allocates host memory."""
    name = "fake-placement"
    device = "fakedev"
    placement = Placement(kv_cache="fakedev")


class NoSession(CPUBased):
    """Says it is available; its session setup names an EP that does not exist."""
    name = "fake-no-session"
    known_failures = {"test_no_such_conformance_test": "a name of no test: warned about"}

    def session_providers(self, options):
        return [("NoSuchFakeExecutionProvider", {})]


class Unavailable(CPUBased):
    name = "fake-unavailable"

    def unavailable_reason(self):
        return "fake hardware missing"


class RaisingProbe(CPUBased):
    name = "fake-raising-probe"

    def unavailable_reason(self):
        raise RuntimeError("probe crashed")


class SessionProbe(CPUBased):
    """Probes by creating a session: no model loads belong in a probe."""
    name = "fake-session-probe"

    def unavailable_reason(self):
        import onnxruntime as ort

        try:
            ort.InferenceSession(b"", providers=["CPUExecutionProvider"])
        except Exception:
            pass
        return None


class CaptureHostKV(CPUBased):
    """Declares graph capture (and passes its option on) but keeps its KV cache in host
    memory."""
    name = "fake-capture-host-kv"
    graph_capture = GraphCapture(option="capture")

    def session_spec(self, options, config=None):
        spec = super().session_spec(options, config)
        spec.config_entries["fake.capture"] = options.get("capture", "0")
        return spec


class CaptureIgnored(CPUBased):
    """Declares graph capture (on the host KV cache) but its session never sees the option."""
    name = "fake-capture-ignored"
    graph_capture = GraphCapture(option="fake_graph", requires_shared_buffer=False)
    known_options = frozenset({"fake_graph"})


class WrongTypeProbe(CPUBased):
    """The probe returns 0 (neither None nor a reason)."""
    name = "fake-wrong-type-probe"

    def unavailable_reason(self):
        return 0


class SlowProbe(CPUBased):
    """A probe slower than the bound its test class sets (probe_seconds)."""
    name = "fake-slow-probe"

    def unavailable_reason(self):
        time.sleep(0.2)
        return None


#: The calls of CountingProbe's probe that the conformance suite made itself.
SUITE_PROBE_CALLS = []


class CountingProbe(CPUBased):
    """Counts the suite's calls of its probe (the engine's, at each model load, aside)."""
    name = "fake-counting-probe"

    def unavailable_reason(self):
        if sys._getframe(1).f_globals.get("__name__") == "genai.testing.conformance.suite":
            SUITE_PROBE_CALLS.append(1)
        return None


class LaxOptions(CPUBased):
    """Declares its options but accepts anything."""
    name = "fake-lax-options"
    known_options = frozenset({"level"})

    def validate_options(self, options):
        return dict(options)


class StaticBatch(CPUBased):
    """Compiles its graphs for one row (static shapes), and declares batching unsupported."""
    name = "fake-static-batch"
    capabilities = Capabilities(batch=False)

    def session_spec(self, options, config=None):
        spec = super().session_spec(options, config)
        spec.free_dimension_overrides["batch_size"] = 1
        return spec


class StaticBatchUndeclared(StaticBatch):
    """The same, but claims batching."""
    name = "fake-static-batch-undeclared"
    capabilities = Capabilities()


class NoSpeechVision(CPUBased):
    """Declares that it runs neither speech nor vision-language models."""
    name = "fake-no-speech-vision"
    capabilities = Capabilities(speech=False, vision=False)


@hookimpl
def register_providers(register):
    for cls in (
        SharedKVBuffer, LyingPlacement, NoSession, Unavailable, RaisingProbe, SessionProbe,
        LaxOptions,
        CaptureHostKV, StaticBatch, StaticBatchUndeclared, NoSpeechVision, CaptureIgnored,
        WrongTypeProbe, SlowProbe, CountingProbe,
    ):
        register(cls)
'''

BROKEN_CONFTEST = """
import broken_providers
from genai.providers import plugins

plugins.register_plugin(broken_providers, "broken-providers")
"""

BROKEN_TESTS = """
from genai.testing.conformance import ProviderConformanceTests
from genai.testing.conformance.suite import (
    BatchTests, GraphCaptureTests, SessionCreationTests, SpeechTests, VisionTests,
)

class TestSharedKV(ProviderConformanceTests):
    provider_name = "fake-shared-kv"

class TestPlacement(ProviderConformanceTests):
    provider_name = "fake-placement"

class TestNoSession(ProviderConformanceTests):
    provider_name = "fake-no-session"

class TestUnavailable(ProviderConformanceTests):
    provider_name = "fake-unavailable"

class TestRaisingProbe(ProviderConformanceTests):
    provider_name = "fake-raising-probe"

class TestSessionProbe(SessionCreationTests):
    provider_name = "fake-session-probe"

class TestLaxOptions(ProviderConformanceTests):
    provider_name = "fake-lax-options"

class TestCaptureHostKV(GraphCaptureTests):
    provider_name = "fake-capture-host-kv"

class TestCaptureIgnored(GraphCaptureTests):
    provider_name = "fake-capture-ignored"

class TestWrongTypeProbe(SessionCreationTests):
    provider_name = "fake-wrong-type-probe"

class TestSlowProbe(SessionCreationTests):
    provider_name = "fake-slow-probe"
    probe_seconds = 0.05

class TestStaticBatch(SpeechTests, BatchTests):
    provider_name = "fake-static-batch"

class TestStaticBatchUndeclared(SpeechTests):
    provider_name = "fake-static-batch-undeclared"

class TestNoSpeechVision(VisionTests, SpeechTests):
    provider_name = "fake-no-speech-vision"
"""


def _run_broken_suite(
    pytester: pytest.Pytester, monkeypatch, tests: str, *args: str
) -> tuple[pytest.RunResult, Path]:
    """Run the conformance plugin over the test module ``tests`` beside the fake providers
    (`BROKEN_PLUGIN`), in a subprocess; returns the result and the JSON report's path."""
    pytester.makepyfile(broken_providers=BROKEN_PLUGIN, test_suite_module=tests)
    pytester.makeconftest(BROKEN_CONFTEST)
    pythonpath = [str(pytester.path), str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in pythonpath if p))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv(plugins.ENV_DISABLE_AUTOLOAD, "1")
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p", "genai.testing.conformance.plugin", "--genai-report", str(report), *args, "-q"
    )
    return result, report


def test_suite_catches_broken_providers(pytester: pytest.Pytester, monkeypatch) -> None:
    result, report = _run_broken_suite(pytester, monkeypatch, BROKEN_TESTS)
    outcomes = {}
    for r in json.loads(report.read_text())["results"]:
        cls = r["nodeid"].split("::")[1]
        outcomes[(cls, r["test"])] = (r["outcome"], r["reason"])

    def outcome(cls: str, test: str) -> str:
        return outcomes[(cls, test)][0]

    # Every KV buffer aliased: the shared layout breaks, the growing one (ORT-allocated) not.
    assert outcome("TestSharedKV", "test_kv_layout[shared]") == "fail"
    assert outcome("TestSharedKV", "test_kv_layout[growing]") == "pass"
    assert outcome("TestSharedKV", "test_greedy_parity_with_cpu") == "fail"
    assert outcome("TestSharedKV", "test_session_creation") == "pass"
    # Claims device-resident KV but allocates host memory.
    assert outcome("TestPlacement", "test_allocated_buffers_live_where_claimed") == "fail"
    assert outcome("TestPlacement", "test_session_io_where_claimed") == "fail"
    assert outcome("TestPlacement", "test_greedy_parity_with_cpu") == "pass"
    # Available on paper, no session in practice: the error names the missing EP.
    assert outcome("TestNoSession", "test_provider_is_available") == "pass"
    status, reason = outcomes[("TestNoSession", "test_session_creation")]
    assert status == "fail" and "NoSuchFake" in reason
    # Unavailable: that is the one failure; everything needing the provider is skipped.
    status, reason = outcomes[("TestUnavailable", "test_provider_is_available")]
    assert status == "fail" and "fake hardware missing" in reason
    skipped = [t for (c, t), (o, _) in outcomes.items() if c == "TestUnavailable" and o == "skip"]
    assert "test_session_creation" in skipped and "test_batch_with_padding" in skipped
    assert outcome("TestRaisingProbe", "test_probe_is_cheap_and_does_not_raise") == "fail"
    status, reason = outcomes[("TestSessionProbe", "test_probe_is_cheap_and_does_not_raise")]
    assert status == "fail" and "created an ORT session" in reason
    assert outcome("TestSessionProbe", "test_session_creation") == "pass"
    assert outcome("TestLaxOptions", "test_unknown_option_is_rejected") == "fail"
    assert outcome("TestLaxOptions", "test_greedy_parity_with_cpu") == "pass"
    # Graph capture declared, KV on the host: a captured graph would not read it: skipped.
    status, reason = outcomes[("TestCaptureHostKV", "test_graph_capture_on_equals_off")]
    assert status == "skip" and "host memory" in reason
    # Graph capture declared, its option never reaching the session: a failure naming both.
    status, reason = outcomes[("TestCaptureIgnored", "test_graph_capture_on_equals_off")]
    assert status == "fail" and "fake-capture-ignored: session_spec() is the same" in reason
    assert "fake_graph=1" in reason
    # A probe answering 0: the message names the provider, what it got and what it expects.
    status, reason = outcomes[("TestWrongTypeProbe", "test_probe_is_cheap_and_does_not_raise")]
    assert status == "fail"
    assert "fake-wrong-type-probe: unavailable_reason() returned 0 (int)" in reason
    assert "expected None (available) or a non-empty str" in reason
    # A probe over the bound (the class sets 0.05 s; it sleeps 0.2 s): flagged, named.
    status, reason = outcomes[("TestSlowProbe", "test_probe_is_cheap_and_does_not_raise")]
    assert status == "fail" and "fake-slow-probe: the availability probe took" in reason
    assert outcome("TestSlowProbe", "test_provider_is_available") == "pass"
    # Aliased KV buffers break the vision model with the shared layout (phi3v), not the
    # growing ones (Qwen2.5-VL, Whisper).
    assert outcome("TestSharedKV", "test_vision_greedy_parity_with_cpu[phi3v]") == "fail"
    assert outcome("TestSharedKV", "test_vision_greedy_parity_with_cpu[qwen2_5_vl]") == "pass"
    assert outcome("TestSharedKV", "test_whisper_greedy_parity_with_cpu") == "pass"
    # Graphs fixed at batch 1: a declared limit runs Whisper on one clip; an undeclared one
    # fails the batch of two.
    assert outcome("TestStaticBatch", "test_whisper_greedy_parity_with_cpu") == "pass"
    assert outcome("TestStaticBatch", "test_batch_with_padding") == "skip"
    status, reason = outcomes[("TestStaticBatchUndeclared", "test_whisper_greedy_parity_with_cpu")]
    assert status == "fail" and "audio_features" in reason
    # Speech and vision declared unsupported: skipped with that reason.
    for test, area in [
        ("test_whisper_greedy_parity_with_cpu", "speech"),
        ("test_vision_greedy_parity_with_cpu[phi3v]", "vision"),
        ("test_vision_greedy_parity_with_cpu[qwen2_5_vl]", "vision"),
    ]:
        status, reason = outcomes[("TestNoSpeechVision", test)]
        assert (status, reason) == ("skip", f"fake-no-speech-vision declares {area} unsupported")
    # The table is printed with the reasons, and pytest exits non-zero.
    result.stdout.fnmatch_lines(["*genai conformance*", "*test_kv_layout*fail*"])
    result.stdout.fnmatch_lines(
        ["SpeechTests::test_whisper_greedy_parity_with_cpu*skip*declares speech unsupported"]
    )
    assert result.ret == 1
    # Several providers: a table for each, the report's top-level provider is none of them.
    document = json.loads(report.read_text())
    assert document["provider"] is None and document["provider_options"] is None
    names = [p["provider"]["name"] for p in document["providers"]]
    assert names[:2] == ["fake-shared-kv", "fake-placement"] and "fake-slow-probe" in names
    result.stdout.fnmatch_lines(
        ["*genai conformance: fake-shared-kv*", "*genai conformance: fake-placement*"]
    )
    assert {r["provider"] for r in document["results"]} == set(names)
    assert "genai conformance: cpu" not in result.stdout.str()


ONE_PROVIDER_TESTS = """
import sys

import broken_providers
from _pytest.assertion.rewrite import AssertionRewritingHook
from genai.testing.conformance import BufferPlacementTests, SessionCreationTests


class TestCounting(SessionCreationTests, BufferPlacementTests):
    provider_name = "fake-counting-probe"
    provider_options = {"level": "2"}


def test_the_suite_probed_once_and_a_second_time_to_compare():
    assert len(broken_providers.SUITE_PROBE_CALLS) == 2


def test_the_suite_asserts_are_rewritten():
    loader = sys.modules["genai.testing.conformance.suite"].__loader__
    assert isinstance(loader, AssertionRewritingHook)
"""


def test_one_provider_is_labelled_with_its_name_and_options(
    pytester: pytest.Pytester, monkeypatch
) -> None:
    """The provider and options a class names (no --genai-provider) head the table and the
    report; the suite probes once per session (and once more to compare); its asserts are
    rewritten, without an assertion-rewrite warning."""
    result, report = _run_broken_suite(pytester, monkeypatch, ONE_PROVIDER_TESTS)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    assert "PytestAssertRewriteWarning" not in output
    result.stdout.fnmatch_lines(["*genai conformance: fake-counting-probe (level=2)*"])
    assert "genai conformance: cpu" not in output
    document = json.loads(report.read_text())
    assert document["provider"]["name"] == "fake-counting-probe"
    assert document["provider"]["unavailable_reason"] is None
    assert document["provider_options"] == {"level": "2"}
    assert [p["provider_options"] for p in document["providers"]] == [{"level": "2"}]
    assert {(r["provider"], str(r["provider_options"])) for r in document["results"]} == {
        ("fake-counting-probe", "{'level': '2'}")
    }


def test_cli_conformance_writes_a_report(tmp_path: Path) -> None:
    report = tmp_path / "cpu.json"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    env[plugins.ENV_DISABLE_AUTOLOAD] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "genai", "conformance", "cpu", "--report", str(report)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "genai conformance: cpu" in proc.stdout
    # the CLI imports the plugin (to read --xfails) before pytest runs: no rewrite warning
    assert "PytestAssertRewriteWarning" not in proc.stdout + proc.stderr
    assert "SessionCreationTests::test_session_creation" in proc.stdout
    document = json.loads(report.read_text())
    assert document["provider"]["name"] == "cpu"
    assert document["provider"]["unavailable_reason"] is None
    assert document["summary"].get("fail", 0) == 0 and document["summary"]["pass"] >= 15
    assert document["environment"]["onnxruntime"]
    by_test = {r["test"]: r for r in document["results"]}
    assert by_test["test_graph_capture_on_equals_off"]["outcome"] == "skip"
    areas = {r["area"] for r in document["results"] if r["outcome"] == "pass"}
    assert {"SpeechTests", "VisionTests"} <= areas


HANGING_PROBE = """
import time

from genai.providers import ExecutionProvider
from genai.providers.hookspecs import hookimpl


class HangingProbe(ExecutionProvider):
    name = "fake-hanging-probe"
    ort_name = "CPUExecutionProvider"

    def unavailable_reason(self):
        time.sleep(3600)  # hangs


@hookimpl
def register_providers(register):
    register(HangingProbe)
"""

RUN_HANGING = """
import json

import hanging
from genai.providers import plugins
from genai.testing.conformance import run_conformance

plugins.register_plugin(hanging, "hanging")
tests = ["test_probe_is_cheap", "test_provider_is_available", "test_session_creation"]
code, results = run_conformance(
    "fake-hanging-probe", timeout=2, extra_args=["-k", " or ".join(tests)]
)
print("RESULT", json.dumps([code, {r["test"]: [r["outcome"], r["reason"]] for r in results}]))
"""


def test_run_conformance_fails_a_hanging_probe_once(tmp_path: Path) -> None:
    """run_conformance loads pytest-timeout (plugin autoloading is off there): a probe that
    never returns fails the test that first calls it, and the others say so at once."""
    pytest.importorskip("pytest_timeout")
    (tmp_path / "hanging.py").write_text(HANGING_PROBE)
    (tmp_path / "run_hanging.py").write_text(RUN_HANGING)
    pythonpath = [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in pythonpath if p))
    env[plugins.ENV_DISABLE_AUTOLOAD] = "1"
    proc = subprocess.run(
        [sys.executable, "run_hanging.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,  # under the session's test timeout: the child is killed, not left behind
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    code, results = json.loads(line.removeprefix("RESULT "))
    assert code == 1
    outcome, reason = results["test_probe_is_cheap_and_does_not_raise"]
    assert outcome in ("fail", "error") and "Timeout" in reason
    for test in ("test_provider_is_available", "test_session_creation"):
        outcome, reason = results[test]
        assert outcome in ("fail", "error")
        assert "fake-hanging-probe" in reason and "probe did not return" in reason


def test_cli_conformance_fails_for_an_unknown_provider(tmp_path: Path) -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    env[plugins.ENV_DISABLE_AUTOLOAD] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "genai", "conformance", "no-such-provider"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""  # one line, before the suite runs (was every test's setup error)
    assert proc.stderr.startswith("genai: error: unknown execution provider 'no-such-provider'")
    assert proc.stderr.count("\n") == 1 and "no installed plugin provides it" in proc.stderr


def test_xfails_file_marks_listed_tests_with_the_line_reason(
    pytester: pytest.Pytester, monkeypatch
) -> None:
    xfails = pytester.path / "known.xfails"
    xfails.write_text(
        "# known failures\ntest_session_creation  # no such EP here\ntest_sesion_creation\n"
    )
    listed_tests = """
from genai.testing.conformance import SessionCreationTests

class TestNoSession(SessionCreationTests):
    provider_name = "fake-no-session"
"""
    result, report = _run_broken_suite(
        pytester, monkeypatch, listed_tests, "--genai-xfails", str(xfails)
    )
    by_test = {r["test"]: r for r in json.loads(report.read_text())["results"]}
    listed = by_test["test_session_creation"]
    assert listed["outcome"] == "xfail"
    assert listed["reason"] == f"listed in {xfails}: no such EP here"
    assert by_test["test_provider_is_available"]["outcome"] == "pass"
    assert result.ret == 0
    # a name of no conformance test (a typo) is a warning naming it
    result.stdout.fnmatch_lines(["*'test_sesion_creation' name no conformance test*"])
    result.stdout.fnmatch_lines(
        ["*provider 'fake-no-session': known_failures names no conformance test: "
         "'test_no_such_conformance_test'*"]
    )  # fmt: skip
