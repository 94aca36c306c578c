"""The tiny models scripts/tiny-models.py writes: each family's chat template (written for these
fixtures) and the table of models (architecture, seed, shapes, tokens, what each covers)."""
import dataclasses

N_CTX = 2048  # the context llama.cpp runs the oracle at (the phi3 model adds a second one)

# ---------------------------------------------------------------------------------------------
# Chat templates (written for these fixtures; each renders its family's turn format).

CHATML_QWEN2 = (
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{%- set system_text = messages[0]['content'] -%}\n"
    "{%- set turns = messages[1:] -%}\n"
    "{%- else -%}\n"
    "{%- set system_text = 'You are a helpful assistant.' -%}\n"
    "{%- set turns = messages -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_start|>system\\n' ~ system_text ~ '<|im_end|>\\n' -}}\n"
    "{%- for m in turns -%}\n"
    "{{- '<|im_start|>' ~ m['role'] ~ '\\n' ~ m['content'] ~ '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
)

CHATML_PLAIN = (
    "{%- for m in messages -%}\n"
    "{{- '<|im_start|>' ~ m['role'] ~ '\\n' ~ m['content'] ~ '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
)

LLAMA3 = (
    "{{- bos_token -}}\n"
    "{%- for m in messages -%}\n"
    "{{- '<|start_header_id|>' ~ m['role'] ~ '<|end_header_id|>\\n\\n' -}}\n"
    "{{- m['content'] | trim -}}\n"
    "{{- '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{%- endif -%}\n"
)

# Llama-2/Mistral-v0.1 turn format: a system message is folded into the first user turn.
MISTRAL = (
    "{{- bos_token -}}\n"
    "{%- set ns = namespace(pending='') -%}\n"
    "{%- for m in messages -%}\n"
    "{%- if m['role'] == 'system' -%}\n"
    "{%- set ns.pending = m['content'] ~ '\\n' -%}\n"
    "{%- elif m['role'] == 'user' -%}\n"
    "{{- '[INST] ' ~ ns.pending ~ m['content'] ~ ' [/INST]' -}}\n"
    "{%- set ns.pending = '' -%}\n"
    "{%- elif m['role'] == 'assistant' -%}\n"
    "{{- m['content'] ~ eos_token -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
)

PHI3 = (
    "{{- bos_token -}}\n"
    "{%- for m in messages -%}\n"
    "{{- '<|' ~ m['role'] ~ '|>\\n' ~ m['content'] ~ '<|end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}\n"
)

# ---------------------------------------------------------------------------------------------
# The models.


@dataclasses.dataclass
class Spec:
    name: str            # fixture name: <name>-<type>.gguf
    arch: str            # general.architecture
    seed: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    rope_theta: float
    tied: bool           # no output.weight: the head is token_embd.weight
    template: str
    extra_tokens: list   # special tokens appended after the SmolLM2 ids (CONTROL type)
    bos: str
    eos: str
    add_bos: bool
    eot: str = None
    context_length: int = 8192
    rms_eps: float = 1e-5
    qkv_bias: bool = False       # qwen2
    qk_norm: bool = False        # qwen3
    fused: bool = False          # phi3: attn_qkv, ffn_up = [gate; up]
    llama3_rope: dict = None     # parameters of the Llama 3 formula that makes rope_freqs.weight
    longrope: dict = None        # phi3: rope_factors_long/short + rope.scaling keys
    sliding_window: int = None   # written as <arch>.attention.sliding_window
    swa_emulate: bool = False    # oracle: emulate the window in llama.cpp (see module doc)
    oracle_n_ctx: tuple = (N_CTX,)
    # weight scales (standard deviations; norms are 1 + N(0, norm_std))
    emb_std: float = 0.3
    out_std: float = 0.35
    qk_std: float = 0.25
    vo_std: float = 0.15
    ffn_std: float = 0.12
    bias_std: float = 0.3
    norm_std: float = 0.1
    out_norm: float = 1.0
    qk_norm_center: float = 2.0  # qwen3's q/k norm weights: ~2 keeps attention from going flat


