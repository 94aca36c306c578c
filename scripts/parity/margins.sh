#!/usr/bin/env bash
# At a step where Hearth and the committed llama.cpp fixture choose differently: the two tokens'
# logits and margin in the exact f64 forward (ref.py), in llama.cpp with the fixture's settings
# (f32 KV cache) and in Hearth's fast backend at f32 KV precision.
# Usage: scripts/parity/margins.sh CASE STEP   (TARGET = cargo target dir with the release example)
set -euo pipefail
cd "$(dirname "$0")/../.."
export LLAMA_CPP_LIB_PATH=${LLAMA_CPP_LIB_PATH:-.cache/llama.cpp/build/bin}
c=$1; s=$2
FX=tests/fixtures/text/smollm2-135m-instruct-q4_1.json
.venv-parity/bin/python scripts/parity/ref.py "$c" "$s" "$FX" >/dev/null
.venv-llama/bin/python scripts/parity/lc.py "$c" "$s" "dict(type_k=0, type_v=0)" >/dev/null
"${TARGET:-target}/release/examples/dump_logits" weights/SmolLM2-135M-Instruct.Q4_1.gguf "$FX" "$c" "$s" fast /tmp/hearth_${c}_${s}.f32 f32
.venv-parity/bin/python - "$c" "$s" <<'PY'
import sys, numpy as np
c, s = sys.argv[1], sys.argv[2]
ex = np.load(f'/tmp/parity_ref_{c}_{s}.npy')
lc = np.fromfile(f'/tmp/lc_{c}_{s}.f32', np.float32)
he = np.fromfile(f'/tmp/hearth_{c}_{s}.f32', np.float32)
a, b = int(lc.argmax()), int(he.argmax())
print(f'case {c} step {s}: llama.cpp picks {a}, hearth picks {b}, exact picks {int(ex.argmax())}')
for name, l in [('exact f64', ex), ('llama.cpp f32 KV', lc), ('hearth fast f32', he)]:
    top = np.argsort(-l)[:3]
    print(f'  {name:17s} logit[{a}]-logit[{b}] = {l[a] - l[b]:+.4f}   top3 ' + ', '.join(f'{int(t)}:{l[t]:.3f}' for t in top))
d = he - lc
print(f'  hearth - llama.cpp: rms {np.sqrt((d * d).mean()):.4f} max {np.abs(d).max():.3f}')
PY
