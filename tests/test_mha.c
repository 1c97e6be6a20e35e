// MultiheadAttention as torch.nn.MultiheadAttention(batch_first=True)
// defines it: parameter names, shapes and initialisation; gradients of the
// whole module in float64; masks, cross-attention, kdim/vdim, dropout, and
// the attention weights it returns; its fused paths (no weights asked for:
// self-attention through one packed projection, anything else through three)
// against its composed one (weights asked for).
#include <limits.h>
#include <stdlib.h>

#include "op_checks.h"

typedef struct {
    ag_mha m;
    ag_mha_opts opts;
    int n_params;
} mha_case;

// inputs: query, key, value, then every parameter of the store.
static ag_tensor *mha_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    mha_case *c = user;
    ag_mha_opts o = c->opts;
    if (o.head_mask) o.head_mask = in[n - 1];  // the last input, so gradcheck perturbs it
    return ag_mha_forward(tp, &c->m, in[0], in[1], in[2], &o, NULL);
}

static ag_tensor *rand_input(int B, int T, int E, uint64_t seed) {
    ag_pcg32 rng = ag_pcg32_make(seed, 5);
    ag_tensor *t = ag_tensor_uniform(AG_F64, 3, (int[]){B, T, E}, &rng, -1, 1);
    ag_tensor_set_requires_grad(t, true);
    return t;
}

// Gradchecks query, key, value and all parameters together. Biases start at
// zero in PyTorch's init; randomise them so their gradients are exercised
// away from a special point.
static bool gradcheck_mha(const ag_mha_config *cfg, ag_mha_opts opts, int B, int T, int S,
                          bool self_attention, uint64_t seed) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    mha_case c = {.opts = opts};
    CHECK(ag_mha_init(&c.m, ps, "", cfg, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.7, 0.7);
    int kdim = c.m.cfg.kdim, vdim = c.m.cfg.vdim, E = cfg->embed_dim;
    ag_tensor *q = rand_input(B, T, E, seed + 1);
    ag_tensor *k = self_attention ? q : rand_input(B, S, kdim, seed + 2);
    ag_tensor *v = self_attention ? q : rand_input(B, S, vdim, seed + 3);
    ag_tensor *in[3 + 8 + 1];
    int n = 0;
    in[n++] = q;
    in[n++] = k;
    in[n++] = v;
    for (int i = 0; i < ag_params_count(ps); i++) in[n++] = ag_params_at(ps, i);
    if (opts.head_mask) in[n++] = opts.head_mask;
    ag_gradcheck_result r;
    bool ok = ag_gradcheck(mha_fn, in, n, &c, NULL, &r);
    if (!self_attention) {
        ag_tensor_free(k);
        ag_tensor_free(v);
    }
    ag_tensor_free(q);
    ag_params_free(ps);
    return ok;
}

static void test_parameters_have_pytorch_names_shapes_and_init(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 16, .num_heads = 4};
    CHECK(ag_mha_init(&m, ps, "attn", &cfg, &rng));
    const char *names[] = {"attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight",
                           "attn.out_proj.bias"};
    const int shapes[][2] = {{48, 16}, {48, 0}, {16, 16}, {16, 0}};
    CHECK(ag_params_count(ps) == 4);
    for (int i = 0; i < 4; i++) {
        ag_tensor *t = ag_params_at(ps, i);
        CHECK(strcmp(t->name, names[i]) == 0);
        CHECK(t->shape[0] == shapes[i][0] && (shapes[i][1] == 0 ? t->ndim == 1 : t->shape[1] == shapes[i][1]));
    }
    // xavier_uniform over [3E, E]: bound sqrt(6 / (4E)); biases zero.
    double bound = sqrt(6.0 / (48 + 16)), mx = 0;
    for (size_t i = 0; i < m.in_proj_weight->numel; i++)
        mx = fmax(mx, fabs(ag_tensor_item(m.in_proj_weight, i)));
    CHECK(mx <= bound && mx > 0.9 * bound);
    for (size_t i = 0; i < 48; i++) CHECK(ag_tensor_item(m.in_proj_bias, i) == 0.0);
    for (size_t i = 0; i < 16; i++) CHECK(ag_tensor_item(m.out_proj.bias, i) == 0.0);
    // out_proj.weight as nn.Linear: U(-1/sqrt(E), 1/sqrt(E)).
    mx = 0;
    for (size_t i = 0; i < m.out_proj.weight->numel; i++)
        mx = fmax(mx, fabs(ag_tensor_item(m.out_proj.weight, i)));
    CHECK(mx <= 0.25 && mx > 0.2);
    ag_params_free(ps);
}

