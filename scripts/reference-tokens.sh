#!/usr/bin/env bash
# Regenerate tests/fixtures/text/*.json (llama.cpp reference token ids) with llama-cpp-python
# 0.3.36 installed from its PyPI sdist into .venv-llama/, using the libllama that
# scripts/build-llama-cpp.sh built (so llama.cpp is compiled once). Idempotent.
# Usage: scripts/reference-tokens.sh [model names...] (see MODELS in reference-tokens.py)
#   KV=q8_0 scripts/reference-tokens.sh   llama.cpp's q8_0 KV cache (with flash attention, which
#                                         it needs), into tests/fixtures/text/kv-q8_0/
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-llama"
VERSION=0.3.36

"$ROOT/scripts/fetch-weights.sh"
BIN="$("$ROOT/scripts/build-llama-cpp.sh")"
SDIST="$ROOT/.cache/llama.cpp/llama_cpp_python-$VERSION.tar.gz"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check numpy
    # The package's own CMake build is switched off: LLAMA_CPP_LIB_PATH points it at our libllama.
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$VENV/bin/pip" install -q --disable-pip-version-check "$SDIST"
fi

KV_ARGS=()
if [ -n "${KV:-}" ]; then
    KV_ARGS=(--kv "$KV" --flash-attn --out-dir "$ROOT/tests/fixtures/text/kv-$KV")
fi
LLAMA_CPP_LIB_PATH="$BIN" "$VENV/bin/python" "$ROOT/scripts/reference-tokens.py" --root "$ROOT" \
    "${KV_ARGS[@]}" ${1:+--models "$@"}
