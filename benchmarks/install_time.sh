#!/usr/bin/env bash
# Install time as a new user meets it: a fresh clone and a fresh venv, the README's two commands,
# then the build alone (`pip install --no-deps -e .`) in another fresh clone, and once more there.
# One tab-separated row per step: wall seconds, CPU seconds (user + sys of pip and everything it
# ran) and the 1-minute load average when the step started (the machines are shared: compare CPU).
#
#   bash benchmarks/install_time.sh [REPO [COMMIT]]    # default: this checkout's HEAD
#
# Before/after: run it on the two commits. Results: docs/benchmarks.md, "Install time".
# -h, --help prints this text. Needs git, /usr/bin/time, bc and network access for pip.
set -euo pipefail

case "${1:-}" in
-h | --help)
    sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
    ;;
-*)
    echo "install_time.sh: unknown option $1 (-h for help)" >&2
    exit 2
    ;;
esac

REPO=${1:-$(cd "$(dirname "$0")/.." && pwd)}
COMMIT=$(git -C "$REPO" rev-parse "${2:-HEAD}")
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/genai-install-time.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

step() {  # label command...
    local label=$1 load
    shift
    load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?")
    if ! /usr/bin/time -f "%e %U %S" -o "$WORK/time" "$@" >"$WORK/log" 2>&1; then
        tail -20 "$WORK/log" >&2
        echo "$label: failed" >&2
        exit 1
    fi
    read -r wall user sys <"$WORK/time"
    printf '%s\t%s\t%.1f\t%s\n' "$label" "$wall" "$(echo "$user + $sys" | bc)" "$load"
}

clone() {  # folder
    git clone -q "$REPO" "$1"
    git -C "$1" checkout -q "$COMMIT"
}

printf 'step (%s)\twall s\tCPU s\tload\n' "$(git -C "$REPO" rev-parse --short "$COMMIT")"
clone "$WORK/user"
"$PYTHON" -m venv "$WORK/venv"
cd "$WORK/user"
step 'pip install -e .' "$WORK/venv/bin/pip" install -e .
step 'then pip install -e ".[test]"' "$WORK/venv/bin/pip" install -e ".[test]"

clone "$WORK/build"
cd "$WORK/build"
step 'build alone, fresh clone' "$WORK/venv/bin/pip" install --no-deps -e .
step 'build alone, again' "$WORK/venv/bin/pip" install --no-deps -e .
