#!/usr/bin/env bash
# The provider conformance suite on a real non-CPU execution provider: OpenVINO (the monolithic
# onnxruntime-openvino build, device_type=CPU), in a virtual environment of its own. CI runs it.
#
#   scripts/conformance_openvino.sh [REPORT.json]     (default: $TMPDIR/genai-conformance-openvino.json)
#
# onnxruntime-openvino replaces the onnxruntime package (both install the `onnxruntime` module), so
# it cannot share CI's venv: this script keeps one under the user cache and reuses it on later
# runs. It holds genai's dependencies except onnxruntime, pytest, onnxruntime-openvino and
# providers/openvino (editable); genai itself is this checkout, put on the venv's path by a .pth
# file (an editable install without pip's build step, which would recompile the Cython extensions
# and overwrite the checkout's, in use by CI's own venv). The checkout must be built in place
# first (`pip install -e .`, as CI does, or `python setup.py build_ext --inplace`).
#
# Exits non-zero when anything cannot be installed, when the OpenVINO EP is not in the installed
# onnxruntime, or when a conformance test fails: a provider that cannot run is a failure here,
# not a skip. (Tests the provider declares unsupported are skipped inside the suite.)
#
# Environment:
#   GENAI_OPENVINO_VENV  the venv (default: ${XDG_CACHE_HOME:-$HOME/.cache}/genai/venv-openvino)
#   ORT_OPENVINO         the ORT requirement (default: onnxruntime-openvino==1.24.1)
#   PYTHON               the interpreter the venv is made from (default: python3)
#   OPENVINO_STATEFUL=0  skip the stateful-mode tests (tests/test_session_kv.py, enable_causallm)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENV=${GENAI_OPENVINO_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/genai/venv-openvino}
ORT_OPENVINO=${ORT_OPENVINO:-onnxruntime-openvino==1.24.1}
REPORT=${1:-${TMPDIR:-/tmp}/genai-conformance-openvino.json}
PY=$VENV/bin/python
start=$SECONDS

# What the venv was made from: a change re-installs (a hash of the packaging files, the ORT
# requirement, the checkout's path and the interpreter).
stamp() {
    {
        cat pyproject.toml providers/openvino/pyproject.toml
        echo "$ORT_OPENVINO $REPO pillow"
        "$PY" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
}

# One run at a time per venv: the venv points at this checkout while the run lasts.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

if ! "$PY" -c 'import sys' 2>/dev/null; then
    rm -rf "$VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi
if [ "$(cat "$VENV/.genai-stamp" 2>/dev/null)" != "$(stamp)" ]; then
    echo "conformance_openvino: installing into $VENV"
    rm -f "$VENV/.genai-stamp"
    "$PY" -m pip install --quiet --upgrade pip
    # genai's run dependencies without onnxruntime (onnxruntime-openvino is it here), read from
    # pyproject.toml; pytest runs the suite.
    mapfile -t deps < <("$PY" - <<'PY'
import re
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)
for req in project["project"]["dependencies"]:
    if not re.match(r"onnxruntime\b", req):
        print(req)
print("pytest>=8")
print("pillow>=10")  # the suite's vision area (genai's 'vision' extra)
PY
    )
    "$PY" -m pip install --quiet "$ORT_OPENVINO" "${deps[@]}"
    # The provider package requires genai-runtime, which the .pth below provides.
    "$PY" -m pip install --quiet --no-deps -e providers/openvino
    stamp > "$VENV/.genai-stamp"
fi
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' | {
    read -r site
    echo "$REPO" > "$site/genai-checkout.pth"
}

# The venv must hold the OpenVINO build of onnxruntime and nothing that brings plain
# onnxruntime back (its files would overwrite the monolithic build's), and genai must import
# from this checkout with its extensions built.
"$PY" - "$REPO" <<'PY'
import importlib.metadata as md
import sys
from pathlib import Path

import onnxruntime

names = {d.metadata["Name"].lower() for d in md.distributions()}
if "onnxruntime" in names:
    sys.exit("conformance_openvino: plain onnxruntime is installed in the OpenVINO venv")
if "OpenVINOExecutionProvider" not in onnxruntime.get_available_providers():
    sys.exit(
        "conformance_openvino: the installed onnxruntime has no OpenVINOExecutionProvider: "
        f"{onnxruntime.get_available_providers()}"
    )
try:
    import genai
except ImportError as exc:
    sys.exit(
        f"conformance_openvino: genai does not import from the checkout ({exc}); build it in "
        "place first: pip install -e . (or python setup.py build_ext --inplace)"
    )
if Path(genai.__file__).parent != Path(sys.argv[1]) / "genai":
    sys.exit(f"conformance_openvino: genai imports from {genai.__file__}, not the checkout")
print(f"onnxruntime-openvino {md.version('onnxruntime-openvino')}, genai {genai.__version__} "
      f"from {Path(genai.__file__).parent}")
PY
echo "conformance_openvino: environment ready after $((SECONDS - start)) s"

status=0
# The suite (capabilities the provider declares unsupported are skipped inside it).
# Known provider failures (each with its reason) are reported as xfail: scripts/conformance_openvino.xfails.
"$PY" -m genai conformance OpenVINO -o device_type=CPU --report "$REPORT" \
    --xfails scripts/conformance_openvino.xfails || status=1
echo "conformance_openvino: suite done after $((SECONDS - start)) s"

# Stateful mode (enable_causallm: the EP keeps the KV cache) against the CPU EP's tokens. The
# test suite's conftest checks that CI's own test dependencies are installed (onnxruntime-genai
# pins plain onnxruntime, so it cannot be here); this file needs none of them.
if [ "${OPENVINO_STATEFUL:-1}" = 1 ]; then
    env -u CI "$PY" -m pytest -q -p no:cacheprovider tests/test_session_kv.py || status=1
    echo "conformance_openvino: stateful tests done after $((SECONDS - start)) s"
fi
[ $status = 0 ] || echo "conformance_openvino: FAILED (see above)" >&2
exit $status
