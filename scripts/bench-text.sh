#!/usr/bin/env bash
# Text inference: llama.cpp vs Hearth on the same GGUF, same thread count, same run.
#
#   Part 1 (single stream): llama.cpp's llama-bench, ik_llama.cpp's (when IK_LLAMA_BIN names its
#   bin/ folder) and Hearth's bench_text example, interleaved REPS times (default 5), same threads;
#   medians of prefill tok/s (PROMPTS-token prompts into an empty cache), decode tok/s (GEN tokens
#   after DEPTHS tokens already in the cache), peak RSS (/usr/bin/time -v), and Hearth's ratio to
#   each. Every engine runs the same tests the same way: a warm-up, then each test once per run.
#   Part 2 (concurrent streams): scripts/bench-scheduler.sh with 1 and 8 streams: Hearth's
#   scheduler and llama-server -np 8 (over HTTP) under the same load, same run.
#
# Usage: scripts/bench-text.sh [gguf] [threads] [reps]
#        scripts/bench-text.sh archs [threads] [reps]
#   env: BACKEND=auto|candle|fast (Hearth backend), KV=f32|f16|q8_0|q4_0 (Hearth's KV cache;
#        both llama.cpp builds keep theirs in f16, or under KV=q8_0 or q4_0 in that type with the
#        flash attention it needs: -ctk q8_0 -ctv q8_0 -fa 1), SKIP_BUILD=1 (reuse the built
#        binaries),
#        PROMPTS=128,512,2048 DEPTHS=0,2048 GEN=128, IK_LLAMA_BIN=.cache/ik_llama.cpp/build/bin,
#        SKIP_STREAMS=1 (part 1 only; part 2 always uses SmolLM2)
#   `archs`: part 1 on one generated model of each architecture issue 18 added (llama3, qwen2,
#   qwen3, mistral, phi3) at the size of the family's smallest published model (random weights,
#   SmolLM2's vocabulary; scripts/tiny_models_specs.py BENCH_SHAPES), quantized to Q4_K_M by
#   llama-quantize into .cache/bench-models/ (made once, about a minute each); PROMPTS=128,512 and
#   DEPTHS=0 unless set.
#        scripts/bench-text.sh shapes [threads] [reps]
#   `shapes`: part 1 on llama-layout models with seeded random weights at the widths of Llama 3.2
#   1B and 3B, Qwen2.5 1.5B, Qwen3 4B, Phi-3 mini and Llama 3.1 8B (SmolLM2's 49,152-token
#   vocabulary; `hearth dev random-model`), for each of TYPES (default q4_k, also q8_0), written
#   into .cache/bench-models/ and removed after their run unless KEEP=1; SHAPES picks some
#   (e.g. SHAPES="llama3.2-1b qwen2.5-1.5b"); PROMPTS=512, DEPTHS=0, GEN=64 unless set. First the
#   machine's read bandwidth with THREADS threads (scripts/bench/readbw.c); after each model, its
#   file size and each engine's decode as a share of that bandwidth (a decode step reads every
#   matrix once; the embedding table, read a row a token, is under 3% of these files).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:-$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf}"
THREADS="${2:-2}"
REPS="${3:-5}"

if [ "$MODEL" = archs ]; then
    DIR="$ROOT/.cache/bench-models"
    VENV="$ROOT/.cache/tiny-models/venv"
    mkdir -p "$DIR"
    [ -x "$VENV/bin/python" ] || "$ROOT/scripts/tiny-models.sh" llama
    BIN="$("$ROOT/scripts/build-llama-cpp.sh")"
    [ -n "${SKIP_BUILD:-}" ] || (cd "$ROOT" && cargo build --release -q -p hearth-infer --example bench_text)
    for name in llama3 qwen2 qwen3 mistral phi3; do
        gguf="$DIR/$name-q4_k_m.gguf"
        if [ ! -f "$gguf" ]; then
            "$VENV/bin/python" "$ROOT/scripts/tiny-models.py" write --bench-shapes --only "$name" \
                --smollm2 "$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf" --vocab-size 49152 --out "$DIR"
            "$BIN/llama-quantize" "$DIR/$name-f32.gguf" "$gguf.tmp" Q4_K_M 2 >"$DIR/$name.quantize.log" 2>&1
            mv "$gguf.tmp" "$gguf"
            rm -f "$DIR/$name-f32.gguf"
        fi
    done
    for name in llama3 qwen2 qwen3 mistral phi3; do
        echo
        PROMPTS="${PROMPTS:-128,512}" DEPTHS="${DEPTHS:-0}" SKIP_BUILD=1 SKIP_STREAMS=1 \
            "$0" "$DIR/$name-q4_k_m.gguf" "$THREADS" "$REPS"
    done
    exit 0
