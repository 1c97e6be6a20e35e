// What ag_tape_check finds and what it never claims: small scaled-gradient errors found
// on nodes of any size (the detection statistics are at the top of src/core/fd_check.c),
// and correct graphs that never fail, among exact kinks, large values, dropout, integer
// inputs and float32 noise.
#include <stdlib.h>

#include "op_checks.h"

// The worked example's custom op (examples/custom_op/): softplus, f32 and f64.
#include "../examples/custom_op/softplus.c"

// Seeds per case. The counts are the issue's: 100 seeds per planted error, 1000 per
// correct graph. A sanitizer build, 10 to 20 times slower, runs a tenth of them; the
// Release builds (CI's gcc and clang) run them all.
#ifdef AG_TEST_FEWER_SEEDS
enum { PLANTED_SEEDS = 10, CORRECT_SEEDS = 100 };
#else
enum { PLANTED_SEEDS = 100, CORRECT_SEEDS = 1000 };
#endif

// ---- A custom op with a planted error: SiLU whose backward is scaled ----------------------
// y = x s(x), s = sigmoid:  dx = dy (s + x s (1 - s)), times `factor` (1: correct).
// Written for both dtypes, so it is its own f64 twin.
typedef struct {
    double factor;
} silu_params;

static double sigmoid(double x) { return 1 / (1 + exp(-x)); }

static void planted_silu_forward(ag_node *n) {
    const ag_tensor *x = n->in[0];
    for (size_t i = 0; i < x->numel; i++) {
        double xi = ag_tensor_item(x, i);
        ag_tensor_set_item(n->out, i, xi * sigmoid(xi));
    }
}

static void planted_silu_backward(ag_node *n) {
    const silu_params *p = n->params;
    ag_tensor *x = n->in[0];
    ag_tensor g = ag_tensor_grad_view(x);
    for (size_t i = 0; i < x->numel; i++) {
        double xi = ag_tensor_item(x, i), s = sigmoid(xi);
        double d = ag_tensor_grad_item(n->out, i) * (s + xi * s * (1 - s)) * p->factor;
        ag_tensor_set_item(&g, i, ag_tensor_grad_item(x, i) + d);
    }
}

static const ag_op planted_silu_op = {"planted_silu", planted_silu_forward,
                                      planted_silu_backward, "dx = dy (s + x s (1 - s))"};
static const ag_op *const silu_twin[] = {&planted_silu_op, &planted_silu_op};

// ---- A small transformer feed-forward block around it -----------------------------------
// x [B, T, E] -> layernorm -> linear to F -> planted_silu (B T F elements) -> linear to E
// -> + x -> linear head to C classes -> cross-entropy: 7 nodes, the custom op at #2.
enum { SILU_NODE = 2, CLASSES = 5 };

typedef struct {
    int B, T, E, F;
} block_shape;

typedef struct {
    ag_params *ps;
    ag_tensor *x, *ln_w, *ln_b, *w1, *b1, *w2, *b2, *head;
    int32_t targets[256];
} block;

static void block_init(block *m, ag_dtype dt, block_shape s, uint64_t seed) {
    ag_pcg32 rng = ag_pcg32_make(seed, 31);
    m->ps = ag_params_new(dt);
    m->ln_w = ag_params_add(m->ps, "ln.weight", 1, (int[]){s.E});
    m->ln_b = ag_params_add(m->ps, "ln.bias", 1, (int[]){s.E});
    m->w1 = ag_params_add(m->ps, "fc1.weight", 2, (int[]){s.F, s.E});
    m->b1 = ag_params_add(m->ps, "fc1.bias", 1, (int[]){s.F});
    m->w2 = ag_params_add(m->ps, "fc2.weight", 2, (int[]){s.E, s.F});
    m->b2 = ag_params_add(m->ps, "fc2.bias", 1, (int[]){s.E});
    m->head = ag_params_add(m->ps, "head.weight", 2, (int[]){CLASSES, s.E});
    ag_tensor_init_uniform(m->ln_w, &rng, 0.5, 1.5);
    ag_tensor_init_uniform(m->ln_b, &rng, -0.5, 0.5);
    for (int i = 2; i < ag_params_count(m->ps); i++)
        ag_tensor_init_uniform(ag_params_at(m->ps, i), &rng, -1, 1);
    m->x = requiring_grad(uniform_tensor(dt, 3, (int[]){s.B, s.T, s.E}, seed, -1, 1));
    for (int r = 0; r < s.B * s.T; r++) m->targets[r] = (int32_t)(ag_pcg32_next(&rng) % CLASSES);
}

