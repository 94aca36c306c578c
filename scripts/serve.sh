#!/usr/bin/env bash
# Quick start: installs what Hearth needs, fetches the default weights and runs `hearth serve`
# with the embedded defaults (auth :8081, completion :8082, markdown :8083, imagine :8084, data
# in ./data). Extra arguments go to `hearth serve` (e.g. scripts/serve.sh --services auth).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { echo "serve.sh: $*" >&2; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
for tool in python3 pip3 cc; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing python3, pip and a C compiler (missing: ${missing[*]})"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-pip build-essential >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { log "cargo not found: install Rust (rustup) first"; exit 1; }

log "fetching Rust dependencies"
cargo fetch --locked 2>/dev/null || cargo fetch

if [ -x scripts/fetch-weights.sh ]; then
    log "fetching default weights"
    scripts/fetch-weights.sh
fi

log "building and starting hearth (release)"
exec cargo run --release -- serve "$@"