static void test_separate_projections_when_kdim_or_vdim_differ(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2, .kdim = 5, .vdim = 3, .no_bias = true};
    CHECK(ag_mha_init(&m, ps, "", &cfg, &rng));
    CHECK(ag_params_count(ps) == 4);  // q, k, v weights and out_proj.weight
    CHECK(ag_params_find(ps, "q_proj_weight")->shape[1] == 8);
    CHECK(ag_params_find(ps, "k_proj_weight")->shape[1] == 5);
    CHECK(ag_params_find(ps, "v_proj_weight")->shape[1] == 3);
    CHECK(ag_params_find(ps, "out_proj.weight") != NULL);
    CHECK(ag_params_find(ps, "in_proj_bias") == NULL && ag_params_find(ps, "out_proj.bias") == NULL);
    ag_params_free(ps);
}

// Self-attention (query, key and value one tensor) runs one projection with the packed
// in_proj_weight and the packed attention.
static void test_gradcheck_self_attention_with_and_without_bias(void) {
    ag_mha_config cfg = {.embed_dim = 6, .num_heads = 2};
    ag_mha_opts o = {0};
    CHECK(gradcheck_mha(&cfg, o, 2, 3, 3, true, 10));
    o.causal = true;
    CHECK(gradcheck_mha(&cfg, o, 2, 4, 4, true, 11));
    ag_mha_config nb = {.embed_dim = 6, .num_heads = 3, .no_bias = true};
    CHECK(gradcheck_mha(&nb, o, 2, 4, 4, true, 20));
    ag_tensor *kpm = ag_tensor_from(AG_BOOL, 2, (int[]){2, 3}, (uint8_t[]){0, 1, 0, 1, 1, 1});
    o = (ag_mha_opts){.key_padding_mask = kpm};  // batch 1 pads every key
    CHECK(gradcheck_mha(&nb, o, 2, 3, 3, true, 21));
    ag_tensor_free(kpm);
}

// Anything else projects query, key and value apart and reads the heads in place.
static void test_gradcheck_cross_attention_t_not_s_with_and_without_bias(void) {
    ag_mha_config cfg = {.embed_dim = 6, .num_heads = 3};
    CHECK(gradcheck_mha(&cfg, (ag_mha_opts){0}, 2, 2, 5, false, 12));
    CHECK(gradcheck_mha(&cfg, (ag_mha_opts){0}, 1, 1, 3, false, 13));  // T = 1
    ag_mha_config nb = {.embed_dim = 6, .num_heads = 2, .no_bias = true};
    CHECK(gradcheck_mha(&nb, (ag_mha_opts){.causal = true}, 2, 4, 3, false, 22));
}

static void test_gradcheck_kdim_vdim_no_bias_one_head(void) {
    ag_mha_config cfg = {.embed_dim = 4, .num_heads = 1, .kdim = 3, .vdim = 5, .no_bias = true};
    CHECK(gradcheck_mha(&cfg, (ag_mha_opts){0}, 2, 3, 2, false, 14));
    ag_mha_config cfg2 = {.embed_dim = 6, .num_heads = 2, .kdim = 3, .vdim = 5};
    CHECK(gradcheck_mha(&cfg2, (ag_mha_opts){0}, 1, 2, 4, false, 15));
}

static void test_gradcheck_with_masks_including_a_fully_masked_query(void) {
    ag_mha_config cfg = {.embed_dim = 6, .num_heads = 2};
    // key_padding [B=2, S=4]: batch 1 pads every key, so its queries see nothing.
    ag_tensor *kpm = ag_tensor_from(AG_BOOL, 2, (int[]){2, 4}, (uint8_t[]){0, 0, 1, 0, 1, 1, 1, 1});
    ag_tensor *bool_mask = ag_tensor_from(AG_BOOL, 2, (int[]){3, 4},
                                          (uint8_t[]){0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0});
    ag_pcg32 rng = ag_pcg32_make(4, 4);
    ag_tensor *add = ag_tensor_uniform(AG_F64, 3, (int[]){4, 3, 4}, &rng, -1, 1);  // [B*h,T,S]
    ag_mha_opts o = {.key_padding_mask = kpm};
    CHECK(gradcheck_mha(&cfg, o, 2, 3, 4, false, 16));
    o.attn_mask = bool_mask;
    CHECK(gradcheck_mha(&cfg, o, 2, 3, 4, false, 17));
    o.attn_mask = add;
    o.causal = true;
    CHECK(gradcheck_mha(&cfg, o, 2, 3, 4, false, 18));
    ag_tensor_free(kpm);
    ag_tensor_free(bool_mask);
    ag_tensor_free(add);
}

static void test_gradcheck_with_dropout_on_the_weights(void) {
    ag_mha_config cfg = {.embed_dim = 6, .num_heads = 2, .dropout = 0.3};
    ag_mha_opts o = {.training = true, .dropout_seed = 99};
    CHECK(gradcheck_mha(&cfg, o, 2, 3, 3, true, 19));
}

