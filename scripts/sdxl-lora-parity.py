#!/usr/bin/env python3
"""Reference LoRA files and latents for Hearth's SDXL LoRA support, made with diffusers + peft.

Usage (see scripts/sdxl-lora-parity.sh, which builds the venv and the tiny model first):
    python scripts/sdxl-lora-parity.py MODEL_DIR OUT_DIR

MODEL_DIR is the tiny SDXL-shaped model Hearth's generator writes (seed TINY_SEED). Seeded, this
script writes two LoRA files for it into OUT_DIR:

  * peft.safetensors, diffusers/peft layout (`unet.<module>.lora_A.weight`, ...), made with
    peft's `add_adapter` and saved by `StableDiffusionXLPipeline.save_lora_weights` with the
    adapter configs in its metadata: every UNet attention projection (rank 4, lora_alpha 8,
    an alpha_pattern giving attn2.to_k alpha 2), both text encoders' attention projections
    (text_encoder rank 2 alpha 4; text_encoder_2 rank 4, no alpha, also fc1/fc2);
  * kohya.safetensors, kohya (sd-scripts) layout with the SGM UNet names SDXL kohya files use
    (`lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q.lora_down.weight`, ...), in
    float16 with `.alpha` tensors: every UNet attention projection (rank 4) and a LoCon on a
    resnet's conv1, a conv_shortcut, a time_emb_proj and an upsampler (rank 2), all alpha 2;
    text_encoder's attention and MLP (rank 2, alpha 1);

then loads them into `StableDiffusionXLPipeline` with `load_lora_weights(adapter_name=...)` and
runs the fixed-noise 4-step generation of scripts/sdxl-parity.py (guidance 0, latents out) with
`set_adapters` at scales other than 1: each alone and both together. reference.safetensors
holds the noise, the latents without LoRA and with each, and the prompt embeddings with each;
reference.json the settings. crates/imagine/tests/lora/ recomputes every one with Hearth.

Before generating, `check_loaded` makes sure diffusers loaded every weight of both files: under
transformers 5, `load_adapter` logs a "LOAD REPORT" calling text_encoder's LoRA weights MISSING
(its `CLIPTextModel` has no `text_model.` level any more), yet they hold the file's values.
"""

import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from diffusers import StableDiffusionXLPipeline
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
import diffusers
import peft
import transformers
import transformers.integrations.peft as transformers_peft

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sdxl_reference import components as reference_components  # noqa: E402
from sdxl_reference import file_digest, load_unet, text_encoders, text_to_image  # noqa: E402

# transformers 5.x asks for peft >= 0.22, which PyPI does not have yet; the text encoders' LoRA
# (add_adapter, load_adapter) works with 0.21, so its version check is lifted for this script.
transformers_peft.check_peft_version = lambda min_version: None

PROMPT = "a photo of an astronaut riding a horse on the moon"
GEN_SIZE = 64
GEN_STEPS = 4
PEFT_SCALE = 0.7
KOHYA_SCALE = 1.3
ATTENTION = ("to_q", "to_k", "to_v", "to_out.0")


def components(model_dir):
    te1, te2 = text_encoders(model_dir)
    return te1, te2, load_unet(model_dir)


def pipeline(model_dir):
    return text_to_image(reference_components(model_dir))


def hub_path(path):
    """A text encoder's module path as the checkpoints (and real LoRA files) spell it: transformers
    5 dropped the `text_model.` level from `CLIPTextModel`, not from the files."""
    return path if path.startswith("text_model.") else "text_model." + path


def randomize(model, g):
    """Seeded values for every LoRA weight (peft starts lora_B at zero, which would do nothing)."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if ".lora_A." in name:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            elif ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 / math.sqrt(p.shape[1]))


def write_peft(model_dir, out):
    te1, te2, unet = components(model_dir)
    g = torch.Generator().manual_seed(11)
    configs = {
        "unet": LoraConfig(r=4, lora_alpha=8, target_modules=list(ATTENTION), alpha_pattern={"attn2.to_k": 2}),
        "text_encoder": LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"]),
        "text_encoder_2": LoraConfig(
            r=4, lora_alpha=4, target_modules=["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
        ),
    }
    layers = {}
    for name, model in (("unet", unet), ("text_encoder", te1), ("text_encoder_2", te2)):
        model.add_adapter(configs[name], adapter_name="gen")
        randomize(model, g)
        sd = get_peft_model_state_dict(model, adapter_name="gen")
        layers[name] = sd if name == "unet" else {hub_path(k): v for k, v in sd.items()}
    # Without the model's temporary path, the target set in order: the file's bytes depend on the
    # seeds alone.
    meta = {
        name: {**c.to_dict(), "base_model_name_or_path": None, "target_modules": sorted(c.target_modules)}
        for name, c in configs.items()
    }
    StableDiffusionXLPipeline.save_lora_weights(
        out.parent, weight_name=out.name,
        unet_lora_layers=layers["unet"], text_encoder_lora_layers=layers["text_encoder"],
        text_encoder_2_lora_layers=layers["text_encoder_2"],
        unet_lora_adapter_metadata=meta["unet"], text_encoder_lora_adapter_metadata=meta["text_encoder"],
        text_encoder_2_lora_adapter_metadata=meta["text_encoder_2"],
    )
    sort_metadata(out)


def sort_metadata(path):
    """Rewrites a safetensors header with its `__metadata__` keys in order (safetensors writes
    them in hash order), so that the same LoRA is the same bytes."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    path.write_bytes(data[:8] + text + b" " * (n - len(text)) + data[8 + n:])