SPECS = [
    # Control: plain llama (SmolLM2's shape family), untied head, no rope scaling.
    Spec(name="llama", arch="llama", seed=1001, n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
         head_dim=16, n_ff=256, rope_theta=10000.0, tied=False, template=CHATML_PLAIN,
         extra_tokens=[], bos="<|im_start|>", eos="<|im_end|>", add_bos=False),
    # Llama 3.x: rope_freqs.weight from the Llama 3 formula, BOS added, <|eot_id|> ends turns.
    Spec(name="llama3", arch="llama", seed=1002, n_layer=3, n_embd=64, n_head=4, n_head_kv=2,
         head_dim=16, n_ff=256, rope_theta=500000.0, tied=True, template=LLAMA3,
         extra_tokens=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                       "<|end_header_id|>", "<|eot_id|>"],
         bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True, context_length=131072,
         # original_max_position_embeddings is small on purpose: with head_dim 16 the scaled
         # frequencies then act within the fixtures' few dozen positions.
         llama3_rope=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=256), out_norm=1.3),
    # Qwen2: Q/K/V biases, NEOX rope, tied head, ChatML with a default system prompt.
    Spec(name="qwen2", arch="qwen2", seed=1003, n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
         head_dim=16, n_ff=256, rope_theta=1000000.0, tied=True, template=CHATML_QWEN2,
         extra_tokens=[], bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
         context_length=32768, rms_eps=1e-6, qkv_bias=True),
    # Qwen3: Q/K RMS norms, head_dim (64) independent of n_embd/n_head, NEOX rope, tied head.
    Spec(name="qwen3", arch="qwen3", seed=1004, n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
         head_dim=64, n_ff=256, rope_theta=1000000.0, tied=True, template=CHATML_PLAIN,
         extra_tokens=[], bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
         context_length=40960, rms_eps=1e-6, qk_norm=True, out_norm=1.3),
    # Mistral: arch llama, 4:1 GQA, sliding window declared and emulated in the oracle.
    Spec(name="mistral", arch="llama", seed=1005, n_layer=2, n_embd=64, n_head=4, n_head_kv=1,
         head_dim=16, n_ff=256, rope_theta=1000000.0, tied=False, template=MISTRAL,
         extra_tokens=["<s>", "</s>", "[INST]", "[/INST]"], bos="<s>", eos="</s>", add_bos=True,
         context_length=32768, sliding_window=32, swa_emulate=True),
    # Phi-3 (128k-style): fused attn_qkv and ffn_up, NEOX rope, LongRoPE factors; the oracle runs
    # at n_ctx 2048 (short factors) and 8192 (long factors: n_ctx > original context 4096).
    Spec(name="phi3", arch="phi3", seed=1006, n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
         head_dim=16, n_ff=256, rope_theta=10000.0, tied=False, template=PHI3,
         extra_tokens=["<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
         bos="<s>", eos="<|endoftext|>", eot="<|end|>", add_bos=False, context_length=131072,
         fused=True, sliding_window=262144,
         longrope=dict(original_context_length=4096), oracle_n_ctx=(N_CTX, 8192)),
]

# ---------------------------------------------------------------------------------------------
# Benchmark shapes (scripts/bench-text.sh archs): each family at the size of its smallest
# published model, so that speed is measured where people run them. Random weights, the same
# seeds and scales; the vocabulary is all of SmolLM2's (49,152 tokens, fewer than Qwen's 151,936
# or Llama 3's 128,256, which makes the output head a smaller share of the work than in the real
# models).
BENCH_SHAPES = {
    # Llama 3.2 1B
    "llama3": dict(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192),
    # Qwen2.5 0.5B
    "qwen2": dict(n_layer=24, n_embd=896, n_head=14, n_head_kv=2, head_dim=64, n_ff=4864),
    # Qwen3 0.6B
    "qwen3": dict(n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072),
    # Mistral's layout (4:1 GQA, a window wider than the benchmark's context) at about 0.5B
    "mistral": dict(n_layer=24, n_embd=1024, n_head=16, n_head_kv=4, head_dim=64, n_ff=3584,
                    sliding_window=4096),
    # Phi-3's layout (fused QKV and gate/up, as many KV heads as query heads) at about 0.5B
    "phi3": dict(n_layer=24, n_embd=1024, n_head=16, n_head_kv=16, head_dim=64, n_ff=2816),
}