static void test_returned_weights_are_averaged_or_per_head_and_rows_sum_to_one(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(2, 2);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4};
    ag_mha_init(&m, ps, "", &cfg, &rng);
    ag_tensor *q = rand_input(2, 3, 8, 20), *kv = rand_input(2, 5, 8, 21);
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = NULL, *wh = NULL;
    ag_mha_opts o = {.causal = true};
    ag_tensor *y = ag_mha_forward(tp, &m, q, kv, kv, &o, &w);
    CHECK(y && y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 8);
    CHECK(w && w->ndim == 3 && w->shape[0] == 2 && w->shape[1] == 3 && w->shape[2] == 5);
    CHECK(!w->requires_grad);
    o.per_head_weights = true;
    ag_mha_forward(tp, &m, q, kv, kv, &o, &wh);
    CHECK(wh && wh->ndim == 4 && wh->shape[1] == 4);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 3; t++) {
            double s = 0, avg = 0;
            for (int j = 0; j < 5; j++) {
                double v = ag_tensor_item(w, ((size_t)b * 3 + t) * 5 + j);
                s += v;
                if (j > t) CHECK(v == 0.0);  // causal
                double mean = 0;
                for (int h = 0; h < 4; h++)
                    mean += ag_tensor_item(wh, (((size_t)b * 4 + h) * 3 + t) * 5 + j) / 4;
                avg = fmax(avg, fabs(mean - v));
            }
            CHECK_NEAR(s, 1.0, 1e-12);
            CHECK(avg < 1e-15);
        }
    ag_tape_free(tp);
    ag_tensor_free(q);
    ag_tensor_free(kv);
    ag_params_free(ps);
}