def sgm(path, layers, up_attention):
    """The SGM name of a diffusers UNet module path (as kohya's SDXL trainer names modules)."""
    p = path.split(".")
    per = layers + 1
    resnet = {"conv1": "in_layers.2", "conv2": "out_layers.3", "time_emb_proj": "emb_layers.1",
              "conv_shortcut": "skip_connection"}
    if p[0] == "down_blocks":
        n = 1 + int(p[1]) * per + int(p[3])
        if p[2] == "resnets":
            return f"input_blocks.{n}.0.{resnet['.'.join(p[4:])]}"
        if p[2] == "attentions":
            return f"input_blocks.{n}.1." + ".".join(p[4:])
    if p[0] == "mid_block":
        if p[1] == "attentions":
            return "middle_block.1." + ".".join(p[3:])
        return f"middle_block.{2 * int(p[2])}.{resnet['.'.join(p[3:])]}"
    if p[0] == "up_blocks":
        i = int(p[1])
        if p[2] == "upsamplers":
            return f"output_blocks.{i * per + layers}.{2 if up_attention[i] else 1}.conv"
        n = i * per + int(p[3])
        if p[2] == "resnets":
            return f"output_blocks.{n}.0.{resnet['.'.join(p[4:])]}"
        return f"output_blocks.{n}.1." + ".".join(p[4:])
    raise ValueError(path)


def write_kohya(model_dir, out):
    te1, _, unet = components(model_dir)
    g = torch.Generator().manual_seed(12)
    layers = unet.config.layers_per_block
    up_attention = [t.startswith("CrossAttn") for t in unet.config.up_block_types]
    convs = ("down_blocks.1.resnets.0.conv1", "up_blocks.1.resnets.2.conv_shortcut",
             "mid_block.resnets.0.time_emb_proj", "up_blocks.0.upsamplers.0.conv")
    sd = {}

    def add(name, module, rank, alpha):
        w = module.weight
        fan_in = w[0].numel()
        if w.dim() == 4:
            down = torch.randn(rank, w.shape[1], w.shape[2], w.shape[3], generator=g)
            up = torch.randn(w.shape[0], rank, 1, 1, generator=g)
        else:
            down = torch.randn(rank, w.shape[1], generator=g)
            up = torch.randn(w.shape[0], rank, generator=g)
        sd[f"{name}.lora_down.weight"] = (down / math.sqrt(fan_in)).half()
        sd[f"{name}.lora_up.weight"] = (up * 0.5 / math.sqrt(rank)).half()
        sd[f"{name}.alpha"] = torch.tensor(alpha).half()

    for path, module in unet.named_modules():
        if path.endswith(ATTENTION) and ".transformer_blocks." in path:
            add("lora_unet_" + sgm(path, layers, up_attention).replace(".", "_"), module, 4, 2.0)
        elif path in convs:
            add("lora_unet_" + sgm(path, layers, up_attention).replace(".", "_"), module, 2, 2.0)
    for path, module in te1.named_modules():
        if path.endswith(("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")):
            add("lora_te1_" + hub_path(path).replace(".", "_"), module, 2, 1.0)
    save_file(dict(sorted(sd.items())), str(out), metadata={"ss_network_module": "networks.lora"})


