"""The exact scores of a generated Qwen3 reranker (tests/fixtures/embed/decoders): its weights
dequantized and the forward computed in float64 with numpy, for the prompts llama.cpp recorded in
rerankers.json, printed beside llama.cpp's scores. It shows how far the quantized engines' own
rounding (8-bit activations, an f16 cache) moves a score, and so what tolerance
crates/embed/tests/decoder_rerank.rs may hold Hearth to against llama.cpp.

    .venv-embed/bin/python scripts/embed/rank_f64.py tests/fixtures/embed/decoders/FILE.gguf \
        tests/fixtures/embed/decoders/rerankers.json

Needs numpy and llama.cpp's gguf-py (scripts/llama-cpp-source.sh).
"""
import sys, json, numpy as np
import os
import subprocess
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
src = subprocess.run(['bash', os.path.join(root, 'scripts/llama-cpp-source.sh'), os.path.join(root, '.cache/llama.cpp')],
                     capture_output=True, text=True, check=True).stdout.strip()
sys.path.insert(0, os.path.join(src, 'gguf-py'))
import gguf
path = sys.argv[1]
r = gguf.GGUFReader(path)
f = {k: v for k, v in r.fields.items()}
def val(k): return f[k].contents()
W = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}
nl = val('qwen3.block_count'); nh = val('qwen3.attention.head_count'); nkv = val('qwen3.attention.head_count_kv')
eps = val('qwen3.attention.layer_norm_rms_epsilon'); theta = val('qwen3.rope.freq_base')
hd = val('qwen3.attention.key_length')
def rms(x, w): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * w
def rope(x, pos):  # x [T, H, hd], neox
    half = hd // 2
    inv = theta ** (-np.arange(half) * 2.0 / hd)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a*c - b*s, a*s + b*c], -1)
def forward(ids):
    T = len(ids); x = W['token_embd.weight'][ids]
    pos = np.arange(T, dtype=np.float64)
    for l in range(nl):
        p = lambda n: W[f'blk.{l}.{n}.weight']
        h = rms(x, p('attn_norm'))
        q = (h @ p('attn_q').T).reshape(T, nh, hd); k = (h @ p('attn_k').T).reshape(T, nkv, hd); v = (h @ p('attn_v').T).reshape(T, nkv, hd)
        q = rope(rms(q, p('attn_q_norm')), pos); k = rope(rms(k, p('attn_k_norm')), pos)
        out = np.zeros((T, nh, hd))
        g = nh // nkv
        for hh in range(nh):
            kk, vv = k[:, hh // g], v[:, hh // g]
            s = q[:, hh] @ kk.T / np.sqrt(hd)
            s = s + np.triu(np.full((T, T), -np.inf), 1)
            s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
            out[:, hh] = s @ vv
        x = x + out.reshape(T, nh*hd) @ p('attn_output').T
        h = rms(x, p('ffn_norm'))
        gt = h @ p('ffn_gate').T; up = h @ p('ffn_up').T
        x = x + ((gt / (1 + np.exp(-gt))) * up) @ p('ffn_down').T
    x = rms(x, W['output_norm.weight'])
    return x[-1]
ref = json.load(open(sys.argv[2]))
m = [m for m in ref['models'] if m['file'] in path][0]
head = W['cls.output.weight']
for c in m['cases']:
    for d in c['documents']:
        hid = forward(np.array(d['tokens']))
        lo = head @ hid; p = 1/(1+np.exp(-(lo[0]-lo[1])))
        print(len(d['tokens']), f"{p:.6f} llama.cpp {d['score']:.6f}")
