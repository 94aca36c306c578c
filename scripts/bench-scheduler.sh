#!/usr/bin/env bash
# Scheduler benchmark: aggregate decode tokens/s and inter-token latency p50/p99 at 1, 2, 4, 8
# and 16 concurrent streams on SmolLM2-135M-Instruct Q4_1 with 2 threads (every stream generates
# exactly MAX_TOKENS tokens), then llama.cpp's llama-server with 8 parallel slots on the same
# model and load in the same run, and the ratio of the two.
#
#   scripts/bench-scheduler.sh            # env: THREADS=2 STREAMS=1,2,4,8,16 MAX_TOKENS=64
#                                         #      SKIP_LLAMA=1 to skip the llama-server part
# Results: a Markdown table on stdout, JSON lines in .cache/bench/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
THREADS="${THREADS:-2}"
STREAMS="${STREAMS:-1,2,4,8,16}"
MAX_TOKENS="${MAX_TOKENS:-64}"
# release (default), or dev: dependencies and the model crates are optimised in dev too.
PROFILE="${PROFILE:-release}"
MODEL="$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT="$ROOT/.cache/bench"
mkdir -p "$OUT"
log() { echo "bench-scheduler: $*" >&2; }

[ -f "$MODEL" ] || scripts/fetch-weights.sh smollm2

log "scheduler alone"
cargo bench -q --profile "$PROFILE" -p hearth-scheduler --bench decode -- \
    --model "$MODEL" --threads "$THREADS" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" \
    --json "$OUT/scheduler.jsonl"

if [ "${SKIP_LLAMA:-0}" = 1 ]; then exit 0; fi
if ! BIN="$(scripts/build-llama-cpp.sh)"; then
    log "llama.cpp could not be built; skipping the llama-server comparison"; exit 0
fi

PORT="${LLAMA_PORT:-18089}"
SLOTS=8
# Each slot gets room for a prompt plus MAX_TOKENS.
CTX=$(( SLOTS * (MAX_TOKENS + 256) ))
log "llama-server -np $SLOTS -t $THREADS on 127.0.0.1:$PORT"
"$BIN/llama-server" -m "$MODEL" -np "$SLOTS" -c "$CTX" -t "$THREADS" -tb "$THREADS" \
    --host 127.0.0.1 --port "$PORT" --no-webui >"$OUT/llama-server.log" 2>&1 &
LLAMA_PID=$!
trap 'kill "$LLAMA_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$LLAMA_PID" 2>/dev/null; then log "llama-server exited; see $OUT/llama-server.log"; exit 1; fi
    sleep 0.5
done

cargo bench -q --profile "$PROFILE" --bench loadgen -- --target llama --url "http://127.0.0.1:$PORT" \
    --streams "$STREAMS" --max-tokens "$MAX_TOKENS" --ignore-eos --json "$OUT/llama.jsonl"

python3 - "$OUT/scheduler.jsonl" "$OUT/llama.jsonl" <<'PY'
import json, sys
ours = {r["streams"]: r for r in map(json.loads, open(sys.argv[1]))}
theirs = {r["streams"]: r for r in map(json.loads, open(sys.argv[2]))}
print("\nhearth scheduler vs llama-server -np 8 (same model, threads, prompts, tokens)")
print("tok/s (wall): all tokens over the level's wall time, prefill included; decode tok/s: the sum")
print("of each stream's tokens after its first over its first-to-last-token time (stalls included)")
print("| streams | hearth tok/s (wall) | llama tok/s (wall) | ratio | hearth decode tok/s | llama decode tok/s | ratio | hearth ITL p99 ms | llama ITL p99 ms |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in sorted(ours):
    if n in theirs:
        a, b = ours[n], theirs[n]
        print(f"| {n} | {a['tok_s']:.1f} | {b['tok_s']:.1f} | {a['tok_s']/b['tok_s']:.2f} | {a['decode_tok_s']:.1f} | {b['decode_tok_s']:.1f} | {a['decode_tok_s']/b['decode_tok_s']:.2f} | {a['itl_p99_ms']:.1f} | {b['itl_p99_ms']:.1f} |")
PY
