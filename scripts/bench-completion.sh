#!/usr/bin/env bash
# Completion service load test: time to first token, inter-token latency p50/p99 and output
# tokens/s at 1, 4, 8 and 16 concurrent SSE streams against a running `hearth serve`
# (alpha-3.3 = SmolLM2-135M-Instruct Q4_1, greedy, natural stop), and the same load on the
# scheduler alone (no HTTP), to report the HTTP layer's overhead. Loopback only.
#
#   scripts/bench-completion.sh      # env: THREADS=2 STREAMS=1,4,8,16 MAX_TOKENS=64 REPEAT=10
# Each level runs REPEAT times on both sides, in rounds that alternate between them; the overhead
# table compares medians, since one run of a level moves by about 10% with how prompts batch.
# Results: Markdown tables on stdout, JSON lines in .cache/bench/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
THREADS="${THREADS:-2}"
STREAMS="${STREAMS:-1,4,8,16}"
REPEAT="${REPEAT:-10}"
MAX_TOKENS="${MAX_TOKENS:-64}"
# release (default), or dev: dependencies and the model crates are optimised in dev too.
PROFILE="${PROFILE:-release}"
AUTH_PORT="${AUTH_PORT:-18181}"
COMPLETION_PORT="${COMPLETION_PORT:-18182}"
OUT="$ROOT/.cache/bench"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
mkdir -p "$OUT"
log() { echo "bench-completion: $*" >&2; }

[ -f weights/SmolLM2-135M-Instruct.Q4_1.gguf ] || scripts/fetch-weights.sh smollm2

log "building hearth ($PROFILE)"
cargo build -q --profile "$PROFILE" --bin hearth
if [ "$PROFILE" = dev ]; then HEARTH="$TARGET/debug/hearth"; else HEARTH="$TARGET/$PROFILE/hearth"; fi

DATA="$(mktemp -d)"
# The shipped model table with absolute weight paths and the benchmark's thread count.
sed -e "s|^weights = \"weights/|weights = \"$ROOT/weights/|" -e "s|^threads = .*|threads = $THREADS|" \
    models.toml >"$DATA/models.toml"
# Credit the benchmark user before the server opens the store (the CLI writes it directly).
"$HEARTH" balance credit bench 1000000 --data-dir "$DATA" >/dev/null
HEARTH_COMPLETION_MAX_CONCURRENT_PER_USER=0 "$HEARTH" serve --data-dir "$DATA" --services auth,completion --models "$DATA/models.toml" \
    --auth-addr "127.0.0.1:$AUTH_PORT" --completion-addr "127.0.0.1:$COMPLETION_PORT" \
    >"$OUT/hearth-serve.log" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; rm -rf "$DATA"' EXIT
for _ in $(seq 1 240); do
    # Every model of the table loads at start-up: wait until none is still loading, so that no
    # load competes with the measured requests for the cores.
    HEALTH="$(curl -sf "http://127.0.0.1:$COMPLETION_PORT/" || true)"
    if grep -q '"alpha-3.3":"ready"' <<<"$HEALTH" && ! grep -q '"loading"' <<<"$HEALTH"; then break; fi
    if ! kill -0 "$PID" 2>/dev/null; then log "hearth exited; see $OUT/hearth-serve.log"; exit 1; fi
    sleep 0.5
done

IDP="$("$HEARTH" idp mint bench --data-dir "$DATA")"
TOKEN="$(curl -sf -X POST "http://127.0.0.1:$AUTH_PORT/token" -H 'Content-Type: application/json' \
    -d "{\"userId\":\"bench\",\"idpToken\":\"$IDP\",\"lifetimeSeconds\":3600}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["serviceToken"])')"

# Rounds alternate between the two sides (every level once per round), so that a drift in the
# machine's speed during the run (other tenants, frequency) falls on both alike.
log "building the scheduler benchmark and the load generator ($PROFILE)"
cargo bench -q --no-run --profile "$PROFILE" -p hearth-scheduler --bench decode
cargo bench -q --no-run --profile "$PROFILE" --bench loadgen
: >"$OUT/scheduler-natural.jsonl"
: >"$OUT/http.jsonl"
for round in $(seq 1 "$REPEAT"); do
    log "round $round/$REPEAT: scheduler alone (same prompts, greedy, natural stop)"
    cargo bench -q --profile "$PROFILE" -p hearth-scheduler --bench decode -- --threads "$THREADS" \
        --streams "$STREAMS" --max-tokens "$MAX_TOKENS" --natural-stop --json "$OUT/round.jsonl"
    cat "$OUT/round.jsonl" >>"$OUT/scheduler-natural.jsonl"
    log "round $round/$REPEAT: HTTP load on 127.0.0.1:$COMPLETION_PORT"
    cargo bench -q --profile "$PROFILE" --bench loadgen -- --target hearth \
        --url "http://127.0.0.1:$COMPLETION_PORT" --token "$TOKEN" --model alpha-3.3 \
        --streams "$STREAMS" --max-tokens "$MAX_TOKENS" --json "$OUT/round.jsonl"
    cat "$OUT/round.jsonl" >>"$OUT/http.jsonl"
done

python3 - "$OUT/scheduler-natural.jsonl" "$OUT/http.jsonl" <<'PY'
import json, sys
import statistics
def medians(path):
    runs = {}
    for r in map(json.loads, open(path)):
        runs.setdefault(r["streams"], []).append(r)
    return {n: {k: statistics.median(x[k] for x in rs) for k in rs[0] if k not in ("target", "streams")}
            for n, rs in runs.items()}
sched = medians(sys.argv[1])
http = medians(sys.argv[2])
print(f"(medians of {len(open(sys.argv[2]).readlines()) // max(len(http), 1)} runs per level)")
print("\nHTTP layer overhead (same prompts and tokens; positive = HTTP slower)")
print("| streams | scheduler tok/s | HTTP tok/s | throughput overhead | scheduler decode tok/s | HTTP decode tok/s | decode overhead | scheduler TTFT p50 ms | HTTP TTFT p50 ms | TTFT overhead ms | scheduler ITL p99 ms | HTTP ITL p99 ms |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in sorted(http):
    if n in sched:
        s, h = sched[n], http[n]
        over = (1 - h["tok_s"] / s["tok_s"]) * 100
        dover = (1 - h["decode_tok_s"] / s["decode_tok_s"]) * 100
        print(f"| {n} | {s['tok_s']:.1f} | {h['tok_s']:.1f} | {over:+.1f}% | {s['decode_tok_s']:.1f} | {h['decode_tok_s']:.1f} | {dover:+.1f}% | {s['ttft_p50_ms']:.1f} | {h['ttft_p50_ms']:.1f} | {h['ttft_p50_ms'] - s['ttft_p50_ms']:+.1f} | {s['itl_p99_ms']:.1f} | {h['itl_p99_ms']:.1f} |")
PY
