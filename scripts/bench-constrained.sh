#!/usr/bin/env bash
# The cost of constrained decoding (issue 17): the scheduler alone on SmolLM2-135M-Instruct Q4_1,
# each level run plain and then with every stream held to a JSON schema (hearth-grammar masks,
# free-text fields, never finished within MAX_TOKENS), alternating for ROUNDS rounds, in one
# process. Prints per-run rows, the constrained/plain ratios of the medians, the constraint's
# own time per token and the sampler's cost with and without a mask.
#
#   scripts/bench-constrained.sh        # env: THREADS=2 STREAMS=1,4,8 MAX_TOKENS=64 ROUNDS=5
# Results: a Markdown table on stdout, JSON lines in .cache/bench/constrained.jsonl.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
THREADS="${THREADS:-2}"
STREAMS="${STREAMS:-1,4,8}"
MAX_TOKENS="${MAX_TOKENS:-64}"
ROUNDS="${ROUNDS:-5}"
MODEL="$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT="$ROOT/.cache/bench"
mkdir -p "$OUT"
[ -f "$MODEL" ] || scripts/fetch-weights.sh smollm2
cargo bench -q -p hearth-scheduler --bench decode -- \
    --model "$MODEL" --threads "$THREADS" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" \
    --schema --rounds "$ROUNDS" --json "$OUT/constrained.jsonl"
