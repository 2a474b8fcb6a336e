#!/usr/bin/env bash
# Run the provider conformance suite on every provider this machine can run, each in an
# environment of its own, and write one JSON report per provider.
#
#   scripts/conformance_all.sh [PROVIDER...]      (default: cpu example webgpu qnn openvino)
#
# Environment:
#   BASE_VENV   a venv with genai's dependencies (default: the active one, else ./.venv); genai
#               itself is used from this checkout (built in place: python setup.py build_ext -i)
#   HW_ROOT     where the per-provider venvs go (default: /tmp/genai-hw)
#   OUT         where the reports go (default: ${TMPDIR:-/tmp}/genai-conformance-reports)
#   SYSTEM_DEPS=1  also install system packages (root, Debian 12): Mesa 25 from
#               bookworm-backports for WebGPU on lavapipe
#
# Each extra provider gets a venv layered on BASE_VENV (a .pth file makes BASE_VENV's packages
# visible underneath its own): the ORT plugin package (and the genai provider package, --no-deps)
# are installed into it. OpenVINO uses the monolithic onnxruntime-openvino, which replaces the
# onnxruntime package: its venv shadows BASE_VENV's onnxruntime. CI runs cpu and example, and
# OpenVINO through scripts/conformance_openvino.sh (a venv of its own, cached; failures fail CI).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
BASE_VENV=${BASE_VENV:-${VIRTUAL_ENV:-$REPO/.venv}}
HW_ROOT=${HW_ROOT:-/tmp/genai-hw}
OUT=${OUT:-${TMPDIR:-/tmp}/genai-conformance-reports}
mkdir -p "$HW_ROOT" "$OUT"
PY=$BASE_VENV/bin/python
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}

layered_venv() {  # name -> path of a venv that sees BASE_VENV's packages underneath its own
    local dir=$HW_ROOT/$1
    if [ ! -x "$dir/bin/python" ]; then
        "$PY" -m venv "$dir" || return 1
        local site
        site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$SITE" > "$site/genai-base.pth"
    fi
    echo "$dir"
}

versions() {  # python -> "package==version ..." of what a report depends on
    "$1" - <<'PY'
import importlib.metadata as md
names = ["onnxruntime", "onnxruntime-openvino", "onnxruntime-qnn", "onnxruntime-ep-webgpu",
         "onnxruntime-ep-openvino", "numpy"]
found = []
for n in names:
    try:
        found.append(f"{n}=={md.version(n)}")
    except md.PackageNotFoundError:
        pass
print(" ".join(found))
PY
}

run() {  # provider python [extra args...]
    local provider=$1 python=$2
    shift 2
    echo "=== $provider ($(versions "$python"))"
    "$python" -m genai conformance "$provider" --report "$OUT/$provider.json" "$@"
    echo "=== $provider: exit $?"
}

providers=("$@")
[ ${#providers[@]} -eq 0 ] && providers=(cpu example webgpu qnn openvino)

for provider in "${providers[@]}"; do
    case $provider in
    cpu)
        run cpu "$PY"
        ;;
    example)
        venv=$(layered_venv example) || continue
        "$venv/bin/pip" install -q --no-deps "$REPO/examples/genai-provider-example"
        run example "$venv/bin/python"
        ;;
    webgpu)
        if [ "${SYSTEM_DEPS:-0}" = 1 ]; then
            if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
                echo "deb http://deb.debian.org/debian bookworm-backports main" \
                    > /etc/apt/sources.list.d/backports.list
            fi
            apt-get update -qq && apt-get install -y -qq -t bookworm-backports \
                mesa-vulkan-drivers libvulkan1 >/dev/null
        fi
        venv=$(layered_venv webgpu) || continue
        "$venv/bin/pip" install -q onnxruntime-ep-webgpu
        "$venv/bin/pip" install -q --no-deps "$REPO/providers/webgpu"
        # lavapipe (software Vulkan) is a CPU "GPU": allow it.
        ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 run WebGPU "$venv/bin/python"
        ;;
    qnn)
        venv=$(layered_venv qnn) || continue
        "$venv/bin/pip" install -q --no-deps onnxruntime-qnn
        "$venv/bin/pip" install -q --no-deps "$REPO/providers/qnn"
        # HTP simulator settings measured on these machines (fp16 needs soc_model).
        run QNN "$venv/bin/python" -o enable_htp_fp16_precision=1 -o soc_model=57 -o htp_arch=73
        # Windowed models (one static session per run length, every node on QNN) against the
        # CPU EP, with the same simulator settings.
        GENAI_QNN_OPTIONS="enable_htp_fp16_precision=1;soc_model=57;htp_arch=73" \
            "$venv/bin/python" -m pytest -q -p no:cacheprovider "$REPO/tests/test_windowed_static.py"
        echo "=== QNN windowed static shapes (tests/test_windowed_static.py): exit $?"
        ;;
    openvino)
        venv=$(layered_venv openvino) || continue
        # The monolithic build replaces onnxruntime (install without deps: nothing else may
        # pull plain onnxruntime back in).
        "$venv/bin/pip" install -q --no-deps onnxruntime-openvino
        "$venv/bin/pip" install -q --no-deps "$REPO/providers/openvino"
        run OpenVINO "$venv/bin/python" -o device_type=CPU
        # Stateful mode (enable_causallm: the EP keeps the KV cache) against the CPU EP.
        "$venv/bin/python" -m pytest -q -p no:cacheprovider "$REPO/tests/test_session_kv.py"
        echo "=== OpenVINO enable_causallm (tests/test_session_kv.py): exit $?"
        ;;
    *)
        echo "unknown provider $provider (cpu, example, webgpu, qnn, openvino)" >&2
        ;;
    esac
done
echo "reports in $OUT"
