#!/usr/bin/env bash
# Hearth on a GPU against its peers on the same machine, in two halves, since the GPU machine has
# no Rust toolchain and no network:
#
#   scripts/bench-gpu.sh prepare      # here: the CUDA builds (scripts/build-cuda.sh) of `hearth`,
#                                     # bench_device, device_check and bench_imagine, the load
#                                     # generator, SmolLM2's tokenizer as a small GGUF, llama.cpp's
#                                     # CUDA llama-bench when scripts/build-llama-cpp-cuda.sh has
#                                     # built it, and the diffusers wheels: stripped, packed into
#                                     # .gpu/ (name .gpu in the device run's carry)
#   scripts/bench-gpu.sh unpack-llama # on the GPU machine, a call before `run` that carries
#                                     # .gpu-llama (llama-bench alone is 41 MB packed)
#   scripts/bench-gpu.sh run [DIR]    # on the GPU machine: everything below, results into DIR
#                                     # (default $OUT), a summary last
#   scripts/bench-gpu.sh check [DIR]  # on the GPU machine: the candle backend on the GPU against
#                                     # the fast CPU path on every generated model of
#                                     # tests/fixtures/arch (examples/device_check.rs)
#   scripts/bench-gpu.sh quick [DIR]  # on the GPU machine, in about a minute: CUDA graphs and
#                                     # the one-row kernels on and off on the 1.1B f16 and Q8_0
#                                     # files, the Q8_0 file against the CPU path, a prefill's
#                                     # kernels
#
# What `run` does, in this order (each step bounded; the whole under 5 minutes on an H100):
#   1. `hearth serve` on the GPU (scripts/gpu/serve.py): `hearth dev random-model` writes a 1.1B
#      llama (Llama 3.2 1B's layers, SmolLM2's 49,152-token vocabulary) in f16 and Q8_0, the
#      server serves both and the tiny image model on the GPU, the contract checks run over
#      HTTP, then the load generator drives SSE `/stream` and `/v1/chat/completions` at 1, 8, 32
#      and 64 concurrent streams of 128 tokens; SIGTERM last.
#   2. bench_device on the same shape (random f16 weights made on the GPU): prefill of 128-token
#      prompts and 64 decode steps at 1, 8, 32 and 64 streams; then with the decode attention as
#      one split a row up to 256 positions and the products' epilogues (gated activation, RoPE
#      and KV write) kernels of their own (HEARTH_DECODE_CHUNK=256 HEARTH_EPILOGUES=off), the
#      epilogues alone, and splits of 32 and 128 positions; then (not SHORT) the first kernels and cuBLAS with a fixed workspace;
#      then the same with every decode
#      step launched kernel by kernel (HEARTH_CUDA_GRAPHS=off), and from there, at 1 and 32
#      streams, with cuBLAS for the few-row matrix products (HEARTH_GEMV=off), with the fused
#      kernels off as well (HEARTH_FUSED=off), and with everything of issue 31 off
#      (HEARTH_CUDA_EVENTS=track HEARTH_DECODE_ATTENTION=gather: the code before); then on the
#      f16 and Q8_0 files of step 1, with graphs and without. Before the rows without graphs, a
#      row with the first decode attention, add-norm and one-row product kernels
#      (HEARTH_STEP_KERNELS=first).
#   3. the GPU against the CPU path (check, f16 activations), with dense f16 llama files besides
#      the fixtures (the fused kernels' path): four small ones (each variant of the decode
#      attention's register kernel), also with a 700-token prompt (a row's positions split), and
#      the two 1.1B files.
#   4. llama.cpp's CUDA llama-bench on the very GGUF files the server served (when unpacked).
#   5. Hugging Face transformers' LlamaForCausalLM, eager attention (scripts/gpu/torch_llama.py).
#   6. images at 1024x1024, 4 steps without guidance: Hearth on SDXL base's full-size shapes with
#      random weights, diffusers on the same shapes (scripts/gpu/torch_sdxl.py).
#   7. Nsight Compute's durations of ~2 one-stream decode steps' kernels (scripts/gpu/step_profile.py):
#      the GPU's own time a step, beside bench_device's wall time; of a 64-stream step's; then of
#      a 32-stream prefill's.
#   8. scripts/gpu/summary.py: one JSON object of the headline figures (docs/gpu/*-summary.json).
# BENCH_GPU_STEPS="2 3 7" runs only those steps (and the summary): a quick look at a kernel
# change in a minute of GPU time. BENCH_GPU_SHORT=1 keeps each step to its headline figures (no
# rows with the changes turned off in turn before graphs, no image checks or image variants, no
# prefill profile), so that the anchors fit one call beside them.
# The binaries need a CUDA 13 driver and CUDA 13's cuBLAS, cuRAND, NVRTC and cudart, which
# PyTorch's CUDA 13 wheels carry there. Figures: docs/benchmarks.md, "On a GPU".
# Not part of scripts/test.sh: it needs a GPU.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PACK="$ROOT/.gpu"
# Where the GPU machine writes its models (the 1.1B files, the small dense one).
WORK=/tmp/hearth-gpu-work
CUDA_BINS=(hearth bench_device device_check bench_imagine image_check)

