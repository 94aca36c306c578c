"""GGUF decoder embedders and rerankers for the tests, with llama.cpp as the oracle.

Copies three of the architecture fixtures (tests/fixtures/arch, seeded random weights) with the
metadata key that makes a GGUF an embedding model, `{arch}.pooling_type` (llama.cpp's values:
1 mean, 2 cls, 3 last), then serves each with llama.cpp's own `llama-server --embedding` and records,
for a few texts, llama.cpp's tokens (`/tokenize` with special tokens) and its embeddings
(`/v1/embeddings`, L2-normalised as llama.cpp's server returns them).

Then makes two Qwen3 rerankers the way llama.cpp's converter makes Qwen3-Reranker's GGUF:
pooling type 4 (rank), labels ["yes", "no"], and a classifier head `cls.output.weight` of two rows
cut out of the (tied) output matrix; one with a rerank prompt template
(`tokenizer.chat_template.rerank`, F16 head), one without (the texts in a row, Q8_0 head). Each
is served with `llama-server --rerank`, and for a query against a few documents the script
records the prompt's tokens (`/tokenize` of the filled template, special tokens parsed, nothing
added; or the query's and the document's tokens in a row), the prompt's length as the server
counts it (`usage.prompt_tokens` of the document alone) and its score (`/v1/rerank`).

    python scripts/embed/decoder_fixture.py LLAMA_CPP_DIR GGUF_PY_DIR OUT_DIR

LLAMA_CPP_DIR holds llama.cpp's CPU build (bin/llama-server, from scripts/build-llama-cpp.sh);
GGUF_PY_DIR is llama.cpp's gguf-py. Needs numpy and tqdm (scripts/embed/reference.sh runs it in
.venv-embed). Writes OUT_DIR/<name>.gguf, OUT_DIR/decoders.json and OUT_DIR/rerankers.json.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

# (fixture copied, pooling name, llama.cpp's pooling_type)
MODELS = [
    ("qwen3-q8_0", "last", 3),
    ("llama3-q8_0", "mean", 1),
    ("qwen2-q8_0", "cls", 2),
]

TEXTS = [
    "hello world",
    "The lighthouse keeper climbed the spiral stairs every evening to light the lamp.",
    "Résumé: naïve café owners in Zürich serve crème brûlée.",
    "x",
    " ".join(["A long input that spans many tokens, to pool over more positions."] * 6),
]


# (fixture copied, file written, with a template?, the head's type)
RANKERS = [
    ("qwen3-q8_0", "qwen3-q8_0-rerank.gguf", True, "F16"),
    ("qwen3-q4_k_m", "qwen3-q4_k_m-rerank-pair.gguf", False, "Q8_0"),
]

# A prompt in the shape of Qwen3-Reranker's (its words are not needed: the weights are random).
RERANK_TEMPLATE = ("<|im_start|>system\nSay yes when the document answers the query, no when it "
                   "does not.<|im_end|>\n<|im_start|>user\nQuery: {query}\nDocument: "
                   "{document}<|im_end|>\n<|im_start|>assistant\n")

QUERIES = ["where does the keeper light the lamp?", "café prices"]

DOCUMENTS = [
    "The lighthouse keeper climbed the spiral stairs every evening to light the lamp.",
    "Résumé: naïve café owners in Zürich serve crème brûlée.",
    "x",
    "A document that writes a special token <|im_end|> in its text.",
    " ".join(["A long document that spans many tokens, for the last position to see."] * 6),
]

# The tokens whose output rows become the head's "yes" and "no" rows.
YES, NO = "y", "n"


def write_ranker(gguf, src, dst, template, head_type):
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = gguf.quants.dequantize(embd.data, embd.tensor_type)
    head = rows[[tokens.index(YES), tokens.index(NO)]].astype("float32")
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_key_value(f"{arch}.pooling_type", 4, gguf.GGUFValueType.UINT32)
    writer.add_key_value(f"{arch}.classifier.output_labels", ["yes", "no"],
                         gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
    if template:
        writer.add_key_value("tokenizer.chat_template.rerank", RERANK_TEMPLATE,
                             gguf.GGUFValueType.STRING)
    if head_type == "F16":
        data, qtype = head.astype("float16"), gguf.GGMLQuantizationType.F16
    else:
        qtype = gguf.GGMLQuantizationType[head_type]
        data = gguf.quants.quantize(head, qtype)
    new = [("cls.output.weight", data, qtype)]
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    for name, d, q in new:
        writer.add_tensor_info(name, d.shape, d.dtype, d.nbytes, q)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    for _, d, _ in new:
        writer.write_tensor_data(d)
    writer.close()


def write_embedder(gguf, copy, src, dst, pooling_type):
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    new = {f"{arch}.pooling_type": copy.MetadataDetails(gguf.GGUFValueType.UINT32, pooling_type)}
    copy.copy_with_new_metadata(reader, writer, new, [])


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(server, model, mode):
    """llama-server on `model` in `mode` (--embedding or --rerank): the process and its port."""
    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(server))
    proc = subprocess.Popen([server, "-m", model, mode, "--port", str(port), "-t", "2",
                             "-fa", "off",
                             "-c", "2048", "-ub", "2048", "-b", "2048"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"llama-server did not start for {model}")


def rank_oracle(server, model, template):
    proc, port = serve(server, model, "--rerank")
    try:
        cases = []
        for query in QUERIES:
            ranked = post(port, "/v1/rerank", {"query": query, "documents": DOCUMENTS,
                                               "top_n": len(DOCUMENTS)})["results"]
            scores = {r["index"]: r["relevance_score"] for r in ranked}
            docs = []
            for i, doc in enumerate(DOCUMENTS):
                if template:
                    prompt = RERANK_TEMPLATE.replace("{query}", query).replace("{document}", doc)
                    tokens = post(port, "/tokenize", {"content": prompt, "add_special": False,
                                                      "parse_special": True})["tokens"]
                else:
                    # The file adds no BOS, EOS or SEP: the two texts' tokens in a row.
                    tokens = [t for text in (query, doc)
                              for t in post(port, "/tokenize", {"content": text,
                                                                "add_special": False,
                                                                "parse_special": False})["tokens"]]
                alone = post(port, "/v1/rerank", {"query": query, "documents": [doc]})
                docs.append({"tokens": tokens, "n_tokens": alone["usage"]["prompt_tokens"],
                             "score": scores[i]})
            cases.append({"query": query, "documents": docs})
        return cases
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def oracle(server, model):
    proc, port = serve(server, model, "--embedding")
    try:
        out = []
        for text in TEXTS:
            tokens = post(port, "/tokenize", {"content": text, "add_special": True})["tokens"]
            vec = post(port, "/v1/embeddings", {"input": text})["data"][0]["embedding"]
            out.append({"text": text, "tokens": tokens, "embedding": vec})
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    llama_dir, gguf_py, out_dir = sys.argv[1:4]
    sys.path.insert(0, gguf_py)
    sys.path.insert(0, os.path.join(gguf_py, "gguf", "scripts"))
    import gguf
    import gguf_new_metadata as copy

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.makedirs(out_dir, exist_ok=True)
    server = os.path.join(llama_dir, "bin", "llama-server")
    result = {"llama_cpp_server": server, "models": []}
    for name, pooling, value in MODELS:
        dst = os.path.join(out_dir, f"{name}-embed-{pooling}.gguf")
        write_embedder(gguf, copy, os.path.join(root, "tests", "fixtures", "arch", f"{name}.gguf"),
                       dst, value)
        result["models"].append({"file": os.path.basename(dst), "pooling": pooling,
                                 "inputs": oracle(server, dst)})
        print(f"{dst}: {len(TEXTS)} embeddings from llama.cpp")
    with open(os.path.join(out_dir, "decoders.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    rankers = {"llama_cpp_server": server, "documents": DOCUMENTS, "models": []}
    for name, file, template, head_type in RANKERS:
        dst = os.path.join(out_dir, file)
        write_ranker(gguf, os.path.join(root, "tests", "fixtures", "arch", f"{name}.gguf"), dst,
                     template, head_type)
        rankers["models"].append({"file": file, "template": template,
                                  "cases": rank_oracle(server, dst, template)})
        print(f"{dst}: scores from llama.cpp")
    with open(os.path.join(out_dir, "rerankers.json"), "w") as f:
        json.dump(rankers, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
