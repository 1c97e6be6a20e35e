// torch.nn.TransformerEncoder, TransformerDecoder (each with its final LayerNorm, as
// nn.Transformer builds them) and torch.nn.Transformer, batch_first=True: stacks of
// encoder layers (ag_block) and decoder layers, with PyTorch's names and initialisation.
#include <string.h>

#include "nn.h"

// What an encoder layer takes of the forward's options.
static ag_block_opts encoder_layer_opts(const ag_transformer_opts *o) {
    return (ag_block_opts){.key_padding_mask = o->src_key_padding_mask,
                           .attn_mask = o->src_mask,
                           .training = o->training,
                           .dropout_seed = o->dropout_seed,
                           .mask_polarity = o->mask_polarity};
}

// A stack: `n` layers "layers.<i>" made by init_layer (each `size` bytes, in `layers`),
// then its final LayerNorm "norm". False after reporting.
typedef bool (*layer_init_fn)(void *layer, ag_params *ps, const char *name,
                              const ag_block_config *cfg, ag_pcg32 *rng);

static bool stack_init(const char *op, ag_params *ps, const char *name,
                       const ag_block_config *cfg, int n, ag_pcg32 *rng, void **layers,
                       size_t size, layer_init_fn init_layer, ag_layernorm_layer *norm) {
    // Without them every parameter's init would report and the stack come back made.
    if (!agi_given(ps, op, "parameter store") || !agi_given(rng, op, "rng") ||
        !agi_module_name_ok(op, name))
        return false;
    ag_block_config c;
    if (!agi_layer_config(op, cfg, &c)) return false;
    if (n < 1 || n > 4096) {
        ag_error("%s: needs 1 to 4096 layers, got %d", op, n);
        return false;
    }
    *layers = agi_calloc((size_t)n * size);
    char module[AGI_NAME_MAX], full[AGI_NAME_MAX];
    for (int i = 0; i < n; i++) {
        snprintf(module, sizeof module, "layers.%d", i);
        if (!agi_join_name(full, name, module) ||
            !init_layer((char *)*layers + (size_t)i * size, ps, full, cfg, rng))
            return false;
    }
    return agi_join_name(full, name, "norm") && agi_layer_norm_init(norm, ps, full, &c);
}

static bool encoder_layer_init(void *layer, ag_params *ps, const char *name,
                               const ag_block_config *cfg, ag_pcg32 *rng) {
    return ag_block_init(layer, ps, name, cfg, rng);
}

static bool decoder_layer_init(void *layer, ag_params *ps, const char *name,
                               const ag_block_config *cfg, ag_pcg32 *rng) {
    return ag_decoder_layer_init(layer, ps, name, cfg, rng);
}

bool ag_transformer_encoder_init(ag_transformer_encoder *e, ag_params *ps, const char *name,
                                 const ag_block_config *cfg, int num_layers, ag_pcg32 *rng) {
    if (!agi_given(e, "transformer_encoder_init", "encoder")) return false;
    memset(e, 0, sizeof *e);
    void *layers = NULL;
    const agi_init_undo u = agi_init_begin(ps, rng);
    bool ok = stack_init("transformer_encoder_init", ps, name, cfg, num_layers, rng, &layers,
                         sizeof *e->layers, encoder_layer_init, &e->norm);
    e->layers = layers;
    e->num_layers = num_layers;
    if (!ok) ag_transformer_encoder_free(e);
    return agi_init_end(&u, ok, NULL, 0);
}

bool ag_transformer_decoder_init(ag_transformer_decoder *d, ag_params *ps, const char *name,
                                 const ag_block_config *cfg, int num_layers, ag_pcg32 *rng) {
    if (!agi_given(d, "transformer_decoder_init", "decoder")) return false;
    memset(d, 0, sizeof *d);
    void *layers = NULL;
    const agi_init_undo u = agi_init_begin(ps, rng);
    bool ok = stack_init("transformer_decoder_init", ps, name, cfg, num_layers, rng, &layers,
                         sizeof *d->layers, decoder_layer_init, &d->norm);
    d->layers = layers;
    d->num_layers = num_layers;
    if (!ok) ag_transformer_decoder_free(d);
    return agi_init_end(&u, ok, NULL, 0);
}

void ag_transformer_encoder_free(ag_transformer_encoder *e) {
    if (!e) return;
    agi_free(e->layers);
    memset(e, 0, sizeof *e);
}

void ag_transformer_decoder_free(ag_transformer_decoder *d) {
    if (!d) return;
    agi_free(d->layers);
    memset(d, 0, sizeof *d);
}

