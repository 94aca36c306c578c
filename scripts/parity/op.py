import numpy as np, sys
sys.path.insert(0, '.venv-parity/work')
from simlib import *
g = dict(np.load('/tmp/lccb.npz'))
def cmp(name, mine):
    ref = g[name]; d = np.abs(mine - ref).max()
    print(f'{name:14s} maxdiff {d:.6g}  max|x| {np.abs(ref).max():.6g}')
for l in [9, 10, 11]:
    print('layer', l, 'ffn_inp absmax', np.abs(g[f'ffn_inp-{l}']).max())
    cmp(f'attn_norm-{l}', rms(g[f'l_out-{l-1}'], F(f'blk.{l}.attn_norm.weight')))
    v = mm(q41(f'blk.{l}.attn_v.weight'), g[f'attn_norm-{l}'])
    cmp(f'Vcur-{l}', v)
    o = np.repeat(f16(g[f'Vcur-{l}']).reshape(3, 64), 3, axis=0).reshape(-1).astype(np.float32)
    cmp(f'kqv_out-{l}', o)
    cmp(f'attn_out-{l}', mm(q41(f'blk.{l}.attn_output.weight'), g[f'kqv_out-{l}']))
    cmp(f'ffn_norm-{l}', rms(g[f'ffn_inp-{l}'], F(f'blk.{l}.ffn_norm.weight')))
    cmp(f'ffn_gate-{l}', mm(q41(f'blk.{l}.ffn_gate.weight'), g[f'ffn_norm-{l}']))
    cmp(f'ffn_up-{l}', mm(q41(f'blk.{l}.ffn_up.weight'), g[f'ffn_norm-{l}']))
    gg, uu = g[f'ffn_gate-{l}'], g[f'ffn_up-{l}']
    cmp(f'ffn_swiglu-{l}', (gg / (1 + np.exp(-gg)) * uu).astype(np.float32))
    cmp(f'ffn_out-{l}', mm(q41(f'blk.{l}.ffn_down.weight'), g[f'ffn_swiglu-{l}']))
    sw = g[f'ffn_swiglu-{l}']; print('  swiglu absmax', np.abs(sw).max(), 'ffn_out absmax', np.abs(g[f'ffn_out-{l}']).max())
