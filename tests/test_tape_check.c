// ag_tape_check: every node of a recorded tape checked on its own, and the first
// wrong one named.
#define _POSIX_C_SOURCE 200809L  // testing_files.h
#include <stdlib.h>
#include <time.h>

#include "op_checks.h"
#include "testing_files.h"

// The copy-task example's model, as the example builds it.
#include "../examples/copy_task/model.c"

// ---- A custom op, correct or subtly wrong -------------------------------------------------
// y [..., E] = c * x W^T with W [E, E]:
//   dx = c * dy W,   dW = c * dy^T x
// Written dtype-generic (through ag_tensor_item/set) so it runs on f32 and f64 tapes.
// BUG_SLIGHT_IN_F32: dx is 0.1% too large, in float32 only (as a bug in a vectorised f32
// path would be).
typedef enum {
    BUG_NONE,
    BUG_MISSING_FACTOR,
    BUG_WRONG_TRANSPOSE,
    BUG_ASSIGN,
    BUG_SLIGHT_IN_F32
} bug_kind;

typedef struct {
    double c;
    bug_kind bug;
} proj_params;

static double grad_at(const ag_tensor *t, size_t i) { return ag_tensor_grad_item(t, i); }

static void grad_set(ag_tensor *t, size_t i, double v) {
    ag_tensor view = ag_tensor_grad_view(t);
    ag_tensor_set_item(&view, i, v);
}

static void proj_forward(ag_node *n) {
    const proj_params *p = n->params;
    const ag_tensor *x = n->in[0], *w = n->in[1];
    size_t E = (size_t)w->shape[0], rows = x->numel / E;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < E; j++) {
            double s = 0;
            for (size_t i = 0; i < E; i++)
                s += ag_tensor_item(x, r * E + i) * ag_tensor_item(w, j * E + i);
            ag_tensor_set_item(n->out, r * E + j, p->c * s);
        }
}

static void proj_backward(ag_node *n) {
    const proj_params *p = n->params;
    ag_tensor *x = n->in[0], *w = n->in[1];
    const ag_tensor *y = n->out;
    size_t E = (size_t)w->shape[0], rows = x->numel / E;
    if (x->grad)
        for (size_t r = 0; r < rows; r++)
            for (size_t i = 0; i < E; i++) {
                double s = 0;
                for (size_t j = 0; j < E; j++) {
                    size_t wij = p->bug == BUG_WRONG_TRANSPOSE ? i * E + j : j * E + i;
                    s += grad_at(y, r * E + j) * ag_tensor_item(w, wij);
                }
                double c = p->bug == BUG_MISSING_FACTOR ? 1.0 : p->c;
                if (p->bug == BUG_SLIGHT_IN_F32 && x->dtype == AG_F32) c *= 1.001;
                grad_set(x, r * E + i, grad_at(x, r * E + i) + c * s);
            }
    if (w->grad)
        for (size_t j = 0; j < E; j++)
            for (size_t i = 0; i < E; i++) {
                double s = 0;
                for (size_t r = 0; r < rows; r++)
                    s += grad_at(y, r * E + j) * ag_tensor_item(x, r * E + i);
                double old = p->bug == BUG_ASSIGN ? 0.0 : grad_at(w, j * E + i);
                grad_set(w, j * E + i, old + p->c * s);
            }
}

static const ag_op proj_op = {"my_proj", proj_forward, proj_backward, "dx = c dy W; dW = c dy^T x"};

static ag_tensor *my_proj(ag_tape *tp, ag_tensor *x, ag_tensor *w, bug_kind bug) {
    proj_params p = {0.5, bug};
    return ag_op_apply(tp, &proj_op, 2, (ag_tensor *[]){x, w}, x->ndim, x->shape, &p, sizeof p);
}

// ---- A MultiheadAttention graph of 23 nodes with the custom op at node 14 ------------------
enum { CUSTOM_NODE = 14 };

typedef struct {
    ag_params *ps;
    ag_mha attn1, attn2;
    ag_layernorm_layer ln0, ln1;
    ag_linear_layer head;
    ag_tensor *wc;  // the custom op's W
    ag_tensor *x;
    int32_t targets[64];
} mha_graph;

static void mha_graph_init(mha_graph *g, ag_dtype dt, int B, int T, int E, uint64_t seed) {
    memset(g, 0, sizeof *g);
    ag_pcg32 rng = ag_pcg32_make(seed, 3);
    g->ps = ag_params_new(dt);
    ag_mha_config mc = {.embed_dim = E, .num_heads = 2, .dropout = 0.2};
    CHECK(ag_mha_init(&g->attn1, g->ps, "attn1", &mc, &rng));
    CHECK(ag_mha_init(&g->attn2, g->ps, "attn2", &mc, &rng));
    CHECK(ag_layernorm_layer_init(&g->ln0, g->ps, "ln0", E));
    CHECK(ag_layernorm_layer_init(&g->ln1, g->ps, "ln1", E));
    CHECK(ag_linear_layer_init(&g->head, g->ps, "head", E, 5, true, &rng));
    g->wc = ag_params_add(g->ps, "custom.weight", 2, (int[]){E, E});
    ag_tensor_init_uniform(g->wc, &rng, -1, 1);
    // Biases are zero after init: make them count.
    ag_tensor_init_uniform(g->attn1.in_proj_bias, &rng, -0.5, 0.5);
    ag_tensor_init_uniform(g->attn2.out_proj.bias, &rng, -0.5, 0.5);
    ag_tensor_init_uniform(g->ln1.weight, &rng, 0.5, 1.5);
    ag_tensor_init_uniform(g->ln1.bias, &rng, -0.5, 0.5);
    g->x = requiring_grad(uniform_tensor(dt, 3, (int[]){B, T, E}, seed, -1, 1));
    for (int r = 0; r < B * T; r++) g->targets[r] = (int32_t)(ag_pcg32_next(&rng) % 5);
}

