"""The CI guard against silently skipped tests: a missing pinned test dependency is found."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT, missing_test_dependencies

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")


def test_every_pinned_test_dependency_is_installed():
    assert missing_test_dependencies() == []


def test_a_missing_one_is_named(tmp_path):
    pyproject = (ROOT / "pyproject.toml").read_text()
    pyproject = pyproject.replace("test = [\n", 'test = [\n    "no-such-package-genai>=1",\n', 1)
    (tmp_path / "pyproject.toml").write_text(pyproject)
    assert missing_test_dependencies(tmp_path / "pyproject.toml") == ["no-such-package-genai>=1"]
