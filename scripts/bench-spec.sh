#!/usr/bin/env bash
# Speculative decoding: Hearth's prompt lookup and draft model against plain decoding, and
# llama.cpp's own n-gram lookup (llama-server --spec-type ngram-simple) and draft model
# (llama-server -md) against its plain decoding, on SmolLM2-135M and Gemma 3 270M, 2 threads,
# greedy, one stream and 8, on input-grounded tasks (summarise, extract, rewrite code, answer from
# a passage, JSON extraction) and open chat; the same prompt tokens for both engines
# (crates/scheduler/benches/shared/grounded.rs).
#
#   scripts/bench-spec.sh             # env: ROUNDS=3 STREAMS=1,8 MAX_TOKENS=160 THREADS=2
#                                     #      MODELS="smollm2 gemma3" SKIP_LLAMA=1 DRAFT=1
#
# DRAFT=1 (the default): the model is an F16 copy of the fetched file and a Q4_0 copy drafts for
# it (both written by `hearth dev requantize` once, into weights/): the pair a team would run,
# the full-precision model checked by its 4-bit self. DRAFT=0: the fetched file itself, plain and
# prompt lookup only.
#
# Hearth: the scheduler bench `speculative`, the engines in one process, taking turns, ROUNDS
# rounds, medians. llama.cpp: llama-server -np 8, plain, with ngram-simple (lookup of 3 tokens,
# drafts of up to 8: Hearth's bounds) and with the draft model (drafts of up to 8, each token
# drafted while the draft is 75% sure of it: llama.cpp's long-time default), ROUNDS rounds
# each, the medians of the sum of its per-request `timings.predicted_per_second`. Results:
# Markdown on stdout, JSON lines in .cache/bench-spec/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ROUNDS="${ROUNDS:-3}"
STREAMS="${STREAMS:-1,8}"
MAX_TOKENS="${MAX_TOKENS:-160}"
THREADS="${THREADS:-2}"
MODELS="${MODELS:-smollm2 gemma3}"
DRAFT="${DRAFT:-1}"
OUT="$ROOT/.cache/bench-spec"
mkdir -p "$OUT"
log() { echo "bench-spec: $*" >&2; }

log "$("$ROOT/scripts/bench/machine.sh") (before the run)"
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
    draft_args=()
    if [ "$DRAFT" = 1 ]; then
        source="$file"
        file="${source%.gguf}.F16-copy.gguf"
        draft="${source%.gguf}.Q4_0-copy.gguf"
        for pair in "$file f16" "$draft q4_0"; do
            set -- $pair
            [ -f "$1" ] || cargo run -q --release -p hearth --bin hearth -- dev requantize \
                "$source" "$1" --type "$2" >&2
        done
        draft_args=(--draft "$draft")
    fi
    log "$name: Hearth, plain, prompt lookup${draft_args:+ and draft model}, $ROUNDS rounds"
    cargo bench -q -p hearth-scheduler --bench speculative -- --model "$file" --template "$template" \
        --threads "$THREADS" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" --rounds "$ROUNDS" \
        --json "$OUT/$name-hearth.jsonl" --prompts "$OUT/$name-prompts.json" "${draft_args[@]}"
    if [ -n "$LLAMA_BIN" ]; then
        log "$name: llama-server plain"
        llama_run "$file" "$OUT/$name-prompts.json" "$OUT/$name-llama-plain.jsonl" plain
        log "$name: llama-server ngram-simple"
        llama_run "$file" "$OUT/$name-prompts.json" "$OUT/$name-llama-ngram.jsonl" ngram \
            --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8
        if [ "$DRAFT" = 1 ]; then
            log "$name: llama-server with the draft model"
            llama_run "$file" "$OUT/$name-prompts.json" "$OUT/$name-llama-draft.jsonl" draft \
                -md "$draft" --spec-type draft-simple --spec-draft-n-max 8 --spec-draft-n-min 0 \
                --spec-draft-p-min 0.75
        fi
    fi
done
log "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT" $MODELS <<'PY'
import json, os, sys
out, models = sys.argv[1], sys.argv[2:]
def rows(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
share = lambda a, d: f"{a / d:.0%}" if d else "-"
hearth = {m: rows(f"{out}/{m}-hearth.jsonl") for m in models}
methods = [k for k in ("ngram", "draft") if any(f"{k}_tok_s" in h for m in models for h in hearth[m])]
head = ["model", "task", "streams", "Hearth plain"]
for k in methods:
    head += [f"Hearth {k}", "ratio", "accepted"]
head += ["llama.cpp plain"]
for k in methods:
    head += [f"llama.cpp {k}", "ratio", "accepted", f"Hearth {k} / llama.cpp {k}"]
print("\n| " + " | ".join(head) + " |")
print("|---|---|" + "---:|" * (len(head) - 2))
for m in models:
    llama = {k: {(r["task"], r["streams"]): r for r in rows(f"{out}/{m}-llama-{k}.jsonl")}
             for k in ["plain"] + methods}
    for h in hearth[m]:
        key = (h["task"], h["streams"])
        cells = [m + (f' (draft {h["draft"]})' if h.get("draft") else ""), h["task"], h["streams"],
                 f'{h["plain_tok_s"]:.1f}']
        for k in methods:
            cells += [f'{h[f"{k}_tok_s"]:.1f}', f'{h[f"{k}_ratio"]:.2f}',
                      share(h[f"{k}_accepted"], h[f"{k}_drafted"])]
        lp = llama["plain"].get(key)
        cells += [f'{lp["tok_s"]:.1f}' if lp else "-"]
        for k in methods:
            lk = llama[k].get(key)
            if lp and lk:
                cells += [f'{lk["tok_s"]:.1f}', f'{lk["tok_s"] / lp["tok_s"]:.2f}',
                          share(lk["accepted"], lk["drafted"]), f'{h[f"{k}_tok_s"] / lk["tok_s"]:.2f}']
            else:
                cells += ["-"] * 4
        print("| " + " | ".join(map(str, cells)) + " |")
        if not h["same_output"]:
            print(f"WARNING: {m} {h['task']} {h['streams']}: Hearth's outputs differ with speculation")
PY