fi
if [ "$MODEL" = shapes ]; then
    DIR="$ROOT/.cache/bench-models"
    mkdir -p "$DIR"
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
    # HEARTH_BIN: a `hearth` binary already built (any profile) writes the files.
    HEARTH_BIN="${HEARTH_BIN:-$CARGO_TARGET_DIR/release/hearth}"
    [ -n "${SKIP_BUILD:-}" ] || {
        "$ROOT/scripts/build-llama-cpp.sh" >/dev/null
        (cd "$ROOT" && cargo build --release -q -p hearth-infer --example bench_text)
        [ -x "$HEARTH_BIN" ] || (cd "$ROOT" && cargo build --release -q --bin hearth)
    }
    [ -f "$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf" ] || "$ROOT/scripts/fetch-weights.sh" smollm2
    cc -O3 -march=native -pthread "$ROOT/scripts/bench/readbw.c" -o "$DIR/readbw"
    BW="$("$DIR/readbw" "$THREADS" 2048)"
    echo "== read bandwidth, $THREADS threads: $BW GB/s (scripts/bench/readbw.c, best of 6 passes over 2 GiB) =="
    # name: layers hidden heads kv_heads ff (Qwen3 4B's 32 heads of 128 over a 2,560 width has
    # no llama layout: 20 heads of 128, 4 KV heads).
    declare -A SHAPE=(
        [llama3.2-1b]="16 2048 32 8 8192" [qwen2.5-1.5b]="28 1536 12 2 8960"
        [llama3.2-3b]="28 3072 24 8 8192" [phi3-mini]="32 3072 32 32 8192"
        [qwen3-4b]="36 2560 20 4 9728" [llama3.1-8b]="32 4096 32 8 14336"
    )
    for name in ${SHAPES:-llama3.2-1b qwen2.5-1.5b llama3.2-3b phi3-mini qwen3-4b llama3.1-8b}; do
        [ -n "${SHAPE[$name]:-}" ] || { echo "unknown shape $name" >&2; exit 2; }
        read -r layers hidden heads kv ff <<<"${SHAPE[$name]}"
        for ty in ${TYPES:-q4_k}; do
            gguf="$DIR/$name-$ty.gguf"
            [ -f "$gguf" ] || "$HEARTH_BIN" dev random-model "$gguf" \
                --tokenizer-from "$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf" --weights "$ty" \
                --layers "$layers" --hidden "$hidden" --heads "$heads" --kv-heads "$kv" --ff "$ff" >/dev/null
            echo
            echo "== $name ($layers layers, width $hidden, $heads heads / $kv KV, ff $ff), $ty, $(du -m "$gguf" | cut -f1) MiB =="
            PROMPTS="${PROMPTS:-512}" DEPTHS="${DEPTHS:-0}" GEN="${GEN:-64}" SKIP_BUILD=1 SKIP_STREAMS=1 \
                READ_BW="$BW" "$0" "$gguf" "$THREADS" "$REPS"
            [ -n "${KEEP:-}" ] || rm -f "$gguf"
        done
    done
    exit 0
fi
BACKEND="${BACKEND:-auto}"
PROMPTS="${PROMPTS:-128,512,2048}"
DEPTHS="${DEPTHS:-0,2048}"
export GEN="${GEN:-128}"
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

IK_BIN="${IK_LLAMA_BIN:-}"
if [ -n "$IK_BIN" ] && [ ! -x "$IK_BIN/llama-bench" ]; then
    echo "IK_LLAMA_BIN=$IK_BIN has no llama-bench (scripts/build-ik-llama-cpp.sh builds it)" >&2; exit 1
fi
[ -n "$IK_BIN" ] || echo "ik_llama.cpp: not measured (set IK_LLAMA_BIN to its bin/ folder; scripts/build-ik-llama-cpp.sh)"

