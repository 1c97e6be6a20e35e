// The parts a transformer layer is made of, shared by the encoder layer (block.c) and the
// decoder layer (decoder_layer.c) as PyTorch's two layers share them: a LayerNorm, the
// residual arrangement of a sublayer f in post-LN or pre-LN,
//     post-LN:  x = norm(x + f(x))        pre-LN:  x = x + f(norm(x)),
// the feed-forward network linear2(drop(act(linear1(x)))), and the layer's dropout.
#include <math.h>
#include <string.h>

#include "nn.h"

static ag_tensor *gelu_erf(ag_tape *tp, ag_tensor *x) { return ag_gelu(tp, x, AG_GELU_ERF); }

// The feed-forward's activations, by ag_activation: PyTorch's "relu" and "gelu" (erf).
static ag_tensor *(*const activations[])(ag_tape *, ag_tensor *) = {
    [AG_ACT_RELU] = ag_relu,
    [AG_ACT_GELU] = gelu_erf,
};

bool agi_layer_config(const char *op, const ag_block_config *cfg, ag_block_config *out) {
    if (!cfg) {
        ag_error("%s: needs a layer config", op);
        return false;
    }
    // The layer's own fields in its own words; the attention's other options are checked
    // by ag_mha_init, which names the module.
    if (cfg->d_model < 1 || cfg->num_heads < 1 || cfg->d_model % cfg->num_heads != 0) {
        ag_error("%s: d_model %d must be a positive multiple of num_heads %d", op,
                 cfg->d_model, cfg->num_heads);
        return false;
    }
    if (!(cfg->dropout >= 0.0 && cfg->dropout <= 1.0)) {
        ag_error("%s: dropout %g must be in [0, 1]", op, cfg->dropout);
        return false;
    }
    if (cfg->dim_feedforward < 1) {
        ag_error("%s: dim_feedforward %d must be >= 1", op, cfg->dim_feedforward);
        return false;
    }
    // Else an unknown activation ran as ReLU, and a bad eps made every forward fail.
    if ((unsigned)cfg->activation >= sizeof activations / sizeof *activations) {
        ag_error("%s: unknown activation %d (AG_ACT_RELU or AG_ACT_GELU)", op,
                 (int)cfg->activation);
        return false;
    }
    if (!(cfg->layer_norm_eps >= 0 && isfinite(cfg->layer_norm_eps))) {
        ag_error("%s: layer_norm_eps %g must be finite and >= 0 (0 means 1e-5)", op,
                 cfg->layer_norm_eps);
        return false;
    }
    *out = *cfg;
    if (out->layer_norm_eps == 0) out->layer_norm_eps = 1e-5;  // PyTorch's default
    return true;
}

ag_mha_config agi_layer_attention_config(const ag_block_config *cfg) {
    return (ag_mha_config){.embed_dim = cfg->d_model, .num_heads = cfg->num_heads,
                           .dropout = cfg->dropout, .no_bias = cfg->no_bias, .pos = cfg->pos,
                           .max_distance = cfg->max_distance, .num_buckets = cfg->num_buckets,
                           .rope_base = cfg->rope_base, .num_kv_heads = cfg->num_kv_heads,
                           .window = cfg->window,
                           .add_bias_kv = cfg->add_bias_kv,
                           .add_zero_attn = cfg->add_zero_attn};
}

bool agi_layer_norm_init(ag_layernorm_layer *l, ag_params *ps, const char *name,
                         const ag_block_config *cfg) {
    if (!cfg->no_bias) {
        if (!ag_layernorm_layer_init(l, ps, name, cfg->d_model)) return false;
    } else {  // PyTorch's LayerNorm(bias=False): a weight only
        char full[AGI_NAME_MAX];
        memset(l, 0, sizeof *l);
        if (!agi_join_name(full, name, "weight") ||
            !(l->weight = ag_params_add(ps, full, 1, (int[]){cfg->d_model})))
            return false;
        ag_tensor_fill(l->weight, 1.0);
    }
    l->eps = cfg->layer_norm_eps;
    return true;
}

bool agi_feed_forward_init(ag_linear_layer *l1, ag_linear_layer *l2, ag_params *ps,
                           const char *name, const ag_block_config *cfg, ag_pcg32 *rng) {
    char full[AGI_NAME_MAX];
    const bool bias = !cfg->no_bias;
    return agi_join_name(full, name, "linear1") &&
           ag_linear_layer_init(l1, ps, full, cfg->d_model, cfg->dim_feedforward, bias, rng) &&
           agi_join_name(full, name, "linear2") &&
           ag_linear_layer_init(l2, ps, full, cfg->dim_feedforward, cfg->d_model, bias, rng);
}

bool agi_layer_input_ok(const char *op, const char *what, const ag_tensor *x, int d_model,
                        const ag_tensor *param) {
    if (!x || x->ndim != 3 || x->shape[2] != d_model) {
        ag_error("%s: %s %s must be [B, L, %d] (d_model)", op, what, x ? agi_shape(x) : "NULL",
                 d_model);
        return false;
    }
    // Else the first op reported the dtypes and the next one that it had no input.
    if (param && x->dtype != param->dtype) {
        ag_error("%s: %s %s %s must be %s, as the layer's parameters", op, what,
                 ag_dtype_name(x->dtype), agi_shape(x), ag_dtype_name(param->dtype));
        return false;
    }
    return true;
}

ag_tensor *agi_sublayer_in(ag_tape *tp, const ag_layernorm_layer *norm, bool norm_first,
                           ag_tensor *x) {
    return norm_first ? ag_layernorm_layer_forward(tp, norm, x) : x;
}

ag_tensor *agi_sublayer_out(ag_tape *tp, const ag_layernorm_layer *norm, bool norm_first,
                            ag_tensor *x, ag_tensor *fx) {
    ag_tensor *sum = ag_add(tp, x, fx);
    return norm_first ? sum : ag_layernorm_layer_forward(tp, norm, sum);
}

ag_tensor *agi_layer_dropout(ag_tape *tp, const ag_block_config *cfg, ag_tensor *x,
                             const agi_layer_run *run, uint64_t which) {
    if (!run->training || cfg->dropout <= 0) return x;
    return ag_dropout(tp, x, cfg->dropout, true, run->seed, run->site + which);
}

ag_tensor *agi_feed_forward(ag_tape *tp, const ag_block_config *cfg, const ag_linear_layer *l1,
                            const ag_linear_layer *l2, ag_tensor *x, const agi_layer_run *run) {
    ag_tensor *h = ag_linear_layer_forward(tp, l1, x);
    h = activations[cfg->activation](tp, h);
    h = ag_linear_layer_forward(tp, l2, agi_layer_dropout(tp, cfg, h, run, AGI_DROP_FF_INNER));
    return agi_layer_dropout(tp, cfg, h, run, AGI_DROP_FF_OUT);
}
