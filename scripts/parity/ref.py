import os, sys, json, numpy as np, gguf
from gguf.quants import dequantize
r = gguf.GGUFReader('weights/SmolLM2-135M-Instruct.Q4_1.gguf')
T = {t.name: t for t in r.tensors}
def W(n, dt=np.float64):
    t = T[n]
    a = dequantize(t.data, t.tensor_type)
    return np.asarray(a, dtype=dt).reshape([int(x) for x in reversed(t.shape)]) if t.tensor_type.name!='F32' else np.asarray(t.data,dtype=dt)
L, H, HKV, HD, eps, base = 30, 9, 3, 64, 1e-5, 100000.0
# optional 3rd argument: another fixture with the same prompts (e.g. made with other llama.cpp
# settings by reference-tokens.py --out-dir), whose greedy ids give the prefix
fx = json.load(open(sys.argv[3] if len(sys.argv) > 3 else 'tests/fixtures/text/smollm2-135m-instruct-q4_1.json'))
case = int(sys.argv[1]) if len(sys.argv)>1 else 0
step = int(sys.argv[2]) if len(sys.argv)>2 else 9
c = fx['cases'][case]
ids = c['prompt_ids'] + c['greedy_ids'][:step]
n = len(ids)
emb = W('token_embd.weight')
x = emb[ids]
def rms(x, w): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * w
# Q8=1: quantize every matmul input to 8-bit blocks of 32 (scale amax/127, round to nearest) as
# llama.cpp and Hearth do before their quantized dot products; everything else stays f64. Shows
# how much of the distance to the exact forward that rounding alone explains.
Q8 = os.environ.get('Q8') == '1'
def a8(x):
    if not Q8: return x
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = np.abs(b).max(-1, keepdims=True) / 127
    return (np.rint(b / np.where(d > 0, d, 1)) * d).reshape(x.shape)
pos = np.arange(n)[:, None]
inv = base ** (-np.arange(0, HD, 2) / HD)
ang = pos * inv[None, :]
cos, sin = np.cos(ang), np.sin(ang)
def rope(q):  # q: [n, h, HD] interleaved pairs
    a, b = q[..., 0::2], q[..., 1::2]
    c_, s_ = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(q); out[..., 0::2] = a*c_ - b*s_; out[..., 1::2] = a*s_ + b*c_
    return out
mask = np.triu(np.full((n, n), -np.inf), 1)
for l in range(L):
    p = lambda s: W(f'blk.{l}.{s}.weight')
    h = rms(x, p('attn_norm'))
    h8 = a8(h)
    q = rope((h8 @ p('attn_q').T).reshape(n, H, HD))
    k = rope((h8 @ p('attn_k').T).reshape(n, HKV, HD))
    v = (h8 @ p('attn_v').T).reshape(n, HKV, HD)
    o = np.empty((n, H, HD))
    for hh in range(H):
        kv = hh // (H // HKV)
        s = q[:, hh] @ k[:, kv].T / np.sqrt(HD) + mask
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        o[:, hh] = s @ v[:, kv]
    x = x + a8(o.reshape(n, -1)) @ p('attn_output').T
    h = rms(x, p('ffn_norm'))
    h8 = a8(h)
    g = h8 @ p('ffn_gate').T; u = h8 @ p('ffn_up').T
    x = x + a8((g / (1 + np.exp(-g))) * u) @ p('ffn_down').T
last = rms(x[-1], W('output_norm.weight'))
logits = emb @ a8(last)
top = np.argsort(-logits)[:5]
print('exact f64' + (' (Q8 activations)' if Q8 else '') + ': top', [(int(i), round(float(logits[i]), 3)) for i in top])
want = c['greedy_ids'][step]
print('llama.cpp chose', want, 'logit', round(float(logits[want]),3))
np.save(f'/tmp/parity_ref{"_q8" if Q8 else ""}_{case}_{step}.npy', logits)
