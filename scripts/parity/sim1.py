# llama.cpp's arithmetic for a single-token forward (no attention mixing), to tell which
# implementation deviates in the matmul/activation path.
import sys, numpy as np, gguf
r = gguf.GGUFReader('weights/SmolLM2-135M-Instruct.Q4_1.gguf')
T = {t.name: t for t in r.tensors}
f16 = lambda a: np.asarray(a, np.float32).astype(np.float16).astype(np.float64)
def q41(name):
    raw = np.asarray(T[name].data, np.uint8); rows = raw.shape[0]
    b = raw.reshape(rows, -1, 20)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    qs = b[..., 4:]
    q = np.concatenate([qs & 15, qs >> 4], -1).astype(np.int64)  # rows, nb, 32
    return ('q41', d, m, q)
def q80(name):
    raw = np.asarray(T[name].data, np.uint8); rows = raw.shape[0]
    b = raw.reshape(rows, -1, 34)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    q = b[..., 2:].copy().view(np.int8).astype(np.int64)
    return ('q80', d, None, q)
def quant(x):  # x f32 vector -> (d16, q, s16) per 32-block, llama.cpp x86
    x = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(x).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    idv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint((x * idv[:, None]).astype(np.float32)).astype(np.int64)
    s = f16((d * q.sum(-1).astype(np.float32)).astype(np.float32))
    return f16(d), q, s
def mm(W, x):
    kind, dw, mw, qw = W
    dx, qx, sx = quant(x)
    sumi = (qw * qx[None]).sum(-1)  # rows, nb
    out = (dw * dx[None]) * sumi
    if kind == 'q41': out = out + mw * sx[None]
    return out.sum(-1).astype(np.float32)
def F(n): return np.asarray(T[n].data, np.float32)
def rms(x, w):
    x = np.asarray(x, np.float32); s = (x.astype(np.float64)**2).sum() / x.size
    return (x * np.float32(1.0 / np.sqrt(np.float32(s + 1e-5)))).astype(np.float32) * w
emb = q80('token_embd.weight')
tok = int(sys.argv[1]) if len(sys.argv) > 1 else 1653
x = (emb[1][tok][:, None] * emb[3][tok]).reshape(-1).astype(np.float32)
for l in range(30):
    h = rms(x, F(f'blk.{l}.attn_norm.weight'))
    v = f16(mm(q41(f'blk.{l}.attn_v.weight'), h)).astype(np.float32)
    o = np.tile(v.reshape(3, 64), (1, 3)).reshape(3, 3, 64)  # head h uses kv h//3
    o = np.repeat(v.reshape(3, 64), 3, axis=0).reshape(-1)
    x = x + mm(q41(f'blk.{l}.attn_output.weight'), o)
    h = rms(x, F(f'blk.{l}.ffn_norm.weight'))
    g = mm(q41(f'blk.{l}.ffn_gate.weight'), h); u = mm(q41(f'blk.{l}.ffn_up.weight'), h)
    x = x + mm(q41(f'blk.{l}.ffn_down.weight'), (g / (1 + np.exp(-g)) * u).astype(np.float32))
    np.save(f'/tmp/sim1_x{l}.npy', x)
lg = mm(emb, rms(x, F('output_norm.weight')))
lg.astype(np.float32).tofile('/tmp/sim1.f32')
