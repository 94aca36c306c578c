#!/usr/bin/env bash
# Builds llama.cpp's llama-bench with its CUDA backend (GGML_CUDA=ON) for the GPU benchmark's
# anchor (scripts/bench-gpu.sh), here, on a machine without a GPU: the same llama.cpp source
# as scripts/build-llama-cpp.sh (vendored in PyPI's llama-cpp-python sdist), the CUDA 13.0
# compiler of scripts/build-cuda.sh, and cuBLAS's headers from NVIDIA's `nvidia-cublas` wheel
# (linked against build-cuda.sh's stub; the GPU machine's real libcublas.so.13 is loaded).
# Static, for compute capability 90 only (CUDA_COMPUTE_CAP), CPU code for AVX2 (the GPU
# machine's CPU is not this one). Output: .cache/llama.cpp-cuda/build/bin/llama-bench.
# Takes about an hour on 2 cores (ggml's CUDA template instances); a finished build is reused.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CUBLAS="${CUBLAS_WHEEL:-13.0.0.19}"
CAP="${CUDA_COMPUTE_CAP:-90}"
CACHE="$ROOT/.cache/llama.cpp-cuda"
JOBS="${JOBS:-$(nproc)}"
log() { echo "build-llama-cpp-cuda: $*" >&2; }

BIN="$CACHE/build/bin"
STAMP="$VERSION sm_$CAP cublas $CUBLAS"
if [ -x "$BIN/llama-bench" ] && [ "$(cat "$CACHE/VERSION" 2>/dev/null)" = "$STAMP" ]; then
    echo "$BIN"; exit 0
fi
TOOLKIT="$("$ROOT/scripts/build-cuda.sh" --toolkit | tail -1)"
mkdir -p "$CACHE"
# nvcc and CMake look for the libraries in lib64; the wheels put them in lib.
[ -e "$TOOLKIT/lib64" ] || ln -s lib "$TOOLKIT/lib64"
if [ ! -f "$TOOLKIT/include/cublas_v2.h" ]; then
    log "cuBLAS headers from nvidia-cublas==$CUBLAS"
    python3 -m pip download --quiet --no-deps -d "$CACHE/wheels" "nvidia-cublas==$CUBLAS"
    python3 - "$CACHE/wheels" "$(dirname "$(dirname "$TOOLKIT")")" <<'PY'
import glob, os, sys, zipfile
wheels, dest = sys.argv[1], sys.argv[2]
for whl in glob.glob(os.path.join(wheels, "nvidia_cublas-*.whl")):
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if "/include/" in n and n.endswith(".h"):
                z.extract(n, dest)
PY
fi
LLAMA="$("$ROOT/scripts/llama-cpp-source.sh" "$CACHE")"
export PATH="$TOOLKIT/bin:$PATH" CUDA_PATH="$TOOLKIT" CUDAToolkit_ROOT="$TOOLKIT"
log "configuring (CUDA $("$TOOLKIT/bin/nvcc" --version | tail -1), sm_$CAP)"
cmake -S "$LLAMA" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$CAP" -DCMAKE_CUDA_COMPILER="$TOOLKIT/bin/nvcc" \
    -DCUDAToolkit_ROOT="$TOOLKIT" -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF >"$CACHE/cmake.log" 2>&1 ||
    { tail -30 "$CACHE/cmake.log" >&2; exit 1; }
log "building llama-bench with $JOBS jobs"
cmake --build "$CACHE/build" --config Release -j "$JOBS" --target llama-bench \
    >"$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log" >&2; exit 1; }
echo "$STAMP" >"$CACHE/VERSION"
log "done: $BIN"
echo "$BIN"
