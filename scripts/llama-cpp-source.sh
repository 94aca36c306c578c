#!/usr/bin/env bash
# The llama.cpp source tree vendored in PyPI's llama-cpp-python sdist (Debian has no llama.cpp
# package and GitHub is unreachable here), unpacked into CACHE, and cmake (from Debian when
# missing). Shared by scripts/build-llama-cpp.sh (CPU) and scripts/build-llama-cpp-cuda.sh.
#
#   scripts/llama-cpp-source.sh CACHE     # prints the llama.cpp folder
# env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), PIP.
set -euo pipefail
CACHE="$1"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PIP="${PIP:-python3 -m pip}"
log() { echo "llama-cpp-source: $*" >&2; }

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
echo "$LLAMA"