static void mha_graph_free(mha_graph *g) {
    ag_params_free(g->ps);
    ag_tensor_free(g->x);
}

// layernorm, attention with its weights (12 nodes, dropout among them), residual, the
// custom op, layernorm, fused causal self-attention (3 nodes), residual, gelu, head, loss.
static ag_tensor *mha_graph_forward(ag_tape *tp, mha_graph *g, bug_kind bug) {
    ag_tensor *a = ag_layernorm_layer_forward(tp, &g->ln0, g->x);  // #0
    ag_mha_opts o1 = {.training = true, .dropout_seed = 11};
    ag_tensor *weights;
    ag_tensor *h = ag_mha_forward(tp, &g->attn1, a, a, a, &o1, &weights);  // #1..#12
    h = ag_add(tp, g->x, h);                                              // #13
    h = my_proj(tp, h, g->wc, bug);                                       // #14
    CHECK(h && h->node && h->node->index == CUSTOM_NODE);
    ag_tensor *z = ag_layernorm_layer_forward(tp, &g->ln1, h);           // #15
    ag_mha_opts o2 = {.causal = true, .training = true, .dropout_seed = 12};
    ag_tensor *u = ag_mha_forward(tp, &g->attn2, z, z, z, &o2, NULL);    // #16..#18
    u = ag_gelu(tp, ag_add(tp, z, u), AG_GELU_TANH);                      // #19, #20
    ag_tensor *logits = ag_linear_layer_forward(tp, &g->head, u);         // #21
    size_t rows = logits->numel / (size_t)logits->shape[2];
    return ag_cross_entropy(tp, logits, g->targets, rows, AG_IGNORE_INDEX);  // #22
}

static ag_tape_check_opts opts_with_seed(uint64_t seed) {
    ag_tape_check_opts o = ag_tape_check_defaults();
    o.seed = seed;
    return o;
}

// Builds the graph with `bug`, runs forward and backward, checks the tape.
static ag_tape_check_report check_graph(ag_dtype dt, int B, int T, int E, bug_kind bug,
                                        uint64_t seed) {
    mha_graph g;
    mha_graph_init(&g, dt, B, T, E, seed);
    ag_tape *tp = ag_tape_new();
    ag_tensor *loss = mha_graph_forward(tp, &g, bug);
    ag_backward(tp, loss);
    CHECK(ag_tape_num_nodes(tp) == 23);
    ag_tape_check_opts o = opts_with_seed(seed);
    ag_tape_check_report r;
    ag_tape_check(tp, &o, &r);
    ag_tape_free(tp);
    mha_graph_free(&g);
    return r;
}

static void expect_only_the_custom_node_fails(bug_kind bug, int B, int T, int E, bool elementwise) {
    for (uint64_t seed = 1; seed <= 5; seed++) {
        ag_tape_check_report r = check_graph(AG_F64, B, T, E, bug, seed);
        CHECK(r.verdict == AG_CHECK_FAIL);
        CHECK(r.first_failure == CUSTOM_NODE);
        CHECK(r.n_failed == 1);
        CHECK(r.n_nodes == 23 && r.nodes[CUSTOM_NODE].fd.verdict == AG_CHECK_FAIL);
        CHECK(r.nodes[CUSTOM_NODE].fd.elementwise == elementwise);
        CHECK(strcmp(r.nodes[CUSTOM_NODE].op, "my_proj") == 0);
        if (r.first_failure != CUSTOM_NODE || r.n_failed != 1) ag_tape_check_print(&r, stderr);
        ag_tape_check_report_free(&r);
    }
}

static void test_correct_mha_graph_passes_every_node(void) {
    for (uint64_t seed = 1; seed <= 5; seed++) {
        ag_tape_check_report r = check_graph(AG_F64, 2, 4, 8, BUG_NONE, seed);
        CHECK(r.verdict == AG_CHECK_PASS && r.n_failed == 0 && r.first_failure == -1);
        for (int i = 0; i < r.n_nodes; i++) {
            CHECK(r.nodes[i].fd.verdict == AG_CHECK_PASS);
            CHECK(r.nodes[i].replay_diff == 0);  // dropout replays its mask
            CHECK(r.nodes[i].fd.comparisons > 0);
        }
        if (r.verdict == AG_CHECK_FAIL) ag_tape_check_print(&r, stderr);
        ag_tape_check_report_free(&r);
    }
}

static void test_missing_factor_is_named_at_its_node(void) {
    expect_only_the_custom_node_fails(BUG_MISSING_FACTOR, 2, 4, 8, false);
}

static void test_wrong_transpose_is_named_at_its_node(void) {
    expect_only_the_custom_node_fails(BUG_WRONG_TRANSPOSE, 2, 4, 8, false);
}

static void test_assign_instead_of_accumulate_is_named_at_its_node(void) {
    expect_only_the_custom_node_fails(BUG_ASSIGN, 2, 4, 8, false);
}

// B = 1, T = 2, E = 4: the custom op has 8 + 16 inputs, checked element by element.
static void test_small_nodes_are_checked_element_by_element(void) {
    expect_only_the_custom_node_fails(BUG_MISSING_FACTOR, 1, 2, 4, true);
    expect_only_the_custom_node_fails(BUG_WRONG_TRANSPOSE, 1, 2, 4, true);
    expect_only_the_custom_node_fails(BUG_ASSIGN, 1, 2, 4, true);
    ag_tape_check_report r = check_graph(AG_F64, 1, 2, 4, BUG_NONE, 1);
    CHECK(r.verdict == AG_CHECK_PASS);
    CHECK(r.nodes[CUSTOM_NODE].fd.elementwise && r.nodes[CUSTOM_NODE].fd.comparisons == 24);
    ag_tape_check_report_free(&r);
}

