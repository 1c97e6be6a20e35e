// The sinusoidal position bias (AG_POS_SINUSOIDAL, src/ops/pos_sinusoidal.c), the scheme
// added as one file and one table entry: its term is the formula (against the formula
// written out here as an additive mask), gradchecked fused and composed in float64, float32
// against float64; in MultiheadAttention the fused, composed and cached paths agree to
// 1e-12 in float64, the module gradchecks, and what cannot run is refused with the
// constraint.
#include <stdlib.h>

#include "op_checks.h"

// b(head, r) as the scheme's comment defines it.
static double term(int h, int head, int D, double base, int r) {
    double sum = 0;
    for (int c = 1; c <= D / 2; c++) sum += cos(r * pow(base, -2.0 * c / D)) - 1;
    return h / (8.0 * (head + 1)) * sum;
}

static ag_pos_bias sinusoidal(int h, int dims, double base) {
    ag_pos_bias p = {.kind = AG_POS_SINUSOIDAL, .heads = h, .dims = dims, .base = base};
    return p;
}

// softmax with the scheme against softmax with the formula as an additive mask [h, T, S].
static void test_the_term_is_the_formula(void) {
    const int B = 2, h = 3, T = 5, S = 7;
    const struct {
        int dims, q_offset;
        double base;
    } cases[] = {{6, 0, 0}, {7, 3, 100}, {2, 9, 10000}};
    for (int i = 0; i < 3; i++) {
        const double base = cases[i].base == 0 ? 10000 : cases[i].base;
        ag_tensor *x = uniform_tensor(AG_F64, 4, (int[]){B, h, T, S}, 1 + (uint64_t)i, -1, 1);
        ag_tensor *add = ag_tensor_zeros(AG_F64, 4, (int[]){1, h, T, S});
        for (int hd = 0; hd < h; hd++)
            for (int t = 0; t < T; t++)
                for (int s = 0; s < S; s++)
                    ag_tensor_set_item(add, ((size_t)hd * T + t) * S + s,
                                  term(h, hd, cases[i].dims, base, s - t - cases[i].q_offset));
        ag_tape *tp = ag_tape_new();
        ag_softmax_opts with = {.scale = 0.7, .q_offset = cases[i].q_offset,
                                .pos = sinusoidal(h, cases[i].dims, cases[i].base)};
        ag_softmax_opts formula = {.scale = 0.7, .additive_mask = add};
        ag_tensor *a = ag_softmax(tp, x, &with), *b = ag_softmax(tp, x, &formula);
        CHECK(a && b && normwise_error(a, b, false) < 1e-15);
        ag_tape_free(tp);
        ag_tensor_free(x), ag_tensor_free(add);
    }
}

typedef struct {
    int h;
    bool causal, composed;
} op_case;

static ag_tensor *attend(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const op_case *c = user;
    ag_attention_opts o = {.softmax = {.scale = 0.5, .causal = c->causal,
                                       .pos = sinusoidal(c->h, 4, 0)}};
    if (!c->composed) return ag_attention(tp, in[0], in[1], in[2], &o);
    ag_tensor *w = ag_softmax(tp, ag_matmul(tp, in[0], in[1], false, true), &o.softmax);
    return ag_matmul(tp, w, in[2], false, false);
}

static void test_gradcheck_fused_and_composed_and_float32(void) {
    for (int causal = 0; causal < 2; causal++)
        for (int composed = 0; composed < 2; composed++) {
            op_case c = {3, causal, composed};
            ag_tensor *in[3] = {random_leaf(AG_F64, 4, (int[]){2, 3, 4, 3}, 10),
                                random_leaf(AG_F64, 4, (int[]){2, 3, 6, 3}, 11),
                                random_leaf(AG_F64, 4, (int[]){2, 3, 6, 2}, 12)};
            CHECK(ag_gradcheck(attend, in, 3, &c, NULL, NULL));
            CHECK(f32_vs_f64_error(attend, in, 3, &c) < 1e-5);
            for (int i = 0; i < 3; i++) ag_tensor_free(in[i]);
        }
}

