#!/usr/bin/env bash
# The virtual environment of the SDXL reference scripts (scripts/sdxl-parity.sh,
# scripts/sdxl-lora-parity.sh): torch, diffusers, transformers and peft from PyPI, in the
# git-ignored .venv-sdxl/. Sourced: sets SDXL_PYTHON.
VENV=.venv-sdxl
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --progress-bar off \
  "torch>=2.4" "diffusers>=0.34" "transformers>=4.44" "peft>=0.15" safetensors numpy pillow
SDXL_PYTHON="$VENV/bin/python"
