#!/usr/bin/env bash
# One line naming the machine a benchmark ran on, for its raw output: the CPU model, the CPU
# count, the vector extensions the kernels choose between (AVX2, AVX-512, VNNI, AMX; Hearth's
# and llama.cpp's speeds differ by path) and the load average now.
set -euo pipefail
model="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-) "
isa=()
for f in avx2 avx512f avx512bw avx512_vnni avx_vnni amx_tile; do
    case "$flags" in *" $f "*) isa+=("$f") ;; esac
done
echo "machine: ${model:-unknown CPU}, $(nproc) CPUs, ${isa[*]:-no AVX2}; load average $(cut -d' ' -f1-3 /proc/loadavg)"