// A backward that assigns is right whenever the gradient it lands in was zero, so a
// whole-function gradcheck (which zeroes the gradients first) cannot see it.
static ag_tensor *graph_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)in, (void)n;
    return mha_graph_forward(tp, user, BUG_ASSIGN);
}

static void test_assign_bug_passes_gradcheck_but_not_tape_check(void) {
    mha_graph g;
    mha_graph_init(&g, AG_F64, 1, 2, 4, 1);
    ag_gradcheck_opts go = ag_gradcheck_defaults();
    go.quiet = true;
    ag_tensor *inputs[] = {g.x, g.wc};
    CHECK(ag_gradcheck(graph_fn, inputs, 2, &g, &go, NULL));
    mha_graph_free(&g);
    ag_tape_check_report r = check_graph(AG_F64, 1, 2, 4, BUG_ASSIGN, 1);
    CHECK(r.first_failure == CUSTOM_NODE);
    ag_tape_check_report_free(&r);
}

// ---- The tape is left as it was --------------------------------------------------------------

static double checksum(const ag_tensor *t, bool grad) {
    double s = 0;
    for (size_t i = 0; i < t->numel; i++) s += (double)(i % 7 + 1) * element(t, grad, i);
    return s;
}

static void test_check_leaves_values_gradients_and_saved_state_untouched(void) {
    mha_graph g;
    mha_graph_init(&g, AG_F64, 2, 4, 8, 2);
    ag_tape *tp = ag_tape_new();
    ag_tensor *loss = mha_graph_forward(tp, &g, BUG_NONE);
    ag_backward(tp, loss);
    int n = ag_tape_num_nodes(tp);
    double before[2 * 23];
    void *saved[23];
    for (int i = 0; i < n; i++) {
        ag_node *nd = ag_tape_node(tp, i);
        before[2 * i] = checksum(nd->out, false);
        before[2 * i + 1] = checksum(nd->out, true);
        saved[i] = nd->saved;
    }
    double x_grad = checksum(g.x, true), wc_grad = checksum(g.wc, true);
    ag_tape_stats stats = ag_tape_usage(tp);

    ag_tape_check_report r;
    CHECK(ag_tape_check(tp, NULL, &r));
    ag_tape_check_report_free(&r);

    for (int i = 0; i < n; i++) {
        ag_node *nd = ag_tape_node(tp, i);
        CHECK(checksum(nd->out, false) == before[2 * i]);
        CHECK(checksum(nd->out, true) == before[2 * i + 1]);
        CHECK(nd->saved == saved[i] && nd->tape == tp && nd->out->node == nd);
    }
    CHECK(checksum(g.x, true) == x_grad && checksum(g.wc, true) == wc_grad);
    CHECK(ag_tape_usage(tp).bytes_used == stats.bytes_used);
    // The saved state still serves a second backward, which adds the same gradient.
    ag_backward(tp, loss);
    CHECK_NEAR(checksum(g.wc, true), 2 * wc_grad, 1e-12);
    ag_tape_free(tp);
    mha_graph_free(&g);
}

static void test_same_seed_gives_the_same_report_twice(void) {
    mha_graph g;
    mha_graph_init(&g, AG_F64, 2, 4, 8, 4);
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, mha_graph_forward(tp, &g, BUG_NONE));
    ag_tape_check_report a, b;
    ag_tape_check(tp, NULL, &a);
    ag_tape_check(tp, NULL, &b);
    CHECK(a.n_nodes == b.n_nodes && a.forward_runs == b.forward_runs);
    for (int i = 0; i < a.n_nodes && i < b.n_nodes; i++) {
        CHECK(a.nodes[i].fd.max_abs_err == b.nodes[i].fd.max_abs_err);
        CHECK(a.nodes[i].fd.worst_numeric == b.nodes[i].fd.worst_numeric);
    }
    ag_tape_check_report_free(&a);
    ag_tape_check_report_free(&b);
    ag_tape_free(tp);
    mha_graph_free(&g);
}

// ---- What is differentiated and what is not ---------------------------------------------------

static void test_masks_and_inputs_without_grad_are_not_differentiated(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 3, (int[]){2, 3, 3}, 5);
    ag_tensor *mask = bool_mask(2, (int[]){3, 3}, 0.3, 6);
    ag_tensor *target = uniform_tensor(AG_F64, 3, (int[]){2, 3, 3}, 7, -1, 1);  // no grad
    ag_softmax_opts so = {.mask = mask};
    ag_tensor *y = ag_softmax(tp, x, &so);
    ag_tensor *loss = ag_mse(tp, y, target);
    ag_tape_check_report r;
    CHECK(ag_tape_check(tp, NULL, &r));
    CHECK(r.n_nodes == 2);
    CHECK(r.nodes[0].inputs_checked == 1 && r.nodes[1].inputs_checked == 1);
    CHECK(strcmp(r.nodes[0].shapes, "[2,3,3] ([3,3]) -> [2,3,3]") == 0);
    CHECK(strcmp(r.nodes[1].shapes, "[2,3,3] ([2,3,3]) -> []") == 0);
    ag_tape_check_report_free(&r);
    (void)loss;
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(mask), ag_tensor_free(target);
}