ag_tensor *ag_transformer_encoder_forward(ag_tape *tp, const ag_transformer_encoder *e,
                                          ag_tensor *src, const ag_transformer_opts *opts) {
    static const ag_transformer_opts none;
    if (!e || !e->layers) {
        ag_error("transformer_encoder_forward: the encoder is %s", e ? "freed" : "NULL");
        return NULL;
    }
    if (!agi_layer_input_ok("transformer_encoder_forward", "src", src, e->layers[0].cfg.d_model,
                            e->layers[0].self_attn.out_proj.weight))
        return NULL;
    const ag_block_opts bo = encoder_layer_opts(opts ? opts : &none);
    static const agi_mask_caller who = {"transformer_encoder_forward", "src_mask",
                                        "src_key_padding_mask"};
    for (int i = 0; i < e->num_layers && src; i++)
        src = agi_block_forward_for(tp, &e->layers[i], src, &bo, &who);
    return src ? ag_layernorm_layer_forward(tp, &e->norm, src) : NULL;
}

ag_tensor *ag_transformer_decoder_forward(ag_tape *tp, const ag_transformer_decoder *d,
                                          ag_tensor *tgt, ag_tensor *memory,
                                          const ag_transformer_opts *opts) {
    static const ag_transformer_opts none;
    if (!d || !d->layers) {
        ag_error("transformer_decoder_forward: the decoder is %s", d ? "freed" : "NULL");
        return NULL;
    }
    const int E = d->layers[0].cfg.d_model;
    if (!agi_decoder_inputs_ok("transformer_decoder_forward", tgt, memory, E,
                               d->layers[0].self_attn.out_proj.weight))
        return NULL;
    ag_transformer_opts o = opts ? *opts : none;
    ag_tensor **cross_weights = o.cross_weights;  // the last layer's
    for (int i = 0; i < d->num_layers && tgt; i++) {
        o.cross_weights = i == d->num_layers - 1 ? cross_weights : NULL;
        tgt = agi_decoder_layer_forward_for(tp, &d->layers[i], tgt, memory, &o,
                                            "transformer_decoder_forward");
    }
    return tgt ? ag_layernorm_layer_forward(tp, &d->norm, tgt) : NULL;
}

bool ag_transformer_init(ag_transformer *t, ag_params *ps, const char *name,
                         const ag_transformer_config *cfg, ag_pcg32 *rng) {
    if (!agi_given(t, "transformer_init", "transformer")) return false;
    memset(t, 0, sizeof *t);
    if (!agi_given(ps, "transformer_init", "parameter store") ||
        !agi_given(rng, "transformer_init", "rng") || !agi_module_name_ok("transformer_init", name))
        return false;
    if (!cfg) {
        ag_error("transformer_init: needs a config");
        return false;
    }
    const agi_init_undo u = agi_init_begin(ps, rng);
    char full[AGI_NAME_MAX];
    if (!agi_join_name(full, name, "encoder") ||
        !ag_transformer_encoder_init(&t->encoder, ps, full, &cfg->layer, cfg->num_encoder_layers,
                                     rng) ||
        !agi_join_name(full, name, "decoder") ||
        !ag_transformer_decoder_init(&t->decoder, ps, full, &cfg->layer,
                                     cfg->num_decoder_layers, rng)) {
        ag_transformer_free(t);
        return agi_init_end(&u, false, NULL, 0);
    }
    // As nn.Transformer._reset_parameters: xavier_uniform on every parameter of two or
    // more dims, in the order they were made.
    for (int i = u.count; i < ag_params_count(ps); i++) {
        ag_tensor *p = ag_params_at(ps, i);
        if (p->ndim > 1) ag_tensor_init_xavier_uniform(p, rng, 1.0);
    }
    return true;
}

void ag_transformer_free(ag_transformer *t) {
    if (!t) return;
    ag_transformer_encoder_free(&t->encoder);
    ag_transformer_decoder_free(&t->decoder);
}

ag_tensor *ag_transformer_forward(ag_tape *tp, const ag_transformer *t, ag_tensor *src,
                                  ag_tensor *tgt, const ag_transformer_opts *opts) {
    if (!agi_given(t, "transformer_forward", "transformer")) return NULL;
    ag_tensor *memory = ag_transformer_encoder_forward(tp, &t->encoder, src, opts);
    return memory ? ag_transformer_decoder_forward(tp, &t->decoder, tgt, memory, opts) : NULL;
}
