#!/usr/bin/env bash
# Speculative decoding: Hearth's prompt lookup against plain decoding, and llama.cpp's own n-gram
# lookup (llama-server --spec-type ngram-simple) against its plain decoding, on SmolLM2-135M and
# Gemma 3 270M, 2 threads, greedy, one stream and 8, on input-grounded tasks (summarise, extract,
# rewrite code, answer from a passage, JSON extraction) and open chat; the same prompt tokens for
# both engines (crates/scheduler/benches/shared/grounded.rs).
#
#   scripts/bench-spec.sh             # env: ROUNDS=3 STREAMS=1,8 MAX_TOKENS=160 THREADS=2
#                                     #      MODELS="smollm2 gemma3" SKIP_LLAMA=1
#
# Hearth: the scheduler bench `speculative`, two engines in one process, plain and speculating
# alternately, ROUNDS rounds, medians. llama.cpp: llama-server -np 8, once plain and once with
# ngram-simple (lookup of 3 tokens, drafts of up to 8: Hearth's bounds), ROUNDS rounds each, the
# medians of the sum of its per-request `timings.predicted_per_second`. Results: Markdown on
# stdout, JSON lines in .cache/bench-spec/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROUNDS="${ROUNDS:-3}"
STREAMS="${STREAMS:-1,8}"
MAX_TOKENS="${MAX_TOKENS:-160}"
THREADS="${THREADS:-2}"
MODELS="${MODELS:-smollm2 gemma3}"
OUT="$ROOT/.cache/bench-spec"
mkdir -p "$OUT"
log() { echo "bench-spec: $*" >&2; }

log "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before the run"
cargo bench -q -p hearth-scheduler --bench speculative --no-run 2>/dev/null
LLAMA_BIN=""
if [ "${SKIP_LLAMA:-0}" != 1 ]; then
    LLAMA_BIN="$(scripts/build-llama-cpp.sh)" || { log "llama.cpp could not be built; Hearth only"; LLAMA_BIN=""; }
fi

model_file() {
    case "$1" in
        smollm2) echo "$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
        gemma3) echo "$ROOT/weights/gemma-3-270m-Q4_K_M.gguf" ;;
        *) log "unknown model $1"; exit 2 ;;
    esac
}

# llama-server on $1 (extra flags after it) answering the prompts of $2 into $3.
llama_run() {
    local file="$1" prompts="$2" out="$3" label="$4"; shift 4
    local port="${LLAMA_PORT:-18091}"
    "$LLAMA_BIN/llama-server" -m "$file" -np 8 -c 16384 -t "$THREADS" -tb "$THREADS" \
        --host 127.0.0.1 --port "$port" --no-webui "$@" >"$OUT/llama-server-$label.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 240); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || { log "llama-server exited; see $OUT/llama-server-$label.log"; return 1; }
        sleep 0.5
    done
    python3 - "$port" "$prompts" "$out" "$label" "$STREAMS" "$MAX_TOKENS" "$ROUNDS" <<'PY'
import json, sys, threading, urllib.request
port, prompts, out, label, streams, max_tokens, rounds = sys.argv[1:8]
prompts = json.load(open(prompts))
lines = []
def one(ids, results, i):
    body = json.dumps({"prompt": ids, "n_predict": int(max_tokens), "temperature": 0.0,
                       "top_k": 1, "stream": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                 {"Content-Type": "application/json"})
    results[i] = json.load(urllib.request.urlopen(req, timeout=600))
for task, ids in prompts.items():
    for n in map(int, streams.split(",")):
        rates, drafted, accepted, tokens = [], 0, 0, 0
        for _ in range(int(rounds)):
            results = [None] * n
            threads = [threading.Thread(target=one, args=(ids, results, i)) for i in range(n)]
            for t in threads: t.start()
            for t in threads: t.join()
            rates.append(sum(r["timings"]["predicted_per_second"] for r in results))
            tokens = sum(r["timings"]["predicted_n"] for r in results)
            drafted += sum(r["timings"].get("draft_n", 0) for r in results)
            accepted += sum(r["timings"].get("draft_n_accepted", 0) for r in results)
        rates.sort()
        lines.append({"task": task, "streams": n, "label": label, "tok_s": rates[len(rates) // 2],
                      "tokens": tokens, "drafted": drafted, "accepted": accepted})
with open(out, "w") as f:
    for l in lines: f.write(json.dumps(l) + "\n")
PY
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

for name in $MODELS; do
    file="$(model_file "$name")"
    [ -f "$file" ] || scripts/fetch-weights.sh "$name"
    template=own
    [ "$name" = gemma3 ] && template=gemma
    log "$name: Hearth, plain and prompt lookup, $ROUNDS rounds"
    cargo bench -q -p hearth-scheduler --bench speculative -- --model "$file" --template "$template" \
        --threads "$THREADS" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" --rounds "$ROUNDS" \
        --json "$OUT/$name-hearth.jsonl" --prompts "$OUT/$name-prompts.json"
    if [ -n "$LLAMA_BIN" ]; then
        log "$name: llama-server plain"
        llama_run "$file" "$OUT/$name-prompts.json" "$OUT/$name-llama-plain.jsonl" plain
        log "$name: llama-server ngram-simple"
        llama_run "$file" "$OUT/$name-prompts.json" "$OUT/$name-llama-ngram.jsonl" ngram \
            --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8
    fi
done
log "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT" $MODELS <<'PY'
import json, os, sys
out, models = sys.argv[1], sys.argv[2:]
def rows(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
print("\n| model | task | streams | Hearth plain | Hearth ngram | ratio | accepted | llama.cpp plain | llama.cpp ngram | ratio | accepted | Hearth ngram / llama.cpp ngram |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
summary = []
for m in models:
    plain = {(r["task"], r["streams"]): r for r in rows(f"{out}/{m}-llama-plain.jsonl")}
    ngram = {(r["task"], r["streams"]): r for r in rows(f"{out}/{m}-llama-ngram.jsonl")}
    for h in rows(f"{out}/{m}-hearth.jsonl"):
        k = (h["task"], h["streams"])
        lp, ln = plain.get(k), ngram.get(k)
        share = lambda a, d: f"{a / d:.0%}" if d else "-"
        cells = [m, h["task"], h["streams"], f'{h["plain_tok_s"]:.1f}', f'{h["ngram_tok_s"]:.1f}',
                 f'{h["ratio"]:.2f}', share(h["accepted"], h["drafted"])]
        if lp and ln:
            cells += [f'{lp["tok_s"]:.1f}', f'{ln["tok_s"]:.1f}', f'{ln["tok_s"] / lp["tok_s"]:.2f}',
                      share(ln["accepted"], ln["drafted"]), f'{h["ngram_tok_s"] / ln["tok_s"]:.2f}']
        else:
            cells += ["-"] * 5
        print("| " + " | ".join(map(str, cells)) + " |")
        if not h["same_output"]:
            print(f"WARNING: {m} {h['task']} {h['streams']}: Hearth's outputs differ with speculation")
PY
