"""Run test files of onnxruntime-genai's own Python suite against genai and against the
reference engine, and list the tests whose outcome differs.

The test files stay as they are: genai runs them through a one-line module named
``onnxruntime_genai`` that makes the name resolve to genai. The model folders the tests look
for under ``--test_models`` are copies of one real decoder-only folder (by default ../shared's
SmolLM2 int4, else the pulled default model) under each name in ``--names``, with the weights
inside ``model.onnx`` (the reference's speculative tests hard-link only that file into the
folders they write). Tests that depend on a named model's own facts (its token ids, its text)
can fail under both engines here.

A developer tool, not part of the test suite: it needs a checkout of the reference's repository
(``--reference-src``; its tests are not shipped in the wheel) and takes minutes per file.

    python scripts/reference_suite.py --reference-src ~/src/onnxruntime-genai \\
        test/python/models/test_n_gram_decoding.py test/python/models/test_speculative_decoding.py
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_MODEL = ROOT.parent / "shared" / "models" / "smollm2-135m-instruct-int4"
#: The folders the reference's speculative tests look for (the first is their decoder-only one).
DEFAULT_NAMES = ("qwen3-speculative/qwen3-0.6b", "qwen3-speculative/qwen3-1.7b")
#: Files the test files import from the suite's root.
SUPPORT_FILES = ("test/python/conftest.py", "test/python/_test_utils.py")
SHIM = "import sys\n\nimport genai\n\nsys.modules[__name__] = genai\n"
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def default_model() -> Path:
    """../shared's SmolLM2 when beside the checkout, else the pulled default model."""
    if (SHARED_MODEL / "genai_config.json").is_file():
        return SHARED_MODEL
    from genai.builder import pull

    return pull.default_model_dir()


def write_models(source: Path, root: Path, names: list[str]) -> None:
    """A copy of ``source`` under ``root / name`` for each name, its weights in model.onnx."""
    import onnx

    graph = onnx.load(str(source / "model.onnx"), load_external_data=False)
    for tensor in graph.graph.initializer:  # the external data read in, by hand (onnx's reader
        info = {entry.key: entry.value for entry in tensor.external_data}  # refuses files with
        if not info:  # several hard links)
            continue
        with open(source / info["location"], "rb") as data:
            data.seek(int(info.get("offset", 0)))
            tensor.raw_data = data.read(int(info["length"]))
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    for name in names:
        folder = root / name
        folder.mkdir(parents=True)
        for item in source.iterdir():
            if item.is_file() and not item.name.startswith("model.onnx"):
                (folder / item.name).write_bytes(item.read_bytes())
        onnx.save(graph, str(folder / "model.onnx"))


def write_suite(reference: Path, files: list[str], out: Path, shim: bool) -> list[str]:
    """The test files and their support files under ``out`` (and the shim when ``shim``);
    returns the test files' paths relative to ``out``."""
    out.mkdir(parents=True)
    for name in (*SUPPORT_FILES, *files):
        source = reference / name
        if not source.is_file():
            raise SystemExit(f"{source} not found: is --reference-src a checkout of the reference?")
        target = out / Path(name).relative_to("test/python")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    if shim:
        (out / "onnxruntime_genai.py").write_text(SHIM)
    return [str(Path(name).relative_to("test/python")) for name in files]


def run(folder: Path, tests: list[str], models: Path, timeout: int, extra: list[str]) -> dict:
    """{test id: outcome} of pytest on ``tests`` in ``folder``."""
    command = [
        sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:randomly", "-p", "no:cacheprovider",
        "-p", "no:genai_conformance", "--rootdir", str(folder), "--timeout", str(timeout),
        "--test_models", str(models), *extra, *tests,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(folder)}
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    (folder / "pytest.log").write_text(done.stdout + done.stderr)
    found = {}
    for line in done.stdout.splitlines():
        match = OUTCOME.match(line)
        if match:
            found[match.group(2)] = match.group(1)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="test files, relative to the reference's repo")
    parser.add_argument("--reference-src", type=Path, required=True, help="a checkout of it")
    parser.add_argument("--model", type=Path, default=None, help="the folder to stand in")
    parser.add_argument("--names", nargs="+", default=list(DEFAULT_NAMES))
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test")
    parser.add_argument("--keep", type=Path, default=None, help="work here and keep it")
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="reference-suite-"))
    model = args.model or default_model()
    print(f"models: copies of {model} as {', '.join(args.names)}; work in {work}", flush=True)
    write_models(model, work / "test_models", args.names)
    extra = ["-k", args.select] if args.select else []
    results = {}
    for engine in ("reference", "genai"):
        folder = work / engine
        tests = write_suite(args.reference_src, args.files, folder, shim=engine == "genai")
        print(f"running {engine} ...", flush=True)
        results[engine] = run(folder, tests, work / "test_models", args.timeout, extra)
    for engine, found in results.items():
        counts = {kind: list(found.values()).count(kind) for kind in sorted(set(found.values()))}
        print(f"{engine}: {counts}")
    reference, ours = results["reference"], results["genai"]
    worse = sorted(
        t for t, kind in reference.items() if kind == "PASSED" and ours.get(t) != "PASSED"
    )
    better = sorted(
        t for t, kind in ours.items() if kind == "PASSED" and reference.get(t) != "PASSED"
    )
    print(f"\npass with the reference, not with genai ({len(worse)}):")
    for test in worse:
        print(f"  {ours.get(test, 'missing')}: {test}")
    print(f"\npass with genai, not with the reference ({len(better)}):")
    for test in better:
        print(f"  {reference.get(test, 'missing')}: {test}")
    print(f"\nlogs: {work}/reference/pytest.log, {work}/genai/pytest.log")
    if args.keep is None and not worse:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
