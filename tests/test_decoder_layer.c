// The decoder layer (torch.nn.TransformerDecoderLayer) and the stacks of torch.nn.Transformer:
// float64 gradcheck of the layer (post-LN and pre-LN, ReLU and GELU, causal, every mask
// kind, T = 1, one head, dropout) and of a whole transformer; the edges (memory all padded
// for a sequence, a NaN in one sequence's memory); the attention weights over memory;
// names, initialisation and refusals. PyTorch parity is tests/test_transformer_pytorch.c.
#include "testing.h"

typedef struct layer_case {
    ag_decoder_layer l;
    ag_transformer_opts opts;
} layer_case;

static ag_tensor *layer_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    layer_case *c = user;
    return ag_decoder_layer_forward(tp, &c->l, in[0], in[1], &c->opts);
}

// Gradcheck of the layer on tgt [B, T, E], memory [B, S, E] and every parameter (moved off
// their special initial values); `extra` is one more input that requires grad (an
// additive mask), or NULL.
static bool gradcheck_layer(ag_block_config cfg, ag_transformer_opts opts, int B, int T, int S,
                            ag_tensor *extra, uint64_t seed) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(seed, 3);
    layer_case c = {.opts = opts};
    CHECK(ag_decoder_layer_init(&c.l, ps, "layer", &cfg, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.8, 0.8);
    ag_tensor *tgt = ag_tensor_uniform(AG_F64, 3, (int[]){B, T, cfg.d_model}, &rng, -1, 1);
    ag_tensor *memory = ag_tensor_uniform(AG_F64, 3, (int[]){B, S, cfg.d_model}, &rng, -1, 1);
    ag_tensor_set_requires_grad(tgt, true);
    ag_tensor_set_requires_grad(memory, true);
    ag_tensor *in[2 + 32];
    int n = 0;
    in[n++] = tgt;
    in[n++] = memory;
    for (int i = 0; i < ag_params_count(ps); i++) in[n++] = ag_params_at(ps, i);
    if (extra) in[n++] = extra;
    bool ok = ag_gradcheck(layer_fn, in, n, &c, NULL, NULL);
    ag_tensor_free(tgt);
    ag_tensor_free(memory);
    ag_params_free(ps);
    return ok;
}

static ag_tensor *bool_mask(int ndim, const int *shape, const uint8_t *values) {
    return ag_tensor_from(AG_BOOL, ndim, shape, values);
}

static void test_gradcheck_post_ln_relu_causal_t_differs_from_s(void) {
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 6};
    CHECK(gradcheck_layer(cfg, (ag_transformer_opts){.causal = true}, 2, 3, 5, NULL, 1));
}

static void test_gradcheck_pre_ln_gelu_with_key_padding_and_masks(void) {
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 5,
                           .activation = AG_ACT_GELU, .norm_first = true};
    ag_tensor *tgt_kpm = bool_mask(2, (int[]){2, 3}, (uint8_t[]){0, 0, 1, 0, 1, 0});
    ag_tensor *mem_kpm = bool_mask(2, (int[]){2, 4}, (uint8_t[]){0, 0, 0, 1, 1, 0, 0, 0});
    ag_tensor *memory_mask = bool_mask(2, (int[]){3, 4}, (uint8_t[]){0, 1, 0, 0, 0, 0, 1, 0,
                                                                      0, 0, 0, 1});
    ag_pcg32 rng = ag_pcg32_make(9, 9);
    ag_tensor *tgt_mask = ag_tensor_uniform(AG_F64, 2, (int[]){3, 3}, &rng, -1, 1);
    ag_tensor_set_requires_grad(tgt_mask, true);  // an additive mask gets its gradient too
    ag_transformer_opts o = {.tgt_key_padding_mask = tgt_kpm, .memory_key_padding_mask = mem_kpm,
                             .memory_mask = memory_mask, .tgt_mask = tgt_mask};
    CHECK(gradcheck_layer(cfg, o, 2, 3, 4, tgt_mask, 2));
    ag_tensor_free(tgt_kpm), ag_tensor_free(mem_kpm), ag_tensor_free(memory_mask);
    ag_tensor_free(tgt_mask);
}