// A NaN among a node's inputs makes it inconclusive, saying where: a difference through a
// NaN is NaN, whatever the gradient. It is neither a pass nor a failure of the op.
static void test_nan_input_makes_its_node_inconclusive(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){3, 4}, 8);
    ag_tensor *w = random_leaf(AG_F64, 2, (int[]){4, 4}, 9);
    ag_tensor *h = ag_relu(tp, x);  // #0: no NaN yet
    ag_tensor_set_item(w, 5, NAN);
    ag_tensor *y = ag_linear(tp, h, w, NULL);  // #1
    ag_sum(tp, y);                            // #2
    ag_tape_check_report r;
    CHECK(!ag_tape_check(tp, NULL, &r));
    CHECK(r.verdict == AG_CHECK_INCONCLUSIVE && r.n_failed == 0 && r.n_inconclusive == 2);
    CHECK(r.nodes[0].fd.verdict == AG_CHECK_PASS);
    // linear's weight holds the NaN; sum's input holds the NaN rows it made
    CHECK(r.nodes[1].fd.verdict == AG_CHECK_INCONCLUSIVE && r.nodes[1].fd.comparisons == 0);
    CHECK(strcmp(r.nodes[1].fd.reason, "input 1 holds 1 NaN element: differences cannot "
                                       "check a gradient through NaN") == 0);
    CHECK(r.nodes[2].fd.verdict == AG_CHECK_INCONCLUSIVE &&
          strstr(r.nodes[2].fd.reason, "input 0 holds 3 NaN elements") != NULL);
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(w);
}

static void copy_forward(ag_node *n) { ag_tensor_copy(n->out, n->in[0]); }

static void copy_backward(ag_node *n) {
    for (size_t i = 0; i < n->out->numel; i++)
        grad_set(n->in[0], i, grad_at(n->in[0], i) + grad_at(n->out, i));
}

// Writes only the first element: the forward contract says every element.
static void lazy_forward(ag_node *n) { ag_tensor_set_item(n->out, 0, ag_tensor_item(n->in[0], 0)); }

static const ag_op no_backward_op = {"no_backward", copy_forward, NULL, NULL};
static const ag_op lazy_op = {"lazy", lazy_forward, copy_backward, "dx = dy"};
static const ag_op copy_op = {"copy", copy_forward, copy_backward, "dx = dy"};

// The report on a tape of one node, op applied to x [3] (NULL: random values), checked
// with options o (NULL: the defaults).
static ag_tape_check_report check_one(const ag_op *op, ag_tensor *x,
                                      const ag_tape_check_opts *o) {
    ag_tensor *own = x ? NULL : random_leaf(AG_F64, 1, (int[]){3}, 10);
    ag_tensor *in = x ? x : own;
    ag_tape *tp = ag_tape_new();
    ag_op_apply(tp, op, 1, &in, 1, (int[]){3}, NULL, 0);
    ag_tape_check_report r;
    ag_tape_check(tp, o, &r);
    ag_tape_free(tp);
    ag_tensor_free(own);
    return r;
}

static void test_op_without_backward_fails_with_a_note(void) {
    ag_tape_check_report r = check_one(&no_backward_op, NULL, NULL);
    CHECK(r.verdict == AG_CHECK_FAIL && r.first_failure == 0);
    CHECK(strstr(r.nodes[0].fd.reason, "no backward") != NULL);
    ag_tape_check_report_free(&r);
    r = check_one(&copy_op, NULL, NULL);  // the same op with its backward passes
    CHECK(r.verdict == AG_CHECK_PASS && r.nodes[0].fd.reason[0] == 0);
    ag_tape_check_report_free(&r);
}

static void test_forward_that_leaves_elements_unwritten_fails(void) {
    ag_tape_check_report r = check_one(&lazy_op, NULL, NULL);
    CHECK(r.verdict == AG_CHECK_FAIL && r.first_failure == 0 && isnan(r.nodes[0].fd.max_abs_err));
    ag_tape_check_report_free(&r);
}

// What ag_tape_check_print writes for r, into buf (cut to its size).
static void print_report(const ag_tape_check_report *r, char *buf, size_t size) {
    buf[0] = 0;
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f) return;
    ag_tape_check_print(r, f);
    rewind(f);
    buf[fread(buf, 1, size - 1, f)] = 0;
    fclose(f);
}

static void test_bad_options_are_reported_and_check_nothing(void) {
    ag_tape_check_opts o = ag_tape_check_defaults();
    o.eps = 0;
    testing_catch_errors();
    ag_tape_check_report r = check_one(&copy_op, NULL, &o);
    CHECK(testing_error_was("tape_check: eps must be finite and > 0 and tolerances finite and "
                            ">= 0, got eps 0 atol 0 rtol 0.0001 f32_vs_f64 0.0001 (f32: eps "
                            "0.001 atol 0 rtol 0.01)"));
    CHECK(r.n_nodes == 0 && r.nodes == NULL && r.verdict == AG_CHECK_FAIL);
    // An infinite tolerance passed any gradient: refused too.
    for (int k = 0; k < 3; k++) {
        o = ag_tape_check_defaults();
        *(k == 0 ? &o.atol : k == 1 ? &o.rtol : &o.rtol_f32) = INFINITY;
        int before = testing_error_count;
        ag_tape_check_report_free(&r);
        r = check_one(&copy_op, NULL, &o);
        CHECK(testing_error_count == before + 1 && r.verdict == AG_CHECK_FAIL && r.n_nodes == 0);
    }
    testing_release_errors();
    ag_tape_check_report_free(&r);
}

