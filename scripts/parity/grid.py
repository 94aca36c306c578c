"""Compares Hearth's greedy ids with llama.cpp's under several settings.

Usage: python3 scripts/parity/grid.py DIR
DIR holds lc-<settings>/<model>.json (scripts/reference-tokens.py --out-dir, one folder per
llama.cpp setting) and hearth-<backend>-<kv>/<model>.json (crates/infer/examples/greedy_ids.rs).
Prints, per model, pairing and case, the first index where the ids differ ('=' when they agree on
the common length, with that length).
"""
import glob
import json
import os
import sys

d = sys.argv[1]
load = lambda p: json.load(open(p))
lcs = sorted(glob.glob(os.path.join(d, "lc-*")))
hs = sorted(glob.glob(os.path.join(d, "hearth-*")))
models = sorted({os.path.basename(p)[:-5] for p in glob.glob(os.path.join(d, "lc-*", "*.json"))})


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


for m in models:
    print(f"== {m}")
    refs = {os.path.basename(p): load(os.path.join(p, m + ".json")) for p in lcs if os.path.exists(os.path.join(p, m + ".json"))}
    # llama.cpp settings against each other
    names = list(refs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diffs = [first_diff(x["greedy_ids"], y["greedy_ids"]) for x, y in zip(refs[a]["cases"], refs[b]["cases"])]
            print(f"  {a:12} vs {b:12}: " + "  ".join("=" if x is None else str(x) for x in diffs))
    for h in hs:
        p = os.path.join(h, m + ".json")
        if not os.path.exists(p):
            continue
        got = load(p)
        for a in names:
            cells = []
            for x, y in zip(got["cases"], refs[a]["cases"]):
                k = first_diff(x["greedy_ids"], y["greedy_ids"])
                n = min(len(x["greedy_ids"]), len(y["greedy_ids"]))
                cells.append(f"={n}" if k is None else str(k))
            print(f"  {os.path.basename(h):18} vs {a:12}: " + "  ".join(f"{c:>4}" for c in cells))
