#!/usr/bin/env bash
# Fetches SDXL-Lightning (4-step UNet) with the SDXL base text encoders, tokenizers, scheduler
# config and the fp16-safe VAE into weights/sdxl-lightning/ in the diffusers layout that
# `[image."xl-lightning"] weights = "weights/sdxl-lightning"` in models.toml expects.
# Needs a machine that reaches the Hugging Face hub; uses the huggingface_hub package from PyPI.
#   scripts/fetch-sdxl.sh [DEST] [STEPS]      # STEPS: 1, 2, 4 (default) or 8
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-weights/sdxl-lightning}
STEPS=${2:-4}
VENV=${VENV:-.venv-sdxl}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --progress-bar off "huggingface_hub>=0.24"
"$VENV/bin/python" - "$DEST" "$STEPS" <<'PY'
import shutil, sys
from pathlib import Path
from huggingface_hub import hf_hub_download, snapshot_download

dest, steps = Path(sys.argv[1]), sys.argv[2]
base = "stabilityai/stable-diffusion-xl-base-1.0"
dest.mkdir(parents=True, exist_ok=True)
snap = Path(snapshot_download(base, allow_patterns=[
    "model_index.json", "scheduler/*", "tokenizer/*", "tokenizer_2/*",
    "text_encoder/config.json", "text_encoder/model.fp16.safetensors",
    "text_encoder_2/config.json", "text_encoder_2/model.fp16.safetensors",
    "unet/config.json", "vae/config.json",
]))
for f in snap.rglob("*"):
    if f.is_file():
        out = dest / f.relative_to(snap)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, out)
unet = hf_hub_download("ByteDance/SDXL-Lightning", f"sdxl_lightning_{steps}step_unet.safetensors")
shutil.copyfile(unet, dest / "unet/diffusion_pytorch_model.safetensors")
# The fp16-safe VAE (same architecture, config force_upcast=false) so GPUs can decode in f16.
for name in ["config.json", "diffusion_pytorch_model.safetensors"]:
    shutil.copyfile(hf_hub_download("madebyollin/sdxl-vae-fp16-fix", name), dest / "vae" / name)
print(f"SDXL-Lightning {steps}-step written to {dest}")
PY
