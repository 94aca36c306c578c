#!/usr/bin/env python3
"""Reference token ids from llama.cpp (llama-cpp-python 0.3.36) for Hearth's parity tests.

For a few fixed chat conversations and each GGUF model, it renders the model's chat template
(the GGUF's own, or the override from models.toml for a base model), tokenizes the result with
special tokens parsed (BOS prepended only when the vocabulary asks for one and the text does not
already start with it, as Hearth does), and runs greedy decoding for up to N tokens, stopping
after an end-of-generation token. Each generated id comes with llama.cpp's margin (best minus
second-best logit) at that step. The llama.cpp settings (KV cache type, flash attention) are
options, recorded in the fixture; the defaults are the reference's (see scripts/parity/README.md).
Output: tests/fixtures/text/<name>.json

Run through scripts/reference-tokens.sh, which prepares .venv-llama (llama-cpp-python from the
PyPI sdist, linked against the libllama built by scripts/build-llama-cpp.sh).
"""
import argparse
import hashlib
import json
import os
import sys
import tomllib

import numpy as np
import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

CONVERSATIONS = [
    [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Explain how a bicycle gear system works, step by step."},
    ],
    [
        {"role": "user", "content": "What is 17 * 23? Show your working."},
        {"role": "assistant", "content": "Let me compute it."},
        {"role": "user", "content": "Go on, and then list three prime numbers above 100."},
    ],
    [{"role": "user", "content": "Décris Paris en quelques phrases, avec des émojis 🗼 et des accents."}],
]

MODELS = {
    # name: (weights file, models.toml id whose chat_template overrides the GGUF's, or None)
    "smollm2-135m-instruct-q4_1": ("weights/SmolLM2-135M-Instruct.Q4_1.gguf", None),
    "gemma-3-270m-q4_k_m": ("weights/gemma-3-270m-Q4_K_M.gguf", "gamma-3.5-sonnet"),
}


# The reference configuration (see scripts/parity/README.md for why: of llama.cpp's settings,
# it is the one whose choices agree with an exact f64 forward at every near-tie met).
KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
            "q4_0": llama_cpp.GGML_TYPE_Q4_0}
DEFAULT_KV = "f32"
DEFAULT_FLASH_ATTN = False


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def token_text(llm, tid):
    return llm._model.token_get_text(tid) if tid >= 0 else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--tokens", type=int, default=80)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--kv", choices=sorted(KV_TYPES), default=DEFAULT_KV,
                    help="llama.cpp KV cache type (type_k = type_v)")
    ap.add_argument("--flash-attn", action=argparse.BooleanOptionalAction, default=DEFAULT_FLASH_ATTN)
    ap.add_argument("--out-dir", default=None, help="default: ROOT/tests/fixtures/text")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    with open(os.path.join(root, "models.toml"), "rb") as f:
        table = tomllib.load(f)

    for name in args.models:
        rel, template_from = MODELS[name]
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run scripts/fetch-weights.sh")
        llm = Llama(
            model_path=path, n_ctx=2048, n_batch=512, n_threads=2, seed=0, verbose=False,
            type_k=KV_TYPES[args.kv], type_v=KV_TYPES[args.kv], flash_attn=args.flash_attn,
        )
        template = llm.metadata.get("tokenizer.chat_template")
        if template_from:
            template = table["text"][template_from]["chat_template"]
        if template is None:
            sys.exit(f"{name}: no chat template")
        bos_id, eos_id = llm.token_bos(), llm.token_eos()
        add_bos = llama_cpp.llama_vocab_get_add_bos(llm._model.vocab)
        formatter = Jinja2ChatFormatter(
            template=template, eos_token=token_text(llm, eos_id), bos_token=token_text(llm, bos_id),
            add_generation_prompt=True,
        )
        cases = []
        for messages in CONVERSATIONS:
            prompt = formatter(messages=messages).prompt
            ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
            if add_bos and bos_id >= 0 and (not ids or ids[0] != bos_id):
                ids = [bos_id] + ids
            llm.reset()
            llm.eval(ids)
            out, margins = [], []
            for _ in range(args.tokens):
                # Only the last position's logits are computed; read them from the context.
                logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
                tid = int(np.argmax(logits))
                out.append(tid)
                # How decided the choice was: best minus second-best logit.
                second = np.partition(logits, -2)[-2]
                margins.append(round(float(logits[tid] - second), 4))
                if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tid):
                    break
                llm.eval([tid])
            text = llm.detokenize(out).decode("utf-8", errors="replace")
            print(f"{name}: {len(ids)} prompt ids, {len(out)} generated: {text[:70]!r}...", file=sys.stderr)
            cases.append({"messages": messages, "prompt": prompt, "prompt_ids": ids, "greedy_ids": out,
                          "greedy_margins": margins, "text": text})
        fixture = {
            "generator": "scripts/reference-tokens.py",
            "llama_cpp_python": llama_cpp.__version__,
            "weights": rel,
            "weights_sha256": sha256(path),
            "n_threads": 2,
            "llama_cpp_settings": {
                "type_k": args.kv, "type_v": args.kv, "flash_attn": args.flash_attn,
                "n_ctx": 2048, "n_batch": 512,
            },
            "cases": cases,
        }
        out_dir = args.out_dir or os.path.join(root, "tests", "fixtures", "text")
        out_path = os.path.join(out_dir, f"{name}.json")
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(fixture, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"wrote {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
