#!/usr/bin/env bash
# Image generation benchmark: seconds per image and per step (default 512² and 1024², 4 steps).
# With no --model it times the tiny SDXL-shaped test model on the CPU.
#   scripts/bench-imagine.sh                               # tiny model, CPU
#   scripts/bench-imagine.sh --model weights/sdxl-lightning --sizes 1024 --device cuda   # needs --features cuda
# Extra cargo flags go in CARGO_FLAGS (e.g. CARGO_FLAGS="--features cuda").
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
PROFILE=${PROFILE:-release}
# shellcheck disable=SC2086
cargo run --quiet --profile "$PROFILE" -p hearth-imagine ${CARGO_FLAGS:-} --example bench_imagine -- "$@"
