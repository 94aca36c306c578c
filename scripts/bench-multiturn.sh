#!/usr/bin/env bash
# Multi-turn chats over HTTP: Hearth with prefix reuse, Hearth without it, and llama.cpp's
# llama-server (8 slots, its prompt cache on, as it ships), one after the other in the same run,
# on SmolLM2-135M-Instruct Q4_1 with the same threads. Each conversation is TURNS turns: a user
# message of about 150 tokens each turn, and the model's greedy answer of exactly MAX_TOKENS
# tokens added to the history, so that the prompt reaches about 2,000 tokens at turn 10. The
# client is benches/chat_turns.rs on /v1/chat/completions for every server.
#
#   scripts/bench-multiturn.sh     # env: THREADS=2 TURNS=10 CONVERSATIONS=1,8 MAX_TOKENS=32
#                                  #      SKIP_WITHOUT=1 (skip Hearth without reuse),
#                                  #      CLIENT_TARGET_DIR (where the client is built)
# Prints the time to first token of each turn (median over the conversations), the wall time
# and the output tokens/s of every server, and the ratios; JSON lines in .cache/bench/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
THREADS="${THREADS:-2}"
TURNS="${TURNS:-10}"
CONVERSATIONS="${CONVERSATIONS:-1,8}"
MAX_TOKENS="${MAX_TOKENS:-32}"
PROFILE="${PROFILE:-release}"
# The client is not what is measured: by default it is built in the dev profile, in the target dir
# the tests use (the root package's dev-dependencies are built there already).
CLIENT_PROFILE="${CLIENT_PROFILE:-dev}"
CLIENT_TARGET="${CLIENT_TARGET_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}}"
AUTH_PORT="${AUTH_PORT:-18191}"
COMPLETION_PORT="${COMPLETION_PORT:-18192}"
LLAMA_PORT="${LLAMA_PORT:-18199}"
MODEL="$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT="$ROOT/.cache/bench"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
mkdir -p "$OUT"
log() { echo "bench-multiturn: $*" >&2; }

[ -f "$MODEL" ] || scripts/fetch-weights.sh smollm2
log "building hearth and the chat client ($PROFILE)"
cargo build -q --profile "$PROFILE" --bin hearth
CARGO_TARGET_DIR="$CLIENT_TARGET" cargo bench -q --no-run --profile "$CLIENT_PROFILE" --bench chat_turns
if [ "$PROFILE" = dev ]; then HEARTH="$TARGET/debug/hearth"; else HEARTH="$TARGET/$PROFILE/hearth"; fi
LLAMA_BIN="$(scripts/build-llama-cpp.sh)"

PID=""
DATA="$(mktemp -d)"
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$DATA"' EXIT
stop() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=""; }

wait_for() { # URL PATTERN: until the body of URL matches PATTERN, or the server exits
    for _ in $(seq 1 480); do
        if curl -sf "$1" 2>/dev/null | grep -q "$2"; then return 0; fi
        kill -0 "$PID" 2>/dev/null || { log "the server exited; see $OUT/multiturn-*.log"; exit 1; }
        sleep 0.5
    done
    log "timed out waiting for $1"; exit 1
}

chat() { # LABEL URL TOKEN
    CARGO_TARGET_DIR="$CLIENT_TARGET" cargo bench -q --profile "$CLIENT_PROFILE" --bench chat_turns -- --label "$1" --url "$2" --token "$3" \
        --model alpha-3.3 --turns "$TURNS" --conversations "$CONVERSATIONS" \
        --max-tokens "$MAX_TOKENS" --json "$OUT/multiturn-$1.jsonl"
}

