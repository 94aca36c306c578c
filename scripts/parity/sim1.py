# llama.cpp's arithmetic for a single-token forward (no attention mixing), to tell which
# implementation deviates in the matmul/activation path. Run from the repository root.
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from simlib import *  # noqa: F401,F403 (the GGUF reader, dequantizers and llama.cpp-order ops)
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
