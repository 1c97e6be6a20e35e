// ag_rmsnorm, ag_nll_loss and ag_bce_with_logits: values against their definitions, float64
// gradient checks (E = 1, no weight, ignored targets, a target that requires grad), float32
// against float64, stability for huge logits, infinite logits, errors, threads and memory.
#include <stdlib.h>

#include "general_ops.h"

static void test_rmsnorm_matches_its_definition(void) {
    ag_tensor *x = normal_tensor(AG_F64, 3, (int[]){2, 3, 6}, 1, 0.5, 2);
    ag_tensor *w = normal_tensor(AG_F64, 1, (int[]){6}, 2, 1, 0.5);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_rmsnorm(tp, x, w, 1e-6);
    for (size_t r = 0; r < 6; r++) {
        double ss = 0;
        for (size_t e = 0; e < 6; e++) ss += pow(ag_tensor_item(x, r * 6 + e), 2) / 6;
        for (size_t e = 0; e < 6; e++)
            CHECK_NEAR(ag_tensor_item(y, r * 6 + e),
                       ag_tensor_item(x, r * 6 + e) / sqrt(ss + 1e-6) * ag_tensor_item(w, e), 1e-14);
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(w);
}

static ag_tensor *rmsnorm_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)user;
    return ag_rmsnorm(tp, in[0], n > 1 ? in[1] : NULL, 1e-5);
}

static void test_rmsnorm_gradcheck_with_and_without_weight(void) {
    const test_shape shapes[] = {{1, {5}}, {2, {3, 1}}, {3, {2, 3, 8}}, {4, {2, 1, 2, 4}}};
    for (int s = 0; s < 4; s++)
        for (int with_w = 0; with_w < 2; with_w++) {
            ag_tensor *in[] = {
                requiring_grad(random_tensor(AG_F64, shapes[s], 10 + (uint64_t)s, -2, 2)),
                               leaf(1, &shapes[s].shape[shapes[s].ndim - 1], 20 + (uint64_t)s)};
            char label[48];
            snprintf(label, sizeof label, "rmsnorm shape %d weight %d", s, with_w);
            CHECK(op_checks_pass(label, rmsnorm_fn, in, 1 + with_w, NULL));
            free_tensors(in, 2);
        }
}

typedef struct {
    const int32_t *targets;
    size_t n;
    int32_t ignore;
} nll_case;

static ag_tensor *nll_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const nll_case *c = user;
    return ag_nll_loss(tp, ag_log_softmax(tp, in[0], -1), c->targets, c->n, c->ignore);
}

// float32 RMSNorm on long rows (E = 65536) and over many rows (2^17 rows of 8: the weight's
// gradient sums them), values and gradients against float64 on the same numbers (max-norm
// relative error). The mean of the squares and the weight's gradient were summed in float:
// y was 3e-6 off, dw 6e-6 (PyTorch's float32 composition, x * rsqrt(mean(x^2) + eps) * w:
// about 1e-7). In double they are at float rounding, about 1e-7.
static void test_rmsnorm_float32_long_sums_match_float64(void) {
    const int shapes[2][2] = {{2, 65536}, {1 << 17, 8}};
    for (int c = 0; c < 2; c++) {
        const int E = shapes[c][1];
        ag_tensor *x32 = uniform_tensor(AG_F32, 2, shapes[c], 91, -1, 1);
        ag_tensor *w32 = uniform_tensor(AG_F32, 1, &E, 92, 0.5, 1.5);
        ag_tensor *dy32 = uniform_tensor(AG_F32, 2, shapes[c], 93, -1, 1);
        ag_tensor *x64 = ag_tensor_convert(x32, AG_F64), *w64 = ag_tensor_convert(w32, AG_F64);
        ag_tensor *dy64 = ag_tensor_convert(dy32, AG_F64);  // the same numbers, exactly
        ag_tensor *leaves[4] = {x32, w32, x64, w64};
        for (int k = 0; k < 4; k++) ag_tensor_set_requires_grad(leaves[k], true);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y32 = ag_rmsnorm(tp, x32, w32, 1e-6), *y64 = ag_rmsnorm(tp, x64, w64, 1e-6);
        ag_backward_with(tp, y32, dy32);
        ag_backward_with(tp, y64, dy64);
        const double e[3] = {normwise_error(y32, y64, false), normwise_error(x32, x64, true),
                             normwise_error(w32, w64, true)};
        if (e[0] > 5e-7 || e[1] > 5e-7 || e[2] > 5e-7)
            fprintf(stderr, "  [%d, %d]: y %.2e, dx %.2e, dw %.2e\n", shapes[c][0], E, e[0],
                    e[1], e[2]);
        CHECK(e[0] <= 5e-7 && e[1] <= 5e-7 && e[2] <= 5e-7);
        ag_tape_free(tp);
        for (int k = 0; k < 4; k++) ag_tensor_free(leaves[k]);
        ag_tensor_free(dy32), ag_tensor_free(dy64);
    }
}

