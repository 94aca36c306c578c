#!/usr/bin/env bash
# What an image job's progress costs per denoising step (issue 37): the step event and a preview
# decoded from the latents, each as a share of the step's own time, and a whole job through the
# worker with a preview every 4 steps against the bare pipeline. The tiny test model on the CPU
# (its short steps are the worst case for a fixed cost per step).
#   scripts/bench-image-jobs.sh                         # 256² and 512², 8 steps, 3 runs
#   scripts/bench-image-jobs.sh --sizes 1024 --runs 1
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
PROFILE=${PROFILE:-release}
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--sizes 256,512 --steps 8 --runs 3)
cargo run --quiet --profile "$PROFILE" -p hearth-imagine --example bench_jobs -- "${ARGS[@]}"