// The module's attention paths: fused (no weights asked for) and composed (weights asked
// for) give the same output and the same gradient for every input and parameter. With
// `self_attention` query, key and value are one tensor (S = T), which the fused path
// projects once with the packed weight. Returns the largest normwise difference.
static double fused_vs_composed(ag_dtype dt, const ag_mha_config *cfg, ag_mha_opts opts, int B,
                                int T, int S, bool self_attention, uint64_t seed) {
    ag_params *ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    ag_mha m;
    CHECK(ag_mha_init(&m, ps, "", cfg, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.7, 0.7);
    ag_tensor *in[3] = {ag_tensor_uniform(dt, 3, (int[]){B, T, cfg->embed_dim}, &rng, -1, 1),
                        ag_tensor_uniform(dt, 3, (int[]){B, S, m.cfg.kdim}, &rng, -1, 1),
                        ag_tensor_uniform(dt, 3, (int[]){B, S, m.cfg.vdim}, &rng, -1, 1)};
    ag_tensor *dy = ag_tensor_uniform(dt, 3, (int[]){B, T, cfg->embed_dim}, &rng, -1, 1);
    for (int i = 0; i < 3; i++) ag_tensor_set_requires_grad(in[i], true);
    ag_tensor *x[3] = {in[0], self_attention ? in[0] : in[1], self_attention ? in[0] : in[2]};
    size_t np = ag_params_numel(ps), ni = 0;
    for (int i = 0; i < 3; i++) ni += in[i]->numel;
    double *out[2], *grad[2];
    for (int path = 0; path < 2; path++) {
        ag_tape *tp = ag_tape_new();
        ag_params_zero_grad(ps);
        for (int i = 0; i < 3; i++) ag_tensor_zero_grad(in[i]);
        ag_tensor *w = NULL;
        ag_tensor *y = ag_mha_forward(tp, &m, x[0], x[1], x[2], &opts, path ? &w : NULL);
        CHECK(y && (path == 0 || w));
        ag_backward_with(tp, y, dy);
        out[path] = malloc(y->numel * sizeof(double));
        grad[path] = malloc((np + ni) * sizeof(double));
        for (size_t e = 0; e < y->numel; e++) out[path][e] = ag_tensor_item(y, e);
        size_t k = 0;
        for (int i = 0; i < ag_params_count(ps); i++)
            for (size_t e = 0; e < ag_params_at(ps, i)->numel; e++)
                grad[path][k++] = ag_tensor_grad_item(ag_params_at(ps, i), e);
        for (int i = 0; i < 3; i++)
            for (size_t e = 0; e < in[i]->numel; e++)
                grad[path][k++] = ag_tensor_grad_item(in[i], e);
        ag_tape_free(tp);
    }
    // Normwise, as tests/op_checks.h measures: max |a - b| / max |b|.
    double worst = 0;
    size_t ny = (size_t)B * T * cfg->embed_dim, lens[2] = {ny, np + ni};
    double *a[2] = {out[0], grad[0]}, *b[2] = {out[1], grad[1]};
    for (int part = 0; part < 2; part++) {
        double diff = 0, scale = 0;
        for (size_t e = 0; e < lens[part]; e++) {
            diff = fmax(diff, fabs(a[part][e] - b[part][e]));
            scale = fmax(scale, fabs(b[part][e]));
        }
        worst = fmax(worst, scale > 0 ? diff / scale : diff);
    }
    for (int path = 0; path < 2; path++) {
        free(out[path]);
        free(grad[path]);
    }
    for (int i = 0; i < 3; i++) ag_tensor_free(in[i]);
    ag_tensor_free(dy);
    ag_params_free(ps);
    return worst;
}

static void test_with_and_without_weights_give_the_same_output_and_gradients(void) {
    ag_tensor *kpm = ag_tensor_from(AG_BOOL, 2, (int[]){2, 5},
                                    (uint8_t[]){0, 0, 1, 0, 0, 1, 1, 1, 1, 1});  // batch 1: all
    ag_tensor *bool_mask = ag_tensor_zeros(AG_BOOL, 2, (int[]){3, 5});
    ((uint8_t *)bool_mask->data)[1] = ((uint8_t *)bool_mask->data)[7] = 1;
    ag_tensor *self_mask = ag_tensor_zeros(AG_BOOL, 2, (int[]){5, 5});  // [T, T]
    ((uint8_t *)self_mask->data)[3] = ((uint8_t *)self_mask->data)[12] = 1;
    ag_mha_config packed = {.embed_dim = 8, .num_heads = 2};
    ag_mha_config packed_nb = {.embed_dim = 8, .num_heads = 4, .no_bias = true};
    ag_mha_config cross = {.embed_dim = 6, .num_heads = 3, .kdim = 4, .vdim = 7};
    ag_mha_config drop = {.embed_dim = 8, .num_heads = 4, .dropout = 0.25};
    for (int dt = 0; dt < 2; dt++) {
        ag_dtype type = dt ? AG_F64 : AG_F32;
        double tol = dt ? 1e-12 : 1e-5;
        ag_pcg32 g = ag_pcg32_make(3, 3);
        ag_tensor *add = ag_tensor_uniform(type, 3, (int[]){6, 3, 5}, &g, -1, 1);  // [B*h,T,S]
        ag_tensor *self_add = ag_tensor_uniform(type, 3, (int[]){4, 5, 5}, &g, -1, 1);
        // Self-attention: one packed projection, then the packed attention.
        CHECK(fused_vs_composed(type, &packed, (ag_mha_opts){0}, 2, 4, 4, true, 40) < tol);
        CHECK(fused_vs_composed(type, &packed, (ag_mha_opts){.causal = true}, 2, 5, 5, true,
                                41) < tol);
        CHECK(fused_vs_composed(type, &packed_nb, (ag_mha_opts){.causal = true}, 2, 5, 5, true,
                                42) < tol);
        CHECK(fused_vs_composed(type, &packed,
                                (ag_mha_opts){.attn_mask = self_mask, .key_padding_mask = kpm},
                                2, 5, 5, true, 43) < tol);
        CHECK(fused_vs_composed(type, &packed, (ag_mha_opts){.attn_mask = self_add}, 2, 5, 5,
                                true, 44) < tol);
        CHECK(fused_vs_composed(type, &drop, (ag_mha_opts){.training = true, .dropout_seed = 5},
                                2, 6, 6, true, 45) < tol);
        // Query, key and value apart: three projections (rows of the packed weight, or
        // separate weights with kdim, vdim), heads read in place.
        CHECK(fused_vs_composed(type, &packed, (ag_mha_opts){0}, 2, 4, 4, false, 30) < tol);
        CHECK(fused_vs_composed(type, &packed, (ag_mha_opts){.causal = true}, 2, 5, 3, false,
                                31) < tol);
        CHECK(fused_vs_composed(type, &packed_nb, (ag_mha_opts){.key_padding_mask = kpm}, 2, 3,
                                5, false, 37) < tol);
        CHECK(fused_vs_composed(type, &cross, (ag_mha_opts){.key_padding_mask = kpm}, 2, 3, 5,
                                false, 32) < tol);
        CHECK(fused_vs_composed(type, &cross,
                                (ag_mha_opts){.attn_mask = bool_mask, .key_padding_mask = kpm,
                                              .causal = true},
                                2, 3, 5, false, 33) < tol);
        CHECK(fused_vs_composed(type, &cross, (ag_mha_opts){.attn_mask = add}, 2, 3, 5, false,
                                34) < tol);
        CHECK(fused_vs_composed(type, &drop, (ag_mha_opts){.training = true, .dropout_seed = 5},
                                2, 6, 6, false, 35) < tol);
        CHECK(fused_vs_composed(type, &drop, (ag_mha_opts){.dropout_seed = 5}, 2, 6, 6, false,
                                36) < tol);
        ag_tensor_free(add);
        ag_tensor_free(self_add);
    }
    ag_tensor_free(kpm);
    ag_tensor_free(bool_mask);
    ag_tensor_free(self_mask);
}

// The op names a forward records, joined by spaces ("linear attention_packed linear").
static void recorded_ops(const ag_tape *tp, char *out, size_t size) {
    out[0] = 0;
    for (int i = 0; i < ag_tape_num_nodes(tp); i++) {
        size_t n = strlen(out);
        snprintf(out + n, size - n, "%s%s", i ? " " : "", ag_tape_node(tp, i)->op->name);
    }
}

// Without weights, the heads are read in place: no split_heads or merge_heads copies;
// self-attention projects once, with the whole in_proj_weight. With weights, the
// composed path splits and merges.
static void test_fused_path_projects_self_attention_once_and_copies_no_heads(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(8, 8);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2};
    CHECK(ag_mha_init(&m, ps, "", &cfg, &rng));
    ag_tensor *x = rand_input(2, 3, 8, 50), *kv = rand_input(2, 4, 8, 51);
    ag_tape *tp = ag_tape_new();
    char ops[256];
    CHECK(ag_mha_forward(tp, &m, x, x, x, NULL, NULL) != NULL);
    recorded_ops(tp, ops, sizeof ops);
    CHECK(strcmp(ops, "linear attention_packed linear") == 0);
    ag_tape_reset(tp);
    CHECK(ag_mha_forward(tp, &m, x, kv, kv, NULL, NULL) != NULL);
    recorded_ops(tp, ops, sizeof ops);
    CHECK(strcmp(ops, "linear linear linear attention linear") == 0);
    ag_tape_reset(tp);
    ag_tensor *w = NULL;
    CHECK(ag_mha_forward(tp, &m, x, x, x, NULL, &w) != NULL && w);
    recorded_ops(tp, ops, sizeof ops);
    CHECK(strstr(ops, "split_heads") && strstr(ops, "merge_heads"));
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(kv);
    ag_params_free(ps);
}