static void test_nll_of_log_softmax_equals_cross_entropy(void) {
    ag_tensor *x = leaf(3, (int[]){2, 3, 5}, 30);
    const int32_t t[] = {1, -100, 4, 0, 2, 2};
    ag_tape *tp = ag_tape_new();
    nll_case c = {t, 6, -100};
    ag_tensor *a = nll_fn(tp, &x, 1, &c), *b = ag_cross_entropy(tp, x, t, 6, -100);
    CHECK_NEAR(ag_tensor_item(a, 0), ag_tensor_item(b, 0), 1e-15);
    ag_tape_free(tp);
    CHECK(op_checks_pass("nll_loss", nll_fn, &x, 1, &c));
    nll_case all_ignored = {(const int32_t[]){3, 3, 3, 3, 3, 3}, 6, 3};
    tp = ag_tape_new();
    ag_tensor_zero_grad(x);
    ag_tensor *z = nll_fn(tp, &x, 1, &all_ignored);
    CHECK(ag_tensor_item(z, 0) == 0);
    ag_backward(tp, z);
    for (size_t k = 0; k < x->numel; k++) CHECK(ag_tensor_grad_item(x, k) == 0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// As ag_cross_entropy: the count is checked before any target is read, so a short array
// (here 3 targets for 4 rows, inside a larger buffer so an overread would go unseen) is an
// error naming the count and logp, not a read past its end.
static void test_nll_target_count_other_than_rows_is_an_error(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_F32, 3, (int[]){2, 2, 5});
    const int32_t t[5] = {0, 1, 2, 3, 4};
    testing_catch_errors();
    CHECK(fails_with(ag_nll_loss(tp, x, t, 3, -100),
                     "nll_loss: 3 targets for logp [2,2,5], which has 4 rows"));
    CHECK(fails_with(ag_nll_loss(tp, x, t, 5, -100),
                     "nll_loss: 5 targets for logp [2,2,5], which has 4 rows"));
    testing_release_errors();
    CHECK(ag_nll_loss(tp, x, t, 4, -100) != NULL);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static ag_tensor *bce_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n, (void)user;
    return ag_bce_with_logits(tp, in[0], in[1]);
}

static void test_bce_with_logits_matches_its_definition_and_gradchecks(void) {
    ag_tensor *in[] = {requiring_grad(uniform_tensor(AG_F64, 2, (int[]){3, 4}, 40, -4, 4)),
                       requiring_grad(uniform_tensor(AG_F64, 2, (int[]){3, 4}, 41, 0, 1))};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = bce_fn(tp, in, 2, NULL);
    double ref = 0;
    for (size_t k = 0; k < 12; k++) {
        double x = ag_tensor_item(in[0], k), t = ag_tensor_item(in[1], k), s = 1 / (1 + exp(-x));
        ref -= (t * log(s) + (1 - t) * log(1 - s)) / 12;
    }
    CHECK_NEAR(ag_tensor_item(y, 0), ref, 1e-14);
    ag_tape_free(tp);
    CHECK(op_checks_pass("bce_with_logits", bce_fn, in, 2, NULL));
    ag_tensor_set_requires_grad(in[1], false);
    CHECK(op_checks_pass("bce_with_logits, fixed target", bce_fn, in, 2, NULL));
    free_tensors(in, 2);
}

static void test_bce_with_logits_is_finite_for_huge_logits(void) {
    ag_tensor *x = requiring_grad(ag_tensor_from(AG_F32, 1, (int[]){2}, (float[]){-500, 500}));
    ag_tensor *t = ag_tensor_from(AG_F32, 1, (int[]){2}, (float[]){1, 0});
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_bce_with_logits(tp, x, t);
    CHECK_NEAR(ag_tensor_item(y, 0), 500, 1e-6);
    ag_backward(tp, y);
    CHECK(ag_tensor_grad_item(x, 0) == -0.5f && ag_tensor_grad_item(x, 1) == 0.5f);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(t);
}

// Infinite logits. x = +inf with t < 1 gave NaN (x - x t = inf - inf, and inf * 0 for t = 0)
// where the loss is +inf. PyTorch 1.13, float64:
//   F.binary_cross_entropy_with_logits(tensor([inf]), tensor([t])) = inf for t = 0 and 0.5,
//   nan for t = 1 (0 * inf); its gradient sigmoid(x) - t = 1 - t.
// For x = -inf and t > 0 the loss is -t x = +inf (by hand; PyTorch: nan).
static void test_bce_with_logits_of_infinite_logits(void) {
    const double xs[] = {INFINITY, INFINITY, INFINITY, -INFINITY};
    const double ts[] = {0, 0.5, 1, 0.75};
    const double want[] = {INFINITY, INFINITY, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        ag_tensor *x = requiring_grad(ag_tensor_from(AG_F64, 1, (int[]){1}, &xs[i]));
        ag_tensor *t = ag_tensor_from(AG_F64, 1, (int[]){1}, &ts[i]);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_bce_with_logits(tp, x, t);
        const double v = ag_tensor_item(y, 0);
        CHECK(isnan(want[i]) ? isnan(v) : v == want[i]);
        ag_backward(tp, y);
        CHECK(ag_tensor_grad_item(x, 0) == (xs[i] > 0 ? 1 : 0) - ts[i]);
        ag_tape_free(tp);
        ag_tensor_free(x);
        ag_tensor_free(t);
    }
}

static void test_misuse_is_one_line_naming_the_op_and_shapes(void) {
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){2, 3});
    ag_tensor *w = ag_tensor_zeros(AG_F64, 1, (int[]){4});
    ag_tensor *t = ag_tensor_zeros(AG_F64, 2, (int[]){3, 2});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(fails_with(ag_rmsnorm(tp, x, w, 1e-5),
                     "rmsnorm: w [4] does not match x [2,3] (expected [3])"));
    CHECK(fails_with(ag_rmsnorm(tp, x, NULL, -1),
                     "rmsnorm: eps must be finite and >= 0, got -1; x [2,3]"));
    CHECK(fails_with(ag_nll_loss(tp, x, (const int32_t[]){0, 3}, 2, -100),
                     "nll_loss: target 3 at position 1 is out of range for 3 classes (logp [2,3], "
                     "ignore_index -100)"));
    CHECK(fails_with(ag_bce_with_logits(tp, x, t),
                     "bce_with_logits: shapes differ: [2,3] and [3,2]"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor *all[] = {x, w, t};
    free_tensors(all, 3);
}

static void run_big(ag_tensor *x, ag_tensor *w, float *out) {
    ag_tensor_zero_grad(x);
    ag_tensor_zero_grad(w);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_rmsnorm(tp, x, w, 1e-5);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, y, y)));
    memcpy(out, y->data, x->numel * sizeof *out);
    memcpy(out + x->numel, x->grad, x->numel * sizeof *out);
    memcpy(out + 2 * x->numel, w->grad, w->numel * sizeof *out);
    ag_tape_free(tp);
}

