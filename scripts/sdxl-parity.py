#!/usr/bin/env python3
"""Reference tensors for Hearth's SDXL pipeline, computed by diffusers + transformers (torch, CPU).

Usage (see scripts/sdxl-parity.sh, which builds the venv and the tiny model first):
    python scripts/sdxl-parity.py MODEL_DIR OUT.safetensors

MODEL_DIR is the tiny SDXL-shaped model written by `hearth dev tiny-sdxl` (Hearth's own
generator, seeded): the reference runs the *same weights* through the reference implementation.
Every component is loaded strictly (no missing, unexpected or mismatched tensor), then:

  * tokens of both tokenizers for a prompt,
  * text encoder 1 penultimate hidden states, text encoder 2 penultimate hidden states and its
    projected pooled output, and the pipeline's concatenated prompt embeddings,
  * one UNet evaluation (t = 999) on fixed latents with those embeddings and SDXL's time ids,
  * one VAE decode of fixed latents (divided by the configured scaling factor),
  * the Euler (trailing) schedule for 4 steps,
  * a full 4-step generation (guidance 0, as SDXL-Lightning) from fixed initial noise,
  * a 2-step generation with a negative prompt and classifier-free guidance scale 2,

are saved to OUT.safetensors, with the settings and weight digests in OUT.json. The Rust test
crates/imagine/tests/parity.rs recomputes each one with Hearth and compares.
"""

import hashlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer
from diffusers import (
    AutoencoderKL,
    EulerDiscreteScheduler,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
import diffusers
import transformers

PROMPT = "a photo of an astronaut riding a horse on the moon"
NEGATIVE = "blurry, dark, low quality"
UNET_SIZE = 128  # pixels; latents 16x16
VAE_SIZE = 64  # pixels; latents 8x8
GEN_SIZE = 64
GEN_STEPS = 4
CFG_STEPS = 2
CFG_SCALE = 2.0


def strict(loaded, what):
    model, info = loaded
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if bad or info.get("error_msgs"):
        sys.exit(f"{what}: weights do not match the reference architecture: {info}")
    return model.eval()


def file_digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main():
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(2)

    tok1 = CLIPTokenizer.from_pretrained(model_dir / "tokenizer")
    tok2 = CLIPTokenizer.from_pretrained(model_dir / "tokenizer_2")
    te1 = strict(CLIPTextModel.from_pretrained(model_dir / "text_encoder", output_loading_info=True), "text_encoder")
    te2 = strict(
        CLIPTextModelWithProjection.from_pretrained(model_dir / "text_encoder_2", output_loading_info=True),
        "text_encoder_2",
    )
    unet = strict(UNet2DConditionModel.from_pretrained(model_dir / "unet", output_loading_info=True), "unet")
    vae = strict(AutoencoderKL.from_pretrained(model_dir / "vae", output_loading_info=True), "vae")
    sched = EulerDiscreteScheduler.from_pretrained(model_dir / "scheduler")
    assert sched.config.timestep_spacing == "trailing"
    pipe = StableDiffusionXLPipeline(
        vae=vae, text_encoder=te1, text_encoder_2=te2, tokenizer=tok1, tokenizer_2=tok2,
        unet=unet, scheduler=sched,
    )
    pipe.set_progress_bar_config(disable=True)
    t = {}
    with torch.no_grad():
        ids1 = tok1(PROMPT, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        ids2 = tok2(PROMPT, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        t["tokens_1"] = ids1.to(torch.int64)
        t["tokens_2"] = ids2.to(torch.int64)
        o1 = te1(ids1, output_hidden_states=True)
        o2 = te2(ids2, output_hidden_states=True)
        t["te1_penultimate"] = o1.hidden_states[-2]
        t["te2_penultimate"] = o2.hidden_states[-2]
        t["te2_pooled"] = o2.text_embeds
        embeds, _, pooled, _ = pipe.encode_prompt(PROMPT, do_classifier_free_guidance=False)
        t["prompt_embeds"] = embeds
        t["pooled_prompt_embeds"] = pooled

        # One UNet step on fixed latents.
        g = torch.Generator().manual_seed(1)
        x = torch.randn(1, 4, UNET_SIZE // 8, UNET_SIZE // 8, generator=g)
        time_ids = torch.tensor([[UNET_SIZE, UNET_SIZE, 0, 0, UNET_SIZE, UNET_SIZE]], dtype=torch.float32)
        eps = unet(
            x, torch.tensor(999.0), encoder_hidden_states=embeds,
            added_cond_kwargs={"text_embeds": pooled, "time_ids": time_ids},
        ).sample
        t["unet_in"], t["unet_out"] = x, eps

        # One VAE decode on fixed latents.
        z = torch.randn(1, 4, VAE_SIZE // 8, VAE_SIZE // 8, generator=g) * 2.0
        t["vae_in"] = z
        t["vae_out"] = vae.decode(z / vae.config.scaling_factor).sample

        # The schedule.
        sched.set_timesteps(GEN_STEPS)
        t["sched_timesteps"] = sched.timesteps.to(torch.float32)
        t["sched_sigmas"] = sched.sigmas.to(torch.float32)

        # Full generation, guidance 0 (Lightning default), from fixed unit noise.
        noise = torch.randn(1, 4, GEN_SIZE // 8, GEN_SIZE // 8, generator=g)
        lat = pipe(
            prompt=PROMPT, height=GEN_SIZE, width=GEN_SIZE, num_inference_steps=GEN_STEPS,
            guidance_scale=0.0, latents=noise.clone(), output_type="latent",
        ).images
        t["gen_noise"], t["gen_latents"] = noise, lat
        t["gen_image"] = vae.decode(lat / vae.config.scaling_factor).sample

        # Negative prompt with classifier-free guidance.
        lat = pipe(
            prompt=PROMPT, negative_prompt=NEGATIVE, height=GEN_SIZE, width=GEN_SIZE,
            num_inference_steps=CFG_STEPS, guidance_scale=CFG_SCALE, latents=noise.clone(),
            output_type="latent",
        ).images
        t["cfg_latents"] = lat

    meta = {
        "prompt": PROMPT, "negative_prompt": NEGATIVE, "unet_size": str(UNET_SIZE),
        "vae_size": str(VAE_SIZE), "gen_size": str(GEN_SIZE), "gen_steps": str(GEN_STEPS),
        "cfg_steps": str(CFG_STEPS), "cfg_scale": str(CFG_SCALE), "unet_timestep": "999",
        "unet_sha256": file_digest(model_dir / "unet/diffusion_pytorch_model.safetensors"),
        "vae_sha256": file_digest(model_dir / "vae/diffusion_pytorch_model.safetensors"),
        "te1_sha256": file_digest(model_dir / "text_encoder/model.safetensors"),
        "te2_sha256": file_digest(model_dir / "text_encoder_2/model.safetensors"),
        "versions": json.dumps({"torch": torch.__version__, "diffusers": diffusers.__version__,
                                "transformers": transformers.__version__}),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, str(out), metadata=meta)
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    for k, v in t.items():
        print(f"{k:22s} {tuple(v.shape)} mean={v.double().mean():+.5f} std={v.double().std():.5f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
