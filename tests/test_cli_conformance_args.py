"""``genai conformance``: what the arguments name is checked before the suite runs.

An unknown provider, options the provider refuses, a folder that is not a model folder, an
unwritable ``--report`` and a missing or malformed ``--xfails`` file are one
``genai: error: ...`` line on stderr and exit 1,
without running the suite (it used to run: 21 setup errors, a pytest INTERNALERROR, or a report
refused only after the whole run). ``run_conformance`` is replaced here by a stub that records
its arguments, so these tests never run the suite itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import genai.testing.conformance as conformance
from genai.cli import main
from genai.errors import InvalidArgumentError
from genai.providers import get_provider_class
from genai.testing.models import write_gqa_decoder

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def suite_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The calls of ``run_conformance`` (a stub: one passing test, pytest exit 0)."""
    calls: list[dict] = []

    def run_conformance(provider: str, **kwargs: object) -> tuple[int, list[dict]]:
        calls.append({"provider": provider, **kwargs})
        return 0, [{"test": "t", "area": "A", "outcome": "pass", "reason": "", "nodeid": "t"}]

    monkeypatch.setattr(conformance, "run_conformance", run_conformance)
    return calls


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gqa_decoder(tmp_path_factory.mktemp("conformance-args"), name="gqa", seed=11)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("genai: error: ") and err.count("\n") == 1, err
    return err


# --- the provider ------------------------------------------------------------------------------


def test_unknown_provider_is_one_line_naming_the_registered_ones(suite_calls, capsys):
    assert main(["conformance", "nope"]) == 1
    err = _one_line_error(capsys)
    assert "unknown execution provider 'nope'" in err and "registered: " in err and "cpu" in err
    assert suite_calls == []


def test_a_known_provider_any_spelling_runs_the_suite(suite_calls, capsys):
    assert main(["conformance", "CPUExecutionProvider"]) == 0
    assert [c["provider"] for c in suite_calls] == ["CPUExecutionProvider"]
    assert capsys.readouterr().err == ""


# --- --option / -o ------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--option", "-o"])
def test_an_option_the_provider_refuses_is_one_line_before_the_suite(suite_calls, capsys, flag):
    """Checked by the provider's own validate_options (was one ConfigError per test)."""
    assert main(["conformance", "cpu", flag, "bogus=1"]) == 1
    err = _one_line_error(capsys)
    assert "--option: unknown option(s) bogus for execution provider 'cpu'" in err
    assert suite_calls == []


def test_options_are_checked_by_the_provider_class(suite_calls, capsys, monkeypatch):
    cpu = get_provider_class("cpu")
    monkeypatch.setattr(cpu, "known_options", frozenset({"turbo"}))
    assert main(["conformance", "cpu", "-o", "turbo=1"]) == 0
    assert [c["options"] for c in suite_calls] == [{"turbo": "1"}]
    assert capsys.readouterr().err == ""


def test_an_option_check_that_fails_otherwise_is_left_to_the_suite(suite_calls, monkeypatch):
    """A validate_options that raises anything but ConfigError is the provider's failure: the
    suite runs and reports it."""

    def broken(self, options):
        raise RuntimeError("validate_options crashed")

    monkeypatch.setattr(get_provider_class("cpu"), "validate_options", broken)
    assert main(["conformance", "cpu", "-o", "turbo=1"]) == 0
    assert [c["options"] for c in suite_calls] == [{"turbo": "1"}]


# --- --model / -m ------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--model", "-m"])
def test_a_missing_model_folder_is_refused_before_the_suite(suite_calls, capsys, tmp_path, flag):
    missing = tmp_path / "no-such-model"
    assert main(["conformance", "cpu", flag, str(missing)]) == 1
    err = _one_line_error(capsys)
    assert str(missing) in err and "does not exist" in err
    assert suite_calls == []


def test_a_folder_that_is_not_a_model_folder_is_refused(suite_calls, capsys, tmp_path):
    assert main(["conformance", "cpu", "-m", str(tmp_path)]) == 1
    err = _one_line_error(capsys)
    assert "genai_config.json not found" in err and str(tmp_path) in err
    assert suite_calls == []


def test_short_m_is_the_model_and_o_stays_option(suite_calls, capsys, model_dir, monkeypatch):
    monkeypatch.setattr(get_provider_class("cpu"), "known_options", frozenset({"k"}))
    assert main(["conformance", "cpu", "-m", str(model_dir), "-o", "k=v"]) == 0
    (call,) = suite_calls
    assert call["model"] == str(model_dir)
    assert call["options"] == {"k": "v"}
    assert capsys.readouterr().err == ""


# --- --report --------------------------------------------------------------------------------


def test_a_report_in_a_missing_folder_is_refused_before_the_suite(suite_calls, capsys, tmp_path):
    report = tmp_path / "no-such-dir" / "r.json"
    assert main(["conformance", "cpu", "--report", str(report)]) == 1
    err = _one_line_error(capsys)
    assert "--report" in err and "no-such-dir" in err and "does not exist" in err
    assert suite_calls == []


def test_a_report_that_is_a_folder_or_under_a_file_is_refused(suite_calls, capsys, tmp_path):
    assert main(["conformance", "cpu", "--report", str(tmp_path)]) == 1
    assert "is a folder" in _one_line_error(capsys)
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["conformance", "cpu", "--report", str(afile / "r.json")]) == 1
    assert "is not a folder" in _one_line_error(capsys)
    assert suite_calls == []


def test_a_writable_report_reaches_the_suite_and_the_check_leaves_no_file(
    suite_calls, capsys, tmp_path
):
    new = tmp_path / "new.json"
    old = tmp_path / "old.json"
    old.write_text("previous")
    assert main(["conformance", "cpu", "--report", str(new)]) == 0
    assert main(["conformance", "cpu", "--report", str(old)]) == 0
    assert [c["report"] for c in suite_calls] == [str(new), str(old)]
    assert not new.exists()  # the stub wrote nothing: the check did not leave a file
    assert old.read_text() == "previous"  # nor truncate an existing one
    assert capsys.readouterr().err == ""


# --- --xfails ----------------------------------------------------------------------------------


def test_a_missing_xfails_file_is_one_line_naming_it(suite_calls, capsys, tmp_path):
    missing = tmp_path / "nope.txt"
    assert main(["conformance", "cpu", "--xfails", str(missing)]) == 1
    err = _one_line_error(capsys)
    assert str(missing) in err and "does not exist" in err
    assert "INTERNALERROR" not in err and suite_calls == []


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "is a folder"),
        (b"\x89PNG\r\n\x1a\n\x00\xff", "is not UTF-8 text (line 1)"),
        (b"test_a\ntest_b test_c\n", "line 2: expected one test name, got 'test_b test_c'"),
    ],
    ids=["folder", "binary", "two-names"],
)
def test_a_malformed_xfails_file_is_one_line(suite_calls, capsys, tmp_path, content, expected):
    path = tmp_path / "xfails"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(["conformance", "cpu", "--xfails", str(path)]) == 1
    err = _one_line_error(capsys)
    assert str(path) in err and expected in err
    assert suite_calls == []


def test_a_good_xfails_file_reaches_the_suite(suite_calls, capsys, tmp_path):
    from genai.testing.conformance.plugin import read_xfails

    path = tmp_path / "xfails.txt"
    path.write_text(
        "# known failures\n\ntest_misuse_is_reported  # flaky\n"
        "KVLayoutTests::test_kv_layout[shared]\ntest_kv_layout[a b]\n"
    )
    assert main(["conformance", "cpu", "--xfails", str(path)]) == 0
    assert [c["xfails"] for c in suite_calls] == [str(path)]
    assert read_xfails(path) == {
        "test_misuse_is_reported": "flaky",
        "KVLayoutTests::test_kv_layout[shared]": "",
        "test_kv_layout[a b]": "",
    }
    assert capsys.readouterr().err == ""


def test_xfails_naming_no_conformance_test_are_a_warning(suite_calls, capsys, tmp_path):
    """A typo (or a test since renamed) marks nothing xfail: said on stderr, the suite runs."""
    path = tmp_path / "xfails.txt"
    path.write_text("test_misuse_is_reported\ntest_sesion_creation  # typo\nTests::test_nope[x]\n")
    assert main(["conformance", "cpu", "--xfails", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"genai: warning: --xfails {path}: 'test_sesion_creation', ")
    assert "'Tests::test_nope[x]' name no conformance test" in err
    assert "test_misuse_is_reported" not in err and err.count("\n") == 1
    assert [c["xfails"] for c in suite_calls] == [str(path)]


def test_read_xfails_raises_invalid_argument(tmp_path):
    from genai.testing.conformance.plugin import read_xfails

    with pytest.raises(InvalidArgumentError, match="does not exist"):
        read_xfails(tmp_path / "missing")


def test_the_pytest_plugin_reports_a_bad_xfails_file_as_a_usage_error(tmp_path):
    """Plain pytest with the plugin: a usage error (exit 4, one line), no INTERNALERROR."""
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    missing = tmp_path / "missing.txt"
    command = [sys.executable, "-m", "pytest", "-p", "genai.testing.conformance.plugin"]
    result = subprocess.run(
        [*command, "-p", "no:cacheprovider", "--genai-xfails", str(missing), "test_x.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 4, output
    assert "INTERNALERROR" not in output
    assert f"xfails file '{missing}' does not exist" in output
