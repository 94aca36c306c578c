"""What Hearth's SDXL reference scripts share (scripts/sdxl-parity.py, scripts/sdxl-lora-parity.py):
the tiny model's components loaded strictly into diffusers + transformers, and file digests.

A component loaded with any missing, unexpected or mismatched tensor stops the script: the
reference must run the very weights Hearth runs.
"""

import hashlib
import sys
from pathlib import Path

from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer


def strict(loaded, what):
    model, info = loaded
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if bad or info.get("error_msgs"):
        sys.exit(f"{what}: weights do not match the reference architecture: {info}")
    return model.eval()


def file_digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_unet(model_dir):
    return strict(UNet2DConditionModel.from_pretrained(Path(model_dir) / "unet", output_loading_info=True), "unet")


def text_encoders(model_dir):
    model_dir = Path(model_dir)
    te1 = strict(CLIPTextModel.from_pretrained(model_dir / "text_encoder", output_loading_info=True), "text_encoder")
    te2 = strict(
        CLIPTextModelWithProjection.from_pretrained(model_dir / "text_encoder_2", output_loading_info=True),
        "text_encoder_2",
    )
    return te1, te2


def components(model_dir):
    """Every component of a diffusers-layout SDXL folder, as the pipelines' keyword arguments."""
    model_dir = Path(model_dir)
    te1, te2 = text_encoders(model_dir)
    return dict(
        vae=strict(AutoencoderKL.from_pretrained(model_dir / "vae", output_loading_info=True), "vae"),
        text_encoder=te1,
        text_encoder_2=te2,
        tokenizer=CLIPTokenizer.from_pretrained(model_dir / "tokenizer"),
        tokenizer_2=CLIPTokenizer.from_pretrained(model_dir / "tokenizer_2"),
        unet=load_unet(model_dir),
        scheduler=EulerDiscreteScheduler.from_pretrained(model_dir / "scheduler"),
    )


def text_to_image(parts):
    pipe = StableDiffusionXLPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe
