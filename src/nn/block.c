// torch.nn.TransformerEncoderLayer (batch_first=True): self-attention and a
// feed-forward network, each with dropout, a residual and a LayerNorm, in the
// post-LN (PyTorch default) or pre-LN (norm_first) arrangement.
#include <string.h>

#include "../ops/op.h"  // agi_dropout_site
#include "nn.h"

// A LayerNorm, or with no_bias one with a weight only (PyTorch's LayerNorm(bias=False)).
static bool norm_init(ag_layernorm_layer *l, ag_params *ps, const char *name,
                      const ag_block_config *cfg) {
    if (!cfg->no_bias) return ag_layernorm_layer_init(l, ps, name, cfg->d_model);
    char full[AGI_NAME_MAX];
    memset(l, 0, sizeof *l);
    if (!agi_join_name(full, name, "weight") ||
        !(l->weight = ag_params_add(ps, full, 1, (int[]){cfg->d_model})))
        return false;
    ag_tensor_fill(l->weight, 1.0);
    return true;
}

bool ag_block_init(ag_block *b, ag_params *ps, const char *name, const ag_block_config *cfg,
                   ag_pcg32 *rng) {
    memset(b, 0, sizeof *b);
    if (!agi_module_name_ok("block_init", name)) return false;
    if (cfg->dim_feedforward < 1) {
        ag_error("block: dim_feedforward %d must be >= 1", cfg->dim_feedforward);
        return false;
    }
    b->cfg = *cfg;
    if (b->cfg.layer_norm_eps == 0) b->cfg.layer_norm_eps = 1e-5;
    char full[AGI_NAME_MAX];
    ag_mha_config mc = {.embed_dim = cfg->d_model, .num_heads = cfg->num_heads,
                        .dropout = cfg->dropout, .no_bias = cfg->no_bias, .pos = cfg->pos,
                        .max_distance = cfg->max_distance, .num_buckets = cfg->num_buckets,
                        .rope_base = cfg->rope_base, .add_bias_kv = cfg->add_bias_kv,
                        .add_zero_attn = cfg->add_zero_attn};
    bool bias = !cfg->no_bias;
    // Same creation order as PyTorch: self_attn, linear1, linear2, norm1, norm2.
    if (!agi_join_name(full, name, "self_attn") ||
        !ag_mha_init(&b->self_attn, ps, full, &mc, rng))
        return false;
    if (!agi_join_name(full, name, "linear1") ||
        !ag_linear_layer_init(&b->linear1, ps, full, cfg->d_model, cfg->dim_feedforward, bias,
                              rng))
        return false;
    if (!agi_join_name(full, name, "linear2") ||
        !ag_linear_layer_init(&b->linear2, ps, full, cfg->dim_feedforward, cfg->d_model, bias,
                              rng))
        return false;
    if (!agi_join_name(full, name, "norm1") || !norm_init(&b->norm1, ps, full, cfg) ||
        !agi_join_name(full, name, "norm2") || !norm_init(&b->norm2, ps, full, cfg))
        return false;
    b->norm1.eps = b->norm2.eps = b->cfg.layer_norm_eps;
    if (!agi_join_name(full, name, "block_dropout")) return false;
    b->site = agi_dropout_site(full, NULL);
    return true;
}

static ag_tensor *drop(ag_tape *tp, const ag_block *b, ag_tensor *x, const ag_block_opts *o,
                       uint64_t which) {
    if (!o->training || b->cfg.dropout <= 0) return x;
    return ag_dropout(tp, x, b->cfg.dropout, true, o->dropout_seed, b->site + which);
}

static ag_tensor *self_attention(ag_tape *tp, const ag_block *b, ag_tensor *x,
                                 const ag_block_opts *o) {
    ag_mha_opts mo = {0};
    mo.key_padding_mask = o->key_padding_mask;
    mo.attn_mask = o->attn_mask;
    mo.causal = o->causal;
    mo.training = o->training;
    mo.dropout_seed = o->dropout_seed;
    mo.head_mask = o->head_mask;
    mo.per_head_weights = o->per_head_weights;
    mo.mask_polarity = o->mask_polarity;
    return drop(tp, b, ag_mha_forward(tp, &b->self_attn, x, x, x, &mo, o->attn_weights), o, 1);
}

static ag_tensor *feed_forward(ag_tape *tp, const ag_block *b, ag_tensor *x,
                               const ag_block_opts *o) {
    ag_tensor *h = ag_linear_layer_forward(tp, &b->linear1, x);
    h = b->cfg.activation == AG_ACT_GELU ? ag_gelu(tp, h, AG_GELU_ERF) : ag_relu(tp, h);
    h = ag_linear_layer_forward(tp, &b->linear2, drop(tp, b, h, o, 3));
    return drop(tp, b, h, o, 2);
}

// The block around its attention: self-attention with the options, or with a KV cache
// the cached step on x's new positions (eval: the options are then none).
static ag_tensor *attend(ag_tape *tp, const ag_block *b, ag_tensor *x, const ag_block_opts *o,
                         ag_kv_cache *c) {
    return c ? agi_mha_forward_cached(tp, &b->self_attn, c, x) : self_attention(tp, b, x, o);
}

static ag_tensor *block_forward(ag_tape *tp, const ag_block *b, ag_tensor *x,
                                const ag_block_opts *o, ag_kv_cache *c) {
    if (b->cfg.norm_first) {
        x = ag_add(tp, x, attend(tp, b, ag_layernorm_layer_forward(tp, &b->norm1, x), o, c));
        return ag_add(tp, x, feed_forward(tp, b, ag_layernorm_layer_forward(tp, &b->norm2, x), o));
    }
    x = ag_layernorm_layer_forward(tp, &b->norm1, ag_add(tp, x, attend(tp, b, x, o, c)));
    return ag_layernorm_layer_forward(tp, &b->norm2, ag_add(tp, x, feed_forward(tp, b, x, o)));
}

ag_tensor *ag_block_forward(ag_tape *tp, const ag_block *b, ag_tensor *x,
                            const ag_block_opts *opts) {
    static const ag_block_opts none;
    return block_forward(tp, b, x, opts ? opts : &none, NULL);
}

ag_tensor *agi_block_forward_cached(ag_tape *tp, const ag_block *b, ag_kv_cache *c,
                                    ag_tensor *x) {
    static const ag_block_opts eval;
    if (x && x->ndim == 2) x = ag_reshape(tp, x, 3, (int[]){x->shape[0], 1, x->shape[1]});
    return block_forward(tp, b, x, &eval, c);
}
