#!/usr/bin/env python3
"""Reference tensors for Hearth's SDXL pipeline, computed by diffusers + transformers (torch, CPU).

Usage (see scripts/sdxl-parity.sh, which builds the venv and the tiny models first):
    python scripts/sdxl-parity.py MODEL_DIR OUT.safetensors INPAINT_MODEL_DIR

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
  * the VAE encoder's latent distribution (mean, std) of a fixed 64x64 picture,
  * image-to-image (StableDiffusionXLImg2ImgPipeline) at strength 0.5 over 4 steps, inpainting
    (StableDiffusionXLInpaintPipeline, the base UNet) at strength 0.75 over 4 steps, and at
    strength 1 over 2 steps with a negative prompt and guidance, with a mask whose edge holds the
    lumas 127 and 128 on either side of the binarization threshold,
  * inpainting with the tiny model's 9-channel inpainting UNet (INPAINT_MODEL_DIR, written by
    `tiny_sdxl --inpainting`): at strength 1 over 4 steps, and at 0.75 with guidance over 4,

are saved to OUT.safetensors, with the settings and weight digests in OUT.json. The Rust test
crates/imagine/tests/parity.rs recomputes each one with Hearth and compares.

The edits draw two normal tensors (the latent distribution's sample, then the noise). Hearth
draws its own from the seed, so diffusers' `randn_tensor` is replaced here by one that hands out
fixed tensors, saved with the rest, which the Rust test passes to Hearth.
"""

import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline
import diffusers
import diffusers.models.autoencoders.vae as vae_module
import diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl_img2img as img2img_module
import diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl_inpaint as inpaint_module
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sdxl_reference import components, file_digest, load_unet, text_to_image  # noqa: E402

PROMPT = "a photo of an astronaut riding a horse on the moon"
NEGATIVE = "blurry, dark, low quality"
UNET_SIZE = 128  # pixels; latents 16x16
VAE_SIZE = 64  # pixels; latents 8x8
GEN_SIZE = 64
GEN_STEPS = 4
CFG_STEPS = 2
CFG_SCALE = 2.0
EDIT_SIZE = 64
IMG2IMG_STRENGTH = 0.5
INPAINT_STRENGTH = 0.75
EDIT_STEPS = 4
INPAINT_CFG_STEPS = 2