static void test_gradcheck_one_position_one_head_keeps_polarity(void) {
    ag_block_config cfg = {.d_model = 3, .num_heads = 1, .dim_feedforward = 4};
    // AG_MASK_KEEPS: true = may attend; memory position 1 of sequence 0 is padding.
    ag_tensor *mem_kpm = bool_mask(2, (int[]){2, 2}, (uint8_t[]){1, 0, 1, 1});
    ag_transformer_opts o = {.memory_key_padding_mask = mem_kpm, .causal = true,
                             .mask_polarity = AG_MASK_KEEPS};
    CHECK(gradcheck_layer(cfg, o, 2, 1, 2, NULL, 3));
    ag_tensor_free(mem_kpm);
}

static void test_gradcheck_with_dropout_and_a_fixed_seed(void) {
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 6, .dropout = 0.2};
    ag_transformer_opts o = {.training = true, .dropout_seed = 11, .causal = true};
    CHECK(gradcheck_layer(cfg, o, 2, 3, 3, NULL, 4));
}

typedef struct transformer_case {
    ag_transformer t;
    ag_transformer_opts opts;
} transformer_case;

static ag_tensor *transformer_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    transformer_case *c = user;
    return ag_transformer_forward(tp, &c->t, in[0], in[1], &c->opts);
}

static void test_gradcheck_a_whole_transformer_with_padding(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(5, 5);
    ag_tensor *src_kpm = bool_mask(2, (int[]){2, 4}, (uint8_t[]){0, 0, 0, 1, 0, 0, 0, 0});
    transformer_case c = {.opts = {.causal = true, .src_key_padding_mask = src_kpm,
                                   .memory_key_padding_mask = src_kpm}};
    ag_transformer_config cfg = {.layer = {.d_model = 4, .num_heads = 2, .dim_feedforward = 5,
                                           .norm_first = true, .activation = AG_ACT_GELU},
                                 .num_encoder_layers = 1, .num_decoder_layers = 2};
    CHECK(ag_transformer_init(&c.t, ps, "", &cfg, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.8, 0.8);
    ag_tensor *src = ag_tensor_uniform(AG_F64, 3, (int[]){2, 4, 4}, &rng, -1, 1);
    ag_tensor *tgt = ag_tensor_uniform(AG_F64, 3, (int[]){2, 3, 4}, &rng, -1, 1);
    ag_tensor_set_requires_grad(src, true);
    ag_tensor_set_requires_grad(tgt, true);
    ag_tensor *in[2 + 64];
    int n = 0;
    in[n++] = src;
    in[n++] = tgt;
    for (int i = 0; i < ag_params_count(ps); i++) in[n++] = ag_params_at(ps, i);
    CHECK(ag_gradcheck(transformer_fn, in, n, &c, NULL, NULL));
    ag_tensor_free(src), ag_tensor_free(tgt), ag_tensor_free(src_kpm);
    ag_transformer_free(&c.t);
    ag_params_free(ps);
}

// A layer with its parameters drawn, and tgt / memory inputs, for the edge cases.
typedef struct fixture {
    ag_params *ps;
    ag_decoder_layer l;
    ag_tensor *tgt, *memory;
} fixture;

static fixture fixture_make(int B, int T, int S) {
    fixture f = {.ps = ag_params_new(AG_F64)};
    ag_pcg32 rng = ag_pcg32_make(21, 1);
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 6};
    CHECK(ag_decoder_layer_init(&f.l, f.ps, "", &cfg, &rng));
    for (int i = 0; i < ag_params_count(f.ps); i++)
        ag_tensor_init_uniform(ag_params_at(f.ps, i), &rng, -0.8, 0.8);
    f.tgt = ag_tensor_uniform(AG_F64, 3, (int[]){B, T, 4}, &rng, -1, 1);
    f.memory = ag_tensor_uniform(AG_F64, 3, (int[]){B, S, 4}, &rng, -1, 1);
    ag_tensor_set_requires_grad(f.memory, true);
    return f;
}

static void fixture_free(fixture *f) {
    ag_tensor_free(f->tgt), ag_tensor_free(f->memory);
    ag_params_free(f->ps);
}