hearth() { # LABEL PREFIX_REUSE
    rm -rf "$DATA" && mkdir -p "$DATA"
    # Only SmolLM2's row, with absolute paths, the benchmark's threads and the reuse setting.
    sed -n '/^\[defaults\]/,/^\[text."beta-4-mini"\]/p' models.toml | sed '$d' |
        sed -e "s|^weights = \"weights/|weights = \"$ROOT/weights/|" -e "s|^threads = .*|threads = $THREADS|" \
            -e "/^\[text.\"alpha-3.3\"\]/a prefix_reuse = $2" >"$DATA/models.toml"
    "$HEARTH" balance credit bench 1000000 --data-dir "$DATA" >/dev/null
    HEARTH_COMPLETION_MAX_CONCURRENT_PER_USER=0 "$HEARTH" serve --data-dir "$DATA" \
        --services auth,completion --models "$DATA/models.toml" \
        --auth-addr "127.0.0.1:$AUTH_PORT" --completion-addr "127.0.0.1:$COMPLETION_PORT" \
        >"$OUT/multiturn-$1.log" 2>&1 &
    PID=$!
    wait_for "http://127.0.0.1:$COMPLETION_PORT/" '"alpha-3.3":"ready"'
    local idp token
    idp="$("$HEARTH" idp mint bench --data-dir "$DATA")"
    token="$(curl -sf -X POST "http://127.0.0.1:$AUTH_PORT/token" -H 'Content-Type: application/json' \
        -d "{\"userId\":\"bench\",\"idpToken\":\"$idp\",\"lifetimeSeconds\":86400}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["serviceToken"])')"
    log "$1: $(cut -d' ' -f1-3 /proc/loadavg) load average at the start"
    chat "$1" "http://127.0.0.1:$COMPLETION_PORT" "$token"
    stop
}

echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); $THREADS threads per server"
hearth hearth true
if [ -z "${SKIP_WITHOUT:-}" ]; then hearth hearth-no-reuse false; fi

# llama-server as it ships (prompt cache on, unified KV, host-memory prompt cache), 8 slots with
# room for 8 whole conversations.
CTX=$(( 8 * (TURNS * (200 + MAX_TOKENS) + 256) ))
"$LLAMA_BIN/llama-server" -m "$MODEL" -np 8 -c "$CTX" -t "$THREADS" -tb "$THREADS" \
    --host 127.0.0.1 --port "$LLAMA_PORT" --no-webui >"$OUT/multiturn-llama-server.log" 2>&1 &
PID=$!
wait_for "http://127.0.0.1:$LLAMA_PORT/health" ok
log "llama-server: $(cut -d' ' -f1-3 /proc/loadavg) load average at the start"
chat llama-server "http://127.0.0.1:$LLAMA_PORT" none
stop

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
runs = {}
for label in ("hearth", "hearth-no-reuse", "llama-server"):
    path = f"{out}/multiturn-{label}.jsonl"
    if os.path.exists(path):
        runs[label] = {r["conversations"]: r for r in map(json.loads, open(path))}
h, l, n = runs["hearth"], runs["llama-server"], runs.get("hearth-no-reuse", {})
for c in sorted(h):
    print(f"\n{c} conversation(s): time to first token per turn, median over conversations (ms)")
    print("| turn | prompt tokens (hearth / llama) | hearth | hearth without reuse | llama-server | hearth / without | hearth / llama-server |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for t, ttft in enumerate(h[c]["ttft_ms"]):
        no = n[c]["ttft_ms"][t] if c in n else float("nan")
        ll = l[c]["ttft_ms"][t]
        print(f"| {t + 1} | {h[c]['prompt_tokens'][t]} / {l[c]['prompt_tokens'][t]} | {ttft:.0f} | {no:.0f} | {ll:.0f} | {ttft / no:.3f} | {ttft / ll:.3f} |")
    print("| wall s | | {:.1f} | {} | {:.1f} | | |".format(
        h[c]["wall_s"], f"{n[c]['wall_s']:.1f}" if c in n else "-", l[c]["wall_s"]))
    print("| output tok/s | | {:.1f} | {} | {:.1f} | | {:.2f}x |".format(
        h[c]["tok_s"], f"{n[c]['tok_s']:.1f}" if c in n else "-", l[c]["tok_s"], h[c]["tok_s"] / l[c]["tok_s"]))
PY