// A training step through the fused paths (self-attention packed, and query apart from
// key and value; masks, dropout, on one thread and two) allocates nothing once the first
// step has sized the tape.
static void test_repeated_training_step_allocates_no_heap_memory(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(7, 7);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 32, .num_heads = 4, .dropout = 0.1};
    CHECK(ag_mha_init(&m, ps, "attn", &cfg, &rng));
    ag_tensor *x = ag_tensor_uniform(AG_F32, 3, (int[]){4, 300, 32}, &rng, -1, 1);
    ag_tensor *kv = ag_tensor_uniform(AG_F32, 3, (int[]){4, 300, 32}, &rng, -1, 1);
    ag_tensor *dy = ag_tensor_uniform(AG_F32, 3, (int[]){4, 300, 32}, &rng, -1, 1);
    ag_tensor *kpm = ag_tensor_zeros(AG_BOOL, 2, (int[]){4, 300});
    ((uint8_t *)kpm->data)[5] = 1;
    ag_tensor *head_mask = ag_tensor_from(AG_F32, 1, (int[]){4}, (float[]){1, 0, 1, 0.5f});
    ag_tensor_set_requires_grad(head_mask, true);
    ag_tape *tp = ag_tape_new();
    for (int self = 0; self < 2; self++)
        for (int threads = 1; threads <= 2; threads++) {
            ag_threads_set(threads);
            ag_tensor *key = self ? x : kv;
            ag_memory_stats before = ag_memory_usage();
            for (int step = 0; step < 3; step++) {
                if (step == 1) before = ag_memory_usage();
                ag_tape_reset(tp);
                ag_params_zero_grad(ps);
                ag_mha_opts o = {.key_padding_mask = kpm, .causal = true, .training = true,
                                 .dropout_seed = (uint64_t)step, .head_mask = head_mask};
                ag_backward_with(tp, ag_mha_forward(tp, &m, x, key, key, &o, NULL), dy);
            }
            CHECK(ag_memory_usage().allocations == before.allocations);
        }
    ag_threads_set(1);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(kv);
    ag_tensor_free(dy);
    ag_tensor_free(kpm);
    ag_tensor_free(head_mask);
    ag_params_free(ps);
}

