#!/usr/bin/env bash
# Embedding throughput, Hearth against sentence-transformers (PyTorch, CPU), in one run on the
# same model (all-MiniLM-L6-v2, fetched by scripts/fetch-weights.sh) and the same cases: batch
# sizes 1 and 32, texts of 16 and 256 tokens, THREADS threads each (default 2), the best of 3.
# Hearth is the hearth-embed engine (release build of its embed_bench example); the reference
# runs in the git-ignored .venv-embed that scripts/embed/reference.sh makes. llama.cpp runs the
# same model converted to GGUF (f16 and f32, by its own convert_hf_to_gguf.py) through
# llama-bench with embeddings on, one text at a time (it has no batch of several texts): its
# tokens/s for a 16- or 256-token prompt, which is texts/s times the length.
# Then a GGUF decoder embedder, the same way on both: llama layers of Qwen3-Embedding-0.6B's size
# (28 layers, hidden 1024, 16 heads, 8 KV heads, MLP 3072; SmolLM2's 49,152-token vocabulary),
# random Q8_0 weights, last-token pooling, written by `hearth dev random-model --pooling last`
# into .cache/bench-embed: Hearth's engine (embed_bench) against llama-bench -embd 1 on the file.
#
#   scripts/bench-embed.sh [THREADS] [decoder]   # `decoder`: only the GGUF decoder embedder
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${1:-2}"
ONLY="${2:-}"
MODEL=weights/all-MiniLM-L6-v2
[ -f "$MODEL/model.safetensors" ] || scripts/fetch-weights.sh minilm
if [ ! -x .venv-embed/bin/python ]; then
    python3 -m venv .venv-embed
    .venv-embed/bin/pip install --quiet --disable-pip-version-check --no-cache-dir \
        "torch>=2.4" "sentence-transformers>=3"
fi
cargo build --quiet --release -p hearth-embed --example embed_bench
TARGET="${CARGO_TARGET_DIR:-target}"
LLAMA_BIN="$(scripts/build-llama-cpp.sh)"
mkdir -p .cache/bench-embed
DECODER=.cache/bench-embed/decoder-q8_0.gguf
[ -f weights/SmolLM2-135M-Instruct.Q4_1.gguf ] || scripts/fetch-weights.sh smollm2
[ -f "$DECODER" ] || cargo run --quiet --bin hearth -- dev random-model "$DECODER" \
    --tokenizer-from weights/SmolLM2-135M-Instruct.Q4_1.gguf --weights q8_0 --layers 28 \
    --hidden 1024 --heads 16 --kv-heads 8 --ff 3072 --pooling last
# llama-bench's JSON lines as this script's: tokens/s of one text of n tokens, and texts/s.
llama_lines() {
    python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    n = r["n_prompt"]
    print(json.dumps({"engine": "llama.cpp " + sys.argv[1], "batch": 1, "tokens": n,
                      "tokens_per_s": round(r["avg_ts"], 1),
                      "texts_per_s": round(r["avg_ts"] / n, 1)}))
' "$1"
}
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$ONLY" != decoder ]; then
RAYON_NUM_THREADS="$THREADS" "$TARGET/release/examples/embed_bench" "$MODEL" \
    --batches 1,32 --tokens 16,256 --texts 256 --runs 3
OMP_NUM_THREADS="$THREADS" .venv-embed/bin/python scripts/embed/bench.py "$MODEL" "$THREADS" \
    1,32 16,256 256 3
LLAMA_SRC="$(ls -d .cache/llama.cpp/llama_cpp_python-*/vendor/llama.cpp | head -1)"
for TYPE in f16 f32; do
    GGUF=".cache/bench-embed/minilm-$TYPE.gguf"
    [ -f "$GGUF" ] || PYTHONPATH="$LLAMA_SRC/gguf-py" .venv-embed/bin/python \
        "$LLAMA_SRC/convert_hf_to_gguf.py" "$MODEL" --outtype "$TYPE" --outfile "$GGUF" >/dev/null 2>&1
    "$LLAMA_BIN/llama-bench" -m "$GGUF" -embd 1 -p 16,256 -n 0 -t "$THREADS" -r 3 -o jsonl \
        2>/dev/null | llama_lines "$TYPE"
done
fi
echo "== a GGUF decoder embedder ($DECODER)"
RAYON_NUM_THREADS="$THREADS" "$TARGET/release/examples/embed_bench" "$DECODER" \
    --batches 1,32 --tokens 16,256 --texts 32 --runs 3
"$LLAMA_BIN/llama-bench" -m "$DECODER" -embd 1 -p 16,256 -n 0 -t "$THREADS" -r 3 -o jsonl \
    2>/dev/null | llama_lines "decoder q8_0"
