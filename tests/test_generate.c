// Generation: the KV-cache path of MultiheadAttention and the transformer block
// against full recomputation, and the sampler (greedy, temperature, top-k, top-p).
#include <math.h>
#include <stdlib.h>

#include "op_checks.h"

enum { V = 11, E = 16, H = 4, FF = 24, LAYERS = 2, PROMPT = 3, NEW = 50 };

// A tiny GPT: embedding (tied head), learned positions, blocks, final LayerNorm.
typedef struct {
    ag_params *ps;
    ag_embedding_layer wte, wpe;
    ag_block blocks[LAYERS];
    ag_layernorm_layer ln_f;
} gpt;

static void gpt_init(gpt *g, ag_dtype dt, bool norm_first, ag_activation act) {
    g->ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(5, 6);
    ag_embedding_layer_init(&g->wte, g->ps, "wte.", V, E, &rng);
    ag_embedding_layer_init(&g->wpe, g->ps, "wpe.", PROMPT + NEW, E, &rng);
    ag_block_config bc = {.d_model = E, .num_heads = H, .dim_feedforward = FF, .dropout = 0.1,
                          .activation = act, .norm_first = norm_first, .layer_norm_eps = 1e-5};
    for (int l = 0; l < LAYERS; l++) {
        char name[16];
        snprintf(name, sizeof name, "b%d.", l);
        ag_block_init(&g->blocks[l], g->ps, name, &bc, &rng);
    }
    ag_layernorm_layer_init(&g->ln_f, g->ps, "ln_f.", E);
    // LayerNorm weights and biases away from 1 and 0, so a wrong one shows.
    ag_tensor_set(g->ln_f.weight, 3, 1.7), ag_tensor_set(g->ln_f.bias, 5, -0.3);
}

// The last position's logits [1, V] from the whole sequence ids[0..T).
static ag_tensor *full_logits(ag_tape *tp, const gpt *g, const int32_t *ids, int T) {
    int32_t pos[PROMPT + NEW];
    for (int t = 0; t < T; t++) pos[t] = t;
    ag_tensor *x = ag_add(tp, ag_embedding_layer_forward(tp, &g->wte, ids, 2, (int[]){1, T}),
                          ag_embedding_layer_forward(tp, &g->wpe, pos, 1, (int[]){T}));
    ag_block_opts o = {.causal = true};
    for (int l = 0; l < LAYERS; l++) x = ag_block_forward(tp, &g->blocks[l], x, &o);
    x = ag_layernorm_layer_forward(tp, &g->ln_f, x);
    ag_tensor *logits = ag_linear(tp, x, g->wte.weight, NULL);  // [1, T, V]
    ag_tensor *last = ag_tape_tensor(tp, logits->dtype, 2, (int[]){1, V});
    for (int c = 0; c < V; c++)
        ag_tensor_set(last, (size_t)c, ag_tensor_get(logits, (size_t)(T - 1) * V + (size_t)c));
    return last;
}

