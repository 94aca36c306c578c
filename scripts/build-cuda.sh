#!/usr/bin/env bash
# Builds the `cuda` binary (`cargo build --release --features cuda`) on a machine without a GPU
# or a CUDA install: the CUDA 13 compiler (nvcc, cicc, ptxas), its headers, libcu++ and cudart
# come from NVIDIA's PyPI wheels into .cache/cuda-13. The CUDA 12 wheels on PyPI carry ptxas but
# no nvcc, so CUDA 13 it is. The binary needs, where it runs: a driver for CUDA 13 (580 or
# later; libcuda.so.1) and the CUDA 13 libraries libcudart.so.13, libcublas.so.13,
# libcublasLt.so.13, libcurand.so.10 and libnvrtc.so.13 (the `nvidia-cublas`, `nvidia-curand`,
# `nvidia-cuda-nvrtc` and `nvidia-cuda-runtime` wheels, or a CUDA 13 toolkit).
#
#   scripts/build-cuda.sh            # build target/cuda/release/hearth
#   CUDA_COMPUTE_CAP=80 scripts/build-cuda.sh   # another GPU generation (default 90: H100/H200)
#   scripts/build-cuda.sh -p hearth-infer --example bench_device   # other cargo targets
#   FEATURES=cudnn scripts/build-cuda.sh   # convolutions on cuDNN 9 (libcudnn.so.9 where it runs)
#   scripts/build-cuda.sh --toolkit  # only fetch the toolkit and make the link stubs; print its path
#
# The toolkit is CUDA 13.0 by default: the PTX its nvcc writes is loaded by the driver at start,
# and a driver runs only PTX of its own CUDA version or older (the lent H100/H200 machines have
# driver 580, CUDA 13.0; PTX from a 13.5 nvcc is refused there).
#
# env: CUDA_WHEELS (the wheel version, default 13.0.88), CUDA_CCCL (libcu++, default 13.0.85),
#      CARGO_TARGET_DIR (default target/cuda, apart from the CPU build's).
# Not run by scripts/test.sh (CI): a cold build takes about 20 minutes on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VER="${CUDA_WHEELS:-13.0.88}"
CCCL="${CUDA_CCCL:-13.0.85}"
DEST="$ROOT/.cache/cuda-13"
TOOLKIT="$DEST/nvidia/cu13"

if [ ! -x "$TOOLKIT/bin/nvcc" ] || [ ! -x "$TOOLKIT/nvvm/bin/cicc" ] || [ "$(cat "$DEST/version" 2>/dev/null)" != "$VER $CCCL" ]; then
    echo "fetching the CUDA $VER wheels into $DEST"
    rm -rf "$DEST"
    mkdir -p "$DEST/wheels"
    python3 -m pip download --quiet --no-deps -d "$DEST/wheels" \
        "nvidia-cuda-nvcc==$VER" "nvidia-nvvm==$VER" "nvidia-cuda-crt==$VER" \
        "nvidia-cuda-runtime==$VER" "nvidia-cuda-cccl==$CCCL"
    # The wheels share one tree (nvidia/cu13); pip --target would refuse to merge them.
    python3 - "$DEST" <<'EOF'
import glob, os, stat, sys, zipfile
dest = sys.argv[1]
for whl in sorted(glob.glob(os.path.join(dest, "wheels", "*.whl"))):
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            path = z.extract(info, dest)
            mode = info.external_attr >> 16
            if mode & stat.S_IXUSR:
                os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
EOF
    chmod +x "$TOOLKIT"/bin/* "$TOOLKIT"/nvvm/bin/*
    echo "$VER $CCCL" >"$DEST/version"
fi

# Link-time stand-ins for the libraries a GPU machine has and this one need not: the driver
# (libcuda.so.1) and cuBLAS, cuBLASLt, cuRAND, NVRTC (the real ones are hundreds of MB). Each
# exports every function cudarc's bindings declare, under the real library's soname, so the
# binary records the real names and the GPU machine's libraries are the ones loaded. cudart is
# the real one from the runtime wheel (the CUDA kernels' registration calls live there).
STUBS="$TOOLKIT/lib"
if [ ! -e "$STUBS/libcuda.so" ]; then
    cudarc_src="$(cd "$ROOT" && cargo metadata --format-version 1 --features cuda 2>/dev/null | python3 -c '
import json, os, sys
pkgs = json.load(sys.stdin)["packages"]
print(next(os.path.dirname(p["manifest_path"]) for p in pkgs if p["name"] == "cudarc"))')/src"
    for spec in cuda:driver:libcuda.so.1 nvrtc:nvrtc:libnvrtc.so.13 curand:curand:libcurand.so.10 \
        cublas:cublas:libcublas.so.13 cublasLt:cublaslt:libcublasLt.so.13; do
        IFS=: read -r lib dir soname <<<"$spec"
        grep -hoE "^pub unsafe fn [A-Za-z0-9_]+" "$cudarc_src/$dir/sys/mod.rs" | awk '{print $4}' |
            sort -u | sed 's/.*/void &(void) {}/' >"$DEST/stub-$lib.c"
        cc -shared -fPIC -o "$STUBS/lib$lib.so" -Wl,-soname,"$soname" "$DEST/stub-$lib.c"
    done
    ln -sf libcudart.so.13 "$STUBS/libcudart.so"
fi
if [ ! -e "$STUBS/libcudnn.so" ]; then
    cudarc_src="$(cd "$ROOT" && cargo metadata --format-version 1 --features cuda 2>/dev/null | python3 -c '
import json, os, sys
pkgs = json.load(sys.stdin)["packages"]
print(next(os.path.dirname(p["manifest_path"]) for p in pkgs if p["name"] == "cudarc"))')/src"
    grep -hoE "^pub unsafe fn [A-Za-z0-9_]+" "$cudarc_src/cudnn/sys/mod.rs" | awk '{print $4}' |
        sort -u | sed 's/.*/void &(void) {}/' >"$DEST/stub-cudnn.c"
    cc -shared -fPIC -o "$STUBS/libcudnn.so" -Wl,-soname,libcudnn.so.9 "$DEST/stub-cudnn.c"
fi

if [ "${1:-}" = --toolkit ]; then
    echo "$TOOLKIT"
    exit 0
fi
"$TOOLKIT/bin/nvcc" --version | tail -1
major_minor="$(echo "$VER" | cut -d. -f1,2)"
# cudarc 0.19 has bindings up to CUDA 13.4; a newer toolkit builds against those (the driver
# API it calls is the same).
case "$major_minor" in
    13.0) cudarc=13000 ;; 13.1) cudarc=13010 ;; 13.2) cudarc=13020 ;; 13.3) cudarc=13030 ;;
    *) cudarc=13040 ;;
esac
export CUDARC_CUDA_VERSION="$cudarc"
export CUDA_ROOT="$TOOLKIT" CUDA_PATH="$TOOLKIT" CUDA_HOME="$TOOLKIT"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export PATH="$TOOLKIT/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/cuda}"
cd "$ROOT"
FEATURES="${FEATURES:-cuda}"
if [ "$#" -gt 0 ]; then
    cargo build --release --features "$FEATURES" "$@"
    echo "built $* in $CARGO_TARGET_DIR/release (CUDA $VER, compute capability $CUDA_COMPUTE_CAP)"
else
    cargo build --release --features "$FEATURES"
    echo "built $CARGO_TARGET_DIR/release/hearth (CUDA $VER, compute capability $CUDA_COMPUTE_CAP)"
fi
