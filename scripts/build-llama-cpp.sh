#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-server and llama-quantize from the source tree vendored in
# PyPI's llama-cpp-python sdist (scripts/llama-cpp-source.sh).
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

log() { echo "build-llama-cpp: $*" >&2; }

# -march=native turns on ggml's AMX kernels wherever the CPU lists AMX. Some virtual machines list
# it but do not let a process use the tile registers (llama.cpp then dies of SIGILL at its first
# matrix product): there, build for this CPU's other features and leave AMX out.
amx_usable() {
    grep -q ' amx_tile' /proc/cpuinfo || return 0
    local dir; dir="$(mktemp -d)"
    cat >"$dir/amx.c" <<'C'
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1; /* ARCH_REQ_XCOMP_PERM, XTILEDATA */
    unsigned char cfg[64]; memset(cfg, 0, sizeof cfg); cfg[0] = 1; cfg[16] = 64; cfg[48] = 16;
    _tile_loadconfig(cfg); _tile_zero(0); _tile_release(); return 0;
}
C
    local ok=1
    if cc -O1 -mamx-tile "$dir/amx.c" -o "$dir/amx" 2>/dev/null && sh -c "\"\$1\"" amx "$dir/amx" 2>/dev/null; then ok=0; fi
    rm -rf "$dir"
    return $ok
}
ARCH=(-DGGML_NATIVE=ON)
if ! amx_usable; then
    ARCH=(-DGGML_NATIVE=OFF)
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { [[ "$flags" == *" $1 "* ]]; }
    for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI \
        avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
        if has "${pair%%:*}"; then ARCH+=("-DGGML_${pair#*:}=ON"); else ARCH+=("-DGGML_${pair#*:}=OFF"); fi
    done
    if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
        ARCH+=(-DGGML_AVX512=ON); else ARCH+=(-DGGML_AVX512=OFF); fi
    ARCH+=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    log "this CPU lists AMX but a process cannot use it: llama.cpp is built without AMX"
fi

if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-quantize" ] \
    && [ "$(cat "$CACHE/VERSION" 2>/dev/null)" = "$VERSION ${ARCH[*]}" ]; then
    echo "$BIN"; exit 0
fi

LLAMA="$("$ROOT/scripts/llama-cpp-source.sh" "$CACHE")"

log "configuring (${ARCH[*]}, LLAMA_CURL=OFF)"
cmake -S "$LLAMA" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release "${ARCH[@]}" -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=ON >"$CACHE/cmake.log" 2>&1 || { tail -30 "$CACHE/cmake.log" >&2; exit 1; }
log "building llama-bench, llama-server and llama-quantize with $JOBS jobs (takes a while on 2 cores)"
cmake --build "$CACHE/build" --config Release -j "$JOBS" --target llama-bench llama-server llama-quantize llama \
    >"$CACHE/build.log" 2>&1 || { tail -30 "$CACHE/build.log" >&2; exit 1; }

echo "$VERSION ${ARCH[*]}" > "$CACHE/VERSION"
log "done: $BIN"
echo "$BIN"
