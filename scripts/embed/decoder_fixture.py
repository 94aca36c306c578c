"""GGUF decoder embedders for the tests, with llama.cpp as the oracle.

Copies two of the architecture fixtures (tests/fixtures/arch, seeded random weights) with the
metadata key that makes a GGUF an embedding model, `{arch}.pooling_type` (llama.cpp's values:
1 mean, 2 cls, 3 last), then serves each with llama.cpp's own `llama-server --embedding` and records,
for a few texts, llama.cpp's tokens (`/tokenize` with special tokens) and its embeddings
(`/v1/embeddings`, L2-normalised as llama.cpp's server returns them).

    python scripts/embed/decoder_fixture.py LLAMA_CPP_DIR GGUF_PY_DIR OUT_DIR

LLAMA_CPP_DIR holds llama.cpp's CPU build (bin/llama-server, from scripts/build-llama-cpp.sh);
GGUF_PY_DIR is llama.cpp's gguf-py. Needs numpy and tqdm (scripts/embed/reference.sh runs it in
.venv-embed). Writes OUT_DIR/<name>.gguf and OUT_DIR/decoders.json.
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


def oracle(server, model):
    port = free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(server))
    proc = subprocess.Popen([server, "-m", model, "--embedding", "--port", str(port), "-t", "2",
                             "-fa", "off",
                             "-c", "2048", "-ub", "2048", "-b", "2048"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"llama-server did not start for {model}")
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


if __name__ == "__main__":
    main()
