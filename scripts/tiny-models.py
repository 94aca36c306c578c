#!/usr/bin/env python3
"""Tiny seeded GGUF models of the architectures Hearth learns from llama.cpp, and llama.cpp's
outputs on them (issue 18's oracle).

Two steps, both driven by scripts/tiny-models.sh:

  write   For each entry of SPECS, a model with seeded random weights (a fixed seed per model, so
          the output is byte-for-byte the same on every run) in F32 GGUF, with every metadata key
          llama.cpp's loader reads for that architecture, a real but small tokenizer (the first
          --vocab-size (1536) tokens of SmolLM2's GPT-2-style BPE and the merges inside them,
          plus the special tokens the family's chat template needs) and a Jinja chat template of
          the family, written here. Output: DIR/<name>-f32.gguf (+ DIR/<name>-f32.json, the
          generator's description: seed, shapes, scales).
  oracle  For each quantized GGUF (<name>-<type>.gguf, made by llama-quantize), runs llama.cpp
          (llama-cpp-python pointed at the libllama scripts/build-llama-cpp.sh built, f32 KV cache,
          no flash attention, 2 threads; a model whose heads are whole blocks of 32 gets two more
          runs, with the q8_0 and the q4_0 KV cache and flash attention) on fixed prompts: the chat prompts are rendered from the
          GGUF's own template (Jinja2, as reference-tokens.py does; llama.cpp's built-in template
          engine renders them too, for comparison), tokenized by llama.cpp with special tokens
          parsed, then decoded greedily. Along the greedy path each step records the top-8 logits
          and the full-vocabulary margin (best minus second best). Output: <name>-<type>.json.

Mistral-style sliding-window attention: llama.cpp reads no sliding window for the `llama`
architecture (its converter drops Mistral's), so the `mistral` model's main run emulates it inside
llama.cpp: tokens are evaluated one at a time and, before each, the KV cells of positions that left
the window are removed (llama_memory_seq_rm), so each query attends to exactly the last W
positions, itself included, with K/V computed under the same rule. A second run without the window
(llama.cpp as it is) shows where the window changes the answer.

Usage (normally through scripts/tiny-models.sh):
  tiny-models.py write --smollm2 weights/SmolLM2-135M-Instruct.Q4_1.gguf --out .cache/tiny-models
  LLAMA_CPP_LIB_PATH=.cache/llama.cpp/build/bin tiny-models.py oracle \
      --models tests/fixtures/arch --sources .cache/tiny-models --out tests/fixtures/arch
"""
import argparse
import hashlib
import json
import math
import os
import sys

import numpy as np

TOP_K = 8
N_GEN = 24
N_THREADS = 2

# The chat templates and the table of models live beside this script.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_models_specs import BENCH_SHAPES, N_CTX, SPECS  # noqa: E402
import dataclasses  # noqa: E402

# ---------------------------------------------------------------------------------------------
# write


def load_smollm2_vocab(path, vocab_size):
    """The first vocab_size tokens of SmolLM2 and the merges whose parts and result stay inside."""
    import gguf
    r = gguf.GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()[:vocab_size]
    types = [int(t) for t in r.fields["tokenizer.ggml.token_type"].contents()[:vocab_size]]
    kept = set(tokens)
    merges = []
    for m in r.fields["tokenizer.ggml.merges"].contents():
        a, b = m.split(" ")
        if a in kept and b in kept and a + b in kept:
            merges.append(m)
    return tokens, types, merges