// head_mask scales each head's context: its gradient (to the mask too) in float64, in
// the packed, the three-projection and the composed (weights) paths.
static void test_gradcheck_with_a_head_mask_that_requires_grad(void) {
    ag_tensor *mask = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){0.5, -1.25, 0.0});
    ag_tensor_set_requires_grad(mask, true);
    ag_mha_config cfg = {.embed_dim = 6, .num_heads = 3};
    ag_mha_config nb = {.embed_dim = 6, .num_heads = 3, .no_bias = true, .kdim = 4};
    CHECK(gradcheck_mha(&cfg, (ag_mha_opts){.head_mask = mask, .causal = true}, 2, 4, 4, true,
                        50));
    CHECK(gradcheck_mha(&cfg, (ag_mha_opts){.head_mask = mask}, 2, 3, 5, false, 51));
    CHECK(gradcheck_mha(&nb, (ag_mha_opts){.head_mask = mask}, 1, 1, 2, false, 52));
    ag_tensor *one = ag_tensor_from(AG_F64, 1, (int[]){1}, (double[]){0.75});
    ag_tensor_set_requires_grad(one, true);
    ag_mha_config h1 = {.embed_dim = 4, .num_heads = 1};
    CHECK(gradcheck_mha(&h1, (ag_mha_opts){.head_mask = one}, 2, 1, 1, true, 53));
    ag_tensor_free(mask);
    ag_tensor_free(one);
}

static void test_head_mask_gives_the_same_result_with_and_without_weights(void) {
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4};
    for (int dt = 0; dt < 2; dt++) {
        ag_dtype type = dt ? AG_F64 : AG_F32;
        double tol = dt ? 1e-12 : 1e-5;
        ag_tensor *mask = ag_tensor_from(AG_F64, 1, (int[]){4}, (double[]){1, 0, 0.5, 2});
        ag_tensor *m = ag_tensor_convert(mask, type);
        CHECK(fused_vs_composed(type, &cfg, (ag_mha_opts){.head_mask = m, .causal = true}, 2, 5,
                                5, true, 54) < tol);
        CHECK(fused_vs_composed(type, &cfg, (ag_mha_opts){.head_mask = m}, 2, 3, 5, false, 55) <
              tol);
        ag_tensor_free(mask);
        ag_tensor_free(m);
    }
}

// A head whose mask entry is 0 contributes nothing: the output equals out_proj's bias
// plus the other heads' part, i.e. the output computed with that head's columns of
// out_proj.weight zeroed.
static void test_a_zero_head_mask_entry_removes_that_head(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(9, 9);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4};
    CHECK(ag_mha_init(&m, ps, "", &cfg, &rng));
    ag_tensor_init_uniform(m.out_proj.bias, &rng, -1, 1);
    ag_tensor *x = rand_input(2, 5, 8, 56);
    ag_tensor *mask = ag_tensor_from(AG_F64, 1, (int[]){4}, (double[]){1, 0, 1, 1});
    ag_tape *tp = ag_tape_new();
    ag_tensor *masked = ag_mha_forward(tp, &m, x, x, x, &(ag_mha_opts){.head_mask = mask}, NULL);
    for (int r = 0; r < 8; r++)
        for (int c = 2; c < 4; c++) ag_tensor_set_item(m.out_proj.weight, (size_t)r * 8 + c, 0.0);
    ag_tensor *zeroed = ag_mha_forward(tp, &m, x, x, x, NULL, NULL);
    CHECK(normwise_error(masked, zeroed, false) < 1e-15);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(mask);
    ag_params_free(ps);
}

static void test_a_head_mask_of_the_wrong_length_is_an_error_naming_it(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(2, 2);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 4};
    CHECK(ag_mha_init(&m, ps, "", &cfg, &rng));
    ag_tensor *x = rand_input(2, 3, 8, 57);
    ag_tensor *mask = ag_tensor_ones(AG_F64, 1, (int[]){3});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(ag_mha_forward(tp, &m, x, x, x, &(ag_mha_opts){.head_mask = mask}, NULL) == NULL);
    CHECK(strcmp(testing_last_error, "mha: head_mask [3] must be [4], one entry per head") == 0);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(mask);
    ag_params_free(ps);
}

// add_bias_kv and add_zero_attn, as PyTorch: names and order, the gradient of the whole
// module (bias_k and bias_v included) with masks and causal, and both paths equal.
static void test_bias_kv_parameters_have_pytorch_names_order_and_shape(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_mha m;
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2, .add_bias_kv = true};
    CHECK(ag_mha_init(&m, ps, "a", &cfg, &rng));
    const char *names[] = {"a.in_proj_weight", "a.in_proj_bias", "a.bias_k", "a.bias_v",
                           "a.out_proj.weight", "a.out_proj.bias"};
    CHECK(ag_params_count(ps) == 6);
    for (int i = 0; i < 6 && i < ag_params_count(ps); i++)
        CHECK(strcmp(ag_params_at(ps, i)->name, names[i]) == 0);
    CHECK(m.bias_k->ndim == 3 && m.bias_k->shape[0] == 1 && m.bias_k->shape[2] == 8);
    double ss = 0;
    for (size_t i = 0; i < 8; i++) ss += ag_tensor_item(m.bias_k, i) * ag_tensor_item(m.bias_k, i);
    CHECK(ss > 0);
    ag_params_free(ps);
}

