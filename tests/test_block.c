// The transformer block (torch.nn.TransformerEncoderLayer, batch_first=True):
// names, and gradients of the whole block in float64 for post-LN and pre-LN,
// ReLU and GELU, causal (decoder-only) and with dropout; the attention's options
// (positions, head mask, add_bias_kv / add_zero_attn, mask polarity) pass through.
#include "testing.h"

typedef struct {
    ag_block b;
    ag_block_opts opts;
} block_case;

static ag_tensor *block_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    block_case *c = user;
    return ag_block_forward(tp, &c->b, in[0], &c->opts);
}

static bool gradcheck_block(ag_block_config cfg, ag_block_opts opts, int B, int T, uint64_t seed) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(seed, 3);
    block_case c = {.opts = opts};
    CHECK(ag_block_init(&c.b, ps, "layer", &cfg, &rng));
    // Move LayerNorm and biases off their special initial values.
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.8, 0.8);
    ag_tensor *x = ag_tensor_uniform(AG_F64, 3, (int[]){B, T, cfg.d_model}, &rng, -1, 1);
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *in[1 + 16];
    int n = 0;
    in[n++] = x;
    for (int i = 0; i < ag_params_count(ps); i++) in[n++] = ag_params_at(ps, i);
    bool ok = ag_gradcheck(block_fn, in, n, &c, NULL, NULL);
    ag_tensor_free(x);
    ag_params_free(ps);
    return ok;
}

static void test_parameters_have_transformer_encoder_layer_names(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_block b;
    ag_block_config cfg = {.d_model = 8, .num_heads = 2, .dim_feedforward = 32};
    CHECK(ag_block_init(&b, ps, "layers.0", &cfg, &rng));
    const char *names[] = {"layers.0.self_attn.in_proj_weight", "layers.0.self_attn.in_proj_bias",
                           "layers.0.self_attn.out_proj.weight", "layers.0.self_attn.out_proj.bias",
                           "layers.0.linear1.weight", "layers.0.linear1.bias",
                           "layers.0.linear2.weight", "layers.0.linear2.bias",
                           "layers.0.norm1.weight", "layers.0.norm1.bias",
                           "layers.0.norm2.weight", "layers.0.norm2.bias"};
    CHECK(ag_params_count(ps) == 12);
    for (int i = 0; i < 12 && i < ag_params_count(ps); i++)
        CHECK(strcmp(ag_params_at(ps, i)->name, names[i]) == 0);
    CHECK(ag_params_find(ps, "layers.0.linear1.weight")->shape[0] == 32);
    CHECK(ag_tensor_item(b.norm1.weight, 3) == 1.0 && ag_tensor_item(b.norm1.bias, 3) == 0.0);
    ag_params_free(ps);
}

static void test_gradcheck_post_ln_relu(void) {
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 6};
    CHECK(gradcheck_block(cfg, (ag_block_opts){0}, 2, 3, 1));
}

static void test_gradcheck_pre_ln_gelu(void) {
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 5,
                           .activation = AG_ACT_GELU, .norm_first = true};
    CHECK(gradcheck_block(cfg, (ag_block_opts){0}, 2, 3, 2));
}

static void test_gradcheck_causal_decoder_only_block_with_t_1(void) {
    ag_block_config cfg = {.d_model = 6, .num_heads = 3, .dim_feedforward = 4};
    ag_block_opts o = {.causal = true};
    CHECK(gradcheck_block(cfg, o, 2, 4, 3));
    CHECK(gradcheck_block(cfg, o, 1, 1, 4));
}

static void test_gradcheck_with_dropout_and_padding(void) {
    ag_block_config cfg = {.d_model = 4, .num_heads = 1, .dim_feedforward = 6, .dropout = 0.2,
                           .norm_first = true};
    ag_tensor *kpm = ag_tensor_from(AG_BOOL, 2, (int[]){2, 3}, (uint8_t[]){0, 0, 1, 0, 1, 0});
    ag_block_opts o = {.training = true, .dropout_seed = 7, .key_padding_mask = kpm};
    CHECK(gradcheck_block(cfg, o, 2, 3, 5));
    ag_tensor_free(kpm);
}