# llama.cpp's cache as close to Hearth's as it has: the same quantized type, else its default f16.
LLAMA_KV=()
case "${KV:-f32}" in q8_0 | q4_0) LLAMA_KV=(-ctk "$KV" -ctv "$KV" -fa 1) ;; esac
echo "== single stream: $(basename "$MODEL"), $THREADS threads, $REPS interleaved runs, Hearth's KV cache ${KV:-f32} =="
echo "prefill of $PROMPTS tokens into an empty cache; decode of $GEN tokens after $DEPTHS tokens"
"$ROOT/scripts/bench/machine.sh"
for i in $(seq 1 "$REPS"); do
    # llama.cpp: the prefill tests, then the decode tests at each depth (-d applies to every test).
    /usr/bin/time -v "$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p "$PROMPTS" -n 0 -r 1 -o json \
        "${LLAMA_KV[@]}" >"$OUT/llama-$i.json" 2>"$OUT/llama-$i.time"
    /usr/bin/time -v "$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 0 -n "$GEN" -d "$DEPTHS" -r 1 -o json \
        "${LLAMA_KV[@]}" >"$OUT/llama-$i.dec.json" 2>"$OUT/llama-$i.dec.time"
    if [ -n "$IK_BIN" ]; then
        # ik_llama.cpp: -gp D,N decodes N tokens after a D-token prompt, timing the N only.
        GP=()
        for d in ${DEPTHS//,/ }; do [ "$d" = 0 ] || GP+=(-gp "$d,$GEN"); done
        /usr/bin/time -v "$IK_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p "$PROMPTS" -n "$GEN" "${GP[@]}" -r 1 -o json \
            "${LLAMA_KV[@]}" >"$OUT/ik-$i.json" 2>"$OUT/ik-$i.time"
    fi
    /usr/bin/time -v "$HEARTH" --model "$MODEL" --threads "$THREADS" --prompt "$PROMPTS" --gen "$GEN" \
        --depth "$DEPTHS" --backend "$BACKEND" --kv "${KV:-f32}" >"$OUT/hearth-$i.json" 2>"$OUT/hearth-$i.time"
    echo "run $i done (load average $(cut -d' ' -f1 /proc/loadavg))"
done

python3 - "$OUT" "$REPS" "$MODEL" <<'EOF'
import json, os, re, statistics, sys
out, reps, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
gen = os.environ.get("GEN", "128")
def rss_mib(paths):
    vals = []
    for path in paths:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(path).read())
        if m:
            vals.append(int(m.group(1)) / 1024)
    return max(vals) if vals else float("nan")
def llama_rows(paths):
    """prefill[n] and decode[depth] from llama-bench JSON (mainline: -d; ik: -gp)."""
    got = {}
    for path in paths:
        for r in json.load(open(path)):
            p, g, d = r["n_prompt"], r["n_gen"], r.get("n_depth", 0)
            key = ("prefill", p) if g == 0 else ("decode", d if p == 0 else p)
            got[key] = r["avg_ts"]
    return got
runs = {"llama.cpp": [], "ik_llama.cpp": [], "hearth": []}
for i in range(1, reps + 1):
    runs["llama.cpp"].append((llama_rows([f"{out}/llama-{i}.json", f"{out}/llama-{i}.dec.json"]),
                              rss_mib([f"{out}/llama-{i}.time", f"{out}/llama-{i}.dec.time"])))
    if os.path.exists(f"{out}/ik-{i}.json"):
        runs["ik_llama.cpp"].append((llama_rows([f"{out}/ik-{i}.json"]), rss_mib([f"{out}/ik-{i}.time"])))
    h = json.loads(open(f"{out}/hearth-{i}.json").read().strip().splitlines()[-1])
    rows = {("prefill", int(n)): v for n, v in h["prefill"].items()}
    rows.update({("decode", int(d)): v for d, v in h["decode"].items()})
    runs["hearth"].append((rows, rss_mib([f"{out}/hearth-{i}.time"])))
engines = [e for e in runs if runs[e]]
others = [e for e in engines if e != "hearth"]
tests = sorted({k for e in engines for rows, _ in runs[e] for k in rows})
med = {e: {t: statistics.median(rows[t] for rows, _ in runs[e] if t in rows) for t in tests} for e in engines}
rss = {e: statistics.median(r for _, r in runs[e]) for e in engines}
print("| test | " + " | ".join(f"{e} tok/s" for e in engines) + " | "
      + " | ".join(f"hearth / {e}" for e in others) + " |")
print("|---|" + "---:|" * (len(engines) + len(others)))
for t in tests:
    name = f"prefill {t[1]}" if t[0] == "prefill" else f"decode {gen} after {t[1]}"
    print(f"| {name} | " + " | ".join(f"{med[e][t]:.1f}" for e in engines) + " | "
          + " | ".join(f"{med['hearth'][t] / med[e][t]:.3f}" for e in others) + " |")
print("| peak RSS MiB | " + " | ".join(f"{rss[e]:.1f}" for e in engines) + " | "
      + " | ".join(f"{rss['hearth'] / rss[e]:.3f}" for e in others) + " |")
bw = float(os.environ.get("READ_BW") or 0)
if bw:
    size = os.path.getsize(model)
    for t in (t for t in tests if t[0] == "decode"):
        shares = ", ".join(f"{e} {med[e][t] * size / 1e9 / bw:.0%}" for e in engines)
        print(f"decode after {t[1]}: the file read once a token at each engine's rate, as a share "
              f"of {bw:.1f} GB/s: {shares}")
print("raw:", json.dumps({e: [[{f"{k[0]} {k[1]}": v for k, v in rows.items()}, r] for rows, r in runs[e]]
                          for e in engines}))
EOF

# == concurrent streams: Hearth's scheduler vs llama-server -np 8, same model, threads, load ====
if [ -z "${SKIP_STREAMS:-}" ]; then
    echo
    echo "== concurrent streams (scripts/bench-scheduler.sh, SmolLM2, $THREADS threads) =="
    THREADS="$THREADS" STREAMS="${STREAMS:-1,8}" "$ROOT/scripts/bench-scheduler.sh"
fi