// Greedy decoding of NEW tokens after a prompt, cached and recomputed, side by
// side; returns the largest logit difference and whether the tokens agreed.
static double cached_vs_full(ag_dtype dt, bool norm_first, ag_activation act, bool *same,
                             uint64_t *allocs_after_first) {
    gpt g;
    gpt_init(&g, dt, norm_first, act);
    ag_kv_cache *cache[LAYERS];
    for (int l = 0; l < LAYERS; l++) cache[l] = ag_kv_cache_new_block(&g.blocks[l], 1, PROMPT + NEW);
    ag_tensor *x = ag_tensor_zeros(dt, 2, (int[]){1, E});
    ag_tape *tp = ag_tape_new(), *head = ag_tape_new();
    ag_tape_set_grad_enabled(tp, false), ag_tape_set_grad_enabled(head, false);
    ag_sample_config greedy = {0, 0, 1};
    ag_sampler *s = ag_sampler_new(V, &greedy, 1, 1);
    int32_t ids[PROMPT + NEW] = {4, 9, 2};
    double worst = 0;
    *same = true;
    uint64_t allocs = 0;
    for (int t = 0; t < PROMPT + NEW - 1; t++) {
        // Counted from the second position through the cached path and its head.
        uint64_t before = ag_memory_stats_get().allocations;
        for (int e = 0; e < E; e++)
            ag_tensor_set(x, (size_t)e, ag_tensor_get(g.wte.weight, (size_t)ids[t] * E + e) +
                                            ag_tensor_get(g.wpe.weight, (size_t)t * E + e));
        for (int l = 0; l < LAYERS; l++) CHECK(ag_block_forward_cached(&g.blocks[l], cache[l], x));
        if (t + 1 < PROMPT) continue;
        ag_tape_reset(head);
        ag_tensor *cached = ag_linear(head, ag_layernorm_layer_forward(head, &g.ln_f, x),
                                      g.wte.weight, NULL);
        if (t >= PROMPT) allocs += ag_memory_stats_get().allocations - before;
        ag_tape_reset(tp);
        ag_tensor *full = full_logits(tp, &g, ids, t + 1);
        for (int c = 0; c < V; c++)
            worst = fmax(worst, fabs(ag_tensor_get(cached, (size_t)c) - ag_tensor_get(full, (size_t)c)));
        int a = ag_sampler_next(s, cached, 0), b = ag_sampler_next(s, full, 0);
        *same = *same && a == b;
        ids[t + 1] = a;
    }
    *allocs_after_first = allocs;
    CHECK(ag_kv_cache_len(cache[0]) == PROMPT + NEW - 1);
    for (int l = 0; l < LAYERS; l++) ag_kv_cache_free(cache[l]);
    ag_sampler_free(s);
    ag_tape_free(tp), ag_tape_free(head), ag_tensor_free(x), ag_params_free(g.ps);
    return worst;
}

static void test_cached_generation_equals_full_recomputation_for_50_tokens_f64(void) {
    const struct {
        bool norm_first;
        ag_activation act;
    } cases[] = {{true, AG_ACT_GELU}, {false, AG_ACT_RELU}};
    for (int i = 0; i < 2; i++) {
        bool same;
        uint64_t allocs;
        double err = cached_vs_full(AG_F64, cases[i].norm_first, cases[i].act, &same, &allocs);
        CHECK(err <= 1e-12);
        CHECK(same);
    }
}

static void test_cached_generation_in_f32_stays_close_to_full(void) {
    bool same;
    uint64_t allocs;
    CHECK(cached_vs_full(AG_F32, true, AG_ACT_GELU, &same, &allocs) <= 1e-4);
}

static void test_a_cached_step_allocates_nothing(void) {
    // The cached blocks hold every buffer; the head's tape keeps its memory
    // across resets.
    bool same;
    uint64_t allocs;
    cached_vs_full(AG_F64, true, AG_ACT_GELU, &same, &allocs);
    CHECK(allocs == 0);
}

static void test_mha_cached_rows_equal_causal_forward_for_a_batch(void) {
    enum { B = 2, T = 7 };
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    ag_mha m;
    ag_mha_init(&m, ps, "attn.", &(ag_mha_config){.embed_dim = E, .num_heads = H}, &rng);
    ag_tensor_fill(m.in_proj_bias, 0.05), ag_tensor_fill(m.out_proj.bias, -0.02);
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 8, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *full = ag_mha_forward(tp, &m, x, x, x, &(ag_mha_opts){.causal = true}, NULL);
    ag_kv_cache *c = ag_kv_cache_new(&m, B, T);
    ag_tensor *xt = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    ag_tensor *out = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    double worst = 0;
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++)
            for (int e = 0; e < E; e++)
                ag_tensor_set(xt, (size_t)(b * E + e), ag_tensor_get(x, ((size_t)b * T + t) * E + e));
        CHECK(ag_mha_forward_cached(&m, c, xt, out));
        for (int b = 0; b < B; b++)
            for (int e = 0; e < E; e++)
                worst = fmax(worst, fabs(ag_tensor_get(out, (size_t)(b * E + e)) -
                                         ag_tensor_get(full, ((size_t)b * T + t) * E + e)));
    }
    CHECK(worst <= 1e-13);
    ag_kv_cache_free(c);
    ag_tensor_free(xt), ag_tensor_free(out), ag_tensor_free(x);
    ag_tape_free(tp), ag_params_free(ps);
}