// Issue 20, item 7: a node whose inputs are all NaN was "ok" after 0 comparisons. It is
// inconclusive, and says why.
static void test_node_whose_inputs_are_all_nan_is_inconclusive(void) {
    ag_tensor *x = random_leaf(AG_F64, 1, (int[]){3}, 12);
    for (size_t i = 0; i < 3; i++) ag_tensor_set_item(x, i, NAN);
    ag_tape_check_report r = check_one(&copy_op, x, NULL);
    CHECK(r.verdict == AG_CHECK_INCONCLUSIVE && r.n_nodes == 1 && r.n_inconclusive == 1);
    CHECK(r.nodes[0].fd.verdict == AG_CHECK_INCONCLUSIVE && r.nodes[0].fd.comparisons == 0);
    CHECK(strstr(r.nodes[0].fd.reason, "input 0 holds 3 NaN elements") == r.nodes[0].fd.reason);
    ag_tape_check_report_free(&r);
    ag_tensor_free(x);
}

// Issue 20, item 7: directions = -1 and max_elementwise = -1 were accepted.
static void test_negative_counts_in_options_are_refused(void) {
    const char *said[] = {"1, 16 and -1", "-1, 16 and 64", "1, -1 and 64"};
    for (int which = 0; which < 3; which++) {
        ag_tape_check_opts o = ag_tape_check_defaults();
        if (which == 0) o.max_elementwise = -1;
        if (which == 1) o.directions = -1;
        if (which == 2) o.directions_f32 = -1;
        testing_catch_errors();
        ag_tape_check_report r = check_one(&copy_op, NULL, &o);
        char expected[160];
        snprintf(expected, sizeof expected, "tape_check: directions and directions_f32 must be "
                 ">= 1 and max_elementwise >= 0, got %s", said[which]);
        CHECK(testing_error_was(expected));
        CHECK(r.n_nodes == 0 && r.nodes == NULL && r.verdict == AG_CHECK_FAIL);
        testing_release_errors();
        // Printed, it says it was refused, not a table of no nodes without a verdict.
        char buf[256];
        print_report(&r, buf, sizeof buf);
        CHECK(strcmp(buf, "tape check: refused, nothing was checked (see the error it "
                          "reported)\n") == 0);
        ag_tape_check_report_free(&r);
    }
}

static void test_report_print_names_the_first_failing_node(void) {
    ag_tape_check_report r = check_graph(AG_F64, 2, 4, 8, BUG_WRONG_TRANSPOSE, 3);
    char buf[8192];
    print_report(&r, buf, sizeof buf);
    CHECK(strstr(buf, "tape check: 23 nodes, 1 failed, 0 inconclusive") != NULL);
    CHECK(strstr(buf, "first failing node: #14 my_proj\n") != NULL);
    CHECK(strstr(buf, "#14 my_proj [2,4,8] [8,8] -> [2,4,8]: FAIL: input 0: 1 of 2 random "
                      "directions failed (along one: numeric ") != NULL);
    CHECK(strstr(buf, "  input 0 element (") != NULL);
    CHECK(strstr(buf, "  its backward should do: dx = c dy W; dW = c dy^T x\n") != NULL);
    CHECK(strstr(buf, "FAIL") != NULL);
    ag_tape_check_report_free(&r);
}

// ---- -inf: masked scores --------------------------------------------------------------------
// The masked-attention pattern: an input or an output holding -inf is not a failure. Equal
// values (-inf and -inf) differ by 0, and an input element that is not finite is never
// perturbed (its gradient cannot be checked by differences).

// y = c x, a custom op that may forget c in its backward.
static void scale_forward(ag_node *n) {
    const proj_params *p = n->params;
    for (size_t i = 0; i < n->out->numel; i++)
        ag_tensor_set_item(n->out, i, p->c * ag_tensor_item(n->in[0], i));
}

static void scale_backward(ag_node *n) {
    const proj_params *p = n->params;
    double c = p->bug == BUG_MISSING_FACTOR ? 1.0 : p->c;
    for (size_t i = 0; i < n->out->numel; i++)
        grad_set(n->in[0], i, grad_at(n->in[0], i) + c * grad_at(n->out, i));
}

static const ag_op scale_op = {"my_scale", scale_forward, scale_backward, "dx = c dy"};

// x [B, 3, T] -> masked_fill(causal, -inf) -> my_scale -> softmax_dim and logsumexp of the
// same -inf scores -> mse + sum: 6 nodes, the custom op at #1 with -inf in and out.
static ag_tape_check_report check_masked(ag_dtype dt, int B, int T, bug_kind bug, uint64_t seed) {
    ag_tensor *x = random_leaf(dt, 3, (int[]){B, 3, T}, seed);
    ag_tensor *causal = ag_tensor_zeros(AG_BOOL, 2, (int[]){3, T});
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < T; j++) ag_tensor_set_item(causal, (size_t)(i * T + j), j > i);
    ag_tensor *target = uniform_tensor(dt, 3, (int[]){B, 3, T}, seed + 1, 0, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *s = ag_masked_fill(tp, x, causal, -INFINITY);  // #0
    proj_params p = {0.5, bug};
    s = ag_op_apply(tp, &scale_op, 1, &s, s->ndim, s->shape, &p, sizeof p);  // #1
    ag_tensor *a = ag_softmax_dim(tp, s, -1);                                // #2
    ag_tensor *lse = ag_logsumexp(tp, s, -1, true);                          // #3
    ag_tensor *loss = ag_add(tp, ag_mse(tp, a, target), ag_sum(tp, lse));   // #4, #5, #6
    ag_backward(tp, loss);
    CHECK(ag_tape_num_nodes(tp) == 7);
    ag_tape_check_opts o = opts_with_seed(seed);
    ag_tape_check_report r;
    ag_tape_check(tp, &o, &r);
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(causal), ag_tensor_free(target);
    return r;
}