static void block_free(block *m) {
    ag_params_free(m->ps);
    ag_tensor_free(m->x);
}

static void block_forward(ag_tape *tp, block *m, double factor) {
    ag_tensor *h = ag_layernorm(tp, m->x, m->ln_w, m->ln_b, 1e-5);
    h = ag_linear(tp, h, m->w1, m->b1);
    silu_params p = {factor};
    h = ag_op_apply(tp, &planted_silu_op, 1, &h, h->ndim, h->shape, &p, sizeof p);
    CHECK(h->node->index == SILU_NODE);
    h = ag_add(tp, m->x, ag_linear(tp, h, m->w2, m->b2));
    ag_tensor *logits = ag_linear(tp, h, m->head, NULL);
    size_t rows = logits->numel / CLASSES;
    ag_backward(tp, ag_cross_entropy(tp, logits, m->targets, rows, AG_IGNORE_INDEX));
}

// The custom op's node holds 16, 256 and 4096 elements.
static const block_shape SIZES[] = {{1, 2, 4, 8}, {2, 4, 8, 32}, {4, 16, 16, 64}};

// The tape check of the block with its op's gradient times `factor`.
static ag_tape_check_report check_block(ag_dtype dt, block_shape s, double factor, bool strict,
                                        uint64_t seed) {
    block m;
    block_init(&m, dt, s, seed);
    ag_tape *tp = ag_tape_new();
    block_forward(tp, &m, factor);
    ag_tape_check_opts o = strict ? ag_tape_check_strict() : ag_tape_check_defaults();
    o.seed = seed;
    o.f64_twins = silu_twin;
    o.n_f64_twins = 1;
    ag_tape_check_report r;
    ag_tape_check(tp, &o, &r);
    ag_tape_free(tp);
    block_free(&m);
    return r;
}

// How many of the seeds name the planted node, and only it.
static int seeds_found(ag_dtype dt, block_shape s, double factor, bool strict) {
    int found = 0;
    for (uint64_t seed = 1; seed <= PLANTED_SEEDS; seed++) {
        ag_tape_check_report r = check_block(dt, s, factor, strict, seed);
        bool named = r.first_failure == SILU_NODE && r.n_failed == 1;
        found += named;
        if (!named && getenv("AG_SHOW_TAPE_CHECK")) ag_tape_check_print(&r, stderr);
        ag_tape_check_report_free(&r);
    }
    return found;
}

// At least 99 of 100 seeds: a 1% or 5% error in the custom op's gradient, at the
// defaults, whatever the node's size, in float64 and in float32 checked through the op's
// f64 twin.
static void test_one_and_five_percent_errors_are_found_at_any_node_size(void) {
    const ag_dtype dts[] = {AG_F64, AG_F32};
    const double factors[] = {1.01, 1.05};
    for (int d = 0; d < 2; d++)
        for (int z = 0; z < 3; z++)
            for (int f = 0; f < 2; f++) {
                int found = seeds_found(dts[d], SIZES[z], factors[f], false);
                block_shape s = SIZES[z];
                fprintf(stderr, "  %s, %4d elements, x%.2f: found in %d of %d seeds\n",
                        ag_dtype_name(dts[d]), s.B * s.T * s.F, factors[f], found,
                        PLANTED_SEEDS);
                CHECK(found >= PLANTED_SEEDS - PLANTED_SEEDS / 100);
            }
}

// The strict setting finds 0.1% the same way.
static void test_strict_setting_finds_a_tenth_of_a_percent(void) {
    const ag_dtype dts[] = {AG_F64, AG_F32};
    for (int d = 0; d < 2; d++)
        for (int z = 0; z < 3; z++) {
            int found = seeds_found(dts[d], SIZES[z], 1.001, true);
            block_shape s = SIZES[z];
            fprintf(stderr, "  strict, %s, %4d elements, x1.001: found in %d of %d seeds\n",
                    ag_dtype_name(dts[d]), s.B * s.T * s.F, found, PLANTED_SEEDS);
            CHECK(found >= PLANTED_SEEDS - PLANTED_SEEDS / 100);
        }
}