static void test_gradcheck_with_bias_kv_and_zero_attn(void) {
    ag_tensor *kpm = ag_tensor_from(AG_BOOL, 2, (int[]){2, 4}, (uint8_t[]){0, 0, 1, 0, 1, 1, 1, 1});
    ag_tensor *bm = ag_tensor_from(AG_BOOL, 2, (int[]){3, 4},
                                   (uint8_t[]){0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0});
    ag_pcg32 rng = ag_pcg32_make(4, 4);
    ag_tensor *add = ag_tensor_uniform(AG_F64, 3, (int[]){4, 3, 4}, &rng, -1, 1);
    for (int variant = 1; variant <= 3; variant++) {
        ag_mha_config cfg = {.embed_dim = 6, .num_heads = 2, .add_bias_kv = variant & 1,
                             .add_zero_attn = variant & 2};
        ag_mha_config sep = cfg;
        sep.kdim = 4, sep.no_bias = true;
        CHECK(gradcheck_mha(&cfg, (ag_mha_opts){0}, 2, 3, 3, true, 60));
        CHECK(gradcheck_mha(&cfg, (ag_mha_opts){.causal = true}, 2, 3, 3, true, 61));
        CHECK(gradcheck_mha(&cfg, (ag_mha_opts){.key_padding_mask = kpm, .attn_mask = bm}, 2, 3,
                            4, false, 62));  // batch 1 sees only the extra keys
        CHECK(gradcheck_mha(&sep, (ag_mha_opts){.attn_mask = add, .causal = true}, 2, 3, 4,
                            false, 63));
    }
    ag_tensor_free(kpm);
    ag_tensor_free(bm);
    ag_tensor_free(add);
}

static void test_bias_kv_and_zero_attn_give_the_same_result_in_both_paths(void) {
    ag_tensor *kpm = ag_tensor_from(AG_BOOL, 2, (int[]){2, 5},
                                    (uint8_t[]){0, 0, 1, 0, 0, 1, 1, 1, 1, 1});
    for (int dt = 0; dt < 2; dt++) {
        ag_dtype type = dt ? AG_F64 : AG_F32;
        double tol = dt ? 1e-12 : 1e-5;
        ag_mha_config both = {.embed_dim = 8, .num_heads = 2, .add_bias_kv = true,
                              .add_zero_attn = true};
        ag_mha_config zero = {.embed_dim = 8, .num_heads = 4, .add_zero_attn = true,
                              .dropout = 0.2};
        CHECK(fused_vs_composed(type, &both, (ag_mha_opts){.causal = true}, 2, 5, 5, true, 64) <
              tol);
        CHECK(fused_vs_composed(type, &both, (ag_mha_opts){.key_padding_mask = kpm}, 2, 3, 5,
                                false, 65) < tol);
        CHECK(fused_vs_composed(type, &zero, (ag_mha_opts){.training = true, .dropout_seed = 3},
                                2, 4, 4, true, 66) < tol);
    }
    ag_tensor_free(kpm);
}

static void test_bad_inputs_name_the_shapes(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(2, 2);
    ag_mha m;
    testing_catch_errors();
    ag_mha_config bad = {.embed_dim = 10, .num_heads = 4};
    CHECK(!ag_mha_init(&m, ps, "", &bad, &rng));
    CHECK(strcmp(testing_last_error, "mha: embed_dim 10 must be a positive multiple of num_heads 4") == 0);
    ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2};
    ag_mha_init(&m, ps, "", &cfg, &rng);
    ag_tensor *q = rand_input(2, 3, 8, 1), *k = rand_input(3, 4, 8, 2), *e = rand_input(2, 3, 6, 3);
    ag_tape *tp = ag_tape_new();
    CHECK(ag_mha_forward(tp, &m, q, k, k, NULL, NULL) == NULL);
    CHECK(strcmp(testing_last_error,
                 "mha: batch or key length differ: query [2,3,8], key [3,4,8], value [3,4,8]") == 0);
    CHECK(ag_mha_forward(tp, &m, e, e, e, NULL, NULL) == NULL);
    CHECK(strstr(testing_last_error, "do not match embed_dim 8") != NULL);
    // float32 inputs to a float64 module: one line (the projection's, then the attention's
    // "NULL" on the packed path before).
    ag_tensor *q32 = ag_tensor_convert(q, AG_F32);
    testing_error_count = 0;
    CHECK(ag_mha_forward(tp, &m, q32, q32, q32, NULL, NULL) == NULL);
    CHECK(testing_error_was("mha: query f32, key f32 and value f32 must be f64, as the "
                            "module's parameters"));
    ag_tensor_free(q32);
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(q);
    ag_tensor_free(k);
    ag_tensor_free(e);
    ag_params_free(ps);
}


