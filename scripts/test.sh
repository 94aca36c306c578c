#!/usr/bin/env bash
# The whole Hearth test suite, on a fresh machine: installs what the tests need (Chromium and
# ChromeDriver for the browser tests), fetches weights and test documents, then runs
# `cargo test --workspace`. Extra arguments go to cargo test (e.g. scripts/test.sh -- auth).
# Browser tests are mandatory here (HEARTH_BROWSER_TESTS=1): a missing browser fails them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { echo "test.sh: $*" >&2; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# apt_need PACKAGE... : installs the Debian packages that are not installed yet.
APT_UPDATED=0
apt_need() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        $SUDO apt-get update -qq
        APT_UPDATED=1
    fi
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ---- system packages --------------------------------------------------------------------
apt_need chromium chromium-driver    # browser tests of the /ui pages (tests/browser_*.rs)
apt_need postgresql                  # the PostgreSQL store's tests (scripts/postgres.sh)
apt_need systemd                     # systemd-analyze verify of deploy/hearth.service (tests/deploy.rs)
# OCR in the markdown service (tesseract-ocr pulls in eng and osd), and the fonts
# scripts/ocr/pages.py draws its test pages with
apt_need tesseract-ocr tesseract-ocr-fra tesseract-ocr-deu tesseract-ocr-spa tesseract-ocr-ita \
    tesseract-ocr-por tesseract-ocr-nld fonts-dejavu-core

# ---- a throwaway PostgreSQL for the store's second backend ------------------------------
# Without HEARTH_TEST_POSTGRES_URL, `cargo test` skips those tests (with a message); here they
# must run, so a cluster is started (unless one was given) and stopped when the script ends.
if [ -z "${HEARTH_TEST_POSTGRES_URL:-}" ]; then
    eval "$(scripts/postgres.sh start)"
    trap 'scripts/postgres.sh stop "$HEARTH_PG_DIR"' EXIT
fi
export HEARTH_TEST_POSTGRES_URL

# ---- fetch steps: weights, documents, python deps ---------------------------------------
# Each service adds its fetch step here. Steps must be idempotent and quick when done already.
if [ -x scripts/fetch-weights.sh ]; then
    log "fetching text weights"
    scripts/fetch-weights.sh
fi
if [ -x scripts/fetch-test-docs.sh ]; then
    log "fetching markdown test documents"
    scripts/fetch-test-docs.sh
fi
log "python clients (openai, anthropic, ollama, cohere, prometheus_client, openapi-spec-validator, pillow)"
scripts/python-clients.sh
log "OCR test pages"
.cache/venv-clients/bin/python scripts/ocr/pages.py \
    "${HEARTH_TEST_DOCS:-$ROOT/.cache/test-docs}/ocr-pages"
# ---- end of fetch steps -----------------------------------------------------------------

export HEARTH_BROWSER_TESTS=1
log "cargo test --workspace $*"
# (The llama.cpp parity emulator and its bit-exact runs are crates/infer-parity's tests, part of
# the workspace's: no serving crate depends on that crate.)
cargo test --workspace "$@"