// The correct op passes at every size, default and strict, every node of the block.
static void test_correct_block_passes_at_every_size(void) {
    for (int z = 0; z < 3; z++)
        for (int strict = 0; strict < 2; strict++)
            for (ag_dtype dt = AG_F32; dt <= AG_F64; dt++)
                for (uint64_t seed = 1; seed <= PLANTED_SEEDS; seed++) {
                    ag_tape_check_report r = check_block(dt, SIZES[z], 1.0, strict, seed);
                    CHECK(r.verdict == AG_CHECK_PASS);
                    if (r.verdict != AG_CHECK_PASS) ag_tape_check_print(&r, stderr);
                    ag_tape_check_report_free(&r);
                }
}

// A failure names the elements: the planted node's report lists elements of its input
// with the value the differences expect and the one backward gave, 1% apart.
static void test_failure_names_elements_with_expected_and_got(void) {
    for (int z = 0; z < 3; z++) {
        ag_tape_check_report r = check_block(AG_F64, SIZES[z], 1.01, false, 7);
        const ag_check_result *fd = &r.nodes[SILU_NODE].fd;
        CHECK(fd->verdict == AG_CHECK_FAIL && fd->n_bad >= 1);
        for (int b = 0; b < fd->n_bad; b++) {
            CHECK(fd->bad[b].input == 0 && fd->bad[b].at[0] == '(');
            CHECK_NEAR(fd->bad[b].got, 1.01 * fd->bad[b].expected, 1e-6);
        }
        ag_tape_check_report_free(&r);
    }
}

// ---- Correct graphs never fail -----------------------------------------------------------
// ids [B, T] -> embedding [V, D] -> * mask (a third of it exact zeros) -> relu -> relu
// (relu at exactly 0, twice) -> dropout (replayed from its seed) -> gather along D (an i64
// index) -> index_select along T (an i32 index) -> + 30 -> exp (about 1e13) -> mean.
enum { V = 7, D = 24, B = 2, T = 3, K = 5 };

typedef struct {
    ag_tensor *weight, *mask, *offset, *gather_index, *select_index;
    int32_t ids[B * T];
} kinks_graph;

static void kinks_init(kinks_graph *g, ag_dtype dt, uint64_t seed) {
    ag_pcg32 rng = ag_pcg32_make(seed, 41);
    g->weight = requiring_grad(uniform_tensor(dt, 2, (int[]){V, D}, seed, -1, 1));
    g->mask = ag_tensor_zeros(dt, 3, (int[]){B, T, D});
    for (size_t i = 0; i < g->mask->numel; i++)
        ag_tensor_set_item(g->mask, i, ag_pcg32_next(&rng) % 3 ? 1.0 : 0.0);
    g->offset = ag_tensor_zeros(dt, 0, NULL);
    ag_tensor_set_item(g->offset, 0, 30);
    g->gather_index = ag_tensor_zeros(AG_I64, 3, (int[]){B, T, K});
    for (size_t i = 0; i < g->gather_index->numel; i++)
        ag_tensor_set_item(g->gather_index, i, ag_pcg32_next(&rng) % D);
    g->select_index = ag_tensor_zeros(AG_I32, 1, (int[]){4});
    for (size_t i = 0; i < 4; i++) ag_tensor_set_item(g->select_index, i, ag_pcg32_next(&rng) % T);
    for (int i = 0; i < B * T; i++) g->ids[i] = (int32_t)(ag_pcg32_next(&rng) % V);
}

static void kinks_free(kinks_graph *g) {
    ag_tensor_free(g->weight), ag_tensor_free(g->mask), ag_tensor_free(g->offset);
    ag_tensor_free(g->gather_index), ag_tensor_free(g->select_index);
}

static void kinks_forward(ag_tape *tp, kinks_graph *g, uint64_t seed) {
    ag_tensor *h = ag_embedding(tp, g->weight, g->ids, 2, (int[]){B, T});
    h = ag_relu(tp, ag_relu(tp, ag_mul(tp, h, g->mask)));
    h = ag_dropout(tp, h, 0.25, true, seed, 3);
    h = ag_index_select(tp, ag_gather(tp, h, -1, g->gather_index), 1, g->select_index);
    ag_backward(tp, ag_mean(tp, ag_exp(tp, ag_add(tp, h, g->offset))));
}

// The f32 softplus without a twin, at inputs of mean 100: x [8, 16] -> softplus -> linear
// -> mse.
static void softplus_forward_at_100(ag_tape *tp, ag_tensor *x, ag_tensor *w, ag_tensor *target) {
    ag_tensor *y = ag_linear(tp, softplus(tp, x), w, NULL);
    ag_backward(tp, ag_mse(tp, y, target));
}