static void test_minus_inf_from_masked_fill_passes_softmax_dim_and_logsumexp(void) {
    // T = 4: 12 elements a batch, element by element for B = 1, along directions for B = 8.
    for (int B = 1; B <= 8; B += 7)
        for (uint64_t seed = 1; seed <= 5; seed++) {
            ag_tape_check_report r = check_masked(AG_F64, B, 4, BUG_NONE, seed);
            CHECK(r.verdict == AG_CHECK_PASS && r.n_nodes == 7);
            for (int i = 0; i < r.n_nodes; i++)
                CHECK(r.nodes[i].fd.verdict == AG_CHECK_PASS && r.nodes[i].replay_diff == 0 &&
                      r.nodes[i].fd.comparisons > 0);
            CHECK(r.nodes[2].fd.elementwise == (B == 1));
            // The inputs of softmax_dim and logsumexp hold 6 -inf a batch: left unperturbed.
            CHECK(r.nodes[0].fd.not_finite == 0 && r.nodes[2].fd.not_finite == 6 * B);
            if (r.verdict == AG_CHECK_FAIL) ag_tape_check_print(&r, stderr);
            ag_tape_check_report_free(&r);
        }
}

static void test_wrong_op_among_minus_inf_is_named(void) {
    for (int B = 1; B <= 8; B += 7)
        for (uint64_t seed = 1; seed <= 5; seed++) {
            ag_tape_check_report r = check_masked(AG_F64, B, 4, BUG_MISSING_FACTOR, seed);
            CHECK(r.verdict == AG_CHECK_FAIL && r.first_failure == 1 && r.n_failed == 1);
            CHECK(strcmp(r.nodes[1].op, "my_scale") == 0);
            ag_tape_check_report_free(&r);
        }
}

// A leaf holding -inf (logsumexp over a row with masked entries, one row all -inf).
static void test_minus_inf_leaf_into_logsumexp_and_log_softmax_passes(void) {
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){4, 5}, 21);
    for (size_t i = 0; i < 20; i += 3) ag_tensor_set_item(x, i, -INFINITY);
    for (size_t i = 15; i < 20; i++) ag_tensor_set_item(x, i, -INFINITY);  // row 3: all -inf
    ag_tape *tp = ag_tape_new();
    ag_tensor *lse = ag_logsumexp(tp, x, -1, false);
    ag_tensor *ls = ag_log_softmax(tp, x, 0);  // along columns: -inf stays -inf
    ag_tensor *m = ag_masked_fill(tp, ls, ag_tape_tensor(tp, AG_BOOL, 0, NULL), 0);
    (void)lse, (void)m;
    ag_tape_check_report r;
    CHECK(ag_tape_check(tp, NULL, &r));
    for (int i = 0; i < r.n_nodes; i++) CHECK(r.nodes[i].replay_diff == 0);
    CHECK(r.nodes[0].fd.not_finite == 10 && r.nodes[1].fd.not_finite == 10);
    if (r.verdict == AG_CHECK_FAIL) ag_tape_check_print(&r, stderr);
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// log(x + 1e-10) at x = 0, the entropy of masked attention weights: a step of eps would
// take log below 0, so the step shrinks; a wrong op after it is still named.
static void test_log_closer_to_zero_than_eps_passes_and_a_wrong_op_is_still_named(void) {
    for (int bug = 0; bug < 2; bug++) {
        // 120 elements: along directions
        ag_tensor *x = requiring_grad(uniform_tensor(AG_F64, 2, (int[]){3, 40}, 22, 0.1, 1));
        for (size_t i = 0; i < 120; i += 4) ag_tensor_set_item(x, i, 1e-10);
        ag_tape *tp = ag_tape_new();
        proj_params p = {0.5, bug ? BUG_MISSING_FACTOR : BUG_NONE};
        ag_tensor *l = ag_log(tp, x);
        ag_op_apply(tp, &scale_op, 1, &l, l->ndim, l->shape, &p, sizeof p);
        ag_tape_check_report r;
        CHECK(ag_tape_check(tp, NULL, &r) == !bug);
        CHECK(r.nodes[0].fd.verdict == AG_CHECK_PASS && r.nodes[0].fd.smaller_steps == 1);
        CHECK(r.nodes[1].fd.smaller_steps == 0);
        CHECK(r.first_failure == (bug ? 1 : -1));
        if ((r.verdict == AG_CHECK_PASS) == bug) ag_tape_check_print(&r, stderr);
        ag_tape_check_report_free(&r);
        ag_tape_free(tp);
        ag_tensor_free(x);
    }
}

// ---- f32 tapes ------------------------------------------------------------------------------

static ag_tape_check_report check_graph_with(ag_dtype dt, int B, int T, int E, bug_kind bug,
                                             uint64_t seed, const ag_tape_check_opts *o) {
    mha_graph g;
    mha_graph_init(&g, dt, B, T, E, seed);
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, mha_graph_forward(tp, &g, bug));
    ag_tape_check_report r;
    ag_tape_check(tp, o, &r);
    ag_tape_free(tp);
    mha_graph_free(&g);
    return r;
}