// MultiheadAttention with the scheme: output and every gradient of the fused path (no
// weights) against the composed one (weights), self and cross, causal and not; the
// cached rows against the causal forward.
static void test_module_paths_agree(void) {
    enum { B = 2, T = 7, S = 5, E = 12, H = 3 };
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(20, 1);
    ag_mha m;
    CHECK(ag_mha_init(&m, ps, "", &(ag_mha_config){.embed_dim = E, .num_heads = H,
                                                     .pos = AG_POS_SINUSOIDAL}, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.6, 0.6);
    ag_tensor *x = random_leaf(AG_F64, 3, (int[]){B, T, E}, 21);
    ag_tensor *kv = random_leaf(AG_F64, 3, (int[]){B, S, E}, 22);
    ag_tensor *dy = uniform_tensor(AG_F64, 3, (int[]){B, T, E}, 23, -1, 1);
    const size_t np = ag_params_numel(ps);
    for (int cross = 0; cross < 2; cross++)
        for (int causal = 0; causal < 2; causal++) {
            double *g[2];
            ag_tensor *y[2];
            ag_tape *tp[2] = {ag_tape_new(), ag_tape_new()};
            ag_tensor *k = cross ? kv : x;
            for (int path = 0; path < 2; path++) {
                ag_params_zero_grad(ps);
                ag_tensor_zero_grad(x), ag_tensor_zero_grad(kv);
                ag_tensor *w = NULL;
                y[path] = ag_mha_forward(tp[path], &m, x, k, k,
                                         &(ag_mha_opts){.causal = causal}, path ? &w : NULL);
                ag_backward_with(tp[path], y[path], dy);
                g[path] = malloc((np + x->numel + kv->numel) * sizeof(double));
                size_t n = 0;
                for (int i = 0; i < ag_params_count(ps); i++)
                    for (size_t e = 0; e < ag_params_at(ps, i)->numel; e++)
                        g[path][n++] = ag_tensor_grad_item(ag_params_at(ps, i), e);
                for (size_t e = 0; e < x->numel; e++) g[path][n++] = ag_tensor_grad_item(x, e);
                for (size_t e = 0; e < kv->numel; e++) g[path][n++] = ag_tensor_grad_item(kv, e);
            }
            normwise e = {0, 0};
            for (size_t i = 0; i < np + x->numel + kv->numel; i++) normwise_add(&e, g[0][i], g[1][i]);
            CHECK(normwise_error(y[0], y[1], false) < 1e-12 && normwise_result(e) < 1e-12);
            for (int path = 0; path < 2; path++) free(g[path]), ag_tape_free(tp[path]);
        }
    // Cached, position by position.
    ag_tape *tp = ag_tape_new();
    ag_tensor *full = ag_mha_forward(tp, &m, x, x, x, &(ag_mha_opts){.causal = true}, NULL);
    ag_kv_cache *c = ag_kv_cache_new(&m, B, T);
    ag_tensor *xt = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    ag_tensor *out = ag_tensor_zeros(AG_F64, 2, (int[]){B, E});
    normwise e = {0, 0};
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++)
            for (int i = 0; i < E; i++)
                ag_tensor_set_item(xt, (size_t)b * E + i, ag_tensor_item(x, ((size_t)b * T + t) * E + i));
        CHECK(ag_mha_forward_cached(&m, c, xt, out));
        for (int b = 0; b < B; b++)
            for (int i = 0; i < E; i++)
                normwise_add(&e, ag_tensor_item(out, (size_t)b * E + i),
                             ag_tensor_item(full, ((size_t)b * T + t) * E + i));
    }
    CHECK(normwise_result(e) < 1e-12);
    ag_kv_cache_free(c);
    ag_tape_free(tp);
    ag_tensor_free(xt), ag_tensor_free(out), ag_tensor_free(x), ag_tensor_free(kv);
    ag_tensor_free(dy), ag_params_free(ps);
}

