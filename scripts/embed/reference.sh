#!/usr/bin/env bash
# Regenerates the encoder fixtures: tests/fixtures/embed/minilm.json (sentence-transformers'
# vectors, PyTorch on the CPU, for the texts in scripts/embed/reference.py, from the
# all-MiniLM-L6-v2 folder fetch-weights.sh writes) and tests/fixtures/rerank (a seeded tiny
# cross-encoder and CrossEncoder's scores for it, scripts/embed/rerank_fixture.py) and
# tests/fixtures/embed/decoders (generated GGUF decoder embedders and rerankers, and llama.cpp's
# server's vectors and scores for them, scripts/embed/decoder_fixture.py; llama.cpp from
# scripts/build-llama-cpp.sh).
# Needs PyPI (torch, sentence-transformers); the venv lives in the git-ignored .venv-embed/. The
# tests read the fixtures and need none of it.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-embed
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir \
    "torch>=2.4" "sentence-transformers>=3" tqdm
bash scripts/fetch-weights.sh minilm
"$VENV/bin/python" scripts/embed/reference.py weights/all-MiniLM-L6-v2 \
    tests/fixtures/embed/minilm.json
# The generated cross-encoder and CrossEncoder's scores for it (tests/fixtures/rerank).
rm -rf tests/fixtures/rerank
"$VENV/bin/python" scripts/embed/rerank_fixture.py weights/all-MiniLM-L6-v2 tests/fixtures/rerank
# GGUF decoder embedders and rerankers, and llama.cpp's answers for them
# (tests/fixtures/embed/decoders).
bin="$(bash scripts/build-llama-cpp.sh)"
src="$(bash scripts/llama-cpp-source.sh .cache/llama.cpp)"
"$VENV/bin/python" scripts/embed/decoder_fixture.py "$(dirname "$bin")" "$src/gguf-py" \
    tests/fixtures/embed/decoders
