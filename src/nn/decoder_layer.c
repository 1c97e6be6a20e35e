// torch.nn.TransformerDecoderLayer (batch_first=True): self-attention, attention over an
// encoder's memory (multihead_attn) and a feed-forward network, each a residual sublayer
// with dropout and a LayerNorm (norm1, norm2, norm3), post-LN or pre-LN. The arrangement,
// the feed-forward network and the dropout are the encoder layer's (sublayer.c); the
// attention is ag_mha's, and a cached step runs the same code on the KV caches.
#include <string.h>

#include "../ops/op.h"  // agi_dropout_site
#include "nn.h"

static bool init_parts(ag_decoder_layer *l, ag_params *ps, const char *name,
                       const ag_block_config *cfg, ag_pcg32 *rng) {
    if (!agi_given(l, "decoder_layer_init", "layer")) return false;
    memset(l, 0, sizeof *l);
    // Without them every parameter's init would report and the layer come back made.
    if (!agi_given(ps, "decoder_layer_init", "parameter store") ||
        !agi_given(rng, "decoder_layer_init", "rng") ||
        !agi_module_name_ok("decoder_layer_init", name) ||
        !agi_layer_config("decoder_layer", cfg, &l->cfg))
        return false;
    const ag_mha_config self = agi_layer_attention_config(&l->cfg);
    ag_mha_config cross = self;  // positions are the target's own; memory has no extra keys
    cross.pos = AG_POS_NONE;
    cross.add_bias_kv = cross.add_zero_attn = false;
    cross.window = 0;  // the window is over the target's own positions
    char full[AGI_NAME_MAX];
    // PyTorch's order: self_attn, multihead_attn, linear1, linear2, norm1, norm2, norm3.
    if (!agi_join_name(full, name, "self_attn") ||
        !ag_mha_init(&l->self_attn, ps, full, &self, rng) ||
        !agi_join_name(full, name, "multihead_attn") ||
        !ag_mha_init(&l->multihead_attn, ps, full, &cross, rng) ||
        !agi_feed_forward_init(&l->linear1, &l->linear2, ps, name, &l->cfg, rng))
        return false;
    ag_layernorm_layer *norms[3] = {&l->norm1, &l->norm2, &l->norm3};
    const char *norm_names[3] = {"norm1", "norm2", "norm3"};
    for (int i = 0; i < 3; i++)
        if (!agi_join_name(full, name, norm_names[i]) ||
            !agi_layer_norm_init(norms[i], ps, full, &l->cfg))
            return false;
    if (!agi_join_name(full, name, "decoder_dropout")) return false;
    l->site = agi_dropout_site(full, NULL);
    return true;
}

bool ag_decoder_layer_init(ag_decoder_layer *l, ag_params *ps, const char *name,
                           const ag_block_config *cfg, ag_pcg32 *rng) {
    const agi_init_undo u = agi_init_begin(ps, rng);
    const bool ok = init_parts(l, ps, name, cfg, rng);
    return agi_init_end(&u, ok, l, l ? sizeof *l : 0);
}

// The sublayers around the two attentions, which the forward and the cached step each
// give their own way: the whole target with its masks, or new positions on the caches.
typedef struct attend {
    ag_tensor *(*self)(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *x, const void *how);
    ag_tensor *(*cross)(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *x, const void *how);
    const void *how;
} attend;

static ag_tensor *layer_forward(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *x,
                                const attend *a, const agi_layer_run *run) {
    const bool pre = l->cfg.norm_first;
    ag_tensor *h = a->self(tp, l, agi_sublayer_in(tp, &l->norm1, pre, x), a->how);
    if (!h) return NULL;  // reported: the rest would only report that it has no input
    x = agi_sublayer_out(tp, &l->norm1, pre, x,
                         agi_layer_dropout(tp, &l->cfg, h, run, AGI_DROP_SELF));
    h = x ? a->cross(tp, l, agi_sublayer_in(tp, &l->norm2, pre, x), a->how) : NULL;
    if (!h) return NULL;
    x = agi_sublayer_out(tp, &l->norm2, pre, x,
                         agi_layer_dropout(tp, &l->cfg, h, run, AGI_DROP_CROSS));
    h = x ? agi_feed_forward(tp, &l->cfg, &l->linear1, &l->linear2,
                             agi_sublayer_in(tp, &l->norm3, pre, x), run)
          : NULL;
    return h ? agi_sublayer_out(tp, &l->norm3, pre, x, h) : NULL;
}

