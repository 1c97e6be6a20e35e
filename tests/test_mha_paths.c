// One attention, three paths: what ag_mha_init accepts runs in the fused path (packed
// self-attention and cross-attention), the composed path (weights asked for) and the
// KV-cache path, with the same results in float64; what any of them would refuse,
// ag_mha_init refuses, naming the real constraint (issue 22: it used to accept rope_base
// -5 or NaN and T5 with one bucket, which the forward then refused with a misleading
// message and the cache ran into NaN).
#include <stdlib.h>

#include "op_checks.h"

enum { B = 2, T = 6, S = 5 };


// The output of one forward and the gradients of x and of every parameter, as one array.
static double *run(const ag_mha *m, ag_params *ps, ag_tensor *x, ag_tensor *kv, bool causal,
                   bool weights, size_t *n) {
    ag_params_zero_grad(ps);
    ag_tensor_zero_grad(x);
    if (kv) ag_tensor_zero_grad(kv);
    ag_tape *tp = ag_tape_new();
    ag_tensor *w = NULL;
    ag_tensor *y = ag_mha_forward(tp, m, x, kv ? kv : x, kv ? kv : x,
                                  &(ag_mha_opts){.causal = causal}, weights ? &w : NULL);
    CHECK(y && (!weights || w));
    *n = 0;
    if (!y) {
        ag_tape_free(tp);
        return NULL;
    }
    ag_pcg32 rng = ag_pcg32_make(77, 1);
    ag_tensor *dy = ag_tensor_uniform(AG_F64, 3, y->shape, &rng, -1, 1);
    ag_backward_with(tp, y, dy);
    size_t total = y->numel + x->numel + (kv ? kv->numel : 0) + ag_params_numel(ps);
    double *v = malloc(total * sizeof *v);
    size_t k = 0;
    for (size_t e = 0; e < y->numel; e++) v[k++] = ag_tensor_item(y, e);
    for (size_t e = 0; e < x->numel; e++) v[k++] = ag_tensor_grad_item(x, e);
    for (size_t e = 0; kv && e < kv->numel; e++) v[k++] = ag_tensor_grad_item(kv, e);
    for (int i = 0; i < ag_params_count(ps); i++)
        for (size_t e = 0; e < ag_params_at(ps, i)->numel; e++)
            v[k++] = ag_tensor_grad_item(ag_params_at(ps, i), e);
    ag_tensor_free(dy);
    ag_tape_free(tp);
    *n = total;
    return v;
}

// Fused against composed, output and every gradient.
static double fused_vs_composed(const ag_mha *m, ag_params *ps, ag_tensor *x, ag_tensor *kv,
                                bool causal) {
    size_t n0, n1;
    double *a = run(m, ps, x, kv, causal, false, &n0), *b = run(m, ps, x, kv, causal, true, &n1);
    normwise e = {0, 0};
    for (size_t i = 0; a && b && i < n0 && n0 == n1; i++) normwise_add(&e, a[i], b[i]);
    const double err = a && b && n0 == n1 ? normwise_result(e) : INFINITY;
    free(a), free(b);
    return err;
}

// Rows of the causal forward against the cache, position by position.
static double cached_vs_fused(const ag_mha *m, ag_tensor *x) {
    const int E = m->cfg.embed_dim;
    ag_tape *tp = ag_tape_new();
    ag_tensor *full = ag_mha_forward(tp, m, x, x, x, &(ag_mha_opts){.causal = true}, NULL);
    ag_kv_cache *c = ag_kv_cache_new(m, B, T);
    ag_tensor *xt = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    ag_tensor *out = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    normwise e = {0, 0};
    bool ok = full && c;
    for (int t = 0; ok && t < T; t++) {
        for (int b = 0; b < B; b++)
            for (int i = 0; i < E; i++)
                ag_tensor_set_item(xt, (size_t)b * E + i, ag_tensor_item(x, ((size_t)b * T + t) * E + i));
        ok = ag_mha_forward_cached(m, c, xt, out);
        for (int b = 0; ok && b < B; b++)
            for (int i = 0; i < E; i++)
                normwise_add(&e, ag_tensor_item(out, (size_t)b * E + i),
                             ag_tensor_item(full, ((size_t)b * T + t) * E + i));
    }
    ag_kv_cache_free(c);
    ag_tensor_free(xt), ag_tensor_free(out);
    ag_tape_free(tp);
    return ok ? normwise_result(e) : INFINITY;
}