typedef struct {
    ag_mha m;
    bool causal, weights;
} module_case;

static ag_tensor *module_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    module_case *c = user;
    ag_tensor *w = NULL;
    return ag_mha_forward(tp, &c->m, in[0], in[0], in[0], &(ag_mha_opts){.causal = c->causal},
                          c->weights ? &w : NULL);
}

static void test_module_gradcheck(void) {
    for (int causal = 0; causal < 2; causal++)
        for (int weights = 0; weights < 2; weights++) {
            ag_params *ps = ag_params_new(AG_F64);
            ag_pcg32 rng = ag_pcg32_make(30, 1);
            module_case c = {.causal = causal, .weights = weights};
            CHECK(ag_mha_init(&c.m, ps, "", &(ag_mha_config){.embed_dim = 8, .num_heads = 2,
                                                              .pos = AG_POS_SINUSOIDAL}, &rng));
            for (int i = 0; i < ag_params_count(ps); i++)
                ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.7, 0.7);
            ag_tensor *in[8] = {random_leaf(AG_F64, 3, (int[]){2, 5, 8}, 31)};
            int n = 1;
            for (int i = 0; i < ag_params_count(ps); i++) in[n++] = ag_params_at(ps, i);
            CHECK(ag_gradcheck(module_fn, in, n, &c, NULL, NULL));
            ag_tensor_free(in[0]), ag_params_free(ps);
        }
}

static void test_what_cannot_run_is_refused_with_its_constraint(void) {
    ag_tensor *x = uniform_tensor(AG_F64, 4, (int[]){1, 2, 3, 4}, 40, -1, 1);
    ag_tape *tp = ag_tape_new();
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(41, 1);
    ag_mha m;
    testing_catch_errors();
    CHECK(!ag_softmax(tp, x, &(ag_softmax_opts){.pos = sinusoidal(2, 1, 0)}));
    CHECK(strcmp(testing_last_error, "softmax: sinusoidal positions need dims >= 2 (a module's "
                                     "head_dim) and a finite base > 0, got dims 1 and base 0; "
                                     "scores [1,2,3,4]") == 0);
    CHECK(!ag_softmax(tp, x, &(ag_softmax_opts){.pos = sinusoidal(0, 4, 0)}));
    CHECK(strcmp(testing_last_error, "softmax: sinusoidal takes no table and pos heads = h >= "
                                     "1, got heads 0; scores [1,2,3,4]") == 0);
    CHECK(!ag_mha_init(&m, ps, "", &(ag_mha_config){.embed_dim = 4, .num_heads = 4,
                                                     .pos = AG_POS_SINUSOIDAL}, &rng));
    CHECK(strcmp(testing_last_error, "mha: sinusoidal positions need dims >= 2 (a module's "
                                     "head_dim) and a finite base > 0, got dims 1 and base "
                                     "10000") == 0);
    CHECK(ag_mha_init(&m, ps, "", &(ag_mha_config){.embed_dim = 8, .num_heads = 2,
                                                    .pos = AG_POS_SINUSOIDAL}, &rng));
    CHECK(!ag_mha_prune_heads(&m, ps, (int[]){0}, 1));
    CHECK(strcmp(testing_last_error, "mha_prune_heads: the sinusoidal bias's scales depend on "
                                     "the head count; cannot prune") == 0);
    testing_release_errors();
    ag_params_free(ps);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

int main(void) {
    RUN(test_the_term_is_the_formula);
    RUN(test_gradcheck_fused_and_composed_and_float32);
    RUN(test_module_paths_agree);
    RUN(test_module_gradcheck);
    RUN(test_what_cannot_run_is_refused_with_its_constraint);
    return testing_summary();
}
