// Positions inside MultiheadAttention (ag_mha_config.pos): for each scheme the float64
// gradient of the whole module (the position table included), the fused path equal to
// the composed one, the table's name and shape, pruning a RELATIVE or T5 module equal
// to a zero head mask, no heap allocation in a repeated step, and the errors.
#include <stdlib.h>

#include "op_checks.h"

static const ag_pos_kind kinds[] = {AG_POS_RELATIVE, AG_POS_T5, AG_POS_ALIBI, AG_POS_ROPE};
static const char *const kind_names[] = {"relative", "t5", "alibi", "rope"};
#define N_KINDS 4

typedef struct {
    ag_mha m;
    ag_mha_opts opts;
    bool weights;
} pos_case;

// inputs: query, key, value, then every parameter.
static ag_tensor *pos_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    pos_case *c = user;
    ag_tensor *w = NULL;
    return ag_mha_forward(tp, &c->m, in[0], in[1], in[2], &c->opts, c->weights ? &w : NULL);
}

static ag_mha_config config(ag_pos_kind k, int E, int h) {
    // small tables so the clipping and the far buckets are reached at T = 5
    return (ag_mha_config){.embed_dim = E,
                           .num_heads = h,
                           .pos = k,
                           .max_distance = k == AG_POS_T5 ? 6 : 2,
                           .num_buckets = 4};
}

static bool gradcheck_pos(ag_pos_kind k, bool self, bool causal, bool weights, uint64_t seed) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    pos_case c = {.opts = {.causal = causal}, .weights = weights};
    ag_mha_config cfg = config(k, 8, 2);
    CHECK(ag_mha_init(&c.m, ps, "", &cfg, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.7, 0.7);
    ag_tensor *q = random_leaf(AG_F64, 3, (int[]){2, 5, 8}, seed + 1);
    ag_tensor *kv = self ? q : random_leaf(AG_F64, 3, (int[]){2, 6, 8}, seed + 2);
    ag_tensor *in[3 + 8] = {q, kv, kv};
    int n = 3;
    for (int i = 0; i < ag_params_count(ps); i++) in[n++] = ag_params_at(ps, i);
    bool ok = ag_gradcheck(pos_fn, in, n, &c, NULL, NULL);
    if (!ok)
        fprintf(stderr, "  %s self %d causal %d weights %d\n", kind_names[k - 1], self, causal,
                weights);
    if (!self) ag_tensor_free(kv);
    ag_tensor_free(q);
    ag_params_free(ps);
    return ok;
}

static void test_gradcheck_every_scheme_in_both_paths_table_included(void) {
    for (int i = 0; i < N_KINDS; i++)
        for (int w = 0; w < 2; w++) {
            CHECK(gradcheck_pos(kinds[i], true, true, w, 10 + (uint64_t)i));
            CHECK(gradcheck_pos(kinds[i], true, false, w, 20 + (uint64_t)i));
            CHECK(gradcheck_pos(kinds[i], false, false, w, 30 + (uint64_t)i));
        }
}

// Output and every gradient, fused (no weights) against composed (weights).
static double fused_vs_composed(ag_dtype dt, ag_pos_kind k, bool causal, int T, uint64_t seed) {
    ag_params *ps = ag_params_new(dt);
    ag_pcg32 rng = ag_pcg32_make(seed, 1);
    ag_mha m;
    ag_mha_config cfg = config(k, 16, 4);
    CHECK(ag_mha_init(&m, ps, "", &cfg, &rng));
    for (int i = 0; i < ag_params_count(ps); i++)
        ag_tensor_init_uniform(ag_params_at(ps, i), &rng, -0.5, 0.5);
    ag_tensor *x = random_leaf(dt, 3, (int[]){2, T, 16}, seed + 1);
    ag_tensor *dy = uniform_tensor(dt, 3, (int[]){2, T, 16}, seed + 2, -1, 1);
    size_t np = ag_params_numel(ps);
    double *g[2], worst = 0;
    ag_tensor *y[2];
    ag_tape *tp[2] = {ag_tape_new(), ag_tape_new()};
    for (int path = 0; path < 2; path++) {
        ag_params_zero_grad(ps);
        ag_tensor_zero_grad(x);
        ag_tensor *w = NULL;
        y[path] = ag_mha_forward(tp[path], &m, x, x, x, &(ag_mha_opts){.causal = causal},
                                 path ? &w : NULL);
        ag_backward_with(tp[path], y[path], dy);
        g[path] = malloc((np + x->numel) * sizeof(double));
        size_t n = 0;
        for (int i = 0; i < ag_params_count(ps); i++)
            for (size_t e = 0; e < ag_params_at(ps, i)->numel; e++)
                g[path][n++] = ag_tensor_grad_item(ag_params_at(ps, i), e);
        for (size_t e = 0; e < x->numel; e++) g[path][n++] = ag_tensor_grad_item(x, e);
    }
    worst = normwise_error(y[0], y[1], false);
    normwise e = {0, 0};
    for (size_t i = 0; i < np + x->numel; i++) normwise_add(&e, g[0][i], g[1][i]);
    worst = fmax(worst, normwise_result(e));
    for (int path = 0; path < 2; path++) {
        free(g[path]);
        ag_tape_free(tp[path]);
    }
    ag_tensor_free(x);
    ag_tensor_free(dy);
    ag_params_free(ps);
    return worst;
}

