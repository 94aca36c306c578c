#!/usr/bin/env bash
# Regenerate tests/fixtures/arch/: tiny seeded models of the architectures issue 18 adds (qwen2,
# qwen3, llama with Llama 3 RoPE scaling, mistral-style sliding window, phi3, and plain llama as a
# control), quantized by llama.cpp's own llama-quantize, and llama.cpp's greedy ids and top logits
# on them (see scripts/tiny-models.py and tests/fixtures/arch/README.md).
#
#   1. builds llama.cpp (scripts/build-llama-cpp.sh: llama-quantize and libllama),
#   2. prepares .cache/tiny-models/venv (gguf + numpy + llama-cpp-python from the sdist that
#      build-llama-cpp.sh downloaded, its own CMake build switched off),
#   3. writes .cache/tiny-models/<name>-f32.gguf (tiny-models.py write),
#   4. quantizes each to Q8_0, Q4_0 and Q4_K_M (llama and qwen3 also to Q5_K_M) into
#      tests/fixtures/arch/<name>-<type>.gguf,
#   5. runs llama.cpp on each quantized model: tests/fixtures/arch/<name>-<type>.json.
#
# Idempotent: every step is deterministic, and a file whose new bytes equal the old is left alone.
# Usage: scripts/tiny-models.sh [model names...]   (default: all; see SPECS in tiny_models_specs.py)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache/tiny-models"
VENV="$CACHE/venv"
OUT="$ROOT/tests/fixtures/arch"
VERSION=0.3.36             # llama-cpp-python, as in build-llama-cpp.sh and reference-tokens.sh
GGUF_VERSION=0.19.0
NUMPY_VERSION=2.4.6        # pinned: the seeded weights come from numpy's generator
TYPES=(Q8_0 Q4_0 Q4_K_M)
# Q5_K_M for two families only (its Q5_K tensors are the 256-wide rows: ffn_down, and qwen3's
# attn_output), to keep the fixtures small.
declare -A EXTRA_TYPES=([llama]=Q5_K_M [qwen3]=Q5_K_M)
VOCAB_SIZE=1536

log() { echo "tiny-models: $*" >&2; }

"$ROOT/scripts/fetch-weights.sh" smollm2
BIN="$(JOBS="${JOBS:-2}" "$ROOT/scripts/build-llama-cpp.sh")"
SDIST="$ROOT/.cache/llama.cpp/llama_cpp_python-$VERSION.tar.gz"

# llama_cpp loads libllama on import: point it at ours, as the oracle step does.
if [ ! -x "$VENV/bin/python" ] \
    || ! LLAMA_CPP_LIB_PATH="$BIN" "$VENV/bin/python" -c "import gguf, llama_cpp" 2>/dev/null; then
    log "preparing $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "gguf==$GGUF_VERSION" "numpy==$NUMPY_VERSION"
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
        "$VENV/bin/pip" install -q --disable-pip-version-check "$SDIST"
fi

NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || read -r -a NAMES <<<"$("$VENV/bin/python" "$ROOT/scripts/tiny-models.py" names)"

"$VENV/bin/python" "$ROOT/scripts/tiny-models.py" write \
    --smollm2 "$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf" --vocab-size "$VOCAB_SIZE" \
    --out "$CACHE" --only "${NAMES[@]}"

# Quantizing takes a second a file: always redo it, keep the old file when the bytes agree.
mkdir -p "$OUT"
for name in "${NAMES[@]}"; do
    for type in "${TYPES[@]}" ${EXTRA_TYPES[$name]:-}; do
        dst="$OUT/$name-${type,,}.gguf"
        qlog="$CACHE/$name-${type,,}.quantize.log"
        "$BIN/llama-quantize" "$CACHE/$name-f32.gguf" "$dst.tmp" "$type" 2 >"$qlog" 2>&1 \
            || { tail -20 "$qlog" >&2; exit 1; }
        if [ -f "$dst" ] && cmp -s "$dst" "$dst.tmp"; then
            rm "$dst.tmp"
        else
            mv "$dst.tmp" "$dst"; log "quantized $dst"
        fi
    done
done

# llama.cpp's commit as its CMake build recorded it (the sdist's CHANGELOG names the same one).
COMMIT="$(sed -n 's/.*LLAMA_COMMIT = "\([^"]*\)".*/\1/p' "$ROOT/.cache/llama.cpp/build/common/build-info.cpp")"
LLAMA_CPP_VERSION="ggml-org/llama.cpp@${COMMIT:-unknown} (vendored in llama-cpp-python $VERSION)"

LLAMA_CPP_LIB_PATH="$BIN" "$VENV/bin/python" "$ROOT/scripts/tiny-models.py" oracle \
    --models "$OUT" --sources "$CACHE" --out "$OUT" --llama-cpp-version "$LLAMA_CPP_VERSION" \
    --only "${NAMES[@]}"
log "done: $OUT"
