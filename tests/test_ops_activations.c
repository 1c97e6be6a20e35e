// ReLU, GELU (both forms) and reshape: values against naive formulas and
// PyTorch, gradients against finite differences, float32 against float64, and
// the messages for bad input.
#include "op_checks.h"

static const test_shape shapes[] = {
    {0, {0}}, {1, {1}}, {1, {7}}, {2, {3, 5}}, {3, {2, 3, 4}}, {4, {2, 1, 3, 2}},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

static ag_tensor *relu_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n, (void)user;
    return ag_relu(tp, in[0]);
}

static ag_tensor *gelu_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return ag_gelu(tp, in[0], *(const ag_gelu_kind *)user);
}

// Keeps every element at least 1e-3 away from 0, where relu has a kink that
// central differences with eps 1e-6 must not straddle.
static void push_away_from_zero(ag_tensor *x) {
    for (size_t i = 0; i < x->numel; i++) {
        double v = ag_tensor_item(x, i);
        ag_tensor_set_item(x, i, v < 0 ? v - 1e-3 : v + 1e-3);
    }
}

// ---- ReLU ----------------------------------------------------------------------------

static void test_relu_forward_matches_max_with_zero(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){2, {4, 6}}, 1, -2, 2);
    ag_tensor_set_item(x, 3, 0.0);
    ag_tensor *y = ag_relu(tp, x);
    CHECK(y && y->ndim == 2 && y->shape[0] == 4 && y->shape[1] == 6);
    for (size_t i = 0; i < x->numel; i++) {
        double v = ag_tensor_item(x, i);
        CHECK(ag_tensor_item(y, i) == (v > 0 ? v : 0.0));
    }
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_relu_gradient_at_exactly_zero_is_zero(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){4}, (double[]){-1.0, 0.0, 2.0, -0.0});
    ag_tensor_set_requires_grad(x, true);
    ag_backward(tp, ag_sum(tp, ag_relu(tp, x)));
    CHECK(ag_tensor_grad_item(x, 0) == 0.0);
    CHECK(ag_tensor_grad_item(x, 1) == 0.0);
    CHECK(ag_tensor_grad_item(x, 2) == 1.0);
    CHECK(ag_tensor_grad_item(x, 3) == 0.0);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_relu_keeps_nan(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F32, 1, (int[]){2}, (float[]){NAN, -1.0f});
    ag_tensor *y = ag_relu(tp, x);
    CHECK(isnan(ag_tensor_item(y, 0)));
    CHECK(ag_tensor_item(y, 1) == 0.0);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

// PyTorch 1.13 passes the gradient at a NaN input (its backward zeroes only where the output
// is <= 0): relu'(NaN) = 1, in f32 and f64.
static void test_relu_gradient_at_nan_passes_dy_as_pytorch(void) {
    for (int f = 0; f < 2; f++) {
        ag_tensor *x64 = ag_tensor_from(AG_F64, 1, (int[]){4}, (double[]){NAN, -1, 0, 2});
        ag_tensor *x = requiring_grad(ag_tensor_convert(x64, f ? AG_F64 : AG_F32));
        ag_tape *tp = ag_tape_new();
        ag_backward(tp, ag_sum(tp, ag_relu(tp, x)));
        const double torch_grad[4] = {1, 0, 0, 1};  // torch.relu(x).sum().backward()
        for (size_t k = 0; k < 4; k++) CHECK(ag_tensor_grad_item(x, k) == torch_grad[k]);
        ag_tape_free(tp);
        ag_tensor_free(x), ag_tensor_free(x64);
    }
}

static void test_relu_gradcheck_f64_over_shapes(void) {
    for (int s = 0; s < N_SHAPES; s++) {
        ag_tensor *x = random_tensor(AG_F64, shapes[s], 100 + (uint64_t)s, -2, 2);
        push_away_from_zero(x);
        ag_tensor_set_requires_grad(x, true);
        CHECK(ag_gradcheck(relu_fn, &x, 1, NULL, NULL, NULL));
        ag_tensor_free(x);
    }
}

