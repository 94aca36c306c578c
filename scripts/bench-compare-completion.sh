#!/usr/bin/env bash
# Before/after for the completion service: two `hearth` binaries served side by side on loopback
# (each with its own data dir and the shipped model table), the same SSE load (benches/loadgen.rs:
# alpha-3.3, greedy, natural stop) on each in rounds that alternate between them, and the medians
# per level. For showing that a change costs no throughput or time to first token, in one run.
#
#   scripts/bench-compare-completion.sh BEFORE_BIN AFTER_BIN
#   env: THREADS=2 STREAMS=1,4,8,16 MAX_TOKENS=64 REPEAT=6 LOADGEN=(a built benches/loadgen binary)
# Results: a Markdown table on stdout, JSON lines in .cache/bench/compare-{before,after}.jsonl.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ $# -eq 2 ] || { echo "usage: $0 BEFORE_BIN AFTER_BIN" >&2; exit 2; }
THREADS="${THREADS:-2}"
STREAMS="${STREAMS:-1,4,8,16}"
REPEAT="${REPEAT:-6}"
MAX_TOKENS="${MAX_TOKENS:-64}"
OUT="$ROOT/.cache/bench"
mkdir -p "$OUT"
log() { echo "bench-compare-completion: $*" >&2; }
[ -f weights/SmolLM2-135M-Instruct.Q4_1.gguf ] || scripts/fetch-weights.sh smollm2

# The load generator is built once and run as a binary: `cargo bench` in each round would rebuild
# it (and the workspace) mid-run whenever a source file changed. LOADGEN=path skips the build.
if [ -z "${LOADGEN:-}" ]; then
    log "building the load generator (release)"
    LOADGEN="$(cargo bench -q --no-run --bench loadgen --message-format=json |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "loadgen" and m.get("executable"):
        print(m["executable"])')"
fi
[ -x "$LOADGEN" ] || { echo "no load generator binary at '$LOADGEN'" >&2; exit 1; }

PIDS=()
DIRS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; rm -rf "${DIRS[@]}"' EXIT

# start NAME BIN AUTH_PORT COMPLETION_PORT: serves BIN and writes a service token for it to
# $OUT/compare-NAME.token (not printed: a command substitution would run it in a subshell, and
# the server's pid would not reach the clean-up).
start() {
    local name="$1" bin="$2" auth="$3" completion="$4" data
    data="$(mktemp -d)"
    DIRS+=("$data")
    sed -e "s|^weights = \"weights/|weights = \"$ROOT/weights/|" -e "s|^threads = .*|threads = $THREADS|" \
        models.toml >"$data/models.toml"
    "$bin" balance credit bench 1000000 --data-dir "$data" >/dev/null
    HEARTH_COMPLETION_MAX_CONCURRENT_PER_USER=0 "$bin" serve --data-dir "$data" \
        --services auth,completion --models "$data/models.toml" \
        --auth-addr "127.0.0.1:$auth" --completion-addr "127.0.0.1:$completion" \
        >"$OUT/compare-$name-serve.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 240); do
        local health
        health="$(curl -sf "http://127.0.0.1:$completion/" || true)"
        if grep -q '"alpha-3.3":"ready"' <<<"$health" && ! grep -q '"loading"' <<<"$health"; then break; fi
        sleep 0.5
    done
    local idp
    idp="$("$bin" idp mint bench --data-dir "$data")"
    curl -sf -X POST "http://127.0.0.1:$auth/token" -H 'Content-Type: application/json' \
        -d "{\"userId\":\"bench\",\"idpToken\":\"$idp\",\"lifetimeSeconds\":7200}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["serviceToken"])' >"$OUT/compare-$name.token"
}

start before "$1" 18281 18282
start after "$2" 18381 18382
TOKEN_BEFORE="$(cat "$OUT/compare-before.token")"
TOKEN_AFTER="$(cat "$OUT/compare-after.token")"
: >"$OUT/compare-before.jsonl"
: >"$OUT/compare-after.jsonl"
load() { # NAME PORT TOKEN
    "$LOADGEN" --bench --target hearth --url "http://127.0.0.1:$2" --token "$3" \
        --model alpha-3.3 --streams "$STREAMS" --max-tokens "$MAX_TOKENS" --json "$OUT/round.jsonl"
    cat "$OUT/round.jsonl" >>"$OUT/compare-$1.jsonl"
}
for round in $(seq 1 "$REPEAT"); do
    # Alternate which side goes first, so that a drift in the machine's speed falls on both.
    if [ $((round % 2)) -eq 1 ]; then
        log "round $round/$REPEAT: before, then after"
        load before 18282 "$TOKEN_BEFORE"; load after 18382 "$TOKEN_AFTER"
    else
        log "round $round/$REPEAT: after, then before"
        load after 18382 "$TOKEN_AFTER"; load before 18282 "$TOKEN_BEFORE"
    fi
done
python3 - "$OUT/compare-before.jsonl" "$OUT/compare-after.jsonl" <<'PY'
import json, statistics, sys
def medians(path):
    runs = {}
    for r in map(json.loads, open(path)):
        runs.setdefault(r["streams"], []).append(r)
    return {n: {k: statistics.median(x[k] for x in rs) for k in ("tok_s", "decode_tok_s", "ttft_p50_ms", "itl_p99_ms")}
            for n, rs in runs.items()}
b, a = medians(sys.argv[1]), medians(sys.argv[2])
print(f"(medians of {len(open(sys.argv[1]).readlines()) // max(len(b), 1)} runs per level and side)")
print("| streams | before tok/s | after tok/s | after / before | before TTFT p50 ms | after TTFT p50 ms | TTFT change ms | before ITL p99 ms | after ITL p99 ms |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in sorted(a):
    if n in b:
        x, y = b[n], a[n]
        print(f"| {n} | {x['tok_s']:.1f} | {y['tok_s']:.1f} | {y['tok_s'] / x['tok_s']:.3f} | {x['ttft_p50_ms']:.1f} | {y['ttft_p50_ms']:.1f} | {y['ttft_p50_ms'] - x['ttft_p50_ms']:+.1f} | {x['itl_p99_ms']:.1f} | {y['itl_p99_ms']:.1f} |")
PY