static void test_fused_equals_composed_for_every_scheme(void) {
    for (int i = 0; i < N_KINDS; i++)
        for (int causal = 0; causal < 2; causal++) {
            CHECK(fused_vs_composed(AG_F64, kinds[i], causal, 7, 40 + (uint64_t)i) < 1e-12);
            CHECK(fused_vs_composed(AG_F32, kinds[i], causal, 70, 50 + (uint64_t)i) < 1e-5);
        }
}

static void test_the_table_has_its_name_and_shape(void) {
    for (int i = 0; i < N_KINDS; i++) {
        ag_params *ps = ag_params_new(AG_F32);
        ag_pcg32 rng = ag_pcg32_make(1, 1);
        ag_mha m;
        ag_mha_config cfg = {.embed_dim = 8, .num_heads = 2, .pos = kinds[i]};
        CHECK(ag_mha_init(&m, ps, "attn", &cfg, &rng));
        ag_tensor *t = ag_params_find(ps, "attn.relative_attention_bias.weight");
        CHECK(t == m.pos_table);
        if (kinds[i] == AG_POS_RELATIVE) CHECK(t && t->shape[0] == 2 && t->shape[1] == 33);
        if (kinds[i] == AG_POS_T5) CHECK(t && t->shape[0] == 2 && t->shape[1] == 32);
        if (kinds[i] == AG_POS_ALIBI || kinds[i] == AG_POS_ROPE) CHECK(!t);
        ag_params_free(ps);
    }
}

// Pruning a module with a table drops the pruned heads' rows: output equal to the
// unpruned module with a zero head mask.
static void test_pruning_a_table_module_equals_a_zero_head_mask(void) {
    for (int i = 0; i < 2; i++) {
        ag_params *pa = ag_params_new(AG_F64), *pb = ag_params_new(AG_F64);
        ag_pcg32 ra = ag_pcg32_make(60, 1), rb = ag_pcg32_make(60, 1);
        ag_mha a, b;
        ag_mha_config cfg = config(kinds[i], 12, 3);
        CHECK(ag_mha_init(&a, pa, "", &cfg, &ra) && ag_mha_init(&b, pb, "", &cfg, &rb));
        for (int p = 0; p < ag_params_count(pa); p++) {
            ag_tensor_init_uniform(ag_params_at(pa, p), &ra, -0.7, 0.7);
            ag_tensor_init_uniform(ag_params_at(pb, p), &rb, -0.7, 0.7);
        }
        ag_tensor *x = uniform_tensor(AG_F64, 3, (int[]){2, 6, 12}, 61, -1, 1);
        ag_tensor *mask = ag_tensor_from(AG_F64, 1, (int[]){3}, (double[]){1, 0, 1});
        ag_tape *tp = ag_tape_new();
        ag_tensor *ya = ag_mha_forward(tp, &a, x, x, x,
                                       &(ag_mha_opts){.causal = true, .head_mask = mask}, NULL);
        CHECK(ag_mha_prune_heads(&b, pb, (int[]){1}, 1));
        CHECK(b.pos_table->shape[0] == 2);
        ag_tensor *yb = ag_mha_forward(tp, &b, x, x, x, &(ag_mha_opts){.causal = true}, NULL);
        CHECK(normwise_error(yb, ya, false) < 1e-14);
        ag_tape_free(tp);
        ag_tensor_free(x);
        ag_tensor_free(mask);
        ag_params_free(pa);
        ag_params_free(pb);
    }
}

typedef struct {
    ag_mha *m;
    ag_tensor *x, *dy;
} step_data;