static void test_relu_f32_matches_f64(void) {
    ag_tensor *x = random_tensor(AG_F64, (test_shape){3, {2, 5, 8}}, 7, -3, 3);
    ag_tensor_set_requires_grad(x, true);
    CHECK(f32_vs_f64_error(relu_fn, &x, 1, NULL) <= 1e-5);
    ag_tensor_free(x);
}

// ---- GELU ----------------------------------------------------------------------------

// From PyTorch 1.13 (/usr/bin/python3), float64:
//   x = torch.tensor([1.0, -0.5, 2.5, -3.0], dtype=torch.float64, requires_grad=True)
//   y = torch.nn.functional.gelu(x, approximate=a); y.sum().backward()
//   print(['%.17g' % v for v in y.tolist()], ['%.17g' % v for v in x.grad.tolist()])
// for a = 'none' and a = 'tanh'.
static const double torch_x[4] = {1.0, -0.5, 2.5, -3.0};
static const double torch_erf_y[4] = {0.84134474606854304, -0.15426876936299344,
                                      2.4844758366855597, -0.0040496940948903104};
static const double torch_erf_dx[4] = {1.0833154705876864, 0.13250487534383712,
                                       1.0376110859081451, -0.01194564720418392};
static const double torch_tanh_y[4] = {0.84119199060827676, -0.15428599017485606,
                                       2.4849157339100012, -0.0036373920817729943};
static const double torch_tanh_dx[4] = {1.0829640838457826, 0.13263009646535764,
                                        1.0379515762126661, -0.011584166630969648};

static void check_against_torch(ag_gelu_kind kind, const double want_y[4],
                                const double want_dx[4]) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){4}, torch_x);
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *y = ag_gelu(tp, x, kind);
    ag_backward(tp, ag_sum(tp, y));
    for (size_t i = 0; i < 4; i++) {
        CHECK_NEAR(ag_tensor_item(y, i), want_y[i], 1e-15);
        CHECK_NEAR(ag_tensor_grad_item(x, i), want_dx[i], 1e-15);
    }
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_gelu_erf_matches_pytorch_values(void) {
    check_against_torch(AG_GELU_ERF, torch_erf_y, torch_erf_dx);
}

static void test_gelu_tanh_matches_pytorch_values(void) {
    check_against_torch(AG_GELU_TANH, torch_tanh_y, torch_tanh_dx);
}

static void test_gelu_of_zero_is_zero_with_slope_one_half(void) {
    ag_gelu_kind kinds[] = {AG_GELU_ERF, AG_GELU_TANH};
    for (int k = 0; k < 2; k++) {
        ag_tape *tp = ag_tape_new();
        ag_tensor *x = ag_tensor_zeros(AG_F64, 0, NULL);
        ag_tensor_set_requires_grad(x, true);
        ag_tensor *y = ag_gelu(tp, x, kinds[k]);
        ag_backward(tp, y);
        CHECK(ag_tensor_item(y, 0) == 0.0);
        CHECK(ag_tensor_grad_item(x, 0) == 0.5);
        ag_tensor_free(x);
        ag_tape_free(tp);
    }
}

// The two forms written out directly in double, as in their definitions.
static double naive_gelu_erf(double x) { return x * 0.5 * (1.0 + erf(x / sqrt(2.0))); }
static double naive_gelu_tanh(double x) {
    const double pi = 3.14159265358979323846;
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / pi) * (x + 0.044715 * pow(x, 3.0))));
}

