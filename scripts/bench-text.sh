#!/usr/bin/env bash
# Text inference: llama.cpp vs Hearth on the same GGUF, same thread count, same run.
#
#   Part 1 (single stream): llama-bench -t T -p 128 -n 128 and Hearth's bench_text example,
#   interleaved REPS times (default 5); medians of prefill tok/s (128-token prompt), decode tok/s
#   (128 tokens), peak RSS (/usr/bin/time -v), and the Hearth/llama.cpp ratios. Both sides run
#   the same two tests the same way: a warm-up, then prefill into an empty cache, and decode
#   from an empty cache.
#   Part 2 (concurrent streams): scripts/bench-scheduler.sh with 1 and 8 streams: Hearth's
#   scheduler and llama-server -np 8 (over HTTP) under the same load, same run.
#
# Usage: scripts/bench-text.sh [gguf] [threads] [reps]
#   env: BACKEND=auto|candle|fast (Hearth backend), SKIP_BUILD=1 (reuse the built binaries),
#        SKIP_STREAMS=1 (part 1 only; part 2 always uses SmolLM2)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${2:-2}"
REPS="${3:-5}"
BACKEND="${BACKEND:-auto}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

[ -f "$MODEL" ] || "$ROOT/scripts/fetch-weights.sh"
[ -f "$MODEL" ] || { echo "missing $MODEL: run scripts/fetch-weights.sh" >&2; exit 1; }
if [ -z "${SKIP_BUILD:-}" ]; then
    LLAMA_BIN="$("$ROOT/scripts/build-llama-cpp.sh")"
    (cd "$ROOT" && cargo build --release -q -p hearth-infer --example bench_text)
else
    LLAMA_BIN="$ROOT/.cache/llama.cpp/build/bin"
fi
HEARTH="$CARGO_TARGET_DIR/release/examples/bench_text"

echo "== single stream: $(basename "$MODEL"), $THREADS threads, $REPS interleaved runs =="
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$REPS"); do
    /usr/bin/time -v "$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 128 -n 128 -r 1 -o json \
        >"$OUT/llama-$i.json" 2>"$OUT/llama-$i.time"
    /usr/bin/time -v "$HEARTH" --model "$MODEL" --threads "$THREADS" --prompt 128 --gen 128 --backend "$BACKEND" \
        >"$OUT/hearth-$i.json" 2>"$OUT/hearth-$i.time"
    echo "run $i done (load average $(cut -d' ' -f1 /proc/loadavg))"
done

python3 - "$OUT" "$REPS" <<'EOF'
import json, re, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def rss_mib(path):
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(path).read())
    return int(m.group(1)) / 1024 if m else float("nan")
rows = {"llama.cpp": {"prefill": [], "decode": [], "rss": []}, "hearth": {"prefill": [], "decode": [], "rss": [], "load": []}}
for i in range(1, reps + 1):
    for r in json.load(open(f"{out}/llama-{i}.json")):
        key = "prefill" if r["n_prompt"] > 0 else "decode"
        rows["llama.cpp"][key].append(r["avg_ts"])
    rows["llama.cpp"]["rss"].append(rss_mib(f"{out}/llama-{i}.time"))
    h = json.loads(open(f"{out}/hearth-{i}.json").read().strip().splitlines()[-1])
    rows["hearth"]["prefill"].append(h["prefill_tok_s"])
    rows["hearth"]["decode"].append(h["decode_tok_s"])
    rows["hearth"]["load"].append(h["load_s"])
    rows["hearth"]["rss"].append(rss_mib(f"{out}/hearth-{i}.time"))
med = {e: {k: statistics.median(v) for k, v in d.items() if v} for e, d in rows.items()}
print(f"{'engine':<10} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MiB':>13}")
for e in ("llama.cpp", "hearth"):
    m = med[e]
    print(f"{e:<10} {m['prefill']:>14.1f} {m['decode']:>13.2f} {m['rss']:>13.1f}")
l, h = med["llama.cpp"], med["hearth"]
print(f"{'ratio':<10} {h['prefill']/l['prefill']:>14.3f} {h['decode']/l['decode']:>13.3f} {h['rss']/l['rss']:>13.3f}   (hearth / llama.cpp)")
print(f"hearth load time median: {h['load']*1000:.0f} ms")
print("raw:", json.dumps(rows))
EOF

# == concurrent streams: Hearth's scheduler vs llama-server -np 8, same model, threads, load ====
if [ -z "${SKIP_STREAMS:-}" ]; then
    echo
    echo "== concurrent streams (scripts/bench-scheduler.sh, SmolLM2, $THREADS threads) =="
    THREADS="$THREADS" STREAMS="${STREAMS:-1,8}" "$ROOT/scripts/bench-scheduler.sh"
fi
