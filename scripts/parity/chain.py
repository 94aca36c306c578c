import numpy as np, sys
sys.path.insert(0, '.venv-parity/work')
from simlib import *
g = dict(np.load('/tmp/lccb.npz'))
x = np.load('/tmp/sim1_x8.npy')
def cmp(name, mine):
    ref = g[name]; d = np.abs(mine - ref); i = int(d.argmax())
    print(f'{name:14s} maxdiff {d.max():.4g} at {i} (val {ref[i]:.6g})  n>0: {(d>0).sum()}')
for l in [9, 10]:
    h = rms(x, F(f'blk.{l}.attn_norm.weight')); cmp(f'attn_norm-{l}', h)
    v = mm(q41(f'blk.{l}.attn_v.weight'), h); cmp(f'Vcur-{l}', v)
    o = np.repeat(f16(v).reshape(3, 64), 3, axis=0).reshape(-1).astype(np.float32); cmp(f'kqv_out-{l}', o)
    a = mm(q41(f'blk.{l}.attn_output.weight'), o); cmp(f'attn_out-{l}', a)
    x = x + a; cmp(f'ffn_inp-{l}', x)
    h = rms(x, F(f'blk.{l}.ffn_norm.weight')); cmp(f'ffn_norm-{l}', h)
    gg = mm(q41(f'blk.{l}.ffn_gate.weight'), h); cmp(f'ffn_gate-{l}', gg)
    uu = mm(q41(f'blk.{l}.ffn_up.weight'), h); cmp(f'ffn_up-{l}', uu)
    sw = (gg / (1 + np.exp(-gg)) * uu).astype(np.float32); cmp(f'ffn_swiglu-{l}', sw)
    fo = mm(q41(f'blk.{l}.ffn_down.weight'), sw); cmp(f'ffn_out-{l}', fo)
    x = x + fo; cmp(f'l_out-{l}', x)
