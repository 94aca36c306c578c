#!/usr/bin/env bash
# A throwaway virtual environment with the third-party clients the integration tests drive
# Hearth with: the official `openai`, `cohere`, `anthropic` and `ollama` packages, `prometheus_client` (its text-format parser),
# `openapi-spec-validator` (the OpenAPI 3.1 schema) and `jsonschema` (to validate structured
# output); and Pillow, which draws the OCR test pages (scripts/ocr/pages.py). Idempotent; prints
# nothing when done already.
#
#   scripts/python-clients.sh            # creates or updates .cache/venv-clients
# The tests find it at $HEARTH_CLIENTS_PYTHON or .cache/venv-clients/bin/python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.cache/venv-clients"
PACKAGES=("openai>=1.50,<3" "prometheus_client>=0.20" "openapi-spec-validator>=0.7" "jsonschema>=4.18"
    "pillow>=11" "cohere>=5.10,<8" "anthropic>=0.40,<3" "ollama>=0.4,<1")
STAMP="$VENV/.packages"
WANT="$(printf '%s\n' "${PACKAGES[@]}")"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ]; then
    exit 0
fi
echo "python-clients.sh: installing ${PACKAGES[*]} into $VENV" >&2
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PACKAGES[@]}"
printf '%s' "$WANT" >"$STAMP"
