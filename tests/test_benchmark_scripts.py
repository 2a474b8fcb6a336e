"""The benchmark scripts' command lines (no model runs): every ``benchmarks/*.py --help`` works
from any directory with or without ``PYTHONPATH``, nonsense counts are argparse errors naming
the option, and ``benchmarks/_bench_args.py``'s types and header."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
#: (script, arguments, the option the error must name): each exits 2 before loading a model.
BAD_COUNTS = [
    ("decode.py", ["--rounds", "0"], "--rounds"),
    ("decode.py", ["--threads", "1", "-1"], "--threads"),
    ("speculative.py", ["--rounds", "-2"], "--rounds"),
    ("pipeline.py", ["--tokens", "0"], "--tokens"),
    ("serving.py", ["--streams", "0"], "--streams"),
    ("prefill.py", ["--lengths", "x"], "--lengths"),
    ("memory.py", ["--new-tokens", "0"], "--new-tokens"),
    ("beam_reorder.py", ["--filled", "512", "--capacity", "64"], "--filled"),
    ("gil_native.py", ["--switch-interval", "0"], "--switch-interval"),
]


#: Runs each (script, args) of its argv (JSON) as ``python benchmarks/SCRIPT ARGS`` runs it, in
#: one interpreter (each script imports genai, onnxruntime-genai or onnx: ~0.1-1.5 s apiece
#: when each runs alone), and prints {key: [exit status, stdout, stderr]} as JSON.
_DRIVER = """
import contextlib, io, json, runpy, sys
benchmarks, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, benchmarks)
results = {}
for key, script, args in jobs:
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [f"{benchmarks}/{script}", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:
            code = 99
            print(f"Traceback: {exc!r}", file=sys.stderr)
    results[key] = [code, out.getvalue(), err.getvalue()]
sys.stdout.write(json.dumps(results))
"""


def _env(pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def _script(script: str, args: list[str], cwd: Path, pythonpath: str | None):
    """``python benchmarks/SCRIPT ARGS`` from ``cwd``: (exit status, stdout, stderr)."""
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=cwd,
        env=_env(pythonpath),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return [out.returncode, out.stdout, out.stderr]


def _driver(jobs: list, cwd: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(BENCHMARKS), json.dumps(jobs)],
        cwd=cwd,
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every command of this module: {key: [exit status, stdout, stderr]}."""
    elsewhere = tmp_path_factory.mktemp("cwd")
    jobs = [[f"help {s}", s, ["--help"]] for s in SCRIPTS]
    jobs += [[f"bad {s} {option}", s, args] for s, args, option in BAD_COUNTS]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        driver = pool.submit(_driver, jobs, elsewhere)
        # as a user runs them: from another directory without PYTHONPATH, from the checkout with
        alone = pool.submit(_script, "serving.py", ["--help"], elsewhere, None)
        with_path = pool.submit(_script, "decode.py", ["--help"], ROOT, ".")
        results = driver.result()
        results["alone serving.py"] = alone.result()
        results["pythonpath decode.py"] = with_path.result()
    return results


def test_scripts_found() -> None:
    assert "decode.py" in SCRIPTS and len(SCRIPTS) >= 20, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_from_another_directory(runs: dict, script: str) -> None:
    code, out, err = runs[f"help {script}"]
    assert code == 0, err[-2000:]
    assert out.startswith("usage:"), out[:500]  # (no header line for --help)


@pytest.mark.parametrize("key", ["alone serving.py", "pythonpath decode.py"])
def test_help_in_its_own_process(runs: dict, key: str) -> None:
    """``import _bench_args`` works as Python runs a script: from another directory without
    PYTHONPATH, and from the checkout with PYTHONPATH=."""
    code, out, err = runs[key]
    assert code == 0, err[-2000:]
    assert out.startswith("usage:"), out[:500]
    if "decode" in key:
        assert "decode ahead off" in out  # --lockstep says how it measures


@pytest.mark.parametrize(("script", "args", "option"), BAD_COUNTS)
def test_bad_count_is_an_argparse_error(runs: dict, script: str, args: list, option: str) -> None:
    code, out, err = runs[f"bad {script} {option}"]
    assert code == 2, (out[-1000:], err[-2000:])
    assert "Traceback" not in err
    assert f"argument {option}" in err.splitlines()[-1], err


@pytest.fixture(scope="module")
def bench_args():
    """benchmarks/_bench_args.py, imported as the scripts import it."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _bench_args
    finally:
        sys.path.remove(str(BENCHMARKS))
    return _bench_args


@pytest.mark.parametrize("name", ["positive_int", "non_negative_int", "positive_float"])
def test_types_reject_nonsense_and_accept_1(bench_args, name: str) -> None:
    kind = getattr(bench_args, name)
    assert kind("1") == 1
    refused = ["-1", "x", "", "nan"] + ([] if name == "non_negative_int" else ["0"])
    for text in refused:
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)
    if name == "non_negative_int":
        assert kind("0") == 0
    if name == "positive_float":
        assert kind("0.5") == 0.5
        with pytest.raises(argparse.ArgumentTypeError):
            kind("inf")
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            kind("1.5")


def test_types_make_argparse_name_the_option(bench_args, capsys) -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--rounds", type=bench_args.positive_int)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--rounds", "0"])
    assert exit_info.value.code == 2
    assert "argument --rounds: an integer >= 1 expected, got '0'" in capsys.readouterr().err


def test_header_is_one_line_with_the_versions(bench_args, capsys) -> None:
    import genai

    line = bench_args.header([1, 2])
    printed = capsys.readouterr().out
    assert printed == line + "\n" and "\n" not in line
    assert f"genai {genai.__version__}" in line
    assert "onnxruntime-genai " in line and "onnxruntime " in line
    assert "threads 1 2" in line and "commit " in line and "load " in line


def test_missing_model_folder_is_one_line(bench_args, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_args.model_folder(tmp_path / "absent")
    message = str(exit_info.value.code)
    assert "absent" in message and "does not exist" in message and "\n" not in message
    with pytest.raises(SystemExit) as exit_info:
        bench_args.require_model(tmp_path)
    assert "has no genai_config.json" in str(exit_info.value.code)


def test_decode_ahead_off_is_restored(bench_args, monkeypatch) -> None:
    monkeypatch.setenv("GENAI_DECODE_AHEAD", "1")
    with bench_args.decode_ahead_off():
        assert os.environ["GENAI_DECODE_AHEAD"] == "0"
    assert os.environ["GENAI_DECODE_AHEAD"] == "1"
    monkeypatch.delenv("GENAI_DECODE_AHEAD")
    with bench_args.decode_ahead_off():
        from genai.generation import decode_ahead

        assert not decode_ahead.enabled()
    assert "GENAI_DECODE_AHEAD" not in os.environ