static void test_rmsnorm_two_threads_are_bit_identical_to_one(void) {
    ag_tensor *x = requiring_grad(uniform_tensor(AG_F32, 3, (int[]){16, 64, 256}, 90, -2, 2));
    ag_tensor *w = requiring_grad(uniform_tensor(AG_F32, 1, (int[]){256}, 91, 0.5, 1.5));
    size_t len = 2 * x->numel + 256;
    float *one = malloc(len * sizeof *one), *two = malloc(len * sizeof *two);
    run_big(x, w, one);
    ag_threads_set(2);
    run_big(x, w, two);
    ag_threads_set(1);
    CHECK(memcmp(one, two, len * sizeof *one) == 0);
    free(one);
    free(two);
    ag_tensor_free(x);
    ag_tensor_free(w);
}

static void losses_step(ag_tape *tp, int step, void *user) {
    (void)step;
    ag_tensor *const *t = user;
    static const int32_t targets[] = {0, 1, 2, 3, 0, 1, 2, 3};
    ag_tensor *h = ag_rmsnorm(tp, t[0], t[1], 1e-5);
    ag_tensor *l = ag_add(tp, ag_nll_loss(tp, ag_log_softmax(tp, h, -1), targets, 8, -100),
                          ag_bce_with_logits(tp, h, t[2]));
    ag_backward(tp, l);
}

static void test_repeated_step_allocates_no_heap_memory(void) {
    ag_tensor *t[] = {leaf(2, (int[]){8, 4}, 100), leaf(1, (int[]){4}, 101),
                      uniform_tensor(AG_F64, 2, (int[]){8, 4}, 102, 0, 1)};
    CHECK(repeated_step_allocates_nothing(losses_step, t));
    free_tensors(t, 3);
}

int main(void) {
    RUN(test_rmsnorm_matches_its_definition);
    RUN(test_rmsnorm_gradcheck_with_and_without_weight);
    RUN(test_rmsnorm_float32_long_sums_match_float64);
    RUN(test_nll_of_log_softmax_equals_cross_entropy);
    RUN(test_nll_target_count_other_than_rows_is_an_error);
    RUN(test_bce_with_logits_matches_its_definition_and_gradchecks);
    RUN(test_bce_with_logits_is_finite_for_huge_logits);
    RUN(test_bce_with_logits_of_infinite_logits);
    RUN(test_misuse_is_one_line_naming_the_op_and_shapes);
    RUN(test_rmsnorm_two_threads_are_bit_identical_to_one);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