typedef struct {
    int pass, fail, inconclusive;
} tally;

static void count(tally *t, const ag_tape_check_report *r) {
    for (int i = 0; i < r->n_nodes; i++) {
        ag_check_verdict v = r->nodes[i].fd.verdict;
        t[i].pass += v == AG_CHECK_PASS;
        t[i].fail += v == AG_CHECK_FAIL;
        t[i].inconclusive += v == AG_CHECK_INCONCLUSIVE;
    }
    if (r->verdict == AG_CHECK_FAIL) ag_tape_check_print(r, stderr);
}

static void print_tally(const char *what, const ag_tape_check_report *r, const tally *t) {
    fprintf(stderr, "  %s, %d seeds (pass / FAIL / inconclusive):\n", what, CORRECT_SEEDS);
    for (int i = 0; i < r->n_nodes; i++)
        fprintf(stderr, "    #%d %-14s %4d %4d %4d\n", i, r->nodes[i].op, t[i].pass, t[i].fail,
                t[i].inconclusive);
}

// Relu at exact zeros, exp of large values, dropout and integer inputs, in f64 and in
// f32 (through the f64 twins): no node fails in any seed. The relus on exact zeros may be
// inconclusive, and only they; every other node passes.
static void test_kinks_large_values_dropout_and_integer_inputs_never_fail(void) {
    for (ag_dtype dt = AG_F32; dt <= AG_F64; dt++) {
        tally t[16] = {{0}};
        ag_tape_check_report last = {0};
        for (uint64_t seed = 1; seed <= CORRECT_SEEDS; seed++) {
            kinks_graph g;
            kinks_init(&g, dt, seed);
            ag_tape *tp = ag_tape_new();
            kinks_forward(tp, &g, seed);
            ag_tape_check_opts o = ag_tape_check_defaults();
            o.seed = seed;
            ag_tape_check_report r;
            ag_tape_check(tp, &o, &r);
            CHECK(r.n_nodes == 10 && r.n_failed == 0);
            count(t, &r);
            for (int i = 0; i < r.n_nodes; i++) {
                bool relu = strcmp(r.nodes[i].op, "relu") == 0;
                CHECK(relu || r.nodes[i].fd.verdict == AG_CHECK_PASS);
                if (r.nodes[i].fd.verdict == AG_CHECK_INCONCLUSIVE)
                    CHECK(strstr(r.nodes[i].fd.reason, "kink") != NULL);
            }
            ag_tape_check_report_free(&last);
            last = r;
            ag_tape_free(tp);
            kinks_free(&g);
        }
        print_tally(dt == AG_F64 ? "f64" : "f32", &last, t);
        ag_tape_check_report_free(&last);
    }
}

// relu with its gradient times `factor`, 0 at 0 as the built-in (both dtypes).
static void planted_relu_forward(ag_node *n) {
    for (size_t i = 0; i < n->out->numel; i++)
        ag_tensor_set_item(n->out, i, fmax(ag_tensor_item(n->in[0], i), 0));
}

static void planted_relu_backward(ag_node *n) {
    const silu_params *p = n->params;
    ag_tensor *x = n->in[0];
    ag_tensor g = ag_tensor_grad_view(x);
    for (size_t i = 0; i < x->numel; i++)
        if (ag_tensor_item(x, i) > 0)
            ag_tensor_set_item(&g, i,
                          ag_tensor_grad_item(x, i) + p->factor * ag_tensor_grad_item(n->out, i));
}

static const ag_op planted_relu_op = {"planted_relu", planted_relu_forward, planted_relu_backward,
                                      "dx = dy (x > 0)"};