static void test_cache_misuse_is_reported(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    ag_mha m, other, cross;
    ag_mha_init(&m, ps, "a.", &(ag_mha_config){.embed_dim = E, .num_heads = H}, &rng);
    ag_mha_init(&other, ps, "o.", &(ag_mha_config){.embed_dim = E, .num_heads = H}, &rng);
    ag_mha_init(&cross, ps, "c.", &(ag_mha_config){.embed_dim = E, .num_heads = H, .kdim = 5}, &rng);
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){1, E});
    ag_tensor *out = ag_tensor_zeros(AG_F64, 2, (int[]){1, E});
    ag_tensor *wrong = ag_tensor_zeros(AG_F32, 2, (int[]){1, E});
    testing_catch_errors();
    CHECK(ag_kv_cache_new(&cross, 1, 4) == NULL);
    CHECK(strstr(testing_last_error, "separate projections") != NULL);
    ag_kv_cache *c = ag_kv_cache_new(&m, 1, 2);
    CHECK(!ag_mha_forward_cached(&other, c, x, out));
    CHECK(strcmp(testing_last_error, "mha_forward_cached: the cache was not made for this module") == 0);
    CHECK(!ag_mha_forward_cached(&m, c, wrong, out));
    CHECK(strcmp(testing_last_error, "mha_forward_cached: x [1,16] must be f64 [1,16]") == 0);
    CHECK(ag_mha_forward_cached(&m, c, x, out) && ag_mha_forward_cached(&m, c, x, out));
    CHECK(!ag_mha_forward_cached(&m, c, x, out));
    CHECK(strcmp(testing_last_error, "mha_forward_cached: the cache is full (2 positions)") == 0);
    ag_kv_cache_reset(c);
    CHECK(ag_kv_cache_len(c) == 0 && ag_mha_forward_cached(&m, c, x, out));
    CHECK(testing_error_count == 4);
    testing_release_errors();
    ag_kv_cache_free(c);
    ag_tensor_free(x), ag_tensor_free(out), ag_tensor_free(wrong), ag_params_free(ps);
}

// ---- The sampler ----------------------------------------------------------------------

static ag_tensor *logits_of(const double *z, int n) {
    return ag_tensor_from(AG_F64, 2, (int[]){1, n}, z);
}

static void test_greedy_top_1_and_tiny_top_p_all_take_the_argmax(void) {
    const double z[6] = {0.1, 2.0, -1.0, 2.0, 1.9, 0.0};  // a tie: the lower index wins
    ag_tensor *l = logits_of(z, 6);
    const ag_sample_config cfgs[3] = {{0, 0, 1}, {5.0, 1, 1}, {5.0, 0, 1e-9}};
    for (int i = 0; i < 3; i++) {
        ag_sampler *s = ag_sampler_new(6, &cfgs[i], 9, 1);
        for (int k = 0; k < 20; k++) CHECK(ag_sampler_next(s, l, 0) == 1);
        ag_sampler_free(s);
    }
    ag_tensor_free(l);
}

static void test_draws_follow_softmax_over_temperature(void) {
    const double z[4] = {1.0, 0.0, -1.0, 0.5};
    const double T = 1.5;
    ag_tensor *l = logits_of(z, 4);
    ag_sampler *s = ag_sampler_new(4, &(ag_sample_config){T, 0, 1}, 4, 2);
    enum { N = 40000 };
    int count[4] = {0};
    for (int k = 0; k < N; k++) count[ag_sampler_next(s, l, 0)]++;
    double Z = 0;
    for (int c = 0; c < 4; c++) Z += exp(z[c] / T);
    for (int c = 0; c < 4; c++) {
        double p = exp(z[c] / T) / Z, sd = sqrt(p * (1 - p) / N);
        CHECK(fabs((double)count[c] / N - p) < 5 * sd);
    }
    ag_sampler_free(s);
    ag_tensor_free(l);
}