// ---- The forward: the whole target, with the options -----------------------------------
typedef struct whole {
    ag_tensor *memory;
    const ag_transformer_opts *o;
    const char *op;  // the public op, for the masks' messages
} whole;

static ag_tensor *whole_self(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *x,
                             const void *how) {
    const whole *w = how;
    const ag_transformer_opts *o = w->o;
    const agi_mask_caller who = {w->op, "tgt_mask", "tgt_key_padding_mask"};
    const ag_mha_opts mo = {.key_padding_mask = o->tgt_key_padding_mask,
                            .attn_mask = o->tgt_mask,
                            .causal = o->causal,
                            .training = o->training,
                            .dropout_seed = o->dropout_seed,
                            .mask_polarity = o->mask_polarity};
    return agi_mha_forward_for(tp, &l->self_attn, x, x, x, &mo, NULL, &who);
}

static ag_tensor *whole_cross(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *x,
                              const void *how) {
    const whole *w = how;
    const ag_transformer_opts *o = w->o;
    const agi_mask_caller who = {w->op, "memory_mask", "memory_key_padding_mask"};
    const ag_mha_opts mo = {.key_padding_mask = o->memory_key_padding_mask,
                            .attn_mask = o->memory_mask,
                            .training = o->training,
                            .dropout_seed = o->dropout_seed,
                            .per_head_weights = o->per_head_weights,
                            .mask_polarity = o->mask_polarity};
    return agi_mha_forward_for(tp, &l->multihead_attn, x, w->memory, w->memory, &mo,
                               o->cross_weights, &who);
}

bool agi_decoder_inputs_ok(const char *op, const ag_tensor *tgt, const ag_tensor *memory,
                           int d_model, const ag_tensor *param) {
    if (!agi_layer_input_ok(op, "tgt", tgt, d_model, NULL) ||
        !agi_layer_input_ok(op, "memory", memory, d_model, NULL))
        return false;
    // Else the attention over memory reports it, and for the dtype its ops one after another.
    if (tgt->dtype != memory->dtype || tgt->shape[0] != memory->shape[0]) {
        ag_error("%s: tgt %s %s and memory %s %s must have one dtype and one batch", op,
                 ag_dtype_name(tgt->dtype), agi_shape(tgt), ag_dtype_name(memory->dtype),
                 agi_shape(memory));
        return false;
    }
    return agi_layer_input_ok(op, "tgt", tgt, d_model, param);  // and memory, of its dtype
}

ag_tensor *ag_decoder_layer_forward(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *tgt,
                                    ag_tensor *memory, const ag_transformer_opts *opts) {
    static const ag_transformer_opts none;
    const ag_transformer_opts *o = opts ? opts : &none;
    if (!agi_given(l, "decoder_layer_forward", "layer")) return NULL;
    if (!agi_decoder_inputs_ok("decoder_layer_forward", tgt, memory, l->cfg.d_model,
                               l->self_attn.out_proj.weight))
        return NULL;
    return agi_decoder_layer_forward_for(tp, l, tgt, memory, o, "decoder_layer_forward");
}

ag_tensor *agi_decoder_layer_forward_for(ag_tape *tp, const ag_decoder_layer *l,
                                         ag_tensor *tgt, ag_tensor *memory,
                                         const ag_transformer_opts *o, const char *op) {
    const whole w = {memory, o, op};
    const attend a = {whole_self, whole_cross, &w};
    const agi_layer_run run = {o->training, o->dropout_seed, l->site};
    return layer_forward(tp, l, tgt, &a, &run);
}

// ---- The cached step: new positions against the layer's caches --------------------------
typedef struct cached {
    ag_kv_cache *self, *memory;
    const agi_memory_rows *rows;
} cached;

static ag_tensor *cached_self(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *x,
                              const void *how) {
    return agi_mha_forward_cached(tp, &l->self_attn, ((const cached *)how)->self, x);
}

static ag_tensor *cached_cross(ag_tape *tp, const ag_decoder_layer *l, ag_tensor *x,
                               const void *how) {
    const cached *c = how;
    return agi_mha_forward_memory(tp, &l->multihead_attn, c->memory, c->rows, x);
}

ag_tensor *agi_decoder_layer_forward_cached(ag_tape *tp, const ag_decoder_layer *l,
                                            ag_kv_cache *self, ag_kv_cache *memory,
                                            const agi_memory_rows *rows, ag_tensor *x) {
    const cached c = {self, memory, rows};
    const attend a = {cached_self, cached_cross, &c};
    const agi_layer_run eval = {false, 0, l->site};
    return layer_forward(tp, l, x, &a, &eval);
}
