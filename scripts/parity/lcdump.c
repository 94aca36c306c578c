// llama.cpp's logits (and optionally every f32 graph tensor) along a fixed token path, with
// the reference settings of scripts/reference-tokens.py (f32 K/V cache, no flash attention,
// n_ctx 2048, n_batch = n_ubatch = 512, 2 threads, logits of the last token only).
//
// Build and run through lcdump.sh. Usage:
//   lcdump MODEL OUT_DIR DUMP_CALL PROMPT_IDS [FORCED_IDS]
// PROMPT_IDS / FORCED_IDS: comma-separated token ids. The prompt is decoded in one call, then
// each forced id in its own call (teacher forcing). After call k, the logits go to
// OUT_DIR/logits_k.f32 and the argmax to stdout. During call DUMP_CALL (-1: none), each
// contiguous f32 tensor the graph computes goes to OUT_DIR/t/NAME.f32 (shape in OUT_DIR/t/index).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static const char *g_dir;
static int g_dump;
static FILE *g_index;

static bool cb_eval(struct ggml_tensor *t, bool ask, void *ud) {
    (void)ud;
    if (ask) {
        return g_dump;
    }
    if (!g_dump || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->data == NULL) {
        return true;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/t/%s.f32", g_dir, t->name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(t->data, sizeof(float), ggml_nelements(t), f);
        fclose(f);
        fprintf(g_index, "%s %lld %lld %lld %lld\n", t->name, (long long)t->ne[0],
                (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    }
    return true;
}

static int parse_ids(const char *s, llama_token *out, int cap) {
    int n = 0;
    while (s && *s && n < cap) {
        out[n++] = (llama_token)strtol(s, (char **)&s, 10);
        if (*s == ',') {
            s++;
        }
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL OUT_DIR DUMP_CALL PROMPT_IDS [FORCED_IDS]\n", argv[0]);
        return 2;
    }
    g_dir = argv[2];
    int dump_call = atoi(argv[3]);
    static llama_token prompt[4096], forced[4096];
    int n_prompt = parse_ids(argv[4], prompt, 4096);
    int n_forced = argc > 5 ? parse_ids(argv[5], forced, 4096) : 0;

    char path[1024];
    snprintf(path, sizeof path, "%s/t/index", g_dir);
    g_index = fopen(path, "w");
    if (!g_index) {
        fprintf(stderr, "cannot write %s (create OUT_DIR/t)\n", path);
        return 1;
    }

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.rope_scaling_type = LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED;
    cp.pooling_type = LLAMA_POOLING_TYPE_UNSPECIFIED;
    cp.attention_type = LLAMA_ATTENTION_TYPE_UNSPECIFIED;
    cp.rope_freq_base = 0;
    cp.rope_freq_scale = 0;
    cp.yarn_ext_factor = -1.0f;
    cp.yarn_attn_factor = 1.0f;
    cp.yarn_beta_fast = 32.0f;
    cp.yarn_beta_slow = 1.0f;
    cp.yarn_orig_ctx = 0;
    cp.embeddings = false;
    cp.offload_kqv = true;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.cb_eval = cb_eval;
    cp.cb_eval_user_data = NULL;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_batch batch = llama_batch_init(4096, 0, 1);
    int pos = 0;
    for (int call = 0; call <= n_forced; call++) {
        const llama_token *ids = call == 0 ? prompt : &forced[call - 1];
        int n = call == 0 ? n_prompt : 1;
        batch.n_tokens = n;
        for (int i = 0; i < n; i++) {
            batch.token[i] = ids[i];
            batch.pos[i] = pos + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = i == n - 1;
        }
        g_dump = call == dump_call;
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "decode failed at call %d\n", call);
            return 1;
        }
        pos += n;
        const float *lg = llama_get_logits_ith(ctx, n - 1);
        snprintf(path, sizeof path, "%s/logits_%d.f32", g_dir, call);
        FILE *f = fopen(path, "wb");
        fwrite(lg, sizeof(float), n_vocab, f);
        fclose(f);
        int best = 0;
        for (int i = 1; i < n_vocab; i++) {
            if (lg[i] > lg[best]) {
                best = i;
            }
        }
        printf("%d%s", best, call == n_forced ? "\n" : ",");
    }
    fclose(g_index);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
