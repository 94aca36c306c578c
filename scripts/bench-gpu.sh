#!/usr/bin/env bash
# The GPU benchmarks of the candle backend (text) and the image pipeline against PyTorch on the
# same machine, in two halves, since the GPU machine has no Rust toolchain and no network:
#
#   scripts/bench-gpu.sh prepare      # here: the CUDA builds of bench_device and bench_imagine
#                                     # (scripts/build-cuda.sh), stripped and packed into .gpu/,
#                                     # with the diffusers wheels the PyTorch image side needs
#                                     # (IMAGE_FEATURES=cudnn: bench_imagine on cuDNN)
#   scripts/bench-gpu.sh run [DIR]    # on the GPU machine, with .gpu/ beside the checkout:
#                                     # the check below, then every benchmark, JSON lines into DIR
#                                     # (default $OUT)
#   scripts/bench-gpu.sh check [DIR]  # on the GPU machine: the candle backend on the GPU against
#                                     # the fast CPU path on every generated model of
#                                     # tests/fixtures/arch (examples/device_check.rs)
#
# What runs: a llama shape of 1.2B weights (Llama 3.2 1B's layers with a 32k vocabulary), random
# f16 weights made on the GPU, 128-token prompts then 64 decode steps, at 1, 8, 32 and 64
# streams: Hearth (examples/bench_device.rs) and Hugging Face transformers' LlamaForCausalLM
# (scripts/gpu/torch_llama.py, SDPA attention, and eager at 32 streams). Then images at
# 1024x1024, 4 steps without guidance (SDXL-Lightning's schedule): Hearth on the tiny test model
# and on SDXL base's full-size shapes with random weights, and diffusers on the same full-size
# shapes (scripts/gpu/torch_sdxl.py). The binaries need a CUDA 13 driver and CUDA 13's cuBLAS,
# cuRAND, NVRTC, cudart and (bench_imagine built with `cudnn`) cuDNN 9, which PyTorch's CUDA 13
# wheels carry there. Figures and the machine they came from: docs/benchmarks.md, "On a GPU".
# Not part of scripts/test.sh: it needs a GPU.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PACK="$ROOT/.gpu"

prepare() {
    set -e
    for spec in hearth-infer:bench_device:cuda hearth-infer:device_check:cuda \
        "hearth-imagine:bench_imagine:${IMAGE_FEATURES:-cuda}"; do
        IFS=: read -r pkg ex features <<<"$spec"
        FEATURES="$features" scripts/build-cuda.sh -p "$pkg" --example "$ex"
    done
    mkdir -p "$PACK/whl"
    local target="${CARGO_TARGET_DIR:-$ROOT/target/cuda}"
    for ex in bench_device device_check bench_imagine; do
        strip -o "$PACK/$ex" "$target/release/examples/$ex"
        xz -T2 -6 -f "$PACK/$ex"
    done
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d "$PACK/whl" \
        diffusers==0.42.1 importlib_metadata==10.2.0
    du -sh "$PACK"
    echo "packed into $PACK: name .gpu in the device run's carry"
}

unpack() {
    bin=/tmp/hearth-gpu
    mkdir -p "$bin"
    for ex in bench_device device_check bench_imagine; do
        python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
            "$PACK/$ex.xz" "$bin/$ex"
        chmod +x "$bin/$ex"
    done
    # CUDA 13's libraries from the PyTorch wheels (nvidia/cu13/lib), the driver's from the system.
    local libs
    libs="$(python3 - <<'PY'
import glob, os, site
dirs = set()
for sp in site.getsitepackages():
    for pat in ("libcublas.so.13*", "libcublasLt.so.13*", "libcurand.so.10*", "libnvrtc.so.13*",
                "libcudart.so.13*", "libcudnn.so.9*"):
        for f in glob.glob(os.path.join(sp, "nvidia", "**", pat), recursive=True):
            dirs.add(os.path.dirname(f))
print(":".join(sorted(dirs)))
PY
)"
    export LD_LIBRARY_PATH="$libs:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
}

check() {
    local out="${1:-${OUT:-/tmp/bench-gpu}}"
    mkdir -p "$out"
    [ -n "${bin:-}" ] || unpack
    echo "== the candle backend on the GPU against the fast CPU path"
    timeout 150 "$bin/device_check" --device cuda tests/fixtures/arch/*.gguf 2>&1 | tee "$out/check.jsonl"
    echo "== the same with f32 activations on the GPU"
    timeout 150 "$bin/device_check" --device cuda --dtype f32 tests/fixtures/arch/*.gguf 2>&1 |
        tee "$out/check-f32.jsonl"
}

run() {
    local out="${1:-${OUT:-/tmp/bench-gpu}}"
    mkdir -p "$out"
    unpack
    check "$out"
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
        nproc
        python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
        ldd "$bin/bench_device" "$bin/bench_imagine" | grep -E 'cuda|cublas|curand|nvrtc|cudnn|not found' || true
    } 2>&1 | tee "$out/device.txt"
    echo "== text: Hearth"
    timeout 200 "$bin/bench_device" --device cuda --streams 1,8,32,64 2>&1 | tee "$out/text.jsonl"
    echo "== text: PyTorch"
    timeout 200 python3 scripts/gpu/torch_llama.py --attn sdpa 2>&1 | tee -a "$out/text.jsonl"
    timeout 120 python3 scripts/gpu/torch_llama.py --attn eager --streams 32 2>&1 | tee -a "$out/text.jsonl"
    echo "== images: Hearth"
    timeout 90 "$bin/bench_imagine" --device cuda --dtype f16 --sizes 1024 --steps 4 --runs 2 \
        --guidance 0 2>&1 | tee "$out/image.txt"
    timeout 200 "$bin/bench_imagine" --device cuda --dtype f16 --random-full --sizes 1024 \
        --steps 4 --runs 2 --guidance 0 2>&1 | tee -a "$out/image.txt"
    echo "== images: PyTorch"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$PACK"/whl/*.whl &&
        PYTHONPATH=/tmp/site timeout 200 python3 scripts/gpu/torch_sdxl.py --size 1024 --steps 4 \
            --runs 2 2>&1 | tee -a "$out/image.txt"
}

case "${1:-}" in
    prepare) prepare ;;
    run) shift; run "$@" ;;
    check) shift; check "$@" ;;
    *) echo "usage: scripts/bench-gpu.sh prepare | run [DIR] | check [DIR]" >&2; exit 2 ;;
esac
