#!/usr/bin/env bash
# The store's two backends side by side, in one run: /validate throughput (wrk, through
# scripts/bench-auth.sh) and hold+settle pairs per second (crates/store/examples/holds_bench.rs,
# one user per task and all tasks on one user), first on sled, then on a throwaway PostgreSQL
# (scripts/postgres.sh: local, fsync off) or the database in BENCH_POSTGRES_URL.
#
#   scripts/bench-store.sh [SECS] [CONNECTIONS] [TASKS]     (default 10 64 16)
#
# PROFILE=release (default) or dev; CARGO_TARGET_DIR is honoured. Prints one table at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECS="${1:-10}"; CONNECTIONS="${2:-64}"; TASKS="${3:-16}"
PROFILE="${PROFILE:-release}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
if [ "$PROFILE" = dev ]; then DIR_NAME=debug; else DIR_NAME="$PROFILE"; fi
log() { echo "bench-store: $*" >&2; }

log "building hearth and holds_bench ($PROFILE)"
cargo build -q --profile "$PROFILE" --bin hearth
cargo build -q --profile "$PROFILE" -p hearth-store --features postgres --example holds_bench
HEARTH="$TARGET/$DIR_NAME/hearth"
HOLDS="$TARGET/$DIR_NAME/examples/holds_bench"

PG_DIR=""
trap 'if [ -n "$PG_DIR" ]; then scripts/postgres.sh stop "$PG_DIR"; fi' EXIT
if [ -n "${BENCH_POSTGRES_URL:-}" ]; then
    PG="$BENCH_POSTGRES_URL"
else
    eval "$(scripts/postgres.sh start)"
    PG_DIR="$HEARTH_PG_DIR"
    PG="$HEARTH_TEST_POSTGRES_URL"   # the throwaway cluster's own database
fi

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS=()
for backend in sled postgres; do
    if [ "$backend" = sled ]; then url=""; target=sled; else url="$PG"; target="$PG"; fi
    log "$backend: /validate, ${SECS}s, $CONNECTIONS connections"
    out="$(HEARTH_STORE_URL="$url" HEARTH_BIN="$HEARTH" scripts/bench-auth.sh "$SECS" "$CONNECTIONS" 1)"
    echo "$out" >&2
    rps="$(echo "$out" | sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p')"
    p99="$(echo "$out" | sed -n 's/^p99 latency: \(.*\)/\1/p')"
    bad="$(echo "$out" | sed -n 's/^non-200 responses: \(.*\)/\1/p')"
    many="$("$HOLDS" "$target" "$TASKS" "$SECS")"
    one="$("$HOLDS" "$target" "$TASKS" "$SECS" one)"
    log "$many"; log "$one"
    pairs() { echo "$1" | grep -o '[0-9.]* hold+settle pairs/s' | cut -d' ' -f1; }
    RESULTS+=("| $backend | $rps | $p99 | $bad | $(pairs "$many") | $(pairs "$one") |")
done

echo "load average at the start $LOAD_BEFORE, at the end $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; profile $PROFILE; ${SECS}s each"
echo "| backend | /validate req/s | /validate p99 | non-200 | hold+settle pairs/s, $TASKS users | same, 1 user |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${RESULTS[@]}"