static void test_top_k_and_top_p_keep_only_the_likeliest(void) {
    // Probabilities about 0.53, 0.20, 0.17, 0.07, 0.03.
    const double z[5] = {2.0, 1.0, 0.8, -0.1, -1.0};
    ag_tensor *l = logits_of(z, 5);
    ag_sampler *k2 = ag_sampler_new(5, &(ag_sample_config){1, 2, 1}, 1, 1);
    ag_sampler *p80 = ag_sampler_new(5, &(ag_sample_config){1, 0, 0.8}, 1, 1);
    int seen_k[5] = {0}, seen_p[5] = {0};
    for (int k = 0; k < 5000; k++) seen_k[ag_sampler_next(k2, l, 0)]++, seen_p[ag_sampler_next(p80, l, 0)]++;
    CHECK(seen_k[0] > 0 && seen_k[1] > 0 && seen_k[2] + seen_k[3] + seen_k[4] == 0);
    // 0.53 + 0.20 < 0.8 <= 0.53 + 0.20 + 0.17: the three likeliest.
    CHECK(seen_p[0] > 0 && seen_p[1] > 0 && seen_p[2] > 0 && seen_p[3] + seen_p[4] == 0);
    ag_sampler_free(k2), ag_sampler_free(p80);
    ag_tensor_free(l);
}

static void test_same_seed_same_draws_other_seed_other_draws(void) {
    const double z[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    ag_tensor *l = logits_of(z, 8);
    ag_sample_config c = {1, 0, 1};
    ag_sampler *a = ag_sampler_new(8, &c, 5, 1), *b = ag_sampler_new(8, &c, 5, 1);
    ag_sampler *d = ag_sampler_new(8, &c, 6, 1);
    int same = 0, differ = 0;
    for (int k = 0; k < 100; k++) {
        int x = ag_sampler_next(a, l, 0);
        same += x == ag_sampler_next(b, l, 0);
        differ += x != ag_sampler_next(d, l, 0);
    }
    CHECK(same == 100 && differ > 50);
    ag_sampler_free(a), ag_sampler_free(b), ag_sampler_free(d);
    ag_tensor_free(l);
}

static void test_a_nan_row_is_an_error_not_a_token(void) {
    const double z[6] = {0, 1, 2, 3, 4, 5};
    ag_tensor *l = ag_tensor_from(AG_F64, 2, (int[]){2, 3}, z);
    ag_tensor_set(l, 4, NAN);
    ag_sampler *s = ag_sampler_new(3, &(ag_sample_config){0, 0, 1}, 1, 1);
    testing_catch_errors();
    CHECK(ag_sampler_next(s, l, 0) == 2);
    CHECK(ag_sampler_next(s, l, 1) == -1);
    CHECK(strcmp(testing_last_error, "sampler: row 1 of logits [2,3] holds a NaN") == 0);
    CHECK(ag_sampler_next(s, l, 2) == -1);
    CHECK(ag_sampler_new(3, &(ag_sample_config){-1, 0, 1}, 1, 1) == NULL);
    CHECK(ag_sampler_new(3, &(ag_sample_config){1, 0, 0}, 1, 1) == NULL);
    CHECK(testing_error_count == 4);
    testing_release_errors();
    ag_sampler_free(s);
    ag_tensor_free(l);
}

int main(void) {
    RUN(test_cached_generation_equals_full_recomputation_for_50_tokens_f64);
    RUN(test_cached_generation_in_f32_stays_close_to_full);
    RUN(test_a_cached_step_allocates_nothing);
    RUN(test_mha_cached_rows_equal_causal_forward_for_a_batch);
    RUN(test_cache_misuse_is_reported);
    RUN(test_greedy_top_1_and_tiny_top_p_all_take_the_argmax);
    RUN(test_draws_follow_softmax_over_temperature);
    RUN(test_top_k_and_top_p_keep_only_the_likeliest);
    RUN(test_same_seed_same_draws_other_seed_other_draws);
    RUN(test_a_nan_row_is_an_error_not_a_token);
    return testing_summary();
}