def llama3_rope_factors(theta, dim, p):
    """rope_freqs.weight as llama.cpp's converter derives it for rope_type "llama3"."""
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    lo = p["original_max_position_embeddings"] / p["low_freq_factor"]
    hi = p["original_max_position_embeddings"] / p["high_freq_factor"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < hi:
            out.append(1.0)
        elif wavelen > lo:
            out.append(p["factor"])
        else:
            smooth = (p["original_max_position_embeddings"] / wavelen - p["low_freq_factor"]) / (
                p["high_freq_factor"] - p["low_freq_factor"])
            out.append(1.0 / ((1.0 - smooth) / p["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def longrope_factors(n):
    """Deterministic Phi-3-like LongRoPE factors: short near 1, long rising to ~24."""
    x = np.arange(n, dtype=np.float64) / max(n - 1, 1)
    short = 1.0 + 0.25 * x * x
    long = np.exp(x * math.log(24.0))
    return short.astype(np.float32), long.astype(np.float32)


def build_tensors(s, n_vocab):
    """(name, numpy array in GGUF's row-major order: [rows = ne1, cols = ne0]) in a fixed order."""
    rng = np.random.default_rng(s.seed)

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def norm(n, center=1.0):
        return (np.float32(center) + normal((n,), s.norm_std)).astype(np.float32)

    q_dim, kv_dim = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    t = [("token_embd.weight", normal((n_vocab, s.n_embd), s.emb_std))]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        t.append((p + "attn_norm.weight", norm(s.n_embd)))
        wq = normal((q_dim, s.n_embd), s.qk_std)
        wk = normal((kv_dim, s.n_embd), s.qk_std)
        wv = normal((kv_dim, s.n_embd), s.vo_std)
        if s.fused:
            t.append((p + "attn_qkv.weight", np.concatenate([wq, wk, wv], axis=0)))
        else:
            t += [(p + "attn_q.weight", wq), (p + "attn_k.weight", wk), (p + "attn_v.weight", wv)]
        if s.qkv_bias:
            t += [(p + "attn_q.bias", normal((q_dim,), s.bias_std)),
                  (p + "attn_k.bias", normal((kv_dim,), s.bias_std)),
                  (p + "attn_v.bias", normal((kv_dim,), s.bias_std))]
        if s.qk_norm:
            t += [(p + "attn_q_norm.weight", norm(s.head_dim, s.qk_norm_center)),
                  (p + "attn_k_norm.weight", norm(s.head_dim, s.qk_norm_center))]
        t.append((p + "attn_output.weight", normal((s.n_embd, q_dim), s.vo_std)))
        t.append((p + "ffn_norm.weight", norm(s.n_embd)))
        gate = normal((s.n_ff, s.n_embd), s.ffn_std)
        up = normal((s.n_ff, s.n_embd), s.ffn_std)
        if s.fused:
            # llama.cpp's LLM_FFN_SWIGLU: silu(first half) * second half
            t.append((p + "ffn_up.weight", np.concatenate([gate, up], axis=0)))
        else:
            t += [(p + "ffn_gate.weight", gate), (p + "ffn_up.weight", up)]
        t.append((p + "ffn_down.weight", normal((s.n_embd, s.n_ff), s.ffn_std)))
    t.append(("output_norm.weight", norm(s.n_embd, s.out_norm)))
    if not s.tied:
        t.append(("output.weight", normal((n_vocab, s.n_embd), s.out_std)))
    if s.llama3_rope:
        t.append(("rope_freqs.weight", llama3_rope_factors(s.rope_theta, s.head_dim, s.llama3_rope)))
    if s.longrope:
        short, long = longrope_factors(s.head_dim // 2)
        t += [("rope_factors_long.weight", long), ("rope_factors_short.weight", short)]
    return t


def write_model(s, base_tokens, base_types, merges, out_dir):
    import gguf
    tokens = list(base_tokens)
    types = list(base_types)
    for tok in s.extra_tokens:
        if tok in tokens:
            sys.exit(f"{s.name}: extra token {tok!r} is already in the vocabulary")
        tokens.append(tok)
        types.append(int(gguf.TokenType.CONTROL))
    ids = {tok: i for i, tok in enumerate(tokens)}
    n_vocab = len(tokens)
    tensors = build_tensors(s, n_vocab)

    path = os.path.join(out_dir, f"{s.name}-f32.gguf")
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, s.arch)
    w.add_type(gguf.GGUFType.MODEL)
    # Not "phi3"/"phi-3": llama.cpp's vocabulary loader keys a Phi-3 tokenizer quirk (right-strip
    # whitespace after special tokens) on general.name; the converter's names ("Phi 3 Mini ...")
    # do not trigger it either.
    display = {"llama3": "Llama 3", "phi3": "Phi 3"}.get(s.name, s.name.capitalize())
    w.add_name(f"Hearth Tiny {display}")
    w.add_description(f"Hearth test fixture: seeded random weights (seed {s.seed}), not a trained model")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(n_vocab)
    w.add_context_length(s.context_length)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    if s.head_dim * s.n_head != s.n_embd:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    if s.sliding_window is not None:
        w.add_sliding_window(s.sliding_window)
    if s.longrope:
        orig = s.longrope["original_context_length"]
        scale = s.context_length / orig
        # as llama.cpp's Phi-3 converter: sqrt(1 + ln(scale) / ln(original context))
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_rope_scaling_attn_factors(attn_factor)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids[s.bos])
    w.add_eos_token_id(ids[s.eos])
    if s.eot:
        w.add_eot_token_id(ids[s.eot])
    w.add_pad_token_id(ids[s.eos])
    w.add_add_bos_token(s.add_bos)
    w.add_add_eos_token(False)
    w.add_chat_template(s.template)

    for name, arr in tensors:
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    done = replace_if_changed(tmp, path)

    n_params = sum(a.size for _, a in tensors)
    desc = {
        "name": s.name, "arch": s.arch, "seed": s.seed, "n_vocab": n_vocab, "n_params": int(n_params),
        "shapes": {"n_layer": s.n_layer, "n_embd": s.n_embd, "n_head": s.n_head,
                   "n_head_kv": s.n_head_kv, "head_dim": s.head_dim, "n_ff": s.n_ff},
        "tied_output": s.tied, "rope_theta": s.rope_theta, "rms_eps": s.rms_eps,
        "context_length": s.context_length, "sliding_window": s.sliding_window,
        "llama3_rope": s.llama3_rope, "longrope": s.longrope,
        "weight_std": {k: getattr(s, k) for k in
                       ("emb_std", "out_std", "qk_std", "vo_std", "ffn_std", "bias_std", "norm_std",
                        "out_norm", "qk_norm_center")},
        "extra_tokens": {tok: ids[tok] for tok in s.extra_tokens},
        "tensors": {name: list(arr.shape[::-1]) for name, arr in tensors},  # ggml order: ne0 first
    }
    with open(os.path.join(out_dir, f"{s.name}-f32.json"), "w") as f:
        json.dump(desc, f, indent=1)
        f.write("\n")
    print(f"tiny-models: {done} {path} ({n_vocab} tokens, {len(merges)} merges, {n_params} parameters)",
          file=sys.stderr)


def replace_if_changed(tmp, path):
    """Keep the old file (and its mtime) when the new bytes are the same: reruns change nothing.
    Returns what happened, for the log."""
    if os.path.exists(path) and sha256(tmp) == sha256(path):
        os.remove(tmp)
        return "unchanged"
    os.replace(tmp, path)
    return "wrote"


def cmd_write(args):
    unknown = set(args.only or []) - {s.name for s in SPECS}
    if unknown:
        sys.exit(f"tiny-models: no model named {', '.join(sorted(unknown))}")
    os.makedirs(args.out, exist_ok=True)
    tokens, types, merges = load_smollm2_vocab(args.smollm2, args.vocab_size)
    for s in SPECS:
        if args.bench_shapes:
            if s.name not in BENCH_SHAPES:
                continue
            s = dataclasses.replace(s, **BENCH_SHAPES[s.name])
        if not args.only or s.name in args.only:
            write_model(s, tokens, types, merges, args.out)


# ---------------------------------------------------------------------------------------------
# oracle

CASES = [
    {"name": "chat", "messages": [
        {"role": "user", "content": "Write a short poem about the sea and the wind."}]},
    {"name": "chat_multi_turn", "messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy? Answer in one word."}]},
    {"name": "raw", "text": "The lighthouse keeper climbed the stairs every evening, counting the "
                            "steps one by one, and watched the ships pass far away on the grey water."},
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tensor_types(path):
    import gguf
    r = gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name for t in r.tensors}


def builtin_render(llama_cpp, template, messages):
    """llama.cpp's own (built-in, non-Jinja) chat template engine: llama_chat_apply_template."""
    import ctypes
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role, arr[i].content = role, content
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(template.encode(), arr, len(messages), True, buf, len(buf))
    return None if n < 0 else buf.raw[:n].decode("utf-8")


def run_case(llm, llama_cpp, ids, window):
    """Greedy decode N_GEN tokens after ids; with window, evict KV cells that left the window."""
    mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
    n_vocab = llm.n_vocab()
    vocab = llm._model.vocab

    def evict(pos):  # before evaluating the token at pos: keep positions > pos - window
        if window is not None and pos - window + 1 > 0:
            llama_cpp.llama_memory_seq_rm(mem, 0, 0, pos - window + 1)

    llm.reset()
    if window is None:
        llm.eval(ids)
    else:
        for pos, tid in enumerate(ids):
            evict(pos)
            llm.eval([tid])
    out, top_ids, top_logits, margins = [], [], [], []
    for _ in range(N_GEN):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float64)
        order = np.argsort(-logits, kind="stable")[:TOP_K]
        tid = int(order[0])
        top_ids.append([int(i) for i in order])
        top_logits.append([round(float(logits[i]), 5) for i in order])
        margins.append(round(float(logits[order[0]] - logits[order[1]]), 5))
        out.append(tid)
        if llama_cpp.llama_vocab_is_eog(vocab, tid):
            break
        evict(llm.n_tokens)
        llm.eval([tid])
    return out, top_ids, top_logits, margins


