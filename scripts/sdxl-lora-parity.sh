#!/usr/bin/env bash
# Regenerates tests/fixtures/imagine/lora/: a LoRA file in each layout Hearth reads (peft and
# kohya), made seeded for the tiny SDXL model Hearth's generator writes, and the latents diffusers
# + peft (torch, CPU) generate with them through `load_lora_weights`. The Rust side is
# crates/imagine/tests/lora/. Needs PyPI; the venv lives in the git-ignored .venv-sdxl/.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-sdxl
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --progress-bar off \
  "torch>=2.4" "diffusers>=0.34" "transformers>=4.44" "peft>=0.15" safetensors numpy
MODEL=$(mktemp -d)
trap 'rm -rf "$MODEL"' EXIT
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo run --quiet -p hearth-imagine --example tiny_sdxl -- "$MODEL"
"$VENV/bin/python" scripts/sdxl-lora-parity.py "$MODEL" tests/fixtures/imagine/lora
