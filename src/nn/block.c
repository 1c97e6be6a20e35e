// torch.nn.TransformerEncoderLayer (batch_first=True): self-attention and a
// feed-forward network, each with dropout, a residual and a LayerNorm, in the
// post-LN (PyTorch default) or pre-LN (norm_first) arrangement.
#include <string.h>

#include "../ops/op.h"  // agi_dropout_site
#include "nn.h"

static bool init_parts(ag_block *b, ag_params *ps, const char *name,
                       const ag_block_config *cfg, ag_pcg32 *rng) {
    if (!agi_given(b, "block_init", "block") || !agi_given(rng, "block_init", "rng")) return false;
    memset(b, 0, sizeof *b);
    if (!agi_module_name_ok("block_init", name) || !agi_layer_config("block", cfg, &b->cfg))
        return false;
    char full[AGI_NAME_MAX];
    const ag_mha_config mc = agi_layer_attention_config(&b->cfg);
    // Same creation order as PyTorch: self_attn, linear1, linear2, norm1, norm2.
    if (!agi_join_name(full, name, "self_attn") ||
        !ag_mha_init(&b->self_attn, ps, full, &mc, rng) ||
        !agi_feed_forward_init(&b->linear1, &b->linear2, ps, name, &b->cfg, rng))
        return false;
    if (!agi_join_name(full, name, "norm1") ||
        !agi_layer_norm_init(&b->norm1, ps, full, &b->cfg) ||
        !agi_join_name(full, name, "norm2") || !agi_layer_norm_init(&b->norm2, ps, full, &b->cfg))
        return false;
    if (!agi_join_name(full, name, "block_dropout")) return false;
    b->site = agi_dropout_site(full, NULL);
    return true;
}

bool ag_block_init(ag_block *b, ag_params *ps, const char *name, const ag_block_config *cfg,
                   ag_pcg32 *rng) {
    const agi_init_undo u = agi_init_begin(ps, rng);
    const bool ok = init_parts(b, ps, name, cfg, rng);
    return agi_init_end(&u, ok, b, b ? sizeof *b : 0);
}

static ag_tensor *self_attention(ag_tape *tp, const ag_block *b, ag_tensor *x,
                                 const ag_block_opts *o, const agi_layer_run *run,
                                 const agi_mask_caller *who) {
    ag_mha_opts mo = {0};
    mo.key_padding_mask = o->key_padding_mask;
    mo.attn_mask = o->attn_mask;
    mo.causal = o->causal;
    mo.training = o->training;
    mo.dropout_seed = o->dropout_seed;
    mo.head_mask = o->head_mask;
    mo.per_head_weights = o->per_head_weights;
    mo.mask_polarity = o->mask_polarity;
    ag_tensor *y = agi_mha_forward_for(tp, &b->self_attn, x, x, x, &mo, o->attn_weights, who);
    // Reported: in training the dropout would report a second line, that it has no input.
    return y ? agi_layer_dropout(tp, &b->cfg, y, run, AGI_DROP_SELF) : NULL;
}

// The block around its attention: self-attention with the options, or with a KV cache
// the cached step on x's new positions (eval: the options are then none).
static ag_tensor *block_forward(ag_tape *tp, const ag_block *b, ag_tensor *x,
                                const ag_block_opts *o, ag_kv_cache *c,
                                const agi_mask_caller *who) {
    const agi_layer_run run = {o->training, o->dropout_seed, b->site};
    const bool pre = b->cfg.norm_first;
    ag_tensor *h = agi_sublayer_in(tp, &b->norm1, pre, x);
    h = c ? agi_mha_forward_cached(tp, &b->self_attn, c, h)
          : self_attention(tp, b, h, o, &run, who);
    if (!h) return NULL;  // reported: the rest would only report that it has no input
    x = agi_sublayer_out(tp, &b->norm1, pre, x, h);
    h = agi_feed_forward(tp, &b->cfg, &b->linear1, &b->linear2,
                         agi_sublayer_in(tp, &b->norm2, pre, x), &run);
    return agi_sublayer_out(tp, &b->norm2, pre, x, h);
}

ag_tensor *ag_block_forward(ag_tape *tp, const ag_block *b, ag_tensor *x,
                            const ag_block_opts *opts) {
    static const ag_block_opts none;
    if (!agi_given(b, "block_forward", "block")) return NULL;
    if (!agi_layer_input_ok("block_forward", "x", x, b->cfg.d_model, b->self_attn.out_proj.weight))
        return NULL;
    static const agi_mask_caller block = {"block_forward", "attn_mask", "key_padding_mask"};
    return block_forward(tp, b, x, opts ? opts : &none, NULL, &block);
}

ag_tensor *agi_block_forward_for(ag_tape *tp, const ag_block *b, ag_tensor *x,
                                 const ag_block_opts *opts, const agi_mask_caller *who) {
    return block_forward(tp, b, x, opts, NULL, who);
}

ag_tensor *agi_block_forward_cached(ag_tape *tp, const ag_block *b, ag_kv_cache *c,
                                    ag_tensor *x) {
    static const ag_block_opts eval;
    if (x && x->ndim == 2) x = ag_reshape(tp, x, 3, (int[]){x->shape[0], 1, x->shape[1]});
    return block_forward(tp, b, x, &eval, c, NULL);
}
