#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool lm_init(lm *m, const lm_config *cfg, uint64_t seed) {
    *m = (lm){.cfg = *cfg};
    const int E = cfg->d_model;  // cfg->layers <= LM_MAX_LAYERS: options.c checks it
    m->ps = ag_params_new(cfg->f64 ? AG_F64 : AG_F32);
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    bool ok = ag_embedding_layer_init(&m->wte, m->ps, "wte.", LM_VOCAB, E, &rng) &&
              ag_embedding_layer_init(&m->wpe, m->ps, "wpe.", cfg->ctx, E, &rng);
    // GPT-2's scale for the embeddings: N(0, 1) would make the tied head's logits
    // of size sqrt(E) at the start.
    if (ok) ag_init_normal(m->wte.weight, &rng, 0, 0.02), ag_init_normal(m->wpe.weight, &rng, 0, 0.02);
    ag_block_config bc = {.d_model = E, .num_heads = cfg->heads, .dim_feedforward = cfg->ff ? cfg->ff : 4 * E,
                          .dropout = cfg->dropout, .activation = AG_ACT_GELU, .norm_first = true};
    for (int l = 0; ok && l < cfg->layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "blocks.%d.", l);
        ok = ag_block_init(&m->blocks[l], m->ps, name, &bc, &rng);
    }
    ok = ok && ag_layernorm_layer_init(&m->ln_f, m->ps, "ln_f.", E);
    if (ok && cfg->untied) ok = ag_linear_layer_init(&m->head, m->ps, "head.", E, LM_VOCAB, false, &rng);
    if (!ok) return lm_free(m), false;
    m->positions = malloc((size_t)cfg->ctx * sizeof *m->positions);
    for (int t = 0; t < cfg->ctx; t++) m->positions[t] = t;
    return true;
}

void lm_free(lm *m) {
    for (int l = 0; l < LM_MAX_LAYERS; l++) ag_kv_cache_free(m->cache[l]);
    ag_tensor_free(m->x1), ag_tensor_free(m->logits1);
    ag_params_free(m->ps);
    free(m->positions);
    *m = (lm){0};
}

static ag_tensor *head(ag_tape *tp, const lm *m, ag_tensor *x) {
    x = ag_layernorm_layer_forward(tp, &m->ln_f, x);
    return ag_linear(tp, x, m->cfg.untied ? m->head.weight : m->wte.weight, NULL);
}

ag_tensor *lm_forward(ag_tape *tp, const lm *m, const int32_t *ids, int B, int T, bool training,
                      uint64_t dropout_seed) {
    ag_tensor *x = ag_add(tp, ag_embedding_layer_forward(tp, &m->wte, ids, 2, (int[]){B, T}),
                          ag_embedding_layer_forward(tp, &m->wpe, m->positions, 1, (int[]){T}));
    x = ag_dropout(tp, x, m->cfg.dropout, training, dropout_seed, 0x656d6264);  // "embd"
    ag_block_opts o = {.causal = true, .training = training, .dropout_seed = dropout_seed};
    for (int l = 0; l < m->cfg.layers; l++) x = ag_block_forward(tp, &m->blocks[l], x, &o);
    return head(tp, m, x);
}

// Runs byte `id` at position `t` through the cached blocks: m->logits1 = its logits.
static void step(lm *m, ag_tape *tp, int id, int t) {
    const int E = m->cfg.d_model;
    const ag_tensor *wte = m->wte.weight, *wpe = m->wpe.weight;
    for (int e = 0; e < E; e++)
        ag_tensor_set(m->x1, (size_t)e, ag_tensor_get(wte, (size_t)id * E + e) +
                                            ag_tensor_get(wpe, (size_t)t * E + e));
    for (int l = 0; l < m->cfg.layers; l++) ag_block_forward_cached(&m->blocks[l], m->cache[l], m->x1);
    ag_tape_reset(tp);  // the head's two ops, without recording
    ag_tensor_copy(m->logits1, head(tp, m, m->x1));
}

bool lm_generate(lm *m, const char *prompt, int n, ag_sampler *s, FILE *out) {
    const int ctx = m->cfg.ctx;
    if (!m->x1) {
        m->x1 = ag_tensor_new(ag_params_dtype(m->ps), 2, (int[]){1, m->cfg.d_model});
        m->logits1 = ag_tensor_new(ag_params_dtype(m->ps), 2, (int[]){1, LM_VOCAB});
        for (int l = 0; l < m->cfg.layers; l++)
            m->cache[l] = ag_kv_cache_new_block(&m->blocks[l], 1, ctx);
    }
    ag_tape *tp = ag_tape_new();
    ag_tape_set_grad_enabled(tp, false);
    int32_t *text = malloc(((size_t)n + strlen(prompt) + 1) * sizeof *text);
    int len = 0;
    for (const char *c = prompt; *c; c++) text[len++] = (uint8_t)*c;
    if (len == 0) text[len++] = '\n';
    int pos = 0, start = len > ctx ? len - ctx : 0;  // pos: positions in the cache
    for (int l = 0; l < m->cfg.layers; l++) ag_kv_cache_reset(m->cache[l]);
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        // Feed what the cache lacks; when it is full, start again from the last ctx/2 bytes.
        while (start + pos < len) {
            if (pos == ctx) {
                start = len - (ctx + 1) / 2, pos = 0;
                for (int l = 0; l < m->cfg.layers; l++) ag_kv_cache_reset(m->cache[l]);
            }
            step(m, tp, text[start + pos], pos), pos++;
        }
        int next = ag_sampler_next(s, m->logits1, 0);
        if (next < 0) ok = false;
        else fputc(text[len++] = next, out);
    }
    fflush(out);
    free(text);
    ag_tape_free(tp);
    return ok;
}
