"""The headline figures of one `scripts/bench-gpu.sh run`, as one JSON object (the keys of
docs/gpu/<date>-summary.json): seconds per image and tokens per second, each measured in that
run, null where a step did not run.

    python3 scripts/gpu/summary.py DIR     # DIR: the run's output (run.log, text.jsonl, ...)
"""
import json
import os
import re
import sys


def lines(path):
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        yield json.loads(line)
                    except ValueError:
                        pass
    except OSError:
        return


def main():
    d = sys.argv[1]
    text = list(lines(os.path.join(d, "text.jsonl")))
    pick = lambda engine, streams, key: next(
        (r[key] for r in text if r.get("engine") == engine and r.get("streams") == streams), None)
    llama = next((r["avg_ts"] for r in text if r.get("engine") == "llama.cpp-llama-1b-f16"
                  and r.get("n_gen", 0) > 0 and r.get("n_prompt", 1) == 0), None)
    serve = next((r["decode_tok_s"] for r in lines(os.path.join(d, "serve-load.jsonl"))
                  if r.get("target") == "llama-1b-f16-hearth" and r.get("streams") == 32), None)
    image = diffusers = None
    try:
        for line in open(os.path.join(d, "image.txt")):
            if line.startswith("[{") and image is None:  # the first: every kernel on
                image = json.loads(line)[0]["s_per_image"]
            elif line.startswith("{") and "torch-diffusers" in line:
                diffusers = json.loads(line)["s_per_image"]
    except OSError:
        pass
    device = None
    try:
        log = open(os.path.join(d, "run.log")).read()
        m = re.search(r"^(NVIDIA [^,]+), ([\d.]+),", log, re.M)
        if m:
            device = f"{m.group(1)}, driver {m.group(2)}"
    except OSError:
        pass
    print(json.dumps({
        "device": device,
        "image_s": image,
        "diffusers_image_s": diffusers,
        "decode1_tok_s": pick("hearth", 1, "decode_tok_s"),
        "llamacpp_decode1_tok_s": llama,
        "decode32_tok_s": pick("hearth", 32, "decode_tok_s"),
        "hf_eager_decode32_tok_s": pick("torch-eager", 32, "decode_tok_s"),
        "prefill32_tok_s": pick("hearth", 32, "prefill_tok_s"),
        "hf_eager_prefill32_tok_s": pick("torch-eager", 32, "prefill_tok_s"),
        "serve32_tok_s": serve,
        "bench32_tok_s": pick("hearth", 32, "decode_tok_s"),
    }, indent=1))


if __name__ == "__main__":
    main()