static void test_gelu_forward_matches_naive_formulas(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){2, {8, 16}}, 3, -6, 6);
    ag_tensor *ye = ag_gelu(tp, x, AG_GELU_ERF), *yt = ag_gelu(tp, x, AG_GELU_TANH);
    for (size_t i = 0; i < x->numel; i++) {
        double v = ag_tensor_item(x, i);
        CHECK_NEAR(ag_tensor_item(ye, i), naive_gelu_erf(v), 1e-14);
        CHECK_NEAR(ag_tensor_item(yt, i), naive_gelu_tanh(v), 1e-14);
    }
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_gelu_forms_differ_slightly(void) {
    // The tanh form approximates the erf form to about 1e-3, but is not it:
    // a wrong switch between the two would pass the tests above only by luck.
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F64, 0, NULL, (double[]){1.0});
    double e = ag_tensor_item(ag_gelu(tp, x, AG_GELU_ERF), 0);
    double t = ag_tensor_item(ag_gelu(tp, x, AG_GELU_TANH), 0);
    CHECK(fabs(e - t) > 1e-4 && fabs(e - t) < 1e-3);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_gelu_gradcheck_f64_over_shapes_both_forms(void) {
    ag_gelu_kind kinds[] = {AG_GELU_ERF, AG_GELU_TANH};
    for (int k = 0; k < 2; k++) {
        for (int s = 0; s < N_SHAPES; s++) {
            ag_tensor *x = random_tensor(AG_F64, shapes[s], 200 + (uint64_t)s, -4, 4);
            ag_tensor_set_requires_grad(x, true);
            CHECK(ag_gradcheck(gelu_fn, &x, 1, &kinds[k], NULL, NULL));
            ag_tensor_free(x);
        }
    }
}

static void test_gelu_f32_matches_f64_both_forms(void) {
    ag_gelu_kind kinds[] = {AG_GELU_ERF, AG_GELU_TANH};
    for (int k = 0; k < 2; k++) {
        ag_tensor *x = random_tensor(AG_F64, (test_shape){3, {2, 5, 8}}, 9, -5, 5);
        ag_tensor_set_requires_grad(x, true);
        CHECK(f32_vs_f64_error(gelu_fn, &x, 1, &kinds[k]) <= 1e-5);
        ag_tensor_free(x);
    }
}

// ---- Reshape -------------------------------------------------------------------------

typedef struct {
    int ndim;
    int shape[AG_MAX_DIMS];
} reshape_to;

static ag_tensor *reshape_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const reshape_to *r = user;
    // Through gelu first, so the gradient reaching reshape is not uniform.
    return ag_reshape(tp, ag_gelu(tp, in[0], AG_GELU_ERF), r->ndim, r->shape);
}

// The f32 kernels compute exp and erfc themselves (so that they vectorise):
// element by element, over [-15, 15] and on both sides of every chunk boundary
// (the tensor spans several threads' chunks), they stay within rounding of the
// f64 values, and in the negative tail of the erf form within 2e-5 relative
// (down to -5: further out the f64 op itself loses digits to 1 + erf(x)).
static void test_gelu_f32_is_within_rounding_of_f64_elementwise_at_any_size(void) {
    enum { N = 60001 };
    ag_tensor *x64 = ag_tensor_zeros(AG_F64, 1, (int[]){N});
    for (int i = 0; i < N; i++) ag_tensor_set_item(x64, (size_t)i, -15 + 30.0 * i / (N - 1));
    ag_tensor *x32 = requiring_grad(ag_tensor_convert(x64, AG_F32));
    ag_tensor_free(x64);
    x64 = requiring_grad(ag_tensor_convert(x32, AG_F64));  // the very same inputs
    ag_threads_set(2);
    for (int kind = 0; kind < 2; kind++) {
        ag_tape *tp = ag_tape_new();
        ag_tensor_zero_grad(x32), ag_tensor_zero_grad(x64);
        ag_tensor *y32 = ag_gelu(tp, x32, (ag_gelu_kind)kind), *y64 = ag_gelu(tp, x64, (ag_gelu_kind)kind);
        ag_backward(tp, ag_sum(tp, y32)), ag_backward(tp, ag_sum(tp, y64));
        size_t bad = 0, bad_tail = 0;
        for (size_t i = 0; i < N; i++) {
            double x = ag_tensor_item(x64, i), a = ag_tensor_item(y32, i), b = ag_tensor_item(y64, i);
            bad += fabs(a - b) > 4e-7 * (1 + fabs(x));
            bad += fabs(ag_tensor_grad_item(x32, i) - ag_tensor_grad_item(x64, i)) > 4e-7 * (1 + fabs(x));
            if (kind == AG_GELU_ERF && x < -1 && x > -5) bad_tail += fabs(a - b) > 2e-5 * fabs(b);
        }
        CHECK(bad == 0 && bad_tail == 0);
        ag_tape_free(tp);
    }
    ag_threads_set(1);
    ag_tensor_free(x32), ag_tensor_free(x64);
}

