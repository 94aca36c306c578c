#!/usr/bin/env bash
# Build ik_llama.cpp's llama-bench (the fastest CPU fork of llama.cpp) for scripts/bench-text.sh.
# It has no source package on the registries here: bring its public repository in first (the
# tool library's `fetch github:ikawrakow/ik_llama.cpp`, or `git clone` where GitHub is reachable)
# and give its git directory or work tree as IK_LLAMA_SRC. Release build, native CPU flags, static
# libraries, as its README builds it, except that its flash-attention kernels are compiled for the
# f16 KV cache only (the one llama-bench uses), not for every cache type. Idempotent: a finished
# build of the same commit is reused.
# Prints the bin folder on stdout (use it as IK_LLAMA_BIN).
#
#   IK_LLAMA_SRC=/work/.mirror/ikawrakow+ik_llama.cpp/repo scripts/build-ik-llama-cpp.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="${IK_LLAMA_SRC:-/work/.mirror/ikawrakow+ik_llama.cpp/repo}"
CACHE="$ROOT/.cache/ik_llama.cpp"
JOBS="${JOBS:-$(nproc)}"
log() { echo "build-ik-llama-cpp: $*" >&2; }

if [ -d "$SRC/.git" ]; then GIT=(git -C "$SRC"); elif [ -f "$SRC/HEAD" ]; then GIT=(git --git-dir="$SRC"); else
    log "no ik_llama.cpp repository at $SRC (set IK_LLAMA_SRC)"; exit 1
fi
COMMIT="$("${GIT[@]}" rev-parse HEAD)"
BIN="$CACHE/build/bin"
if [ -x "$BIN/llama-bench" ] && [ "$(cat "$CACHE/COMMIT" 2>/dev/null)" = "$COMMIT" ]; then
    echo "$BIN"; exit 0
fi

log "extracting $COMMIT"
rm -rf "$CACHE" && mkdir -p "$CACHE/src"
# File by file: the fetched copy may lack a few large blobs (web assets, vocab GGUFs) that no
# build target here needs; those are left out and named.
"${GIT[@]}" ls-tree -r -z "$COMMIT" | python3 -c '
import os, subprocess, sys
git, out = sys.argv[1:-1], sys.argv[-1]
entries = [e.split("\t", 1) for e in sys.stdin.buffer.read().decode().split("\0") if e]
cat = subprocess.Popen(git + ["cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
missing = 0
for meta, path in entries:
    mode, kind, sha = meta.split()
    if kind != "blob":
        continue
    cat.stdin.write((sha + "\n").encode()); cat.stdin.flush()
    header = cat.stdout.readline().decode().split()
    if header[-1] == "missing":
        missing += 1; print("build-ik-llama-cpp: missing from the copy:", path, file=sys.stderr); continue
    data = cat.stdout.read(int(header[2])); cat.stdout.read(1)
    dst = os.path.join(out, path)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if mode == "120000":
        os.symlink(data.decode(), dst)
    else:
        with open(dst, "wb") as f:
            f.write(data)
        if mode == "100755":
            os.chmod(dst, 0o755)
' "${GIT[@]}" "$CACHE/src"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
log "configuring and building llama-bench with $JOBS jobs (about 11 minutes on 2 cores)"
cmake -S "$CACHE/src" -B "$CACHE/build" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DGGML_IQK_FA_ALL_QUANTS=OFF \
    >"$CACHE/cmake.log" 2>&1 || { tail -30 "$CACHE/cmake.log" >&2; exit 1; }
cmake --build "$CACHE/build" --target llama-bench -j "$JOBS" >"$CACHE/build.log" 2>&1 \
    || { tail -30 "$CACHE/build.log" >&2; exit 1; }
echo "$COMMIT" >"$CACHE/COMMIT"
echo "$BIN"