// Configs at the edges of what init accepts, every scheme and option.
static const ag_mha_config accepted[] = {
    {.embed_dim = 8, .num_heads = 2},
    {.embed_dim = 8, .num_heads = 2, .head_dim = 3},  // h*d = 6 != E, odd d
    {.embed_dim = 8, .num_heads = 1},
    {.embed_dim = 8, .num_heads = 2, .pos = AG_POS_RELATIVE, .max_distance = 1},
    {.embed_dim = 8, .num_heads = 2, .pos = AG_POS_T5, .num_buckets = 4, .max_distance = 3},
    {.embed_dim = 8, .num_heads = 2, .pos = AG_POS_T5},
    {.embed_dim = 12, .num_heads = 3, .pos = AG_POS_ALIBI},
    {.embed_dim = 8, .num_heads = 2, .pos = AG_POS_ROPE, .rope_base = 1e-3},
    {.embed_dim = 8, .num_heads = 2, .pos = AG_POS_ROPE, .head_dim = 2},
    {.embed_dim = 8, .num_heads = 2, .add_bias_kv = true},
    {.embed_dim = 8, .num_heads = 2, .add_zero_attn = true},
    {.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .add_zero_attn = true, .no_bias = true},
    {.embed_dim = 8, .num_heads = 2, .dropout = 1},
    // Grouped-query and multi-query attention, with every kind of option.
    {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2},
    {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 1, .head_dim = 3},
    {.embed_dim = 12, .num_heads = 6, .num_kv_heads = 3, .pos = AG_POS_ROPE},
    {.embed_dim = 12, .num_heads = 4, .num_kv_heads = 2, .pos = AG_POS_ALIBI},
    {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .pos = AG_POS_T5},
    {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .pos = AG_POS_RELATIVE},
    {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .pos = AG_POS_SINUSOIDAL},
    {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .add_bias_kv = true,
     .add_zero_attn = true},
    // Sliding windows (the cache's ring wraps: T = 6 positions), with every scheme.
    {.embed_dim = 8, .num_heads = 2, .window = 1},
    {.embed_dim = 8, .num_heads = 2, .window = 2, .head_dim = 3},
    {.embed_dim = 12, .num_heads = 6, .num_kv_heads = 3, .window = 3, .pos = AG_POS_ROPE},
    {.embed_dim = 12, .num_heads = 3, .window = 4, .pos = AG_POS_ALIBI},
    {.embed_dim = 8, .num_heads = 4, .num_kv_heads = 1, .window = 2, .pos = AG_POS_T5},
    {.embed_dim = 8, .num_heads = 2, .window = 3, .pos = AG_POS_RELATIVE, .max_distance = 2},
    {.embed_dim = 8, .num_heads = 2, .window = 5, .pos = AG_POS_SINUSOIDAL},
    {.embed_dim = 8, .num_heads = 2, .window = 100, .dropout = 1},
};
#define N_ACCEPTED (int)(sizeof accepted / sizeof accepted[0])