def oracle_model(path, spec, llama_cpp, Llama, Jinja2ChatFormatter):
    base = os.path.basename(path)[:-len(".gguf")]
    runs = []
    variants = [(n_ctx, spec.sliding_window if spec.swa_emulate else None, "f32")
                for n_ctx in spec.oracle_n_ctx]
    if spec.swa_emulate:
        variants.append((N_CTX, None, "f32"))
    # llama.cpp's q8_0 and q4_0 KV caches (with its flash attention, which a quantized V needs)
    # store blocks of 32 values: a model whose heads are whole blocks gets a run with each too.
    if spec.head_dim % 32 == 0:
        variants.append((variants[0][0], variants[0][1], "q8_0"))
        variants.append((variants[0][0], variants[0][1], "q4_0"))
    kv_types = {"f32": llama_cpp.GGML_TYPE_F32, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
                "q4_0": llama_cpp.GGML_TYPE_Q4_0}
    for n_ctx, window, kv in variants:
        llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_threads=N_THREADS,
                    n_threads_batch=N_THREADS, seed=0, verbose=False,
                    type_k=kv_types[kv], type_v=kv_types[kv], flash_attn=kv != "f32")
        vocab = llm._model.vocab
        template = llm.metadata["tokenizer.chat_template"]
        bos_id, eos_id = llm.token_bos(), llm.token_eos()
        add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        text_of = lambda i: llm._model.token_get_text(i) if i >= 0 else ""
        formatter = Jinja2ChatFormatter(template=template, eos_token=text_of(eos_id),
                                        bos_token=text_of(bos_id), add_generation_prompt=True)
        cases = []
        for case in CASES:
            entry = {"name": case["name"]}
            if "messages" in case:
                prompt = formatter(messages=case["messages"]).prompt
                builtin = builtin_render(llama_cpp, template, case["messages"])
                entry["messages"] = case["messages"]
                entry["prompt"] = prompt
                entry["prompt_llama_cpp_builtin"] = builtin
                # the built-in engine never writes BOS text; the Jinja templates may
                bos_text = text_of(bos_id)
                stripped = prompt[len(bos_text):] if bos_text and prompt.startswith(bos_text) else prompt
                entry["builtin_matches"] = builtin is not None and builtin in (prompt, stripped)
            else:
                prompt = case["text"]
                entry["prompt"] = prompt
            ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
            if add_bos and bos_id >= 0 and (not ids or ids[0] != bos_id):
                ids = [bos_id] + ids
            # the cut-down tokenizer must cover the prompts: detokenizing gives the text back
            back = llm.detokenize(ids, special=True).decode("utf-8")
            if back not in (prompt, text_of(bos_id) + prompt):
                sys.exit(f"{base}: {case['name']}: tokens do not give the prompt back: {back!r}")
            out, top_ids, top_logits, margins = run_case(llm, llama_cpp, ids, window)
            entry.update({
                "prompt_ids": ids, "greedy_ids": out,
                "text": llm.detokenize(out).decode("utf-8", errors="replace"),
                "top_ids": top_ids, "top_logits": top_logits, "margins": margins,
            })
            cases.append(entry)
            print(f"tiny-models: {base} n_ctx={n_ctx} window={window} kv={kv} {case['name']}: "
                  f"{len(ids)} prompt ids, {len(out)} generated, {len(set(out))} distinct, "
                  f"margins >= 1: {sum(m >= 1 for m in margins)}/{len(margins)}", file=sys.stderr)
        eog = [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]
        run = {
            "llama_cpp_settings": {"n_ctx": n_ctx, "n_batch": 512, "n_threads": N_THREADS,
                                   "type_k": kv, "type_v": kv, "flash_attn": kv != "f32"},
            "sliding_window_emulated": window,
            "prompt_processing": "one token per decode" if window else "one batch",
            "cases": cases,
        }
        if spec.longrope:
            run["rope_factors_used"] = ("rope_factors_long" if n_ctx > spec.longrope["original_context_length"]
                                        else "rope_factors_short")
        runs.append(run)
        tokens = {"bos_id": bos_id, "eos_id": eos_id, "eot_id": int(llama_cpp.llama_vocab_eot(vocab)),
                  "add_bos": add_bos, "eog_ids": eog, "n_vocab": llm.n_vocab()}
        del llm
    return tokens, runs


