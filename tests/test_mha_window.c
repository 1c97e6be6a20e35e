// Sliding-window attention in the modules (ag_mha_config.window = W): the KV cache keeps a
// ring of the last W positions, so its memory is O(W) whatever max_len and generation runs
// past any length, one position or a prompt longer than W at a time, beams reordering the
// rings -- each step equal to the rows of the full causal forward over every position,
// RoPE (keys rotated at their absolute positions when stored) and grouped-query attention
// included. The paths against each other are in test_mha_paths.c, against PyTorch in
// test_mha_pytorch.c, the op against its definition in test_attention_gqa_window.c.
#include <stdlib.h>

#include "op_checks.h"

enum { B = 2, E = 8 };

static void make(ag_mha *m, ag_params *ps, int window) {
    const ag_mha_config cfg = {.embed_dim = E, .num_heads = 4, .num_kv_heads = 2,
                               .pos = AG_POS_ROPE, .window = window};
    CHECK(mha_random(m, ps, &cfg, 3));
}

// Positions [t0, t0 + n) of x [B, T, E] through the cache, against the same rows of
// `full`; sequence b of the cache is sequence from[b] of x. The normwise error.
static double steps(const ag_mha *m, ag_kv_cache *c, const ag_tensor *x, const ag_tensor *full,
                    int t0, int n, const int from[B]) {
    const int T = x->shape[1];
    ag_tensor *xs = ag_tensor_zeros(AG_F64, 3, (int[]){B, n, E});
    ag_tensor *out = ag_tensor_zeros(AG_F64, 3, (int[]){B, n, E});
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            for (int i = 0; i < E; i++)
                ag_tensor_set_item(xs, ((size_t)b * n + t) * E + i,
                              ag_tensor_item(x, ((size_t)from[b] * T + t0 + t) * E + i));
    normwise e = {0, 0};
    const bool ok = ag_mha_forward_cached(m, c, xs, out);
    CHECK(ok);
    for (int b = 0; ok && b < B; b++)
        for (int t = 0; t < n; t++)
            for (int i = 0; i < E; i++)
                normwise_add(&e, ag_tensor_item(out, ((size_t)b * n + t) * E + i),
                             ag_tensor_item(full, ((size_t)from[b] * T + t0 + t) * E + i));
    ag_tensor_free(xs), ag_tensor_free(out);
    return ok ? normwise_result(e) : INFINITY;
}

static ag_tensor *causal_forward(ag_tape *tp, const ag_mha *m, ag_tensor *x) {
    return ag_mha_forward(tp, m, x, x, x, &(ag_mha_opts){.causal = true}, NULL);
}

static void test_a_window_cache_runs_far_past_max_len_in_memory_of_w(void) {
    enum { W = 3, T = 40 };
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    make(&m, ps, W);
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 4, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *full = causal_forward(tp, &m, x);
    ag_kv_cache *c = ag_kv_cache_new(&m, B, 2);  // max_len 2: the ring holds W anyway
    CHECK(ag_kv_cache_capacity(c) == W);
    // k and v, [B, W, h_kv * d] each
    CHECK(ag_kv_cache_bytes(c) == 2 * (size_t)B * W * 2 * (E / 4) * sizeof(double));
    double worst = 0;
    for (int t = 0; t < T; t++) worst = fmax(worst, steps(&m, c, x, full, t, 1, (int[]){0, 1}));
    CHECK(ag_kv_cache_len(c) == T);
    CHECK(worst <= 1e-12);
    ag_kv_cache *big = ag_kv_cache_new(&m, B, 1 << 20);  // memory O(W), not O(max_len)
    CHECK(ag_kv_cache_bytes(big) == ag_kv_cache_bytes(c));
    ag_kv_cache_free(big);
    ag_kv_cache_free(c);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(ps);
}

static void test_prompts_longer_than_the_window_run_as_one_step(void) {
    enum { W = 4, T = 23 };
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    make(&m, ps, W);
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 5, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *full = causal_forward(tp, &m, x);
    ag_kv_cache *c = ag_kv_cache_new(&m, B, T);
    const int sizes[] = {9, 1, 2, 6, 5};  // 9 and 6 > W, 5 = W + 1
    double worst = 0;
    for (int k = 0, t = 0; k < 5; t += sizes[k++])
        worst = fmax(worst, steps(&m, c, x, full, t, sizes[k], (int[]){0, 1}));
    CHECK(worst <= 1e-12);
    ag_kv_cache_free(c);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(ps);
}

static void test_beams_reorder_the_rings(void) {
    enum { W = 3, T = 10 };
    ag_params *ps = ag_params_new(AG_F64);
    ag_mha m;
    make(&m, ps, W);
    ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 6, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *full = causal_forward(tp, &m, x);
    ag_kv_cache *c = ag_kv_cache_new(&m, B, T);
    double worst = 0;
    for (int t = 0; t < 5; t++) worst = fmax(worst, steps(&m, c, x, full, t, 1, (int[]){0, 1}));
    CHECK(ag_kv_cache_reorder(c, (int[]){1, 0}, B));  // the sequences change places
    for (int t = 5; t < T; t++) worst = fmax(worst, steps(&m, c, x, full, t, 1, (int[]){1, 0}));
    CHECK(worst <= 1e-12);
    ag_kv_cache_free(c);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_params_free(ps);
}

// A float64 gradcheck of modules with a sliding window, fused and composed: causal,
// bidirectional with key padding and grouped-query T5 positions, causal with ALiBi.
static void test_gradcheck_of_windowed_modules(void) {
    ag_tensor *kpm = bool_mask(2, (int[]){2, 4}, 0.3, 3);
    for (int w = 0; w < 2; w++) {
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 2, .window = 2},
                            (ag_mha_opts){.causal = true}, true, w, NULL, 0, 10));
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 2, .window = 2,
                                             .num_kv_heads = 1, .pos = AG_POS_T5},
                            (ag_mha_opts){.key_padding_mask = kpm}, true, w, NULL, 0, 20));
        CHECK(mha_gradcheck(&(ag_mha_config){.embed_dim = 8, .num_heads = 2, .window = 3,
                                             .pos = AG_POS_ALIBI},
                            (ag_mha_opts){.causal = true}, true, w, NULL, 0, 30));
    }
    ag_tensor_free(kpm);
}

int main(void) {
    RUN(test_a_window_cache_runs_far_past_max_len_in_memory_of_w);
    RUN(test_prompts_longer_than_the_window_run_as_one_step);
    RUN(test_beams_reorder_the_rings);
    RUN(test_gradcheck_of_windowed_modules);
    return testing_summary();
}
