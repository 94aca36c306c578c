"""The PyTorch side of the GPU text benchmark: the same llama shape as bench_device (random
weights, f16, on the GPU), run by Hugging Face transformers' LlamaForCausalLM, a plain PyTorch
implementation: one prefill call of all the streams' prompts, then decode steps of one token per
stream through its KV cache, greedy on the device. Prints one JSON line per stream count, in
bench_device's format.

    python3 scripts/gpu/torch_llama.py [--attn sdpa|eager] [--streams 1,8,32,64] [--prompt 128] [--gen 64]
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ff", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32768)
    a = ap.parse_args()
    cfg = LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ff,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, attn_implementation=a.attn,
    )
    torch.manual_seed(7)
    t = time.time()
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.float16).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"torch model: {params / 1e9:.2f}B parameters, {a.attn} attention, made in {time.time() - t:.1f} s",
          flush=True)

    @torch.inference_mode()
    def round_(b, prompt, gen):
        ids = (torch.arange(b * prompt, device="cuda").reshape(b, prompt) * 104729 + 7919) % a.vocab
        torch.cuda.synchronize()
        t0 = time.time()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        prefill = time.time() - t0
        past = out.past_key_values
        t0 = time.time()
        for _ in range(gen):
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        return prefill, time.time() - t0

    round_(2, 16, 4)
    for b in [int(s) for s in a.streams.split(",")]:
        prefill, decode = round_(b, a.prompt, a.gen)
        print(json.dumps({
            "engine": f"torch-{a.attn}", "streams": b, "prompt": a.prompt, "gen": a.gen,
            "prefill_tok_s": round(b * a.prompt / prefill, 1),
            "decode_tok_s": round(b * a.gen / decode, 1),
            "decode_step_ms": round(decode / a.gen * 1e3, 3),
        }), flush=True)


if __name__ == "__main__":
    main()
