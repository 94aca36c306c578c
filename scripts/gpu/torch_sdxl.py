"""The PyTorch side of the GPU image benchmark: SDXL base's full-size shapes (both CLIP text
encoders, the UNet, the VAE) with random weights in f16 on the GPU, run by diffusers and
transformers, timed as bench_imagine times Hearth: prompt encoding, each UNet step at the given
size (one batch row per step: no classifier-free guidance, as SDXL-Lightning), the VAE decode.
Prints one JSON line.

    python3 scripts/gpu/torch_sdxl.py [--size 1024] [--steps 4] [--runs 2]
"""
import argparse
import json
import time

import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    dev, dt = "cuda", torch.float16
    torch.manual_seed(7)
    t = time.time()
    with torch.device(dev):
        te1 = CLIPTextModel(CLIPTextConfig(
            vocab_size=49408, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
            num_hidden_layers=12, hidden_act="quick_gelu", projection_dim=768)).to(dt).eval()
        te2 = CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_attention_heads=20,
            num_hidden_layers=32, hidden_act="gelu", projection_dim=1280)).to(dt).eval()
        unet = UNet2DConditionModel(
            sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
            block_out_channels=(320, 640, 1280),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=(5, 10, 20), transformer_layers_per_block=(1, 2, 10),
            cross_attention_dim=2048, use_linear_projection=True,
            addition_embed_type="text_time", addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=2816).to(dt).eval()
        vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
            block_out_channels=(128, 256, 512, 512),
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4).to(dt).eval()
    torch.cuda.synchronize()
    print(f"torch SDXL-shaped model made in {time.time() - t:.1f} s, UNet "
          f"{sum(p.numel() for p in unet.parameters()) / 1e9:.2f}B parameters", flush=True)
    ids = torch.randint(0, 49408, (1, 77), device=dev)
    lat_size = a.size // 8

    @torch.inference_mode()
    def image():
        torch.cuda.synchronize()
        t0 = time.time()
        h1 = te1(ids, output_hidden_states=True).hidden_states[-2]
        o2 = te2(ids, output_hidden_states=True)
        ctx = torch.cat([h1, o2.hidden_states[-2]], dim=-1)
        pooled = o2.text_embeds
        time_ids = torch.tensor([[a.size, a.size, 0, 0, a.size, a.size]], device=dev, dtype=dt)
        torch.cuda.synchronize()
        enc = time.time() - t0
        lat = torch.randn(1, 4, lat_size, lat_size, device=dev, dtype=dt)
        steps = []
        for i in range(a.steps):
            t1 = time.time()
            eps = unet(lat, 999 - 250 * i, encoder_hidden_states=ctx,
                       added_cond_kwargs={"text_embeds": pooled, "time_ids": time_ids}).sample
            lat = lat - 0.1 * eps
            torch.cuda.synchronize()
            steps.append(time.time() - t1)
        t1 = time.time()
        img = vae.decode(lat / 0.13025).sample
        img = ((img.clamp(-1, 1) + 1) * 127.5).to(torch.uint8).cpu()
        dec = time.time() - t1
        return enc, steps, dec, time.time() - t0

    image()
    runs = [image() for _ in range(a.runs)]
    n = len(runs)
    print(json.dumps({
        "engine": "torch-diffusers", "size": a.size, "steps": a.steps, "runs": n,
        "s_per_image": round(sum(r[3] for r in runs) / n, 4),
        "s_per_step": round(sum(sum(r[1]) / len(r[1]) for r in runs) / n, 5),
        "encode_s": round(sum(r[0] for r in runs) / n, 5),
        "decode_s": round(sum(r[2] for r in runs) / n, 4),
    }), flush=True)


if __name__ == "__main__":
    main()
