#!/usr/bin/env bash
# Regenerates the encoder fixtures: tests/fixtures/embed/minilm.json (sentence-transformers'
# vectors, PyTorch on the CPU, for the texts in scripts/embed/reference.py, from the
# all-MiniLM-L6-v2 folder fetch-weights.sh writes) and tests/fixtures/rerank (a seeded tiny
# cross-encoder and CrossEncoder's scores for it, scripts/embed/rerank_fixture.py). Needs PyPI (torch, sentence-transformers); the venv lives in the git-ignored
# .venv-embed/. The tests read the fixture and need neither.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-embed
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir \
    "torch>=2.4" "sentence-transformers>=3"
bash scripts/fetch-weights.sh minilm
"$VENV/bin/python" scripts/embed/reference.py weights/all-MiniLM-L6-v2 \
    tests/fixtures/embed/minilm.json
# The generated cross-encoder and CrossEncoder's scores for it (tests/fixtures/rerank).
rm -rf tests/fixtures/rerank
"$VENV/bin/python" scripts/embed/rerank_fixture.py weights/all-MiniLM-L6-v2 tests/fixtures/rerank
