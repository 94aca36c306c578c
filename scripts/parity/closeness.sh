#!/usr/bin/env bash
# How far each llama.cpp setting and each Hearth KV precision is from the exact f64 forward
# (ref.py), over fixture steps whose prefix all settings share. Prints, per (case, step), the
# RMS and max of (logits - exact) after removing the mean shift (a constant shift does not change
# the argmax). Needs .venv-parity, .venv-llama and a release build of the dump_logits example
# (CARGO_TARGET_DIR as given in $TARGET, default target/).
# Usage: scripts/parity/closeness.sh [CASE:STEP ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
export LLAMA_CPP_LIB_PATH=${LLAMA_CPP_LIB_PATH:-.cache/llama.cpp/build/bin}
DUMP=${TARGET:-target}/release/examples/dump_logits
FX=tests/fixtures/text/smollm2-135m-instruct-q4_1.json
W=weights/SmolLM2-135M-Instruct.Q4_1.gguf
POINTS=${*:-0:0 0:4 1:0 1:5 2:0 3:0 3:20}
for p in $POINTS; do
    c=${p%%:*}; s=${p##*:}
    .venv-parity/bin/python scripts/parity/ref.py "$c" "$s" "$FX" >/dev/null
    for kw in "{}" "dict(type_k=0, type_v=0)" "dict(flash_attn=True)"; do
        .venv-llama/bin/python scripts/parity/lc.py "$c" "$s" "$kw" >/dev/null
        cp "/tmp/lc_${c}_${s}.f32" "/tmp/close_${c}_${s}_lc_$(echo "$kw" | tr -dc 'a-z0-9').f32"
    done
    for kv in f16 f32; do
        "$DUMP" "$W" "$FX" "$c" "$s" fast "/tmp/close_${c}_${s}_hearth_fast_$kv.f32" "$kv"
    done
    .venv-parity/bin/python - "$c" "$s" <<'PY'
import glob, sys, numpy as np
c, s = sys.argv[1], sys.argv[2]
ref = np.load(f'/tmp/parity_ref_{c}_{s}.npy')
for p in sorted(glob.glob(f'/tmp/close_{c}_{s}_*.f32')):
    d = np.fromfile(p, np.float32) - ref
    d -= d.mean()
    name = p.split(f'close_{c}_{s}_')[1][:-4]
    print(f'case {c} step {s:>3} {name:28s} rms {np.sqrt((d * d).mean()):.4f} max {np.abs(d).max():.3f}')
PY
done
