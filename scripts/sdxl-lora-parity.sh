#!/usr/bin/env bash
# Regenerates tests/fixtures/imagine/lora/: a LoRA file in each layout Hearth reads (peft and
# kohya), made seeded for the tiny SDXL model Hearth's generator writes, and the latents diffusers
# + peft (torch, CPU) generate with them through `load_lora_weights`. The Rust side is
# crates/imagine/tests/lora/. Needs PyPI; the venv lives in the git-ignored .venv-sdxl/.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/sdxl-venv.sh
MODEL=$(mktemp -d)
trap 'rm -rf "$MODEL"' EXIT
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo run --quiet -p hearth-imagine --example tiny_sdxl -- "$MODEL"
"$SDXL_PYTHON" scripts/sdxl-lora-parity.py "$MODEL" tests/fixtures/imagine/lora
