#!/usr/bin/env bash
# Builds lcdump.c against the libllama of scripts/build-llama-cpp.sh (once, into
# .cache/llama.cpp/lcdump) and runs it: llama.cpp's logits (and graph tensors) along a token path
# of a fixture (SmolLM2 by default; WEIGHTS and FIXTURE for Gemma 3), for comparison with
# Hearth's `numerics = ggml` mode.
# Usage: scripts/parity/lcdump.sh OUT_DIR DUMP_CALL CASE N_FORCED [WEIGHTS] [FIXTURE]
#   CASE: fixture case index; the prompt is its prompt_ids, then its first N_FORCED greedy ids.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$ROOT/.cache/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp"
BIN="$ROOT/.cache/llama.cpp/build/bin"
EXE="$ROOT/.cache/llama.cpp/lcdump"
if [ ! -x "$EXE" ] || [ "$ROOT/scripts/parity/lcdump.c" -nt "$EXE" ]; then
    cc -O2 -o "$EXE" "$ROOT/scripts/parity/lcdump.c" -I"$SRC/include" -I"$SRC/ggml/include" \
        -L"$BIN" -lllama -lggml -lggml-base -Wl,-rpath,"$BIN"
fi
OUT="$1"; CALL="$2"; CASE="$3"; N="$4"
WEIGHTS="${5:-$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf}"
FIXTURE="${6:-$ROOT/tests/fixtures/text/smollm2-135m-instruct-q4_1.json}"
mkdir -p "$OUT/t"
IDS=$(python3 -c "
import json,sys
c=json.load(open('$FIXTURE'))['cases'][$CASE]
print(','.join(map(str,c['prompt_ids'])), ','.join(map(str,c['greedy_ids'][:$N])))")
# shellcheck disable=SC2086
"$EXE" "$WEIGHTS" "$OUT" "$CALL" $IDS 2>/dev/null
