#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-server and llama-quantize from the source tree vendored in
# PyPI's llama-cpp-python sdist (Debian has no llama.cpp package and GitHub is unreachable here).
# Built with shared libraries so that scripts/reference-tokens.py can point llama-cpp-python at the
# very same libllama (LLAMA_CPP_LIB_PATH) instead of compiling llama.cpp a second time.
# Idempotent: a finished build is reused. Output: .cache/llama.cpp/build/bin/{llama-bench,
# llama-server,llama-quantize,libllama.so,libggml*.so}. Prints that bin folder on stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="$ROOT/.cache/llama.cpp"
BIN="$CACHE/build/bin"
JOBS="${JOBS:-$(nproc)}"
PIP="${PIP:-python3 -m pip}"

log() { echo "build-llama-cpp: $*" >&2; }

if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-quantize" ] \
    && [ "$(cat "$CACHE/VERSION" 2>/dev/null)" = "$VERSION" ]; then
    echo "$BIN"; exit 0
fi

if ! command -v cmake >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing cmake from Debian"
        apt-get install -y -q cmake >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q cmake >/dev/null; }
    else
        log "cmake is required (apt-get install cmake)"; exit 1
    fi
fi

mkdir -p "$CACHE"
SDIST="$(ls "$CACHE"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)"
if [ -z "$SDIST" ]; then
    log "pip download llama-cpp-python==$VERSION (sdist)"
    $PIP download --no-deps --no-binary llama-cpp-python --disable-pip-version-check -q -d "$CACHE" "llama-cpp-python==$VERSION"
    SDIST="$(ls "$CACHE"/llama_cpp_python-"$VERSION".tar.gz)"
fi

SRC="$CACHE/llama_cpp_python-$VERSION"
[ -d "$SRC" ] || tar -xzf "$SDIST" -C "$CACHE"
LLAMA="$SRC/vendor/llama.cpp"
[ -f "$LLAMA/CMakeLists.txt" ] || { log "no vendored llama.cpp in $SRC"; exit 1; }

log "configuring (GGML_NATIVE=ON, LLAMA_CURL=OFF)"
cmake -S "$LLAMA" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=ON >"$CACHE/cmake.log" 2>&1 || { tail -30 "$CACHE/cmake.log" >&2; exit 1; }
log "building llama-bench, llama-server and llama-quantize with $JOBS jobs (takes a while on 2 cores)"
cmake --build "$CACHE/build" --config Release -j "$JOBS" --target llama-bench llama-server llama-quantize llama \
    >"$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log" >&2; exit 1; }

echo "$VERSION" > "$CACHE/VERSION"
log "done: $BIN"
echo "$BIN"