// Every built-in f32 node runs through its op's f64 twin, and agrees with it; the custom op
// has none and is checked in f32.
static void test_f32_built_in_nodes_are_checked_through_their_f64_twins(void) {
    ag_tape_check_report r = check_graph(AG_F32, 2, 4, 8, BUG_NONE, 1);
    CHECK(r.verdict == AG_CHECK_PASS && r.n_nodes == 23);
    for (int i = 0; i < r.n_nodes; i++) {
        const ag_tape_check_entry *e = &r.nodes[i];
        bool custom = i == CUSTOM_NODE;
        CHECK(e->in_f64 == !custom && e->replay_diff == 0);
        CHECK(custom ? e->f32_vs_f64 == -1 : e->f32_vs_f64 >= 0 && e->f32_vs_f64 < 1e-5);
        // f64 differences: as tight as on an f64 tape
        if (!custom) CHECK(e->fd.max_rel_err < 1e-5);
    }
    CHECK(r.nodes[CUSTOM_NODE].fd.comparisons == 2 * 16);  // two inputs, 16 directions each
    if (r.verdict == AG_CHECK_FAIL) ag_tape_check_print(&r, stderr);
    ag_tape_check_report_free(&r);
}

// The custom op in the middle of the f32 graph, wrong in each way: named, and only it, for
// every seed; the correct graph passes for every seed. (Two directions at rtol 2e-2, the
// old f32 settings, missed 3 of these 180 variants in the first 60 seeds.)
static void test_f32_planted_bugs_are_named_for_every_seed(void) {
    int missed = 0, false_failures = 0;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        bool small = seed % 4 == 0;  // one seed in four: element by element
        int B = small ? 1 : 2, T = small ? 2 : 4, E = small ? 4 : 8;
        ag_tape_check_opts o = opts_with_seed(seed);
        ag_tape_check_report r = check_graph_with(AG_F32, B, T, E, BUG_NONE, seed, &o);
        if (r.verdict == AG_CHECK_FAIL) false_failures++, ag_tape_check_print(&r, stderr);
        ag_tape_check_report_free(&r);
        for (bug_kind bug = BUG_MISSING_FACTOR; bug <= BUG_ASSIGN; bug++) {
            r = check_graph_with(AG_F32, B, T, E, bug, seed, &o);
            bool named = r.first_failure == CUSTOM_NODE && r.n_failed == 1 &&
                         r.nodes[CUSTOM_NODE].fd.elementwise == small;
            if (!named) missed++, fprintf(stderr, "  bug %d, seed %d\n", bug, (int)seed);
            ag_tape_check_report_free(&r);
        }
    }
    CHECK(missed == 0 && false_failures == 0);
}

// A custom op that handles both dtypes names itself as its f64 twin: then it is checked in
// f64 like a built-in, and a wrong backward is named by f64 differences.
static void test_custom_op_naming_its_twin_is_checked_in_f64(void) {
    const ag_op *twins[] = {&proj_op, &proj_op};
    for (uint64_t seed = 1; seed <= 5; seed++)
        for (bug_kind bug = BUG_NONE; bug <= BUG_ASSIGN; bug++) {
            ag_tape_check_opts o = opts_with_seed(seed);
            o.f64_twins = twins;
            o.n_f64_twins = 1;
            ag_tape_check_report r = check_graph_with(AG_F32, 2, 4, 8, bug, seed, &o);
            const ag_tape_check_entry *e = &r.nodes[CUSTOM_NODE];
            CHECK(e->in_f64 && e->fd.comparisons == 2);  // f64: one direction an input
            if (bug == BUG_NONE)
                CHECK(r.verdict == AG_CHECK_PASS && e->fd.max_rel_err < 1e-5 &&
                      e->f32_vs_f64 < 1e-5);
            else CHECK(r.first_failure == CUSTOM_NODE && r.n_failed == 1);
            ag_tape_check_report_free(&r);
        }
}

// A bug only the f32 variant has (0.1% in dx) is below what float32 differences can see;
// against its f64 twin it shows, and the report says where.
static void test_f32_only_bug_is_named_by_the_comparison_with_the_twin(void) {
    const ag_op *twins[] = {&proj_op, &proj_op};
    ag_tape_check_opts o = opts_with_seed(7);
    o.f64_twins = twins;
    o.n_f64_twins = 1;
    ag_tape_check_report r = check_graph_with(AG_F32, 2, 4, 8, BUG_SLIGHT_IN_F32, 7, &o);
    CHECK(r.verdict == AG_CHECK_FAIL && r.first_failure == CUSTOM_NODE && r.n_failed == 1);
    const ag_tape_check_entry *e = &r.nodes[CUSTOM_NODE];
    CHECK(!e->f32_agrees && e->f32_vs_f64_input == 0);
    CHECK(e->f32_vs_f64 > 5e-4 && e->f32_vs_f64 < 2e-3);
    CHECK(e->fd.max_rel_err < 1e-6);  // the twin itself is right
    char buf[8192];
    print_report(&r, buf, sizeof buf);
    CHECK(strstr(buf, "first failing node: #14 my_proj") != NULL);
    CHECK(strstr(buf, "its f32 gradient of input 0 differs from its f64 twin's by 1.00e-03") !=
          NULL);
    ag_tape_check_report_free(&r);
}

// ---- The copy-task model's whole training tape ------------------------------------------------

