// The shared test helpers of op_checks.h catch what they are meant to catch:
// a check built on a helper that always passes would assert nothing.
#include "op_checks.h"

static void test_random_leaf_requires_grad_and_repeats_for_a_seed(void) {
    const int shape[] = {4, 25};
    ag_tensor *a = random_leaf(AG_F64, 2, shape, 3), *b = random_leaf(AG_F64, 2, shape, 3);
    ag_tensor *c = random_leaf(AG_F64, 2, shape, 4);
    CHECK(a->requires_grad);
    CHECK(memcmp(a->data, b->data, a->numel * sizeof(double)) == 0);
    CHECK(memcmp(a->data, c->data, a->numel * sizeof(double)) != 0);
    for (size_t i = 0; i < a->numel; i++)
        CHECK(ag_tensor_item(a, i) >= -1.0 && ag_tensor_item(a, i) < 1.0);
    ag_tensor_free(a);
    ag_tensor_free(b);
    ag_tensor_free(c);
}

static ag_tensor *vector(const double *v, int n) {
    return ag_tensor_from(AG_F64, 1, (int[]){n}, v);
}

static double normwise_of(const double *x, const double *y, int n) {
    ag_tensor *a = vector(x, n), *b = vector(y, n);
    double e = normwise_error(a, b, false);
    ag_tensor_free(a);
    ag_tensor_free(b);
    return e;
}

static void test_normwise_error_is_max_difference_over_max_reference(void) {
    CHECK(normwise_of((double[]){1, 2.5, -4}, (double[]){1, 2, -4}, 3) == 0.5 / 4);
    // An all-zero reference: the plain largest difference.
    CHECK(normwise_of((double[]){0, 1e-3}, (double[]){0, 0}, 2) == 1e-3);
    // Equal infinities agree and stay out of the scale.
    CHECK(normwise_of((double[]){INFINITY, 3}, (double[]){INFINITY, 2}, 2) == 0.5);
}

static void test_normwise_error_is_infinite_for_nan_or_unmatched_infinity(void) {
    CHECK(normwise_of((double[]){NAN, 1}, (double[]){1, 1}, 2) == INFINITY);
    CHECK(normwise_of((double[]){1, 1}, (double[]){NAN, 1}, 2) == INFINITY);
    CHECK(normwise_of((double[]){INFINITY, 1}, (double[]){1, 1}, 2) == INFINITY);
    CHECK(normwise_of((double[]){-INFINITY, 1}, (double[]){INFINITY, 1}, 2) == INFINITY);
    CHECK(normwise_error_f32((float[]){NAN}, (float[]){1}, 1) == INFINITY);
}

static void test_all_close_is_atol_plus_rtol_times_reference(void) {
    ag_tensor *b = vector((double[]){100, 0}, 2);
    ag_tensor *in = vector((double[]){100 + 0.9e-3, 0.9e-6}, 2);
    ag_tensor *out = vector((double[]){100 + 1.1e-3, 0}, 2);
    ag_tensor *nan = vector((double[]){100, NAN}, 2);
    CHECK(all_close(in, b, false, 1e-5, 1e-6));
    CHECK(!all_close(out, b, false, 1e-5, 1e-6));
    CHECK(!all_close(nan, b, false, 1e-5, 1e-6));
    ag_tensor_free(b);
    ag_tensor_free(in);
    ag_tensor_free(out);
    ag_tensor_free(nan);
}

// y = x, with a backward that is off by `f32_slip` (relative) in float32 only.
static void identity_forward(ag_node *n) {
    for (size_t i = 0; i < n->out->numel; i++)
        ag_tensor_set_item(n->out, i, ag_tensor_item(n->in[0], i));
}

static double f32_slip;

static void slipping_backward(ag_node *n) {
    double g = n->out->dtype == AG_F32 ? 1 + f32_slip : 1;
    ag_tensor dx = ag_tensor_grad_view(n->in[0]), dy = ag_tensor_grad_view(n->out);
    for (size_t i = 0; i < n->out->numel; i++)
        ag_tensor_set_item(&dx, i, ag_tensor_item(&dx, i) + g * ag_tensor_item(&dy, i));
}

static const ag_op slipping_identity = {"slipping_identity", identity_forward,
                                        slipping_backward, NULL};

// user: a scale applied to the output in float32 only (1 = none).
static ag_tensor *slipping_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    ag_tensor *y = ag_op_apply(tp, &slipping_identity, 1, in, in[0]->ndim, in[0]->shape, NULL, 0);
    return ag_scale(tp, y, y->dtype == AG_F32 ? *(const double *)user : 1.0);
}

static void test_f32_against_f64_catches_a_wrong_output_or_gradient(void) {
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){3, 7}, 5);
    const double exact = 1.0, off = 1.001;
    f32_slip = 0;
    CHECK(f32_vs_f64_error(slipping_fn, &x, 1, (void *)&exact) <= 1e-6);
    CHECK(f32_close_to_f64(slipping_fn, &x, 1, (void *)&exact, 1e-5, 1e-6));
    // The output is off (and so, through the scale, the gradient).
    CHECK(f32_vs_f64_error(slipping_fn, &x, 1, (void *)&off) > 1e-4);
    CHECK(!f32_close_to_f64(slipping_fn, &x, 1, (void *)&off, 1e-5, 1e-6));
    // Only the gradient is off.
    f32_slip = 1e-3;
    CHECK(f32_vs_f64_error(slipping_fn, &x, 1, (void *)&exact) > 1e-4);
    CHECK(!f32_close_to_f64(slipping_fn, &x, 1, (void *)&exact, 1e-5, 1e-6));
    f32_slip = 0;
    ag_tensor_free(x);
}

static void scale_step(ag_tape *tp, int step, void *user) {
    (void)step;
    ag_tensor *x = user;
    ag_backward(tp, ag_sum(tp, ag_scale(tp, x, 2.0)));
}

// Allocates on the heap in every step but the first, on either thread count.
static void leaky_step(ag_tape *tp, int step, void *user) {
    scale_step(tp, step, user);
    if (step > 0) ag_tensor_free(ag_tensor_zeros(AG_F32, 1, (int[]){8}));
}

static void test_repeated_step_check_catches_an_allocating_step(void) {
    ag_tensor *x = random_leaf(AG_F32, 2, (int[]){16, 16}, 6);
    CHECK(repeated_step_allocates_nothing(scale_step, x));
    CHECK(!repeated_step_allocates_nothing(leaky_step, x));
    CHECK(ag_threads() == 1);
    ag_tensor_free(x);
}

int main(void) {
    RUN(test_random_leaf_requires_grad_and_repeats_for_a_seed);
    RUN(test_normwise_error_is_max_difference_over_max_reference);
    RUN(test_normwise_error_is_infinite_for_nan_or_unmatched_infinity);
    RUN(test_all_close_is_atol_plus_rtol_times_reference);
    RUN(test_f32_against_f64_catches_a_wrong_output_or_gradient);
    RUN(test_repeated_step_check_catches_an_allocating_step);
    return testing_summary();
}