prepare() {
    set -e
    local target="${CUDA_TARGET_DIR:-$ROOT/target/cuda}"
    CARGO_TARGET_DIR="$target" scripts/build-cuda.sh -p hearth -p hearth-infer -p hearth-imagine \
        --features hearth/cudnn,hearth-infer/cuda,hearth-imagine/cudnn --bin hearth \
        --example bench_device --example device_check --example bench_imagine --example image_check
    rm -rf "$PACK"
    mkdir -p "$PACK/whl"
    for b in "${CUDA_BINS[@]}"; do
        local f="$target/release/$b"
        [ -f "$f" ] || f="$target/release/examples/$b"
        strip -o "$PACK/$b" "$f"
    done
    # The CPU side: the load generator and the tokenizer (written by the CPU build of hearth).
    local loadgen
    loadgen="$(cargo bench --no-run --profile dev --bench loadgen --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "loadgen" and m.get("executable"):
        print(m["executable"])')"
    strip -o "$PACK/loadgen" "$loadgen"
    [ -f weights/SmolLM2-135M-Instruct.Q4_1.gguf ] || scripts/fetch-weights.sh smollm2
    cargo run -q --bin hearth -- dev random-model "$PACK/tok.gguf" --tokenizer-only \
        --tokenizer-from weights/SmolLM2-135M-Instruct.Q4_1.gguf
    for f in "$PACK"/*; do [ -f "$f" ] && [ "${f%.gguf}" = "$f" ] && xz -T2 -6 -f "$f"; done
    # llama.cpp's CUDA llama-bench is 41 MB packed, too much beside the rest in one call's
    # 64 MiB: it goes in a pack of its own, sent by a call before `run` (`unpack-llama`).
    local llama="$ROOT/.cache/llama.cpp-cuda/build/bin/llama-bench"
    rm -rf "$PACK-llama"
    if [ -x "$llama" ]; then
        mkdir -p "$PACK-llama"
        strip -o "$PACK-llama/llama-bench" "$llama"
        xz -T2 -6 -f "$PACK-llama/llama-bench"
    else
        echo "no CUDA llama-bench (scripts/build-llama-cpp-cuda.sh): packed without it"
    fi
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d "$PACK/whl" \
        diffusers==0.42.1 importlib_metadata==10.2.0
    du -sh "$PACK" "$PACK-llama" 2>/dev/null
    echo "packed into $PACK: name .gpu in the device run's carry (and .gpu-llama in a call before)"
}

# An executable from its .xz (the GPU machine has Python's lzma, not necessarily xz).
unxz_to() {
    python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' "$1" "$2"
    chmod +x "$2"
}

# On the GPU machine, in a call of its own that carries .gpu-llama: llama-bench into the folder
# `run` unpacks into, where the next call on the same (warm) machine finds it.
unpack_llama() {
    mkdir -p /tmp/hearth-gpu
    unxz_to "$PACK-llama/llama-bench.xz" /tmp/hearth-gpu/llama-bench
    ls -la /tmp/hearth-gpu/llama-bench
}

unpack() {
    bin=/tmp/hearth-gpu
    mkdir -p "$bin"
    for f in "$PACK"/*.xz; do unxz_to "$f" "$bin/$(basename "$f" .xz)"; done
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
    # Dense f16 llama files take the fused kernels (of the quantized fixtures, the Q8_0 ones and
    # Phi-3's fused projections do): a small one, and the served 1.1B files (f16 and Q8_0) when
    # step 1 or 2 wrote them.
    # The small ones take each variant of the decode attention's register kernel: heads of 64
    # and 128, 4 and 8 query heads a KV head (12 / 2 = 6 is the second).
    local dense="$WORK/small-f16.gguf" shape h n kv
    mkdir -p "$WORK"
    "$bin/hearth" dev random-model "$dense" --tokenizer-from "$PACK/tok.gguf" --layers 4 \
        --hidden 512 --heads 8 --kv-heads 2 --ff 1024 >/dev/null
    local heads=()
    for shape in 768:12:2 1024:8:2 1024:8:1; do
        IFS=: read -r h n kv <<<"$shape"
        "$bin/hearth" dev random-model "$WORK/small-$h-$n-$kv.gguf" --tokenizer-from \
            "$PACK/tok.gguf" --layers 2 --hidden "$h" --heads "$n" --kv-heads "$kv" --ff 1024 \
            >/dev/null
        heads+=("$WORK/small-$h-$n-$kv.gguf")
    done
    echo "== the candle backend on the GPU against the fast CPU path (f16 activations)"
    timeout 150 "$bin/device_check" --device cuda tests/fixtures/arch/*.gguf "$dense" "${heads[@]}" \
        $(ls "$WORK"/llama-1b-{f16,q8}.gguf 2>/dev/null) 2>&1 | tee "$out/check.jsonl"
    echo "-- the small dense files with a prompt of 700 tokens (the attention's rows split)"
    timeout 90 "$bin/device_check" --device cuda --prompt 700 "$dense" "${heads[@]}" 2>&1 |
        tee -a "$out/check.jsonl"
}

# Tags each JSON line of stdin with an engine name.
tag() { sed -u "s/^{/{\"engine\":\"$1\",/"; }

# The 1.1B files the server, llama-bench and bench_device read, written into $WORK when step 1
# (serve.py) has not written them already: f16 and Q8_0.
write_models() {
    local m
    for m in llama-1b-f16:f16 llama-1b-q8:q8_0; do
        [ -f "$WORK/${m%%:*}.gguf" ] || "$bin/hearth" dev random-model "$WORK/${m%%:*}.gguf" \
            --tokenizer-from "$PACK/tok.gguf" --weights "${m##*:}"
    done
}

# Nsight Compute's kernel durations at the clocks and caches the run has (ncu otherwise locks base
# clocks and flushes the caches before each kernel, which makes short kernels look longer than
# they are), summed by scripts/gpu/step_profile.py: `profile NCU_ARGS -- BENCH_DEVICE_ARGS`.
profile() {
    local ncu; ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
    [ -n "$ncu" ] || { echo "(no Nsight Compute here)"; return 0; }
    local args=()
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    timeout 120 "$ncu" --metrics gpu__time_duration.sum --csv --print-units base \
        --clock-control none --cache-control none "${args[@]}" "$bin/bench_device" --device cuda \
        "$@" 2>/dev/null | python3 scripts/gpu/step_profile.py 16
}

# A 32-stream prefill's kernels: the f16 file (random weights made on the GPU would fill the
# window with their making), no warm-up, so that the profile holds the load's casts and the
# prefill.
profile_prefill() {
    profile --launch-count 3000 -- --file "$WORK/llama-1b-f16.gguf" --streams 32 --gen 0 --warmup 0
}

run() {
    local out="${1:-${OUT:-/tmp/bench-gpu}}"
    mkdir -p "$out" "$WORK"
    unpack
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
        nproc
        python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
        ldd "$bin/hearth" | grep -E 'cuda|cublas|curand|nvrtc|not found' || true
        uptime
    } 2>&1
    local steps=" ${BENCH_GPU_STEPS:-1 2 3 4 5 6 7} " short="${BENCH_GPU_SHORT:-}"
    step() { [[ "$steps" == *" $1 "* ]]; }
    touch "$out/text.jsonl"
    if step 1; then
    echo "== 1. hearth serve on the GPU"
    timeout 300 python3 scripts/gpu/serve.py --hearth "$bin/hearth" --loadgen "$bin/loadgen" \
        --tokenizer "$PACK/tok.gguf" --work "$WORK" --out "$out"
    fi
    if step 2; then
    echo "== 2. bench_device: now; then without each of this issue's changes in turn"
    local shape=(--vocab 49152 --streams 1,8,32,64)
    timeout 90 "$bin/bench_device" --device cuda "${shape[@]}" 2>&1 | tag hearth | tee -a "$out/text.jsonl"
    # The decode attention's splits merged in the kernel and the products' epilogues (the
    # gated activation, RoPE with the KV write), off together (a row of up to 256 positions one
    # block, as before them) and the epilogues alone; then other split sizes.
    HEARTH_DECODE_CHUNK=256 HEARTH_EPILOGUES=off timeout 60 "$bin/bench_device" --device cuda \
        --vocab 49152 --streams 1,8,32 2>&1 | tag hearth-one-split | tee -a "$out/text.jsonl"
    HEARTH_EPILOGUES=off timeout 60 "$bin/bench_device" --device cuda --vocab 49152 --streams 1 \
        2>&1 | tag hearth-separate-epilogues | tee -a "$out/text.jsonl"
    for c in 32 128; do
        HEARTH_DECODE_CHUNK=$c timeout 60 "$bin/bench_device" --device cuda --vocab 49152 \
            --streams 1,32 2>&1 | tag "hearth-chunk-$c" | tee -a "$out/text.jsonl"
    done
    if [ -z "$short" ]; then
    HEARTH_STEP_KERNELS=first timeout 60 "$bin/bench_device" --device cuda "${shape[@]}" 2>&1 |
        tag hearth-first-kernels | tee -a "$out/text.jsonl"
    # Graphed steps of many rows have been slower than launched ones in this benchmark (not in
    # the server): with cuBLAS given a fixed workspace, in case its captured products differ.
    CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 60 "$bin/bench_device" --device cuda --vocab 49152 \
        --streams 32,64 2>&1 | tag hearth-cublas-workspace | tee -a "$out/text.jsonl"
    fi
    HEARTH_CUDA_GRAPHS=off timeout 60 "$bin/bench_device" --device cuda "${shape[@]}" 2>&1 |
        tag hearth-no-graphs | tee -a "$out/text.jsonl"
    export HEARTH_CUDA_GRAPHS=off
    if [ -z "$short" ]; then
    HEARTH_GEMV=off timeout 60 "$bin/bench_device" --device cuda --vocab 49152 \
        --streams 1,8,32 2>&1 | tag hearth-cublas-rows | tee -a "$out/text.jsonl"
    HEARTH_GEMV=off HEARTH_FUSED=off timeout 60 "$bin/bench_device" --device cuda \
        --vocab 49152 --streams 1,32 2>&1 | tag hearth-attention-only | tee -a "$out/text.jsonl"
    HEARTH_CUDA_EVENTS=track HEARTH_DECODE_ATTENTION=gather HEARTH_FUSED=off HEARTH_GEMV=off \
        timeout 60 "$bin/bench_device" --device cuda --vocab 49152 --streams 1,32 2>&1 |
        tag hearth-before | tee -a "$out/text.jsonl"
    fi
    unset HEARTH_CUDA_GRAPHS
    # f16 against Q8_0, read from the file as a user's model is, with graphs and without.
    write_models
    for m in llama-1b-f16 llama-1b-q8; do
        # Each graph captured is logged (a line that is not JSON).
        RUST_LOG=hearth_infer=debug timeout 60 "$bin/bench_device" --device cuda \
            --file "$WORK/$m.gguf" --streams 1,8,32 2>&1 | tag "hearth-file-$m" |
            tee -a "$out/text.jsonl"
        HEARTH_CUDA_GRAPHS=off timeout 60 "$bin/bench_device" --device cuda --file "$WORK/$m.gguf" \
            --streams 1,32 2>&1 | tag "hearth-file-$m-no-graphs" | tee -a "$out/text.jsonl"
    done
    fi
    if step 3; then
    echo "== 3. the GPU against the CPU path"
    check "$out"
    fi
    if step 4 && [ -x "$bin/llama-bench" ]; then
        echo "== 4. llama.cpp CUDA on the same files"
        for m in llama-1b-f16 llama-1b-q8; do
            timeout 90 "$bin/llama-bench" -m "$WORK/$m.gguf" -ngl 99 -p 128,512 -n 128 -r 3 -o jsonl \
                2>/dev/null | tag "llama.cpp-$m" | tee -a "$out/text.jsonl"
        done
    fi
    if step 5; then
    echo "== 5. transformers, eager attention"
    timeout 120 python3 scripts/gpu/torch_llama.py --attn eager --vocab 49152 --streams 1,32 2>&1 |
        tee -a "$out/text.jsonl"
    fi
    if step 6; then
    echo "== 6. images"
    if [ -z "$short" ]; then
    echo "-- the image layers on the GPU against candle's f32 (Hearth's kernels, then candle's f16)"
    timeout 60 "$bin/image_check" 2>&1 | tee "$out/image-check.jsonl"
    HEARTH_IMAGE_CONV=candle HEARTH_IMAGE_FUSED=off HEARTH_IMAGE_ATTENTION=f32 timeout 60 \
        "$bin/image_check" 2>&1 | tag candle-f16 | tee -a "$out/image-check.jsonl"
    fi
    echo "-- SDXL's full-size shapes, 1024x1024, 4 steps: now, then without each kernel in turn"
    local img=(--device cuda --dtype f16 --random-full --sizes 1024 --steps 4 --runs 2 --guidance 0)
    timeout 60 "$bin/bench_imagine" "${img[@]}" 2>&1 | tee "$out/image.txt"
    [ -n "$short" ] ||
    for v in HEARTH_IMAGE_CONV=candle HEARTH_IMAGE_FUSED=off HEARTH_IMAGE_ATTENTION=f32 \
        "HEARTH_IMAGE_CONV=candle HEARTH_IMAGE_FUSED=off HEARTH_IMAGE_ATTENTION=f32"; do
        echo "-- $v"
        env $v timeout 60 "$bin/bench_imagine" "${img[@]}" 2>&1 | tail -1 | tee -a "$out/image.txt"
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$PACK"/whl/*.whl &&
        PYTHONPATH=/tmp/site timeout 120 python3 scripts/gpu/torch_sdxl.py --size 1024 --steps 4 \
            --runs 2 2>&1 | tee -a "$out/image.txt"
    fi
    if step 6p; then
        echo "== 6p. what the GPU spends on two 1-step images, the first with cuDNN's measurements (Nsight Compute)"
        local ncu; ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
        if [ -n "$ncu" ]; then
            timeout 150 "$ncu" --metrics gpu__time_duration.sum --csv --print-units base \
                --clock-control none --cache-control none "$bin/bench_imagine" \
                --device cuda --dtype f16 --random-full --sizes 1024 --steps 1 --runs 1 --guidance 0 \
                2>/dev/null | python3 scripts/gpu/step_profile.py 16 30
        fi
    fi
    if step 7; then
        echo "== 7. what the GPU spends on a one-stream decode step (Nsight Compute)"
        profile --launch-skip 3000 --launch-count 400 -- --vocab 49152 --streams 1 --gen 64
        echo "== 7a. and a 64-stream decode step"
        profile --launch-skip 3000 --launch-count 400 -- --vocab 49152 --streams 64 --gen 64
        if [ -z "$short" ]; then
        echo "== 7b. and a prefill of 32 prompts of 128 tokens (the f16 file, no warm-up)"
        write_models
        profile_prefill
        fi
    fi
    echo "== 8. summary"
    python3 scripts/gpu/summary.py "$out" | tee "$out/summary.json"
}

# A minute's look at the decode path: the f16 and Q8_0 files with CUDA graphs, without
# (HEARTH_CUDA_GRAPHS=off), and without the one-row kernels too (HEARTH_GEMV=off); the Q8_0 file
# against the CPU path (graphs against no graphs with it); a 32-stream prefill's kernels.
quick() {
    local out="${1:-${OUT:-/tmp/bench-gpu}}"
    mkdir -p "$out" "$WORK"
    unpack
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    uptime
    write_models
    echo "== decode steps as CUDA graphs, then launch by launch, then without the one-row kernels"
    for m in llama-1b-f16 llama-1b-q8; do
        timeout 40 "$bin/bench_device" --device cuda --file "$WORK/$m.gguf" --streams 1,8 \
            2>&1 | tag "hearth-file-$m" | tee -a "$out/text.jsonl"
        HEARTH_CUDA_GRAPHS=off timeout 40 "$bin/bench_device" --device cuda \
            --file "$WORK/$m.gguf" --streams 1,8 2>&1 | tag "hearth-file-$m-no-graphs" |
            tee -a "$out/text.jsonl"
        HEARTH_CUDA_GRAPHS=off HEARTH_GEMV=off timeout 40 "$bin/bench_device" --device cuda \
            --file "$WORK/$m.gguf" --streams 1 2>&1 | tag "hearth-file-$m-cublas-rows" |
            tee -a "$out/text.jsonl"
    done
    echo "== the Q8_0 file on the GPU against the CPU path"
    timeout 60 "$bin/device_check" --device cuda "$WORK/llama-1b-q8.gguf" 2>&1 |
        tee "$out/check.jsonl"
    echo "== a 32-stream prefill's kernels (Nsight Compute)"
    profile_prefill
}

case "${1:-}" in
    prepare) prepare ;;
    unpack-llama) unpack_llama ;;
    run)
        shift
        dir="${1:-${OUT:-/tmp/bench-gpu}}"
        mkdir -p "$dir"
        run "$dir" 2>&1 | tee "$dir/run.log"
        ;;
    check) shift; check "$@" ;;
    quick)
        shift
        dir="${1:-${OUT:-/tmp/bench-gpu}}"
        mkdir -p "$dir"
        quick "$dir" 2>&1 | tee "$dir/quick.log"
        ;;
    *) echo "usage: scripts/bench-gpu.sh prepare | unpack-llama | run [DIR] | check [DIR] | quick [DIR]" >&2
       exit 2 ;;
esac