// Memory all padded for sequence 0: its queries attend to nothing (zeros, where PyTorch
// gives NaN), the attention sublayer gives out_proj.bias, and no gradient reaches that
// memory; sequence 1 is as if alone.
static void test_memory_all_padded_gives_the_bias_and_no_gradient(void) {
    fixture f = fixture_make(2, 3, 2);
    ag_tensor *kpm = bool_mask(2, (int[]){2, 2}, (uint8_t[]){1, 1, 0, 0});
    ag_tensor *weights = NULL;
    ag_transformer_opts o = {.memory_key_padding_mask = kpm, .cross_weights = &weights};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_decoder_layer_forward(tp, &f.l, f.tgt, f.memory, &o);
    ag_backward(tp, ag_sum(tp, y));
    bool finite = true, zero_grad = true, zero_weights = true;
    for (size_t i = 0; i < y->numel; i++) finite &= isfinite(ag_tensor_item(y, i));
    for (size_t i = 0; i < 2 * 4; i++) zero_grad &= ((double *)f.memory->grad)[i] == 0;
    for (size_t i = 0; i < 3 * 2; i++) zero_weights &= ag_tensor_item(weights, i) == 0;
    CHECK(finite && zero_grad && zero_weights);
    double grad1 = 0;
    for (size_t i = 8; i < 16; i++) grad1 += fabs(((double *)f.memory->grad)[i]);
    CHECK(grad1 > 0);
    ag_tape_free(tp);
    ag_tensor_free(kpm);
    fixture_free(&f);
}

static void test_a_nan_in_one_memory_reaches_only_its_sequence(void) {
    fixture f = fixture_make(2, 3, 4);
    ag_tensor_set_item(f.memory, 5, NAN);  // sequence 0, position 1
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_decoder_layer_forward(tp, &f.l, f.tgt, f.memory, NULL);
    bool nan0 = true, finite1 = true;
    for (size_t i = 0; i < 12; i++) nan0 &= isnan(ag_tensor_item(y, i));
    for (size_t i = 12; i < 24; i++) finite1 &= isfinite(ag_tensor_item(y, i));
    CHECK(nan0 && finite1);
    ag_tape_free(tp);
    fixture_free(&f);
}

// cross_weights: the attention over memory averaged over heads, [B, T, S], each row a
// distribution over the keys left by the masks; the output is the same as without.
static void test_cross_weights_are_distributions_over_memory(void) {
    fixture f = fixture_make(2, 3, 4);
    ag_tensor *kpm = bool_mask(2, (int[]){2, 4}, (uint8_t[]){0, 0, 1, 0, 0, 0, 0, 0});
    ag_tensor *w = NULL;
    ag_transformer_opts o = {.memory_key_padding_mask = kpm, .cross_weights = &w};
    ag_transformer_opts plain = {.memory_key_padding_mask = kpm};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_decoder_layer_forward(tp, &f.l, f.tgt, f.memory, &o);
    ag_tensor *y2 = ag_decoder_layer_forward(tp, &f.l, f.tgt, f.memory, &plain);
    CHECK(w && w->ndim == 3 && w->shape[0] == 2 && w->shape[1] == 3 && w->shape[2] == 4);
    for (int r = 0; w && r < 6; r++) {
        double sum = 0;
        for (int s = 0; s < 4; s++) sum += ag_tensor_item(w, (size_t)r * 4 + s);
        CHECK(fabs(sum - 1) < 1e-12);
        if (r < 3) CHECK(ag_tensor_item(w, (size_t)r * 4 + 2) == 0);  // padded key
    }
    double diff = 0;
    for (size_t i = 0; i < y->numel; i++)
        diff = fmax(diff, fabs(ag_tensor_item(y, i) - ag_tensor_item(y2, i)));
    CHECK(diff < 1e-14);
    ag_tape_free(tp);
    ag_tensor_free(kpm);
    fixture_free(&f);
}