// On an input a third of which is exactly 0, the kinks make a direction undecided; the
// elements at 0 are then left out, so a 1% error in the rest is still found, and the
// correct op is inconclusive (never a pass that checked nothing, never a failure).
static void test_error_in_relu_on_exact_zeros_is_still_found(void) {
    int found = 0, inconclusive = 0;
    for (uint64_t seed = 1; seed <= PLANTED_SEEDS; seed++)
        for (int bug = 0; bug < 2; bug++) {
            ag_tensor *x = requiring_grad(uniform_tensor(AG_F64, 2, (int[]){16, 256}, seed, -1, 1));
            ag_tensor *mask = bool_mask(2, (int[]){16, 256}, 0.33, seed);
            ag_tape *tp = ag_tape_new();
            ag_tensor *h = ag_masked_fill(tp, x, mask, 0);
            silu_params p = {bug ? 1.01 : 1.0};
            h = ag_op_apply(tp, &planted_relu_op, 1, &h, h->ndim, h->shape, &p, sizeof p);
            ag_backward(tp, ag_sum(tp, ag_mul(tp, h, h)));
            ag_tape_check_opts o = ag_tape_check_defaults();
            o.seed = seed;
            ag_tape_check_report r;
            ag_tape_check(tp, &o, &r);
            const ag_check_result *fd = &r.nodes[1].fd;
            if (bug) found += fd->verdict == AG_CHECK_FAIL && r.n_failed == 1;
            else inconclusive += fd->verdict == AG_CHECK_INCONCLUSIVE && r.n_failed == 0 &&
                                 strstr(fd->reason, "elements at exactly 0") != NULL;
            ag_tape_check_report_free(&r);
            ag_tape_free(tp);
            ag_tensor_free(x), ag_tensor_free(mask);
        }
    fprintf(stderr, "  relu x1.01 on exact zeros: found in %d of %d seeds; correct relu "
                    "inconclusive in %d\n", found, PLANTED_SEEDS, inconclusive);
    CHECK(found >= PLANTED_SEEDS - PLANTED_SEEDS / 100 && inconclusive == PLANTED_SEEDS);
}

// An f32 op without a twin, at inputs of mean 100: float32 differences, never a failure.
static void test_f32_op_without_twin_at_mean_100_never_fails(void) {
    tally t[4] = {{0}};
    ag_tape_check_report last = {0};
    for (uint64_t seed = 1; seed <= CORRECT_SEEDS; seed++) {
        ag_tensor *x = requiring_grad(normal_tensor(AG_F32, 2, (int[]){8, 16}, seed, 100, 1));
        ag_tensor *w = requiring_grad(uniform_tensor(AG_F32, 2, (int[]){4, 16}, seed + 1, -1, 1));
        ag_tensor *target = uniform_tensor(AG_F32, 2, (int[]){8, 4}, seed + 2, -1, 1);
        ag_tape *tp = ag_tape_new();
        softplus_forward_at_100(tp, x, w, target);
        ag_tape_check_opts o = ag_tape_check_defaults();
        o.seed = seed;
        ag_tape_check_report r;
        ag_tape_check(tp, &o, &r);
        CHECK(r.n_nodes == 3 && r.n_failed == 0 && !r.nodes[0].in_f64);
        count(t, &r);
        ag_tape_check_report_free(&last);
        last = r;
        ag_tape_free(tp);
        ag_tensor_free(x), ag_tensor_free(w), ag_tensor_free(target);
    }
    print_tally("f32, softplus without a twin at mean 100", &last, t);
    ag_tape_check_report_free(&last);
}


// y = (x + 256) - 256 in float32 (dy/dx = 1, times `factor` in backward): the forward
// keeps x to within half an ulp of 256, 1.5e-5, a noise of a few percent of the
// differences over a float32 step of 1e-3.
static void lossy_forward(ag_node *n) {
    const float *x = ag_tensor_f32(n->in[0]);
    float *y = ag_tensor_f32(n->out);
    volatile float big = 256;  // the sum rounds in float, as a real f32 kernel's would
    for (size_t i = 0; i < n->out->numel; i++) y[i] = (x[i] + big) - big;
}

static void lossy_backward(ag_node *n) {
    const silu_params *p = n->params;
    float *dx = n->in[0]->grad;
    const float *dy = n->out->grad;
    for (size_t i = 0; i < n->out->numel; i++) dx[i] += (float)(p->factor * dy[i]);
}

static const ag_op lossy_op = {"lossy", lossy_forward, lossy_backward, "dx = dy"};