static void test_gelu_keeps_nan_in_f32_and_f64_both_forms(void) {
    for (int dt = 0; dt < 2; dt++)
        for (int kind = 0; kind < 2; kind++) {
            ag_tensor *x = requiring_grad(ag_tensor_zeros((ag_dtype)dt, 1, (int[]){3}));
            ag_tensor_set_item(x, 1, NAN);
            ag_tape *tp = ag_tape_new();
            ag_tensor *y = ag_gelu(tp, x, (ag_gelu_kind)kind);
            ag_backward(tp, ag_sum(tp, y));
            CHECK(isnan(ag_tensor_item(y, 1)) && isnan(ag_tensor_grad_item(x, 1)));
            CHECK(ag_tensor_item(y, 0) == 0 && ag_tensor_grad_item(x, 0) == 0.5);
            ag_tape_free(tp);
            ag_tensor_free(x);
        }
}

// At -inf and +inf the f32 kernels give what f64's libm formulas give, value and gradient:
// NaN where the formula multiplies an infinity by zero (x Phi(x) at -inf, x phi(x) at both
// ends), as PyTorch does.
static void test_gelu_at_infinities_matches_f64_both_forms(void) {
    for (int kind = 0; kind < 2; kind++) {
        ag_tape *tp = ag_tape_new();
        ag_tensor *x[2], *y[2];
        for (int dt = 0; dt < 2; dt++) {
            x[dt] = requiring_grad(ag_tensor_zeros((ag_dtype)dt, 1, (int[]){2}));
            ag_tensor_set_item(x[dt], 0, -INFINITY);
            ag_tensor_set_item(x[dt], 1, INFINITY);
            y[dt] = ag_gelu(tp, x[dt], (ag_gelu_kind)kind);
            ag_backward(tp, ag_sum(tp, y[dt]));
        }
        for (size_t i = 0; i < 2; i++) {
            double a = ag_tensor_item(y[0], i), b = ag_tensor_item(y[1], i);
            double ga = ag_tensor_grad_item(x[0], i), gb = ag_tensor_grad_item(x[1], i);
            CHECK((isnan(a) && isnan(b)) || a == b);
            CHECK((isnan(ga) && isnan(gb)) || ga == gb);
        }
        ag_tape_free(tp);
        ag_tensor_free(x[0]), ag_tensor_free(x[1]);
    }
}