static void test_dropout_only_in_training_and_reproducible_from_the_seed(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(6, 6);
    ag_block b;
    ag_block_config cfg = {.d_model = 8, .num_heads = 2, .dim_feedforward = 16, .dropout = 0.5};
    ag_block_init(&b, ps, "", &cfg, &rng);
    ag_tensor *x = ag_tensor_uniform(AG_F64, 3, (int[]){2, 5, 8}, &rng, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_block_opts train = {.training = true, .dropout_seed = 1}, other = train, eval = {0};
    other.dropout_seed = 2;
    ag_tensor *a = ag_block_forward(tp, &b, x, &train), *a2 = ag_block_forward(tp, &b, x, &train);
    ag_tensor *c = ag_block_forward(tp, &b, x, &other);
    ag_tensor *e = ag_block_forward(tp, &b, x, &eval), *e2 = ag_block_forward(tp, &b, x, NULL);
    double same = 0, diff = 0, evald = 0;
    for (size_t i = 0; i < a->numel; i++) {
        same = fmax(same, fabs(ag_tensor_item(a, i) - ag_tensor_item(a2, i)));
        diff = fmax(diff, fabs(ag_tensor_item(a, i) - ag_tensor_item(c, i)));
        evald = fmax(evald, fabs(ag_tensor_item(e, i) - ag_tensor_item(e2, i)));
    }
    CHECK(same == 0.0 && evald == 0.0 && diff > 1e-3);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(ps);
}

// bias=False as PyTorch's TransformerEncoderLayer(bias=False): no bias anywhere (torch
// 1.13 has no such option to compare with, so the check is against this block with
// biased layers whose biases are all zero: the same function).
static void test_no_bias_has_no_bias_parameters_and_equals_zero_biases(void) {
    ag_params *pa = ag_params_new(AG_F64), *pb = ag_params_new(AG_F64);
    ag_pcg32 ra = ag_pcg32_make(5, 5), rb = ag_pcg32_make(5, 5);
    ag_block a, b;
    ag_block_config nb = {.d_model = 8, .num_heads = 2, .dim_feedforward = 12, .no_bias = true};
    ag_block_config wb = nb;
    wb.no_bias = false;
    CHECK(ag_block_init(&a, pa, "", &nb, &ra));
    CHECK(ag_block_init(&b, pb, "", &wb, &rb));
    CHECK(ag_params_count(pa) == 6);  // in_proj, out_proj, linear1, linear2, norm1, norm2
    for (int i = 0; i < ag_params_count(pa); i++)
        CHECK(strstr(ag_params_at(pa, i)->name, "bias") == NULL);
    for (int i = 0; i < ag_params_count(pb); i++) {  // b: a's weights, zero biases
        ag_tensor *t = ag_params_at(pb, i), *src = ag_params_find(pa, t->name);
        if (src) ag_tensor_copy(t, src);
        else ag_tensor_fill(t, 0.0);
    }
    ag_pcg32 r = ag_pcg32_make(6, 6);
    ag_tensor *x = ag_tensor_uniform(AG_F64, 3, (int[]){2, 5, 8}, &r, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_block_opts o = {.causal = true};
    ag_tensor *ya = ag_block_forward(tp, &a, x, &o), *yb = ag_block_forward(tp, &b, x, &o);
    double worst = 0;
    for (size_t i = 0; i < ya->numel; i++)
        worst = fmax(worst, fabs(ag_tensor_item(ya, i) - ag_tensor_item(yb, i)));
    CHECK(worst < 1e-14);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(pa);
    ag_params_free(pb);
}

static void test_gradcheck_no_bias_pre_ln(void) {
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 6, .no_bias = true,
                           .norm_first = true};
    CHECK(gradcheck_block(cfg, (ag_block_opts){.causal = true}, 2, 3, 7));
}

static void test_gradcheck_with_positions_and_a_head_mask(void) {
    ag_tensor *mask = ag_tensor_from(AG_F64, 1, (int[]){2}, (double[]){0.5, 1.5});
    ag_pos_kind kinds[] = {AG_POS_RELATIVE, AG_POS_T5, AG_POS_ALIBI, AG_POS_ROPE};
    for (int i = 0; i < 4; i++) {
        ag_block_config cfg = {.d_model = 8, .num_heads = 2, .dim_feedforward = 6,
                               .pos = kinds[i], .max_distance = kinds[i] == AG_POS_T5 ? 6 : 2,
                               .num_buckets = 4};
        CHECK(gradcheck_block(cfg, (ag_block_opts){.causal = true, .head_mask = mask}, 2, 4,
                              8 + (uint64_t)i));
    }
    ag_tensor_free(mask);
}

// The block returns its attention weights when asked, and the result does not change.
static void test_returns_its_attention_weights(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(9, 9);
    ag_block b;
    ag_block_config cfg = {.d_model = 8, .num_heads = 2, .dim_feedforward = 12};
    CHECK(ag_block_init(&b, ps, "", &cfg, &rng));
    ag_tensor *x = ag_tensor_uniform(AG_F64, 3, (int[]){2, 5, 8}, &rng, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = NULL;
    ag_tensor *y0 = ag_block_forward(tp, &b, x, &(ag_block_opts){.causal = true});
    ag_tensor *y1 = ag_block_forward(
        tp, &b, x, &(ag_block_opts){.causal = true, .attn_weights = &w, .per_head_weights = true});
    CHECK(w && w->ndim == 4 && w->shape[1] == 2 && w->shape[2] == 5 && w->shape[3] == 5);
    CHECK(w && ag_tensor_item(w, 1) == 0.0);  // query 0 never sees key 1 (causal)
    double worst = 0;
    for (size_t i = 0; i < y0->numel; i++)
        worst = fmax(worst, fabs(ag_tensor_item(y0, i) - ag_tensor_item(y1, i)));
    CHECK(worst < 1e-14);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(ps);
}


// add_bias_kv and add_zero_attn reach the attention: self_attn.bias_k and bias_v exist
// (PyTorch's names), and the whole block passes gradcheck with them, causal and padded.
static void test_extra_keys_reach_the_attention(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(11, 11);
    ag_block b;
    ag_block_config cfg = {.d_model = 4, .num_heads = 2, .dim_feedforward = 6,
                           .add_bias_kv = true, .add_zero_attn = true};
    CHECK(ag_block_init(&b, ps, "l", &cfg, &rng));
    CHECK(b.self_attn.cfg.add_bias_kv && b.self_attn.cfg.add_zero_attn);
    CHECK(ag_params_find(ps, "l.self_attn.bias_k") && ag_params_find(ps, "l.self_attn.bias_v"));
    ag_params_free(ps);
    ag_tensor *kpm = ag_tensor_from(AG_BOOL, 2, (int[]){2, 3}, (uint8_t[]){0, 0, 1, 1, 1, 1});
    CHECK(gradcheck_block(cfg, (ag_block_opts){.causal = true, .key_padding_mask = kpm}, 2, 3,
                          12));
    cfg.add_bias_kv = false;
    CHECK(gradcheck_block(cfg, (ag_block_opts){.causal = true}, 2, 3, 13));
    ag_tensor_free(kpm);
}

// mask_polarity reaches the attention: AG_MASK_KEEPS with a mask and a key padding mask
// gives what the default gives with both inverted, with and without weights.
static void test_mask_polarity_reaches_the_attention(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(14, 14);
    ag_block b;
    ag_block_config cfg = {.d_model = 8, .num_heads = 2, .dim_feedforward = 12,
                           .add_zero_attn = true};
    CHECK(ag_block_init(&b, ps, "", &cfg, &rng));
    ag_tensor *x = ag_tensor_uniform(AG_F64, 3, (int[]){2, 5, 8}, &rng, -1, 1);
    uint8_t keep[2 * 5], block[2 * 5], kp[2 * 5], kb[2 * 5];
    for (int i = 0; i < 10; i++) {
        keep[i] = ag_pcg32_double(&rng) < 0.5, block[i] = !keep[i];
        kp[i] = i != 3 && i != 7, kb[i] = !kp[i];
    }
    ag_tensor *mk = ag_tensor_from(AG_BOOL, 4, (int[]){2, 1, 1, 5}, keep);
    ag_tensor *mb = ag_tensor_from(AG_BOOL, 4, (int[]){2, 1, 1, 5}, block);
    ag_tensor *pk = ag_tensor_from(AG_BOOL, 2, (int[]){2, 5}, kp);
    ag_tensor *pb = ag_tensor_from(AG_BOOL, 2, (int[]){2, 5}, kb);
    ag_tape *tp = ag_tape_new();
    for (int weights = 0; weights < 2; weights++) {
        ag_tensor *w = NULL;
        ag_block_opts a = {.attn_mask = mk, .key_padding_mask = pk, .causal = true,
                           .mask_polarity = AG_MASK_KEEPS, .attn_weights = weights ? &w : NULL};
        ag_block_opts o = {.attn_mask = mb, .key_padding_mask = pb, .causal = true,
                           .attn_weights = weights ? &w : NULL};
        ag_tensor *ya = ag_block_forward(tp, &b, x, &a), *yb = ag_block_forward(tp, &b, x, &o);
        ag_tensor *yd = ag_block_forward(tp, &b, x, &(ag_block_opts){.causal = true});
        double worst = 0, apart = 0;
        for (size_t i = 0; i < ya->numel; i++) {
            worst = fmax(worst, fabs(ag_tensor_item(ya, i) - ag_tensor_item(yb, i)));
            apart = fmax(apart, fabs(ag_tensor_item(ya, i) - ag_tensor_item(yd, i)));
        }
        CHECK(worst < 1e-14);
        CHECK(apart > 1e-3);  // the masks do mask something
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(mk);
    ag_tensor_free(mb);
    ag_tensor_free(pk);
    ag_tensor_free(pb);
    ag_params_free(ps);
}

// A bad mask in training is one line, the attention's: the block's dropout went on to
// report "dropout: x is NULL" after it (the encoder stack's too).
static void test_a_bad_mask_in_training_is_one_line(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(15, 15);
    ag_block b;
    ag_transformer_encoder e;
    ag_block_config cfg = {.d_model = 8, .num_heads = 2, .dim_feedforward = 12, .dropout = 0.1};
    CHECK(ag_block_init(&b, ps, "block", &cfg, &rng));
    CHECK(ag_transformer_encoder_init(&e, ps, "encoder", &cfg, 2, &rng));
    ag_tensor *x = ag_tensor_uniform(AG_F64, 3, (int[]){2, 3, 8}, &rng, -1, 1);
    ag_tensor *bad = ag_tensor_zeros(AG_BOOL, 2, (int[]){4, 4});
    ag_tape *tp = ag_tape_new();
    // The message names the op called and the mask by its name there (it named the
    // internal op and "mask", whichever of the caller's masks it was).
    const char *shapes = " [4,4] does not match scores [2,2,3,3] (expected [3,3], [4,3,3] or "
                         "a shape that broadcasts to [2,2,3,3])";
    char expected[256];
    testing_catch_errors();
    CHECK(!ag_block_forward(tp, &b, x, &(ag_block_opts){.attn_mask = bad, .training = true}));
    snprintf(expected, sizeof expected, "block_forward: attn_mask%s", shapes);
    CHECK(testing_error_was(expected));
    CHECK(!ag_transformer_encoder_forward(
        tp, &e, x, &(ag_transformer_opts){.src_mask = bad, .training = true}));
    snprintf(expected, sizeof expected, "transformer_encoder_forward: src_mask%s", shapes);
    CHECK(testing_error_was(expected));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(bad);
    ag_transformer_encoder_free(&e);
    ag_params_free(ps);
}

int main(void) {
    RUN(test_no_bias_has_no_bias_parameters_and_equals_zero_biases);
    RUN(test_gradcheck_no_bias_pre_ln);
    RUN(test_gradcheck_with_positions_and_a_head_mask);
    RUN(test_returns_its_attention_weights);
    RUN(test_extra_keys_reach_the_attention);
    RUN(test_mask_polarity_reaches_the_attention);
    RUN(test_a_bad_mask_in_training_is_one_line);
    RUN(test_parameters_have_transformer_encoder_layer_names);
    RUN(test_gradcheck_post_ln_relu);
    RUN(test_gradcheck_pre_ln_gelu);
    RUN(test_gradcheck_causal_decoder_only_block_with_t_1);
    RUN(test_gradcheck_with_dropout_and_padding);
    RUN(test_dropout_only_in_training_and_reproducible_from_the_seed);
    return testing_summary();
}
