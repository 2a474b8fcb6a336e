#!/usr/bin/env bash
# Fetch llama.cpp's vocab-only GGUF files and their reference token vectors once, from PyPI
# (the llama-cpp-python sdist vendors them; MIT), into $GENAI_LLAMA_VOCAB_DIR
# (default ~/.cache/genai/llama-vocab). tests/test_builder_llama_vocab.py reads them.
set -euo pipefail
dest="${GENAI_LLAMA_VOCAB_DIR:-$HOME/.cache/genai/llama-vocab}"
names=(phi-3 llama-spm llama-bpe gpt-2 qwen2)
have=1
for name in "${names[@]}"; do
    [ -f "$dest/ggml-vocab-$name.gguf.out" ] || have=0
done
[ "$have" = 1 ] && exit 0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Only the sdist itself is wanted: its build dependencies may come as wheels (building them
# from source, as --no-binary :all: does, compiles CMake and takes many minutes).
python -m pip download --quiet --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$tmp"
tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" --wildcards '*/models/ggml-vocab-*'
mkdir -p "$dest"
for name in "${names[@]}"; do
    cp "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-"$name".gguf* "$dest"/
done
echo "llama.cpp vocab files in $dest"