static void pos_step(ag_tape *tp, int step, void *user) {
    step_data *d = user;
    for (int w = 0; w < 2; w++) {
        ag_tensor *weights = NULL;
        ag_mha_opts o = {.causal = true, .training = true, .dropout_seed = (uint64_t)step};
        ag_backward_with(tp, ag_mha_forward(tp, d->m, d->x, d->x, d->x, &o, w ? &weights : NULL),
                         d->dy);
    }
}

static void test_a_repeated_step_allocates_nothing_for_every_scheme(void) {
    for (int i = 0; i < N_KINDS; i++) {
        ag_params *ps = ag_params_new(AG_F32);
        ag_pcg32 rng = ag_pcg32_make(70, 1);
        ag_mha m;
        ag_mha_config cfg = {.embed_dim = 32, .num_heads = 4, .pos = kinds[i], .dropout = 0.1};
        CHECK(ag_mha_init(&m, ps, "", &cfg, &rng));
        step_data d = {&m, random_leaf(AG_F32, 3, (int[]){4, 150, 32}, 71),
                       uniform_tensor(AG_F32, 3, (int[]){4, 150, 32}, 72, -1, 1)};
        CHECK(repeated_step_allocates_nothing(pos_step, &d));
        ag_tensor_free(d.x);
        ag_tensor_free(d.dy);
        ag_params_free(ps);
    }
}

static void test_errors_are_one_line(void) {
    ag_params *ps = ag_params_new(AG_F64);
    ag_pcg32 rng = ag_pcg32_make(1, 1);
    ag_mha m;
    testing_catch_errors();
    ag_mha_config odd = {.embed_dim = 6, .num_heads = 2, .pos = AG_POS_ROPE};
    CHECK(!ag_mha_init(&m, ps, "", &odd, &rng));
    CHECK(strcmp(testing_last_error, "mha: rotary positions need an even head_dim, got 3") == 0);
    ag_mha_config kv = {.embed_dim = 8, .num_heads = 2, .pos = AG_POS_T5, .add_bias_kv = true};
    CHECK(!ag_mha_init(&m, ps, "", &kv, &rng));
    CHECK(strcmp(testing_last_error,
                 "mha: positions do not combine with add_bias_kv or add_zero_attn") == 0);
    ag_params_free(ps);
    ps = ag_params_new(AG_F64);
    ag_mha_config alibi = {.embed_dim = 8, .num_heads = 2, .pos = AG_POS_ALIBI};
    CHECK(ag_mha_init(&m, ps, "", &alibi, &rng));
    CHECK(!ag_mha_prune_heads(&m, ps, (int[]){0}, 1));
    CHECK(strcmp(testing_last_error,
                 "mha_prune_heads: ALiBi's slopes depend on the head count; cannot prune") == 0);
    testing_release_errors();
    ag_params_free(ps);
}

// Pruning no head (a list of heads below a threshold can be empty) is a no-op that
// succeeds for every scheme: ALiBi and sinusoidal refuse to prune heads because the
// heads kept would change their terms, but with no head gone nothing changes. It used to
// be refused for those two, as if a head had been named.
static void test_pruning_no_head_succeeds_whatever_the_scheme(void) {
    const ag_pos_kind kinds[] = {AG_POS_ALIBI, AG_POS_SINUSOIDAL, AG_POS_T5};
    for (int i = 0; i < 3; i++) {
        ag_params *ps = ag_params_new(AG_F64);
        ag_pcg32 rng = ag_pcg32_make(1, 1);
        ag_mha m;
        ag_mha_config c = {.embed_dim = 8, .num_heads = 2, .pos = kinds[i], .max_distance = 20,
                           .num_buckets = 8};
        CHECK(ag_mha_init(&m, ps, "", &c, &rng));
        const uint64_t version = m.version;
        testing_catch_errors();
        CHECK(ag_mha_prune_heads(&m, ps, NULL, 0));
        CHECK(ag_mha_prune_heads(&m, ps, (int[]){1}, 0));
        CHECK(testing_error_count == 0);
        testing_release_errors();
        CHECK(m.cfg.num_heads == 2 && m.version == version);
        ag_params_free(ps);
    }
}

int main(void) {
    RUN(test_gradcheck_every_scheme_in_both_paths_table_included);
    RUN(test_fused_equals_composed_for_every_scheme);
    RUN(test_the_table_has_its_name_and_shape);
    RUN(test_pruning_a_table_module_equals_a_zero_head_mask);
    RUN(test_a_repeated_step_allocates_nothing_for_every_scheme);
    RUN(test_errors_are_one_line);
    RUN(test_pruning_no_head_succeeds_whatever_the_scheme);
    return testing_summary();
}
