#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool lm_init(lm *m, const lm_config *cfg, uint64_t seed) {
    *m = (lm){.cfg = *cfg};
    const int E = cfg->d_model;  // options.c checks the sizes
    const bool learned = cfg->pos == AG_POS_NONE;
    m->ps = ag_params_new(cfg->f64 ? AG_F64 : AG_F32);
    ag_pcg32 rng = ag_pcg32_make(seed, LM_STREAM_INIT);
    bool ok = ag_embedding_layer_init(&m->wte, m->ps, "wte", LM_VOCAB, E, &rng) &&
              (!learned || ag_embedding_layer_init(&m->wpe, m->ps, "wpe", cfg->ctx, E, &rng));
    // GPT-2's scale for the embeddings: N(0, 1) would make the tied head's logits
    // of size sqrt(E) at the start.
    if (ok) ag_tensor_init_normal(m->wte.weight, &rng, 0, 0.02);
    if (ok && learned) ag_tensor_init_normal(m->wpe.weight, &rng, 0, 0.02);
    ag_block_config bc = {.d_model = E, .num_heads = cfg->heads, .pos = (ag_pos_kind)cfg->pos,
                          .dim_feedforward = cfg->ff ? cfg->ff : 4 * E, .dropout = cfg->dropout,
                          .activation = AG_ACT_GELU, .norm_first = true};
    for (int l = 0; ok && l < cfg->layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "blocks.%d", l);
        ok = ag_block_init(&m->blocks[l], m->ps, name, &bc, &rng);
    }
    ok = ok && ag_layernorm_layer_init(&m->ln_f, m->ps, "ln_f", E);
    if (ok && cfg->untied)
        ok = ag_linear_layer_init(&m->head, m->ps, "head", E, LM_VOCAB, false, &rng);
    if (!ok) {
        lm_free(m);
        return false;
    }
    // As nanoGPT: no decay on biases, LayerNorms, embeddings and position tables.
    ag_params_decay_matrices_only(m->ps);
    ag_params_set_decay(m->ps, m->wte.weight, false);
    if (learned) ag_params_set_decay(m->ps, m->wpe.weight, false);
    for (int l = 0; l < cfg->layers; l++)
        if (m->blocks[l].self_attn.pos_table)
            ag_params_set_decay(m->ps, m->blocks[l].self_attn.pos_table, false);
    return true;
}

void lm_free(lm *m) {
    ag_params_free(m->ps);
    *m = (lm){0};
}

ag_tensor *lm_forward(ag_tape *tp, const lm *m, const int32_t *ids, int B, int T, bool training,
                      uint64_t dropout_seed) {
    ag_tensor *x = ag_embedding_layer_forward(tp, &m->wte, ids, 2, (int[]){B, T});
    if (m->cfg.pos == AG_POS_NONE)  // rows 0 .. T-1 of the table, added to every sequence
        x = ag_add(tp, x, ag_slice(tp, m->wpe.weight, 0, 0, T));
    // The site "embd" (in ASCII): the embedding's masks are not the blocks' at the same seed.
    x = ag_dropout(tp, x, m->cfg.dropout, training, dropout_seed, 0x656d6264);
    ag_block_opts o = {.causal = true, .training = training, .dropout_seed = dropout_seed};
    for (int l = 0; l < m->cfg.layers; l++) x = ag_block_forward(tp, &m->blocks[l], x, &o);
    x = ag_layernorm_layer_forward(tp, &m->ln_f, x);
    return ag_linear(tp, x, m->cfg.untied ? m->head.weight : m->wte.weight, NULL);
}

static void put(int32_t byte, void *out) { fputc(byte, out); }

bool lm_generate(const lm *m, const char *prompt, int n, const ag_sample_config *sc,
                 uint64_t seed, bool bf16, FILE *out) {
    ag_decoder d = {.blocks = m->blocks, .layers = m->cfg.layers, .context = m->cfg.ctx,
                    .wte = m->wte.weight, .wpe = m->wpe.weight, .ln_f = &m->ln_f,  // GPT-2's ends,
                    .head = m->cfg.untied ? m->head.weight : m->wte.weight};   // as lm_forward's
    ag_generator *g = ag_generator_new(&d);
    if (g) ag_generator_set_autocast(g, bf16 ? AG_AUTOCAST_BF16 : AG_AUTOCAST_OFF);
    ag_sampler *s = ag_sampler_new(LM_VOCAB, sc, seed, LM_STREAM_SAMPLE);
    const int len = (int)strlen(prompt);
    int32_t *ids = malloc(((size_t)len + 1) * sizeof *ids);
    for (int i = 0; i < len; i++) ids[i] = (uint8_t)prompt[i];
    bool ok = g && s && ag_generate(g, ids, len, n, s, NULL, put, out) == n;
    fflush(out);
    free(ids);
    ag_generator_free(g);
    ag_sampler_free(s);
    return ok;
}