// float32 noise above rtol_f32 with no twin: inconclusive, with the noise level and the
// advice to give the op a twin; a gradient twice too large still fails through the noise.
static void test_f32_noise_above_tolerance_is_inconclusive_with_its_level(void) {
    for (int bug = 0; bug < 2; bug++) {
        ag_tensor *x = requiring_grad(uniform_tensor(AG_F32, 2, (int[]){32, 8}, 51, -1, 1));
        ag_tape *tp = ag_tape_new();
        silu_params p = {bug ? 2.0 : 1.0};
        ag_tensor *y = ag_op_apply(tp, &lossy_op, 1, &x, 2, x->shape, &p, sizeof p);
        ag_backward(tp, ag_sum(tp, ag_mul(tp, y, y)));
        ag_tape_check_report r;
        ag_tape_check(tp, NULL, &r);
        const ag_check_result *fd = &r.nodes[0].fd;
        if (bug) {
            CHECK(fd->verdict == AG_CHECK_FAIL && r.first_failure == 0);
        } else {
            CHECK(fd->verdict == AG_CHECK_INCONCLUSIVE && r.n_failed == 0);
            CHECK(strstr(fd->reason, "float32 differences are too noisy here (noise ") != NULL);
            CHECK(strstr(fd->reason, "give the op an f64 twin") != NULL);
            CHECK(fd->noise > 1e-2);
            fprintf(stderr, "  %s\n", fd->reason);
        }
        ag_tape_check_report_free(&r);
        ag_tape_free(tp);
        ag_tensor_free(x);
    }
}

// y = c x^2 with its gradient times `factor` (f64). Outputs or gradients above 1e154 used to
// overflow when squared (in the rounding allowance, in the scale s of a direction, in an
// input's root-mean-square gradient): the tolerance became infinite and a gradient twice too
// large passed; so did an infinite gradient along a direction. Expected values by hand:
// dy/dx = 2 c x.
typedef struct {
    double c, factor;
} big_square_params;

static void big_square_forward(ag_node *n) {
    const big_square_params *p = n->params;
    for (size_t i = 0; i < n->out->numel; i++) {
        double x = ag_tensor_item(n->in[0], i);
        ag_tensor_set_item(n->out, i, p->c * x * x);
    }
}

static void big_square_backward(ag_node *n) {
    const big_square_params *p = n->params;
    ag_tensor *x = n->in[0];
    ag_tensor g = ag_tensor_grad_view(x);
    for (size_t i = 0; i < x->numel; i++) {
        double d = 2 * p->c * ag_tensor_item(x, i) * ag_tensor_grad_item(n->out, i);
        ag_tensor_set_item(&g, i, ag_tensor_grad_item(x, i) + p->factor * d);
    }
}

static const ag_op big_square_op = {"big_square", big_square_forward, big_square_backward,
                                    "dx = 2 c x dy"};

static void test_outputs_and_gradients_of_1e200_do_not_make_the_tolerance_infinite(void) {
    // {c, x magnitude}: outputs of 1e200 (x 1e100), and gradients of 1e200 too (c 1e200).
    const double cases[][2] = {{1, 1e100}, {1e200, 1}};
    for (int k = 0; k < 2; k++) {
        for (int n = 3; n <= 300; n += 297) {  // element by element, and along a direction
            for (int bug = 0; bug < 3; bug++) {
                ag_tensor *x = uniform_tensor(AG_F64, 1, (int[]){n}, 60 + (uint64_t)n, 0.5, 2);
                for (size_t i = 0; i < x->numel; i++)
                    ag_tensor_set_item(x, i, ag_tensor_item(x, i) * cases[k][1]);
                requiring_grad(x);
                ag_tape *tp = ag_tape_new();
                big_square_params p = {cases[k][0], bug == 2 ? INFINITY : bug ? 2.0 : 1.0};
                ag_op_apply(tp, &big_square_op, 1, &x, 1, x->shape, &p, sizeof p);
                ag_tape_check_report r;
                ag_tape_check(tp, NULL, &r);
                CHECK(r.nodes[0].fd.elementwise == (n == 3));
                CHECK(r.verdict == (bug ? AG_CHECK_FAIL : AG_CHECK_PASS));
                ag_tape_check_report_free(&r);
                ag_tape_free(tp);
                ag_tensor_free(x);
            }
        }
    }
}

int main(void) {
    RUN(test_one_and_five_percent_errors_are_found_at_any_node_size);
    RUN(test_strict_setting_finds_a_tenth_of_a_percent);
    RUN(test_correct_block_passes_at_every_size);
    RUN(test_failure_names_elements_with_expected_and_got);
    RUN(test_kinks_large_values_dropout_and_integer_inputs_never_fail);
    RUN(test_f32_op_without_twin_at_mean_100_never_fails);
    RUN(test_error_in_relu_on_exact_zeros_is_still_found);
    RUN(test_f32_noise_above_tolerance_is_inconclusive_with_its_level);
    RUN(test_outputs_and_gradients_of_1e200_do_not_make_the_tolerance_infinite);
    return testing_summary();
}
