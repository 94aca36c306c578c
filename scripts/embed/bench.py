"""sentence-transformers' embedding throughput (PyTorch, CPU) on the same cases as Hearth's
embed_bench example: texts of exactly N tokens ("the cat sat on the mat ..."), encoded B at a
time, the best of R runs. One JSON line per case. Used by scripts/bench-embed.sh.

    python scripts/embed/bench.py MODEL_DIR THREADS BATCHES TOKENS TEXTS RUNS
"""
import json
import sys
import time

import torch
from sentence_transformers import SentenceTransformer


def text(tokens):
    words = ["the", "cat", "sat", "on", "the", "mat"]
    return " ".join(words[i % len(words)] for i in range(max(0, tokens - 2)))


def main():
    model_dir, threads = sys.argv[1], int(sys.argv[2])
    batches = [int(b) for b in sys.argv[3].split(",")]
    tokens = [int(t) for t in sys.argv[4].split(",")]
    texts, runs = int(sys.argv[5]), int(sys.argv[6])
    torch.set_num_threads(threads)
    model = SentenceTransformer(model_dir, device="cpu")
    for n in tokens:
        t = text(n)
        assert len(model.tokenizer(t)["input_ids"]) == n
        for b in batches:
            model.encode([t] * b, batch_size=b)
            best = float("inf")
            for _ in range(runs):
                started = time.perf_counter()
                done = 0
                while done < texts:
                    k = min(b, texts - done)
                    model.encode([t] * k, batch_size=b)
                    done += k
                best = min(best, time.perf_counter() - started)
            print(json.dumps({"engine": "sentence-transformers", "batch": b, "tokens": n,
                              "texts": texts, "s": round(best, 4),
                              "texts_per_s": round(texts / best, 1)}), flush=True)


if __name__ == "__main__":
    main()