static void test_reshape_keeps_row_major_order(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F32, (test_shape){3, {2, 3, 4}}, 4, -1, 1);
    ag_tensor *y = ag_reshape(tp, x, 2, (int[]){6, 4});
    CHECK(y && y->ndim == 2 && y->shape[0] == 6 && y->shape[1] == 4 && y->numel == 24);
    CHECK(y->data != x->data);
    for (size_t i = 0; i < x->numel; i++) CHECK(ag_tensor_item(y, i) == ag_tensor_item(x, i));
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_reshape_gradient_flows_back_in_the_same_order(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = random_tensor(AG_F64, (test_shape){2, {3, 4}}, 5, -1, 1);
    ag_tensor_set_requires_grad(x, true);
    ag_tensor *y = ag_reshape(tp, x, 3, (int[]){2, 2, 3});
    ag_tensor *dy = random_tensor(AG_F64, (test_shape){3, {2, 2, 3}}, 6, -1, 1);
    ag_backward_with(tp, y, dy);
    for (size_t i = 0; i < x->numel; i++) CHECK(ag_tensor_grad_item(x, i) == ag_tensor_item(dy, i));
    ag_tensor_free(dy);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_reshape_gradcheck_f64_over_shapes(void) {
    const struct {
        test_shape from;
        reshape_to to;
    } cases[] = {
        {{0, {0}}, {1, {1}}},          {{1, {1}}, {0, {0}}},
        {{1, {12}}, {2, {3, 4}}},      {{2, {3, 4}}, {3, {2, 3, 2}}},
        {{3, {2, 3, 4}}, {1, {24}}},   {{4, {2, 1, 3, 2}}, {4, {1, 3, 2, 2}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ag_tensor *x = random_tensor(AG_F64, cases[c].from, 300 + c, -2, 2);
        ag_tensor_set_requires_grad(x, true);
        reshape_to to = cases[c].to;
        CHECK(ag_gradcheck(reshape_fn, &x, 1, &to, NULL, NULL));
        ag_tensor_free(x);
    }
}

static void test_reshape_f32_matches_f64(void) {
    ag_tensor *x = random_tensor(AG_F64, (test_shape){3, {2, 3, 4}}, 8, -3, 3);
    ag_tensor_set_requires_grad(x, true);
    reshape_to to = {2, {4, 6}};
    CHECK(f32_vs_f64_error(reshape_fn, &x, 1, &to) <= 1e-5);
    ag_tensor_free(x);
}

// ---- Bad input -------------------------------------------------------------------------

static void test_reshape_to_a_different_numel_names_both_shapes(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_F32, 2, (int[]){2, 3});
    testing_catch_errors();
    CHECK(ag_reshape(tp, x, 2, (int[]){4, 2}) == NULL);
    CHECK(strcmp(testing_last_error,
                 "reshape: cannot reshape [2,3] (6 elements) to [4,2] (8 elements)") == 0);
    CHECK(ag_reshape(tp, x, 2, (int[]){-2, -3}) == NULL);
    CHECK(strcmp(testing_last_error,
                 "reshape: dimension 0 has extent -2, extents must be >= 1") == 0);
    CHECK(ag_reshape(tp, x, 2, NULL) == NULL);
    CHECK(strcmp(testing_last_error, "reshape: shape is NULL for 2 dimensions (x [2,3])") == 0);
    CHECK(testing_error_count == 3);
    testing_release_errors();
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_gelu_unknown_kind_is_an_error(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_zeros(AG_F32, 2, (int[]){2, 3});
    testing_catch_errors();
    CHECK(ag_gelu(tp, x, (ag_gelu_kind)7) == NULL);
    CHECK(strcmp(testing_last_error,
                 "gelu: unknown kind 7 (AG_GELU_ERF or AG_GELU_TANH) for x [2,3]") == 0);
    CHECK(testing_error_count == 1);
    testing_release_errors();
    ag_tensor_free(x);
    ag_tape_free(tp);
}

static void test_activations_reject_non_float_and_null_input(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *mask = ag_tensor_zeros(AG_BOOL, 2, (int[]){2, 3});
    testing_catch_errors();
    CHECK(ag_relu(tp, mask) == NULL);
    CHECK(strcmp(testing_last_error, "relu: x [2,3] must be f32 or f64, not bool") == 0);
    CHECK(ag_gelu(tp, mask, AG_GELU_TANH) == NULL);
    CHECK(strcmp(testing_last_error, "gelu: x [2,3] must be f32 or f64, not bool") == 0);
    CHECK(ag_reshape(tp, NULL, 1, (int[]){6}) == NULL);
    CHECK(strcmp(testing_last_error, "reshape: x is NULL") == 0);
    CHECK(testing_error_count == 3);
    testing_release_errors();
    ag_tensor_free(mask);
    ag_tape_free(tp);
}

// float32 GELU keeps its negative tail: PyTorch 1.13's float32 GELU computes 1 + erf(x / sqrt 2)
// (or 1 + tanh(u)), which cancels: -1.490e-6 at x = -5 (tanh form -2.98e-7) and 0 from -6
// down (README). Here, within float32 rounding of the exact values x Phi(x) and x / (1 +
// e^(-2u)) (PyTorch float64's -1.4332578593401202e-06 and -2.2917961972623857e-07 at -5);
// the tanh form's value at -12, 2.5e-61, is no float: 0.
static void test_gelu_float32_keeps_the_negative_tail_pytorch_cancels(void) {
    const double xs[3] = {-5, -8, -12};
    const double k = sqrt(2 / 3.14159265358979323846);
    ag_tensor *x = ag_tensor_from(AG_F32, 1, (int[]){3}, (float[]){-5, -8, -12});
    ag_tape *tp = ag_tape_new();
    ag_tensor *ye = ag_gelu(tp, x, AG_GELU_ERF), *yt = ag_gelu(tp, x, AG_GELU_TANH);
    for (int i = 0; i < 3; i++) {
        const double v = xs[i], u = k * (v + 0.044715 * v * v * v);
        const double erf_form = v * 0.5 * erfc(-v / sqrt(2.0)), tanh_form = v / (1 + exp(-2 * u));
        CHECK(ag_tensor_item(ye, (size_t)i) < 0);
        CHECK_NEAR(ag_tensor_item(ye, (size_t)i) / erf_form, 1, 1e-5);
        if (i < 2) CHECK_NEAR(ag_tensor_item(yt, (size_t)i) / tanh_form, 1, 1e-5);
    }
    CHECK(ag_tensor_item(yt, 2) == 0);
    CHECK_NEAR(ag_tensor_item(ye, 0), -1.4332578593401202e-06, 1e-11);
    CHECK_NEAR(ag_tensor_item(yt, 0), -2.2917961972623857e-07, 1e-12);
    ag_tensor_free(x);
    ag_tape_free(tp);
}

int main(void) {
    RUN(test_relu_forward_matches_max_with_zero);
    RUN(test_relu_gradient_at_exactly_zero_is_zero);
    RUN(test_relu_keeps_nan);
    RUN(test_relu_gradient_at_nan_passes_dy_as_pytorch);
    RUN(test_relu_gradcheck_f64_over_shapes);
    RUN(test_relu_f32_matches_f64);
    RUN(test_gelu_erf_matches_pytorch_values);
    RUN(test_gelu_tanh_matches_pytorch_values);
    RUN(test_gelu_of_zero_is_zero_with_slope_one_half);
    RUN(test_gelu_forward_matches_naive_formulas);
    RUN(test_gelu_float32_keeps_the_negative_tail_pytorch_cancels);
    RUN(test_gelu_forms_differ_slightly);
    RUN(test_gelu_gradcheck_f64_over_shapes_both_forms);
    RUN(test_gelu_f32_matches_f64_both_forms);
    RUN(test_gelu_f32_is_within_rounding_of_f64_elementwise_at_any_size);
    RUN(test_gelu_keeps_nan_in_f32_and_f64_both_forms);
    RUN(test_gelu_at_infinities_matches_f64_both_forms);
    RUN(test_reshape_keeps_row_major_order);
    RUN(test_reshape_gradient_flows_back_in_the_same_order);
    RUN(test_reshape_gradcheck_f64_over_shapes);
    RUN(test_reshape_f32_matches_f64);
    RUN(test_reshape_to_a_different_numel_names_both_shapes);
    RUN(test_gelu_unknown_kind_is_an_error);
    RUN(test_activations_reject_non_float_and_null_input);
    return testing_summary();
}
