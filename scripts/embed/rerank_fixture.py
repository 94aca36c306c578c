"""A tiny cross-encoder (BertForSequenceClassification, one label) with seeded random weights,
and the scores sentence-transformers' CrossEncoder gives it for a few queries and documents: the
numeric reference of Hearth's rerank path, since no registry this project reaches carries a real
reranker.

The vocabulary is all-MiniLM-L6-v2's, cut to its first 6,000 entries plus its single-character
word pieces, so the fixture stays small and still splits English into real word pieces.

    python scripts/embed/rerank_fixture.py MINILM_DIR OUT_DIR
"""
import json
import os
import sys
import tempfile

import sentence_transformers
import torch
import transformers
from sentence_transformers import CrossEncoder
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

QUERIES = [
    "When does the harbour office open?",
    "lentil soup recipe",
]
DOCUMENTS = [
    "The harbour office opens at seven in the morning.",
    "Ferries from the islands arrive before noon.",
    "A recipe for lentil soup with onions and carrots.",
    "Le bureau du port ouvre à sept heures du matin.",
    "hi",
    "Clerks record every arrival in a ledger kept beside the window, and the harbour master "
    "signs each page before noon. " * 8,
]
MAX_LENGTH = 128


def vocabulary(spec):
    vocab = spec["model"]["vocab"]
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    keep = [t for t, i in by_id if i < 6000 or (t.startswith("##") and len(t) == 3)]
    return keep


def main():
    minilm_dir, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(35)
    with open(os.path.join(minilm_dir, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    spec["model"]["vocab"] = {t: i for i, t in enumerate(vocabulary(spec))}
    spec["truncation"] = None
    spec["padding"] = None
    for token in spec["added_tokens"]:
        token["id"] = spec["model"]["vocab"][token["content"]]
    for special in spec["post_processor"].get("special_tokens", {}).values():
        special["ids"] = [spec["model"]["vocab"][t] for t in special["tokens"]]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=path,
            model_max_length=MAX_LENGTH,
            unk_token="[UNK]",
            sep_token="[SEP]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            mask_token="[MASK]",
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        )
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_LENGTH,
        num_labels=1,
        initializer_range=0.2,
    )
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        # A head that spreads the scores, so their order is not decided by rounding.
        model.classifier.weight.normal_(0.0, 1.0)
        model.classifier.bias.zero_()
    model.config.sentence_transformers = {
        "activation_fn": "torch.nn.modules.activation.Sigmoid"
    }
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for extra in ["vocab.txt", "special_tokens_map.json"]:
        path = os.path.join(out, extra)
        if os.path.exists(path):
            os.remove(path)

    torch.set_num_threads(2)
    encoder = CrossEncoder(out, device="cpu", max_length=MAX_LENGTH)
    cases = []
    for query in QUERIES:
        pairs = [(query, d) for d in DOCUMENTS]
        scores = encoder.predict(pairs, batch_size=4, convert_to_numpy=True)
        features = encoder.tokenizer(
            [q for q, _ in pairs],
            [d for _, d in pairs],
            truncation=True,
            max_length=MAX_LENGTH,
            padding=True,
            return_tensors="pt",
        )
        with torch.no_grad():
            logits = model(**features).logits[:, 0]
        tokens = features["attention_mask"].sum(dim=1).tolist()
        cases.append(
            {
                "query": query,
                "scores": [round(float(s), 7) for s in scores],
                "logits": [round(float(x), 6) for x in logits],
                "tokens": [int(t) for t in tokens],
            }
        )
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "made_by": f"sentence-transformers {sentence_transformers.__version__}, "
                f"transformers {transformers.__version__}, torch {torch.__version__}",
                "max_length": MAX_LENGTH,
                "documents": DOCUMENTS,
                "cases": cases,
            },
            f,
            ensure_ascii=False,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