static void test_a_transformer_has_nn_transformers_names_and_init(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_transformer t;
    ag_transformer_config cfg = {.layer = {.d_model = 8, .num_heads = 2, .dim_feedforward = 16},
                                 .num_encoder_layers = 1, .num_decoder_layers = 1};
    CHECK(ag_transformer_init(&t, ps, "transformer", &cfg, &rng));
    const char *names[] = {
        "transformer.encoder.layers.0.self_attn.in_proj_weight",
        "transformer.encoder.layers.0.self_attn.in_proj_bias",
        "transformer.encoder.layers.0.self_attn.out_proj.weight",
        "transformer.encoder.layers.0.self_attn.out_proj.bias",
        "transformer.encoder.layers.0.linear1.weight", "transformer.encoder.layers.0.linear1.bias",
        "transformer.encoder.layers.0.linear2.weight", "transformer.encoder.layers.0.linear2.bias",
        "transformer.encoder.layers.0.norm1.weight", "transformer.encoder.layers.0.norm1.bias",
        "transformer.encoder.layers.0.norm2.weight", "transformer.encoder.layers.0.norm2.bias",
        "transformer.encoder.norm.weight", "transformer.encoder.norm.bias",
        "transformer.decoder.layers.0.self_attn.in_proj_weight",
        "transformer.decoder.layers.0.self_attn.in_proj_bias",
        "transformer.decoder.layers.0.self_attn.out_proj.weight",
        "transformer.decoder.layers.0.self_attn.out_proj.bias",
        "transformer.decoder.layers.0.multihead_attn.in_proj_weight",
        "transformer.decoder.layers.0.multihead_attn.in_proj_bias",
        "transformer.decoder.layers.0.multihead_attn.out_proj.weight",
        "transformer.decoder.layers.0.multihead_attn.out_proj.bias",
        "transformer.decoder.layers.0.linear1.weight", "transformer.decoder.layers.0.linear1.bias",
        "transformer.decoder.layers.0.linear2.weight", "transformer.decoder.layers.0.linear2.bias",
        "transformer.decoder.layers.0.norm1.weight", "transformer.decoder.layers.0.norm1.bias",
        "transformer.decoder.layers.0.norm2.weight", "transformer.decoder.layers.0.norm2.bias",
        "transformer.decoder.layers.0.norm3.weight", "transformer.decoder.layers.0.norm3.bias",
        "transformer.decoder.norm.weight", "transformer.decoder.norm.bias"};
    const int n = (int)(sizeof names / sizeof names[0]);
    CHECK(ag_params_count(ps) == n);
    for (int i = 0; i < n && i < ag_params_count(ps); i++)
        CHECK(strcmp(ag_params_at(ps, i)->name, names[i]) == 0);
    // xavier_uniform on the matrices (nn.Transformer._reset_parameters): linear1.weight
    // [16, 8] is within sqrt(6 / 24) = 0.5, and reaches past nn.Linear's 1/sqrt(8) = 0.35.
    ag_tensor *w = ag_params_find(ps, "transformer.decoder.layers.0.linear1.weight");
    double m = 0;
    for (size_t i = 0; i < w->numel; i++) m = fmax(m, fabs(ag_tensor_item(w, i)));
    CHECK(m <= 0.5 && m > 0.36);
    ag_transformer_free(&t);
    ag_params_free(ps);
}

