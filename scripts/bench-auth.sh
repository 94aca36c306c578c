#!/usr/bin/env bash
# /validate throughput and latency, measured by wrk (a second process) against `hearth serve
# --services auth` on loopback. Starts its own server in a temporary data dir and stops it.
#   scripts/bench-auth.sh [DURATION_SECS] [CONNECTIONS] [THREADS]   (default 20 64 1)
# PROFILE=release (default) or PROFILE=dev picks the cargo profile the server is built with;
# HEARTH_BIN=path uses an existing binary instead of building.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DURATION="${1:-20}"; CONNECTIONS="${2:-64}"; THREADS="${3:-1}"
PROFILE="${PROFILE:-release}"
log() { echo "bench-auth: $*" >&2; }

if ! command -v wrk >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq wrk >/dev/null
fi

if [ -n "${HEARTH_BIN:-}" ]; then
    BIN="$HEARTH_BIN"   # a hearth binary built already (skips the build)
elif [ "$PROFILE" = "release" ]; then
    cargo build --release --bin hearth >&2
    DIR_NAME=release
else
    cargo build --bin hearth >&2
    DIR_NAME=debug
fi
BIN="${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/$DIR_NAME/hearth}"

DATA="$(mktemp -d)"
LOG="$DATA/server.log"
cleanup() { [ -n "${SERVER_PID:-}" ] && kill "$SERVER_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$DATA"; }
trap cleanup EXIT

RUST_LOG=hearth=info "$BIN" serve --services auth --auth-addr 127.0.0.1:0 --data-dir "$DATA" 2>"$LOG" &
SERVER_PID=$!
for _ in $(seq 1 100); do
    ADDR="$(sed -n 's/.*listening service=auth addr=\([0-9.:]*\).*/\1/p' "$LOG" | head -1)"
    [ -n "$ADDR" ] && break
    sleep 0.1
done
[ -n "${ADDR:-}" ] || { log "server did not start"; cat "$LOG" >&2; exit 1; }
URL="http://$ADDR"

IDP="$("$BIN" idp mint bench --data-dir "$DATA")"
TOKEN="$(curl -fsS -H 'Content-Type: application/json' \
    -d "{\"userId\":\"bench\",\"idpToken\":\"$IDP\",\"lifetimeSeconds\":3600}" "$URL/token" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["serviceToken"])')"

log "profile=$PROFILE duration=${DURATION}s connections=$CONNECTIONS threads=$THREADS cores=$(nproc)"
TOKEN="$TOKEN" wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -s benches/validate.lua "$URL/validate"
