"""Reference vectors of sentence-transformers (PyTorch, CPU) for the embedding tests: the texts
below through the model folder given, written as JSON beside the library versions that made
them. The last text is longer than the model reads: sentence-transformers cuts it to the model's
max_seq_length, as Hearth does when a request asks to truncate.

    python scripts/embed/reference.py MODEL_DIR OUT.json
"""
import json
import sys

import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

TEXTS = [
    "The harbour office opens at seven in the morning.",
    "Ferries from the islands arrive before noon.",
    "A recipe for lentil soup with onions and carrots.",
    "Le bureau du port ouvre à sept heures du matin.",
    "Die Fähren kommen vor Mittag von den Inseln.",
    "hi",
    "Clerks record every arrival in a ledger kept beside the window, and the harbour master "
    "signs each page before noon. " * 6,
    "Fishermen bring their catch to the market hall across the square, where buyers from the "
    "inland towns wait with their carts. " * 14,
]


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    model = SentenceTransformer(model_dir, device="cpu")
    vectors = model.encode(TEXTS, batch_size=4, convert_to_numpy=True)
    tokens = [len(model.tokenizer(t, truncation=False)["input_ids"]) for t in TEXTS]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(
            {
                "made_by": f"sentence-transformers {sentence_transformers.__version__}, "
                f"torch {torch.__version__}",
                "max_seq_length": model.max_seq_length,
                "texts": TEXTS,
                "tokens": tokens,
                "vectors": [[round(float(x), 7) for x in v] for v in vectors],
            },
            f,
            ensure_ascii=False,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