static void test_bad_names_and_sizes_are_refused_with_one_line(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_decoder_layer l;
    ag_transformer t;
    ag_block_config cfg = {.d_model = 8, .num_heads = 2, .dim_feedforward = 16};
    testing_catch_errors();
    CHECK(!ag_decoder_layer_init(&l, ps, "decoder.", &cfg, &rng));
    CHECK(testing_error_was("decoder_layer_init: module name 'decoder.' ends in '.': pass the "
                            "module's own name, as state_dict makes it (\"head\" owns "
                            "head.weight and head.bias)"));
    ag_block_config no_ff = cfg;
    no_ff.dim_feedforward = 0;
    CHECK(!ag_decoder_layer_init(&l, ps, "decoder", &no_ff, &rng));
    CHECK(testing_error_was("decoder_layer: dim_feedforward 0 must be >= 1"));
    // The layer's dropout and sizes are named as the layer's, not its attention's
    // ("mha: dropout 1.5 ...", "mha: embed_dim 10 ...").
    ag_block_config wet = cfg, odd = cfg;
    wet.dropout = 1.5;
    odd.d_model = 10;
    odd.num_heads = 4;
    CHECK(!ag_block_init(&(ag_block){0}, ps, "block", &wet, &rng));
    CHECK(testing_error_was("block: dropout 1.5 must be in [0, 1]"));
    CHECK(!ag_decoder_layer_init(&l, ps, "decoder", &odd, &rng));
    CHECK(testing_error_was("decoder_layer: d_model 10 must be a positive multiple of "
                            "num_heads 4"));
    CHECK(!ag_transformer_encoder_init(&(ag_transformer_encoder){0}, ps, "encoder", &wet, 2,
                                       &rng));
    CHECK(testing_error_was("transformer_encoder_init: dropout 1.5 must be in [0, 1]"));
    // An activation that is neither kind ran as ReLU; a negative or NaN eps was taken and
    // every forward then failed in its LayerNorm.
    ag_block_config act = cfg, eps = cfg, nan_eps = cfg;
    act.activation = (ag_activation)2;
    eps.layer_norm_eps = -1e-5;
    nan_eps.layer_norm_eps = NAN;
    CHECK(!ag_block_init(&(ag_block){0}, ps, "block", &act, &rng));
    CHECK(testing_error_was("block: unknown activation 2 (AG_ACT_RELU or AG_ACT_GELU)"));
    CHECK(!ag_decoder_layer_init(&l, ps, "decoder", &eps, &rng));
    CHECK(testing_error_was("decoder_layer: layer_norm_eps -1e-05 must be finite and >= 0 (0 "
                            "means 1e-5)"));
    CHECK(!ag_transformer_init(&t, ps, "t", &(ag_transformer_config){.layer = nan_eps,
                                                                     .num_encoder_layers = 1,
                                                                     .num_decoder_layers = 1},
                               &rng));
    CHECK(testing_error_was("transformer_encoder_init: layer_norm_eps nan must be finite and "
                            ">= 0 (0 means 1e-5)"));
    CHECK(ag_params_count(ps) == 0);
    CHECK(!ag_transformer_init(&t, ps, "", &(ag_transformer_config){.layer = cfg,
                                                                    .num_encoder_layers = 1},
                               &rng));
    CHECK(testing_error_was("transformer_decoder_init: needs 1 to 4096 layers, got 0"));
    CHECK(!ag_block_init(&(ag_block){0}, ps, "block", NULL, &rng));
    CHECK(testing_error_was("block: needs a layer config"));
    CHECK(!ag_transformer_encoder_init(&(ag_transformer_encoder){0}, ps, "encoder", NULL, 2,
                                       &rng));
    CHECK(testing_error_was("transformer_encoder_init: needs a layer config"));
    // No rng or no store: one line, and nothing made (each parameter's init reported that
    // its rng was NULL, and the layer, the stacks and the transformer returned true).
    const int made = ag_params_count(ps);
    CHECK(!ag_decoder_layer_init(&l, ps, "decoder", &cfg, NULL));
    CHECK(testing_error_was("decoder_layer_init: the rng is NULL"));
    CHECK(!ag_decoder_layer_init(&l, NULL, "decoder", &cfg, &rng));
    CHECK(testing_error_was("decoder_layer_init: the parameter store is NULL"));
    CHECK(!ag_transformer_decoder_init(&(ag_transformer_decoder){0}, ps, "decoder", &cfg, 2,
                                       NULL));
    CHECK(testing_error_was("transformer_decoder_init: the rng is NULL"));
    CHECK(!ag_transformer_encoder_init(&(ag_transformer_encoder){0}, ps, "encoder", &cfg, 2,
                                       NULL));
    CHECK(testing_error_was("transformer_encoder_init: the rng is NULL"));
    const ag_transformer_config tc = {.layer = cfg, .num_encoder_layers = 1,
                                      .num_decoder_layers = 1};
    CHECK(!ag_transformer_init(&t, ps, "transformer", &tc, NULL));
    CHECK(testing_error_was("transformer_init: the rng is NULL"));
    CHECK(!ag_transformer_init(&t, NULL, "transformer", &tc, &rng));
    CHECK(testing_error_was("transformer_init: the parameter store is NULL"));
    CHECK(ag_params_count(ps) == made);  // each refused before making a parameter
    testing_release_errors();
    ag_params_free(ps);
}