def check_loaded(pipe, out):
    """diffusers loaded every LoRA weight of both files (a weight it misses it leaves at peft's
    initial value, lora_B zero, silently but for a log line): the peft file's values exactly, and
    as many modules per component as each file has, none of them zero."""
    from safetensors.torch import load_file

    peft_file = load_file(str(out / "peft.safetensors"))
    kohya_file = load_file(str(out / "kohya.safetensors"))
    prefixes = {"unet": "lora_unet_", "text_encoder": "lora_te1_", "text_encoder_2": "lora_te2_"}
    for component in ("unet", "text_encoder", "text_encoder_2"):
        model = getattr(pipe, component)
        for adapter, file in (("peft", peft_file), ("kohya", kohya_file)):
            loaded = {n: p for n, p in model.named_parameters() if f".{adapter}." in n}
            if adapter == "peft":
                want = {k for k in file if k.startswith(component + ".")}
                for n, p in loaded.items():
                    path = n.replace(f".{adapter}.", ".")
                    key = f"{component}.{path if component == 'unet' else hub_path(path)}"
                    assert torch.equal(p.detach(), file[key]), f"{key} differs from the file"
                    want.discard(key)
                assert not want, f"diffusers did not load {sorted(want)[:3]}"
            else:
                want = sum(1 for k in file if k.startswith(prefixes[component]) and k.endswith("lora_up.weight"))
                ups = [p for n, p in loaded.items() if ".lora_B." in n]
                assert len(ups) == want, f"{component}: {len(ups)} kohya modules loaded of {want}"
                assert all(p.abs().max() > 0 for p in ups), f"{component}: a kohya module left at zero"


def generate(pipe, noise):
    return pipe(
        prompt=PROMPT, height=GEN_SIZE, width=GEN_SIZE, num_inference_steps=GEN_STEPS,
        guidance_scale=0.0, latents=noise.clone(), output_type="latent",
    ).images


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def main():
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    write_peft(model_dir, out / "peft.safetensors")
    write_kohya(model_dir, out / "kohya.safetensors")

    pipe = pipeline(model_dir)
    t = {}
    with torch.no_grad():
        noise = torch.randn(1, 4, GEN_SIZE // 8, GEN_SIZE // 8, generator=torch.Generator().manual_seed(7))
        t["noise"] = noise
        t["base_latents"] = generate(pipe, noise)
        base_embeds, _, base_pooled, _ = pipe.encode_prompt(PROMPT, do_classifier_free_guidance=False)
        pipe.load_lora_weights(str(out / "peft.safetensors"), adapter_name="peft")
        pipe.load_lora_weights(str(out / "kohya.safetensors"), adapter_name="kohya")
        check_loaded(pipe, out)
        for name, adapters, scales in (
            ("peft", ["peft"], [PEFT_SCALE]),
            ("kohya", ["kohya"], [KOHYA_SCALE]),
            ("both", ["peft", "kohya"], [PEFT_SCALE, KOHYA_SCALE]),
        ):
            pipe.set_adapters(adapters, adapter_weights=scales)
            t[f"{name}_latents"] = generate(pipe, noise)
            embeds, _, pooled, _ = pipe.encode_prompt(PROMPT, do_classifier_free_guidance=False)
            t[f"{name}_prompt_embeds"], t[f"{name}_pooled"] = embeds, pooled
            # Not vacuous: each LoRA moves the text embeddings and the latents.
            for what, ours, base in (("latents", t[f"{name}_latents"], t["base_latents"]),
                                     ("prompt embeds", embeds, base_embeds)):
                d = rel(ours, base)
                print(f"{name:6s} {what}: relative change {d:.3e}")
                assert d > 1e-2, f"{name}: the LoRA barely changed the {what}"
        d = rel(t["peft_pooled"], base_pooled)
        assert d > 1e-2, f"peft: text_encoder_2's LoRA barely changed the pooled output ({d})"
        # A scale of 0 is the model without LoRA.
        pipe.set_adapters(["peft", "kohya"], adapter_weights=[0.0, 0.0])
        zero = generate(pipe, noise)
        assert rel(zero, t["base_latents"]) < 1e-6, "scale 0 should be the base model"

    meta = {
        "prompt": PROMPT, "gen_size": str(GEN_SIZE), "gen_steps": str(GEN_STEPS),
        "peft_scale": str(PEFT_SCALE), "kohya_scale": str(KOHYA_SCALE),
        "unet_sha256": file_digest(model_dir / "unet/diffusion_pytorch_model.safetensors"),
        "te1_sha256": file_digest(model_dir / "text_encoder/model.safetensors"),
        "te2_sha256": file_digest(model_dir / "text_encoder_2/model.safetensors"),
        "versions": json.dumps({"torch": torch.__version__, "diffusers": diffusers.__version__,
                                "transformers": transformers.__version__, "peft": peft.__version__}),
    }
    save_file({k: v.contiguous() for k, v in t.items()}, str(out / "reference.safetensors"))
    (out / "reference.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    for k, v in t.items():
        print(f"{k:22s} {tuple(v.shape)} mean={v.double().mean():+.5f} std={v.double().std():.5f}")
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({total} bytes)")
    assert total < 1_000_000, "fixtures should stay under 1 MB"


if __name__ == "__main__":
    main()
