#!/usr/bin/env bash
# Soak benchmark (not run in CI): a real `hearth serve` with all four services under a steady mix
# of traffic for DURATION, sampled every minute for leaks (RSS, fds, threads, latency), then a
# money check against the ledger. The driver is scripts/soak/; this builds what it needs.
#
#   scripts/soak.sh DURATION [--postgres URL] [--out FILE] [--interval SECS] [--rate X] [--keep]
#   scripts/soak.sh 30m            # 90s, 2h, 1h30m also work
#
# The table and summary go to stdout and to .cache/soak/soak-<timestamp>.md (the server's log
# beside it). Exits 1 when the money check fails, an answer was unexpected (a 5xx other than a
# hostile upload's documented `Conversion failed`), a request got no answer, or the server died.
# PROFILE=dev (default; the model crates are optimised in dev too, and overflow checks stay on,
# which a soak wants) or PROFILE=release; HEARTH_BIN=path uses a built binary and skips the build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { echo "soak.sh: $*" >&2; }

if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
    echo "usage: scripts/soak.sh DURATION [--postgres URL] [--out FILE] [--interval SECS] [--rate X] [--keep]" >&2
    exit 2
fi

PROFILE="${PROFILE:-dev}"
if [ -n "${HEARTH_BIN:-}" ]; then
    BIN="$HEARTH_BIN"
else
    log "building hearth ($PROFILE)"
    cargo build -q --locked --profile "$PROFILE" --bin hearth
    DIR_NAME="$PROFILE"; [ "$PROFILE" = dev ] && DIR_NAME=debug
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/$DIR_NAME/hearth"
fi

scripts/fetch-weights.sh smollm2
# Real documents make the uploads more varied; without them (no network) the driver uses the
# documents it writes itself.
scripts/fetch-test-docs.sh >/dev/null || log "no test documents fetched: the soak uses generated ones only"

# The driver needs only the standard library (see its docstring for why not the openai client).
exec python3 "$ROOT/scripts/soak" "$@" --bin "$BIN"