def edit_picture():
    """A fixed RGB picture with structure at every scale: gradients, a checker, a disc."""
    y, x = np.mgrid[0:EDIT_SIZE, 0:EDIT_SIZE]
    r = (x * 4) % 256
    g = (y * 4) % 256
    b = np.where(((x // 8) + (y // 8)) % 2 == 0, 40, 210)
    disc = (x - 40) ** 2 + (y - 24) ** 2 < 12 ** 2
    r = np.where(disc, 250, r)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def edit_mask():
    """Repaint a rectangle (luma 255 and 128), keep the rest (0 and 127)."""
    m = np.zeros((EDIT_SIZE, EDIT_SIZE), dtype=np.uint8)
    m[16:48, 8:40] = 255
    m[16:48, 40:48] = 128  # just repaints
    m[48:56, 8:48] = 127  # just keeps
    return m


@contextlib.contextmanager
def fixed_draws(*tensors):
    """diffusers' randn_tensor handing out `tensors` in order (then zeros); all must be used."""
    queue = list(tensors)

    def draw(shape, generator=None, device=None, dtype=None, layout=None):
        if not queue:
            return torch.zeros(shape, dtype=dtype)
        t = queue.pop(0)
        assert tuple(t.shape) == tuple(shape), (t.shape, shape)
        return t.clone().to(dtype=dtype)

    modules = [vae_module, img2img_module, inpaint_module]
    saved = [m.randn_tensor for m in modules]
    for m in modules:
        m.randn_tensor = draw
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.randn_tensor = f
    assert not queue, f"{len(queue)} fixed draws unused"


def main():
    model_dir, out, inpaint_dir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    torch.manual_seed(0)
    torch.set_num_threads(2)

    parts = components(model_dir)
    tok1, tok2 = parts["tokenizer"], parts["tokenizer_2"]
    te1, te2 = parts["text_encoder"], parts["text_encoder_2"]
    unet, vae, sched = parts["unet"], parts["vae"], parts["scheduler"]
    assert sched.config.timestep_spacing == "trailing"
    pipe = text_to_image(parts)
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

        # Edits: the encoder, image-to-image and inpainting.
        picture, mask = edit_picture(), edit_mask()
        t["edit_image"], t["edit_mask"] = torch.from_numpy(picture), torch.from_numpy(mask)
        pixels = torch.from_numpy(picture).float().permute(2, 0, 1).unsqueeze(0) / 255.0 * 2 - 1
        dist = vae.encode(pixels).latent_dist
        t["enc_mean"], t["enc_std"] = dist.mean, dist.std
        shape = (1, 4, EDIT_SIZE // 8, EDIT_SIZE // 8)
        posterior = torch.randn(shape, generator=g)
        edit_noise = torch.randn(shape, generator=g)
        t["edit_posterior"], t["edit_noise"] = posterior, edit_noise
        img2img = StableDiffusionXLImg2ImgPipeline(**parts, requires_aesthetics_score=False)
        inpaint = StableDiffusionXLInpaintPipeline(**parts, requires_aesthetics_score=False)
        for p in (img2img, inpaint):
            p.set_progress_bar_config(disable=True)
        with fixed_draws(posterior, edit_noise):
            t["img2img_latents"] = img2img(
                prompt=PROMPT, image=Image.fromarray(picture), strength=IMG2IMG_STRENGTH,
                num_inference_steps=EDIT_STEPS, guidance_scale=0.0, output_type="latent",
            ).images
        with fixed_draws(posterior, edit_noise):
            t["inpaint_latents"] = inpaint(
                prompt=PROMPT, image=Image.fromarray(picture), mask_image=Image.fromarray(mask),
                height=EDIT_SIZE, width=EDIT_SIZE, strength=INPAINT_STRENGTH,
                num_inference_steps=EDIT_STEPS, guidance_scale=0.0, output_type="latent",
            ).images
        with fixed_draws(posterior, edit_noise):
            t["inpaint_cfg_latents"] = inpaint(
                prompt=PROMPT, negative_prompt=NEGATIVE, image=Image.fromarray(picture),
                mask_image=Image.fromarray(mask), height=EDIT_SIZE, width=EDIT_SIZE,
                strength=1.0, num_inference_steps=INPAINT_CFG_STEPS, guidance_scale=CFG_SCALE,
                output_type="latent",
            ).images

        # The 9-channel inpainting UNet: its own latents, mask and masked-picture input.
        unet9 = load_unet(inpaint_dir)
        assert unet9.config.in_channels == 9
        inpaint9 = StableDiffusionXLInpaintPipeline(**{**parts, "unet": unet9},
                                                    requires_aesthetics_score=False)
        inpaint9.set_progress_bar_config(disable=True)
        masked_posterior = torch.randn(shape, generator=g)
        t["edit_masked_posterior"] = masked_posterior
        # Strength 1: the picture itself is not encoded; the noise, then the masked picture's draw.
        with fixed_draws(edit_noise, masked_posterior):
            t["inpaint9_latents"] = inpaint9(
                prompt=PROMPT, image=Image.fromarray(picture), mask_image=Image.fromarray(mask),
                height=EDIT_SIZE, width=EDIT_SIZE, strength=1.0, num_inference_steps=EDIT_STEPS,
                guidance_scale=0.0, output_type="latent",
            ).images
        with fixed_draws(posterior, edit_noise, masked_posterior):
            t["inpaint9_cfg_latents"] = inpaint9(
                prompt=PROMPT, negative_prompt=NEGATIVE, image=Image.fromarray(picture),
                mask_image=Image.fromarray(mask), height=EDIT_SIZE, width=EDIT_SIZE,
                strength=INPAINT_STRENGTH, num_inference_steps=EDIT_STEPS,
                guidance_scale=CFG_SCALE, output_type="latent",
            ).images

    meta = {
        "prompt": PROMPT, "negative_prompt": NEGATIVE, "unet_size": str(UNET_SIZE),
        "vae_size": str(VAE_SIZE), "gen_size": str(GEN_SIZE), "gen_steps": str(GEN_STEPS),
        "cfg_steps": str(CFG_STEPS), "cfg_scale": str(CFG_SCALE), "unet_timestep": "999",
        "edit_size": str(EDIT_SIZE), "edit_steps": str(EDIT_STEPS),
        "img2img_strength": str(IMG2IMG_STRENGTH), "inpaint_strength": str(INPAINT_STRENGTH),
        "inpaint_cfg_steps": str(INPAINT_CFG_STEPS),
        "unet_sha256": file_digest(model_dir / "unet/diffusion_pytorch_model.safetensors"),
        "vae_sha256": file_digest(model_dir / "vae/diffusion_pytorch_model.safetensors"),
        "te1_sha256": file_digest(model_dir / "text_encoder/model.safetensors"),
        "te2_sha256": file_digest(model_dir / "text_encoder_2/model.safetensors"),
        "inpaint_unet_sha256": file_digest(inpaint_dir / "unet/diffusion_pytorch_model.safetensors"),
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
