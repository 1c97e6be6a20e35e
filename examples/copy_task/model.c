#include "model.h"

#include <stdio.h>
#include <string.h>

bool model_init(model *m, const model_config *cfg, ag_dtype dt, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(seed, 0x696e6974);  // "init"
    ag_mha_config mc = {.embed_dim = cfg->d_model, .num_heads = cfg->heads, .dropout = cfg->dropout,
                        .pos = cfg->pos, .max_distance = cfg->max_distance};
    char name[64];
    bool ok = ag_embedding_layer_init(&m->tok, m->ps, "tok_emb", cfg->vocab, cfg->d_model, &rng) &&
              (cfg->pos != AG_POS_NONE ||
               ag_embedding_layer_init(&m->pos, m->ps, "pos_emb", cfg->max_len, cfg->d_model, &rng));
    for (int l = 0; ok && l < cfg->layers; l++) {
        if (cfg->cross) {
            snprintf(name, sizeof name, "encoder.layers.%d.self_attn", l);
            ok = ok && ag_mha_init(&m->enc_attn[l], m->ps, name, &mc, &rng);
            snprintf(name, sizeof name, "encoder.layers.%d.norm", l);
            ok = ok && ag_layernorm_layer_init(&m->enc_norm[l], m->ps, name, cfg->d_model);
        }
        snprintf(name, sizeof name, cfg->cross ? "decoder.layers.%d.cross_attn" : "layers.%d.self_attn", l);
        ag_mha_config lc = mc;  // a pruned layer: fewer heads of the same size
        if (cfg->layer_heads[l])
            lc.num_heads = cfg->layer_heads[l], lc.head_dim = cfg->d_model / cfg->heads;
        ok = ok && ag_mha_init(&m->attn[l], m->ps, name, &lc, &rng);
        snprintf(name, sizeof name, cfg->cross ? "decoder.layers.%d.norm" : "layers.%d.norm", l);
        ok = ok && ag_layernorm_layer_init(&m->norm[l], m->ps, name, cfg->d_model);
    }
    return ok && ag_linear_layer_init(&m->head, m->ps, "head", cfg->d_model, cfg->vocab, true, &rng);
}

void model_free(model *m) { ag_params_free(m->ps); }

// tok_emb(ids) + pos_emb(0..T-1): ids [B, T] -> [B, T, E]
static ag_tensor *embed(ag_tape *tp, const model *m, const int32_t *ids, int B, int T) {
    int32_t positions[1024];
    for (int t = 0; t < T; t++) positions[t] = t;
    ag_tensor *x = ag_embedding_layer_forward(tp, &m->tok, ids, 2, (int[]){B, T});
    if (m->cfg.pos != AG_POS_NONE) return x;  // the attention layers carry the positions
    return ag_add(tp, x, ag_embedding_layer_forward(tp, &m->pos, positions, 1, (int[]){T}));
}

// x = LN(x + MHA(x, kv, kv)): one attention sublayer with its residual.
static ag_tensor *attend(ag_tape *tp, const model *m, const ag_mha *attn,
                         const ag_layernorm_layer *norm, ag_tensor *x, ag_tensor *kv, bool causal,
                         const model_input *in, ag_tensor *head_mask, ag_tensor **weights) {
    if (m->cfg.no_attention) return ag_layernorm_layer_forward(tp, norm, x);  // x + 0
    ag_mha_opts o = {.causal = causal,
                     .per_head_weights = true,
                     .training = in->training,
                     .dropout_seed = in->dropout_seed,
                     .head_mask = head_mask};
    ag_tensor *a = ag_mha_forward(tp, attn, x, kv, kv, &o, weights);
    return ag_layernorm_layer_forward(tp, norm, ag_add(tp, x, a));
}

ag_tensor *model_forward(ag_tape *tp, const model *m, const model_input *in, ag_tensor **weights) {
    const model_config *c = &m->cfg;
    ag_tensor *enc = NULL;
    if (c->cross) {
        enc = embed(tp, m, in->source, in->B, in->S);
        for (int l = 0; l < c->layers; l++)
            enc = attend(tp, m, &m->enc_attn[l], &m->enc_norm[l], enc, enc, false, in, NULL, NULL);
    }
    ag_tensor *x = embed(tp, m, in->ids, in->B, in->T);
    for (int l = 0; l < c->layers; l++)
        x = attend(tp, m, &m->attn[l], &m->norm[l], x, c->cross ? enc : x, !c->cross, in,
                   in->head_masks ? in->head_masks[l] : NULL, weights ? &weights[l] : NULL);
    return ag_linear_layer_forward(tp, &m->head, x);
}