// An input of the wrong width, or none, is one line naming the layer and the shape; the
// layer's ops do not go on to report, one after another, that they have no input (a
// block printed eight lines for one bad x, and the stacks returned NULL with none).
static void test_a_misshapen_or_missing_input_is_one_line(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_transformer t;
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 4};
    CHECK(ag_transformer_init(&t, ps, "", &(ag_transformer_config){.layer = cfg,
        .num_encoder_layers = 2, .num_decoder_layers = 2}, &rng));
    cfg.norm_first = true;
    ag_block pre;
    CHECK(ag_block_init(&pre, ps, "pre", &cfg, &rng));
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_F64, 3, (int[]){1, 2, 4});
    ag_tensor *wide = ag_tensor_zeros(AG_F64, 3, (int[]){1, 2, 5});
    testing_catch_errors();
    CHECK(!ag_block_forward(tp, &t.encoder.layers[0], wide, NULL));
    CHECK(testing_error_was("block_forward: x [1,2,5] must be [B, L, 4] (d_model)"));
    CHECK(!ag_block_forward(tp, &pre, NULL, NULL));
    CHECK(testing_error_was("block_forward: x NULL must be [B, L, 4] (d_model)"));
    CHECK(!ag_decoder_layer_forward(tp, &t.decoder.layers[0], x, wide, NULL));
    CHECK(testing_error_was("decoder_layer_forward: memory [1,2,5] must be [B, L, 4] (d_model)"));
    CHECK(!ag_transformer_encoder_forward(tp, &t.encoder, NULL, NULL));
    CHECK(testing_error_was("transformer_encoder_forward: src NULL must be [B, L, 4] (d_model)"));
    CHECK(!ag_transformer_forward(tp, &t, x, NULL, NULL));
    CHECK(testing_error_was("transformer_decoder_forward: tgt NULL must be [B, L, 4] (d_model)"));
    // tgt and memory of two dtypes or two batches: one line naming the decoder (the
    // attention over memory reported the batch, and its ops the dtype, in two lines).
    ag_tensor *x32 = ag_tensor_zeros(AG_F32, 3, (int[]){1, 2, 4});
    ag_tensor *two = ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 4});
    CHECK(!ag_decoder_layer_forward(tp, &t.decoder.layers[0], x32, x, NULL));
    CHECK(testing_error_was("decoder_layer_forward: tgt f32 [1,2,4] and memory f64 [1,2,4] "
                            "must have one dtype and one batch"));
    CHECK(!ag_transformer_decoder_forward(tp, &t.decoder, x, two, NULL));
    CHECK(testing_error_was("transformer_decoder_forward: tgt f64 [1,2,4] and memory f64 "
                            "[2,3,4] must have one dtype and one batch"));
    // Inputs of another dtype than the parameters: one line naming the layer (the first op
    // reported the dtypes, "linear: dtypes differ" or "layernorm: dtypes differ", and the
    // next that it had no input).
    ag_tensor *y32 = ag_tensor_zeros(AG_F32, 3, (int[]){1, 2, 4});
    CHECK(!ag_block_forward(tp, &pre, x32, NULL));
    CHECK(testing_error_was("block_forward: x f32 [1,2,4] must be f64, as the layer's "
                            "parameters"));
    CHECK(!ag_block_forward(tp, &t.encoder.layers[0], x32, NULL));
    CHECK(testing_error_was("block_forward: x f32 [1,2,4] must be f64, as the layer's "
                            "parameters"));
    CHECK(!ag_decoder_layer_forward(tp, &t.decoder.layers[0], x32, y32, NULL));
    CHECK(testing_error_was("decoder_layer_forward: tgt f32 [1,2,4] must be f64, as the "
                            "layer's parameters"));
    CHECK(!ag_transformer_forward(tp, &t, x32, y32, NULL));
    CHECK(testing_error_was("transformer_encoder_forward: src f32 [1,2,4] must be f64, as the "
                            "layer's parameters"));
    CHECK(!ag_transformer_decoder_forward(tp, &t.decoder, x32, y32, NULL));
    CHECK(testing_error_was("transformer_decoder_forward: tgt f32 [1,2,4] must be f64, as the "
                            "layer's parameters"));
    ag_tensor_free(y32);
    ag_tensor_free(x32);
    ag_tensor_free(two);
    // A bad mask: one line naming the op called and the mask by its name there, and the
    // layer stops there. The decoder's masks were reported by the attention inside
    // ("attention_packed: mask [3,3] does not match scores [1,2,2,2] ..."), which did not
    // say whether tgt_mask or memory_mask was wrong.
    ag_tensor *mask = ag_tensor_zeros(AG_BOOL, 2, (int[]){3, 3});
    ag_tensor *kpm = ag_tensor_zeros(AG_BOOL, 2, (int[]){1, 3});
    testing_error_count = 0;
    CHECK(!ag_block_forward(tp, &pre, x, &(ag_block_opts){.attn_mask = mask}));
    CHECK(testing_error_count == 1);
    const char *scores = "[3,3] does not match scores [1,2,2,2] (expected [2,2], [2,2,2] or a "
                         "shape that broadcasts to [1,2,2,2])";
    const struct {
        ag_transformer_opts o;
        const char *op, *what;
    } cases[] = {
        {{.tgt_mask = mask}, "transformer_decoder_forward", "tgt_mask"},
        {{.memory_mask = mask}, "transformer_decoder_forward", "memory_mask"},
        {{.src_mask = mask}, "transformer_encoder_forward", "src_mask"},
    };
    char want[256];
    for (int i = 0; i < 3; i++) {
        testing_error_count = 0;
        CHECK(!ag_transformer_forward(tp, &t, x, x, &cases[i].o));
        snprintf(want, sizeof want, "%s: %s %s", cases[i].op, cases[i].what, scores);
        CHECK(testing_error_was(want));
        if (i == 2) continue;
        CHECK(!ag_decoder_layer_forward(tp, &t.decoder.layers[0], x, x, &cases[i].o));
        snprintf(want, sizeof want, "decoder_layer_forward: %s %s", cases[i].what, scores);
        CHECK(testing_error_was(want));
    }
    CHECK(!ag_transformer_forward(tp, &t, x, x,
                                  &(ag_transformer_opts){.memory_key_padding_mask = kpm}));
    CHECK(testing_error_was("transformer_decoder_forward: memory_key_padding_mask [1,3] does "
                            "not match query [1,2,4] and key [1,2,4] (expected [1,2])"));
    CHECK(!ag_transformer_forward(tp, &t, x, x,
                                  &(ag_transformer_opts){.tgt_key_padding_mask = mask}));
    CHECK(testing_error_was("transformer_decoder_forward: tgt_key_padding_mask [3,3] does "
                            "not match query [1,2,4] and key [1,2,4] (expected [1,2])"));
    CHECK(!ag_transformer_forward(tp, &t, x, x,
                                  &(ag_transformer_opts){.src_key_padding_mask = kpm}));
    CHECK(testing_error_was("transformer_encoder_forward: src_key_padding_mask [1,3] does "
                            "not match query [1,2,4] and key [1,2,4] (expected [1,2])"));
    testing_release_errors();
    ag_tensor_free(kpm);
    ag_tensor_free(mask);
    ag_tensor_free(x);
    ag_tensor_free(wide);
    ag_tape_free(tp);
    ag_transformer_free(&t);
    ag_params_free(ps);
}

int main(void) {
    RUN(test_gradcheck_post_ln_relu_causal_t_differs_from_s);
    RUN(test_gradcheck_pre_ln_gelu_with_key_padding_and_masks);
    RUN(test_gradcheck_one_position_one_head_keeps_polarity);
    RUN(test_gradcheck_with_dropout_and_a_fixed_seed);
    RUN(test_gradcheck_a_whole_transformer_with_padding);
    RUN(test_memory_all_padded_gives_the_bias_and_no_gradient);
    RUN(test_a_nan_in_one_memory_reaches_only_its_sequence);
    RUN(test_cross_weights_are_distributions_over_memory);
    RUN(test_a_transformer_has_nn_transformers_names_and_init);
    RUN(test_bad_names_and_sizes_are_refused_with_one_line);
    RUN(test_a_misshapen_or_missing_input_is_one_line);
    return testing_summary();
}