// Sizes are computed in 64 bits and refused above INT_MAX with one line naming mha and the
// sizes (3 * embed_dim was an int: E = 715827883 aborted with "extent -2147483647"), and
// every refusal comes before the first parameter is added (rope's odd head_dim came after).
static void test_configs_beyond_int_or_invalid_are_refused_before_any_parameter(void) {
    ag_params *ps = ag_params_new(AG_F32);
    ag_pcg32 rng = ag_pcg32_make(2, 2);
    ag_mha m;
    testing_catch_errors();
    ag_mha_config big = {.embed_dim = 715827883, .num_heads = 1};
    CHECK(!ag_mha_init(&m, ps, "", &big, &rng));
    CHECK(strcmp(testing_last_error,
                 "mha: embed_dim 715827883, num_heads 1, head_dim 715827883: in_proj_weight "
                 "would have 3 * 715827883 rows, more than INT_MAX (2147483647)") == 0);
    ag_mha_config bigger = {.embed_dim = 1000000000, .num_heads = 4};
    CHECK(!ag_mha_init(&m, ps, "", &bigger, &rng));
    CHECK(strstr(testing_last_error, "mha: embed_dim 1000000000, num_heads 4, head_dim "
                                     "250000000: in_proj_weight would have 3 * 1000000000 "
                                     "rows") == testing_last_error);
    ag_mha_config wide = {.embed_dim = 8, .num_heads = 65536, .head_dim = 65536};
    CHECK(!ag_mha_init(&m, ps, "", &wide, &rng));
    CHECK(strstr(testing_last_error, "3 * 4294967296 rows, more than INT_MAX") != NULL);
    ag_mha_config rope = {.embed_dim = 6, .num_heads = 2, .pos = AG_POS_ROPE};
    CHECK(!ag_mha_init(&m, ps, "", &rope, &rng));
    CHECK(strcmp(testing_last_error, "mha: rotary positions need an even head_dim, got 3") == 0);
    ag_mha_config table = {.embed_dim = 8, .num_heads = 2, .pos = AG_POS_RELATIVE,
                           .max_distance = -3};
    CHECK(!ag_mha_init(&m, ps, "", &table, &rng));
    CHECK(strstr(testing_last_error, "mha: max_distance -3 and num_buckets 32 must be >= 1") ==
          testing_last_error);
    table.max_distance = INT_MAX;
    CHECK(!ag_mha_init(&m, ps, "", &table, &rng));
    ag_mha_config kdim = {.embed_dim = 8, .num_heads = 2, .kdim = -1};
    CHECK(!ag_mha_init(&m, ps, "", &kdim, &rng));
    CHECK(strcmp(testing_last_error,
                 "mha: kdim -1 and vdim 0 must be >= 0 (0 means embed_dim 8)") == 0);
    testing_release_errors();
    CHECK(ag_params_count(ps) == 0 && ag_params_numel(ps) == 0);
    ag_params_free(ps);
}

int main(void) {
    RUN(test_parameters_have_pytorch_names_shapes_and_init);
    RUN(test_configs_beyond_int_or_invalid_are_refused_before_any_parameter);
    RUN(test_separate_projections_when_kdim_or_vdim_differ);
    RUN(test_gradcheck_self_attention_with_and_without_bias);
    RUN(test_gradcheck_cross_attention_t_not_s_with_and_without_bias);
    RUN(test_gradcheck_kdim_vdim_no_bias_one_head);
    RUN(test_gradcheck_with_masks_including_a_fully_masked_query);
    RUN(test_gradcheck_with_dropout_on_the_weights);
    RUN(test_returned_weights_are_averaged_or_per_head_and_rows_sum_to_one);
    RUN(test_with_and_without_weights_give_the_same_output_and_gradients);
    RUN(test_fused_path_projects_self_attention_once_and_copies_no_heads);
    RUN(test_repeated_training_step_allocates_no_heap_memory);
    RUN(test_bad_inputs_name_the_shapes);
    RUN(test_gradcheck_with_a_head_mask_that_requires_grad);
    RUN(test_bias_kv_parameters_have_pytorch_names_order_and_shape);
    RUN(test_gradcheck_with_bias_kv_and_zero_attn);
    RUN(test_bias_kv_and_zero_attn_give_the_same_result_in_both_paths);
    RUN(test_head_mask_gives_the_same_result_with_and_without_weights);
    RUN(test_a_zero_head_mask_entry_removes_that_head);
    RUN(test_a_head_mask_of_the_wrong_length_is_an_error_naming_it);
    return testing_summary();
}
