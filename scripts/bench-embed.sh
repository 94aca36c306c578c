#!/usr/bin/env bash
# Embedding throughput, Hearth against sentence-transformers (PyTorch, CPU), in one run on the
# same model (all-MiniLM-L6-v2, fetched by scripts/fetch-weights.sh) and the same cases: batch
# sizes 1 and 32, texts of 16 and 256 tokens, THREADS threads each (default 2), the best of 3.
# Hearth is the hearth-embed engine (release build of its embed_bench example); the reference
# runs in the git-ignored .venv-embed that scripts/embed/reference.sh makes.
#
#   scripts/bench-embed.sh [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-2}"
MODEL=weights/all-MiniLM-L6-v2
[ -f "$MODEL/model.safetensors" ] || scripts/fetch-weights.sh minilm
if [ ! -x .venv-embed/bin/python ]; then
    python3 -m venv .venv-embed
    .venv-embed/bin/pip install --quiet --disable-pip-version-check --no-cache-dir \
        "torch>=2.4" "sentence-transformers>=3"
fi
cargo build --quiet --release -p hearth-embed --example embed_bench
TARGET="${CARGO_TARGET_DIR:-target}"
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
RAYON_NUM_THREADS="$THREADS" "$TARGET/release/examples/embed_bench" "$MODEL" \
    --batches 1,32 --tokens 16,256 --texts 256 --runs 3
OMP_NUM_THREADS="$THREADS" .venv-embed/bin/python scripts/embed/bench.py "$MODEL" "$THREADS" \
    1,32 16,256 256 3
