#!/usr/bin/env bash
# Regenerates tests/fixtures/imagine/sdxl-parity.{safetensors,json}: the reference outputs of
# diffusers + transformers (torch, CPU) on the tiny SDXL model written by Hearth's generator.
# Needs PyPI (torch, diffusers, transformers); the venv lives in the git-ignored .venv-sdxl/.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/sdxl-venv.sh
MODEL=$(mktemp -d)
INPAINT=$(mktemp -d)
trap 'rm -rf "$MODEL" "$INPAINT"' EXIT
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo run --quiet -p hearth-imagine --example tiny_sdxl -- "$MODEL"
cargo run --quiet -p hearth-imagine --example tiny_sdxl -- --inpainting "$INPAINT"
"$SDXL_PYTHON" scripts/sdxl-parity.py "$MODEL" tests/fixtures/imagine/sdxl-parity.safetensors "$INPAINT"