static void test_every_config_init_accepts_runs_in_every_path(void) {
    for (int i = 0; i < N_ACCEPTED; i++)
        for (int prune = 0; prune < 2; prune++) {
            const ag_mha_config *cfg = &accepted[i];
            ag_params *ps = ag_params_new(AG_F64);
            ag_mha m;
            CHECK(mha_random(&m, ps, cfg, 10 + (uint64_t)i));
            // The first head, or with grouped-query attention its whole group.
            const int group = m.cfg.num_heads / m.cfg.num_kv_heads;
            if (prune && cfg->num_heads > group && cfg->pos != AG_POS_ALIBI &&
                cfg->pos != AG_POS_SINUSOIDAL)  // their terms follow from h
                CHECK(ag_mha_prune_heads(&m, ps, (int[]){0, 1, 2, 3}, group));
            const int E = cfg->embed_dim;
            ag_tensor *x = random_leaf(AG_F64, 3, (int[]){B, T, E}, 20 + (uint64_t)i);
            ag_tensor *kv = random_leaf(AG_F64, 3, (int[]){B, S, E}, 30 + (uint64_t)i);
            double worst = 0;
            for (int causal = 0; causal < 2; causal++) {
                worst = fmax(worst, fused_vs_composed(&m, ps, x, NULL, causal));
                worst = fmax(worst, fused_vs_composed(&m, ps, x, kv, causal));
            }
            worst = fmax(worst, cached_vs_fused(&m, x));
            if (!(worst <= 1e-12)) fprintf(stderr, "  config %d prune %d: %.3g\n", i, prune, worst);
            CHECK(worst <= 1e-12);
            ag_tensor_free(x), ag_tensor_free(kv);
            ag_params_free(ps);
        }
}

// What a path would refuse is refused at init, with the constraint it breaks.
static void test_init_refuses_what_a_path_would_refuse(void) {
    const struct {
        ag_mha_config cfg;
        const char *error;
    } refused[] = {
        {{.embed_dim = 8, .num_heads = 2, .pos = AG_POS_ROPE, .rope_base = -5},
         "mha: rotary positions need a finite rope_base > 0, got -5"},
        {{.embed_dim = 8, .num_heads = 2, .pos = AG_POS_ROPE, .rope_base = NAN},
         "mha: rotary positions need a finite rope_base > 0, got nan"},
        {{.embed_dim = 8, .num_heads = 2, .pos = AG_POS_ROPE, .rope_base = INFINITY},
         "mha: rotary positions need a finite rope_base > 0, got inf"},
        {{.embed_dim = 8, .num_heads = 2, .pos = AG_POS_T5, .max_distance = 1, .num_buckets = 1},
         "mha: T5 positions need num_buckets >= 4 and max_distance > num_buckets / 2 (the "
         "exact buckets of the causal variant), got num_buckets 1 and max_distance 1"},
        // Bidirectional would run (3 > 8 / 4), a causal forward would not (3 > 8 / 2).
        {{.embed_dim = 8, .num_heads = 2, .pos = AG_POS_T5, .max_distance = 3, .num_buckets = 8},
         "mha: T5 positions need num_buckets >= 4 and max_distance > num_buckets / 2 (the "
         "exact buckets of the causal variant), got num_buckets 8 and max_distance 3"},
        {{.embed_dim = 8, .num_heads = 2, .pos = (ag_pos_kind)99},
         "mha: unknown position scheme 99"},
        {{.embed_dim = 8, .num_heads = 2, .window = -1},
         "mha: window -1 must be >= 0 (0: no sliding window)"},
        {{.embed_dim = 8, .num_heads = 2, .window = 3, .add_zero_attn = true},
         "mha: window 3 does not combine with add_bias_kv or add_zero_attn (their keys have "
         "no position in a window)"},
    };
    testing_catch_errors();
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ag_params *ps = ag_params_new(AG_F64);
        ag_mha m;
        CHECK(!mha_random(&m, ps, &refused[i].cfg, 1));
        CHECK(strcmp(testing_last_error, refused[i].error) == 0);
        CHECK(ag_params_count(ps) == 0);
        ag_params_free(ps);
    }
    testing_release_errors();
}

int main(void) {
    RUN(test_every_config_init_accepts_runs_in_every_path);
    RUN(test_init_refuses_what_a_path_would_refuse);
    return testing_summary();
}