def to_json(o, indent=0):
    """JSON with objects one key a line and lists of numbers (or of such lists) kept on one line
    each, so that the fixtures stay small and their diffs readable."""
    pad, inner = " " * indent, " " * (indent + 1)
    flat = lambda v: not isinstance(v, (dict, list)) or (
        isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v))
    if isinstance(o, dict):
        if not o:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {to_json(v, indent + 1)}" for k, v in o.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(o, list) and not flat(o):
        items = [inner + (json.dumps(v, ensure_ascii=False) if flat(v) else to_json(v, indent + 1))
                 for v in o]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(o, ensure_ascii=False)


def cmd_oracle(args):
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    by_name = {s.name: s for s in SPECS}
    files = sorted(f for f in os.listdir(args.models) if f.endswith(".gguf"))
    for f in files:
        base = f[:-len(".gguf")]
        name, qtype = base.rsplit("-", 1)
        if name not in by_name or (args.only and name not in args.only):
            continue
        spec = by_name[name]
        path = os.path.join(args.models, f)
        with open(os.path.join(args.sources, f"{name}-f32.json")) as fh:
            src = json.load(fh)
        tokens, runs = oracle_model(path, spec, llama_cpp, Llama, Jinja2ChatFormatter)
        fixture = {
            "generator": "scripts/tiny-models.py",
            "model": f, "model_sha256": sha256(path), "type": qtype.upper(),
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp": args.llama_cpp_version,
            "source": src,
            "tensor_types": tensor_types(path),
            "tokens": tokens,
            "runs": runs,
        }
        out = os.path.join(args.out, base + ".json")
        tmp = out + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(to_json(fixture) + "\n")
        print(f"tiny-models: {replace_if_changed(tmp, out)} {out}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the F32 models")
    w.add_argument("--smollm2", required=True, help="SmolLM2 GGUF whose tokenizer is cut down")
    w.add_argument("--vocab-size", type=int, default=1536)
    w.add_argument("--out", required=True)
    w.add_argument("--only", nargs="*")
    w.add_argument("--bench-shapes", action="store_true",
                   help="the families of BENCH_SHAPES at their benchmark sizes (scripts/bench-text.sh archs)")
    o = sub.add_parser("oracle", help="run llama.cpp on the quantized models")
    o.add_argument("--models", required=True, help="folder of <name>-<type>.gguf")
    o.add_argument("--sources", required=True, help="folder of the <name>-f32.json descriptions")
    o.add_argument("--out", required=True)
    o.add_argument("--llama-cpp-version", default="unknown")
    o.add_argument("--only", nargs="*")
    sub.add_parser("names", help="print the model names, space-separated")
    args = ap.parse_args()
    if args.cmd == "names":
        print(" ".join(s.name for s in SPECS))
        return
    {"write": cmd_write, "oracle": cmd_oracle}[args.cmd](args)


if __name__ == "__main__":
    main()