static double now_seconds(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_copy_task(ag_dtype dt, model_config cfg, int B, int T, const char *what) {
    model m;
    CHECK(model_init(&m, &cfg, dt, 1));
    int32_t *ids = malloc(sizeof *ids * (size_t)(B * T));
    int32_t *targets = malloc(sizeof *targets * (size_t)(B * T));
    ag_pcg32 rng = ag_pcg32_make(4, 5);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(ag_pcg32_next(&rng) % (uint32_t)cfg.vocab);
        // The copy task scores only the second half: the first is ignored.
        int32_t t = (int32_t)(ag_pcg32_next(&rng) % (uint32_t)cfg.vocab);
        targets[i] = i % T < T / 2 ? AG_IGNORE_INDEX : t;
    }
    model_input in = {.B = B, .T = T, .ids = ids, .training = true, .dropout_seed = 9};
    ag_tape *tp = ag_tape_new();
    // One training step (forward and backward), timed as the unit of cost: the best of 3.
    double step = INFINITY;
    for (int rep = 0; rep < 3; rep++) {
        ag_tape_reset(tp);
        double t0 = now_seconds();
        ag_tensor *loss = ag_cross_entropy(tp, model_forward(tp, &m, &in, NULL), targets,
                                           (size_t)B * T, AG_IGNORE_INDEX);
        ag_backward(tp, loss);
        step = fmin(step, now_seconds() - t0);
    }
    ag_tape_check_report r;
    bool ok = ag_tape_check(tp, NULL, &r);
    CHECK(ok);
    CHECK(r.n_nodes == ag_tape_num_nodes(tp) && r.n_nodes >= 10);
    for (int i = 0; i < r.n_nodes; i++)
        CHECK(r.nodes[i].fd.verdict == AG_CHECK_PASS && r.nodes[i].replay_diff == 0 &&
              r.nodes[i].in_f64);
    if (!ok || getenv("AG_SHOW_TAPE_CHECK")) ag_tape_check_print(&r, stderr);
    // The cost, for the README.
    fprintf(stderr,
            "  copy-task tape (%s): %d nodes, %ld node forward runs, %.3f s = %.0f training "
            "steps of %.1f ms\n",
            what, r.n_nodes, r.forward_runs, r.seconds, r.seconds / step, 1e3 * step);
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    model_free(&m);
    free(ids);
    free(targets);
}

// The example's default model: d_model 64, 4 heads, 1 layer, batch 64, 32 positions.
static void test_copy_task_training_tape_passes_node_by_node(void) {
    model_config cfg = {.vocab = 12, .d_model = 64, .heads = 4, .layers = 1, .max_len = 64};
    check_copy_task(AG_F64, cfg, 64, 32, "f64, default config");
}

static void test_copy_task_tape_with_dropout_two_layers_and_cross_attention_passes(void) {
    model_config cfg = {.vocab = 12, .d_model = 32, .heads = 4, .layers = 2, .max_len = 64,
                        .dropout = 0.1};
    check_copy_task(AG_F64, cfg, 8, 16, "f64, 2 layers, dropout 0.1");
    cfg.cross = true;
    model m;
    CHECK(model_init(&m, &cfg, AG_F64, 2));
    int32_t src[8 * 16], ids[8 * 16];
    for (int i = 0; i < 8 * 16; i++) src[i] = ids[i] = (int32_t)(i * 7 % 12);
    model_input in = {.B = 8, .T = 16, .ids = ids, .S = 16, .source = src, .training = true,
                      .dropout_seed = 3};
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_cross_entropy(tp, model_forward(tp, &m, &in, NULL), ids, 8 * 16,
                                     AG_IGNORE_INDEX));
    ag_tape_check_report r;
    CHECK(ag_tape_check(tp, NULL, &r));
    if (r.verdict == AG_CHECK_FAIL) ag_tape_check_print(&r, stderr);
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    model_free(&m);
}

// Every node of the f32 tape runs through its f64 twin.
static void test_copy_task_f32_tape_passes_through_the_f64_twins(void) {
    model_config cfg = {.vocab = 12, .d_model = 64, .heads = 4, .layers = 1, .max_len = 64};
    check_copy_task(AG_F32, cfg, 64, 32, "f32, default config");
}

int main(void) {
    RUN(test_correct_mha_graph_passes_every_node);
    RUN(test_missing_factor_is_named_at_its_node);
    RUN(test_wrong_transpose_is_named_at_its_node);
    RUN(test_assign_instead_of_accumulate_is_named_at_its_node);
    RUN(test_small_nodes_are_checked_element_by_element);
    RUN(test_assign_bug_passes_gradcheck_but_not_tape_check);
    RUN(test_check_leaves_values_gradients_and_saved_state_untouched);
    RUN(test_same_seed_gives_the_same_report_twice);
    RUN(test_masks_and_inputs_without_grad_are_not_differentiated);
    RUN(test_nan_input_makes_its_node_inconclusive);
    RUN(test_op_without_backward_fails_with_a_note);
    RUN(test_forward_that_leaves_elements_unwritten_fails);
    RUN(test_bad_options_are_reported_and_check_nothing);
    RUN(test_node_whose_inputs_are_all_nan_is_inconclusive);
    RUN(test_negative_counts_in_options_are_refused);
    RUN(test_report_print_names_the_first_failing_node);
    RUN(test_minus_inf_from_masked_fill_passes_softmax_dim_and_logsumexp);
    RUN(test_wrong_op_among_minus_inf_is_named);
    RUN(test_minus_inf_leaf_into_logsumexp_and_log_softmax_passes);
    RUN(test_log_closer_to_zero_than_eps_passes_and_a_wrong_op_is_still_named);
    RUN(test_f32_built_in_nodes_are_checked_through_their_f64_twins);
    RUN(test_f32_planted_bugs_are_named_for_every_seed);
    RUN(test_custom_op_naming_its_twin_is_checked_in_f64);
    RUN(test_f32_only_bug_is_named_by_the_comparison_with_the_twin);
    RUN(test_copy_task_training_tape_passes_node_by_node);
    RUN(test_copy_task_tape_with_dropout_two_layers_and_cross_attention_passes);
    RUN(test_copy_task_f32_tape_passes_through_the_f64_twins);
    return testing_summary();
}
