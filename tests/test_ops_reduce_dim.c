// Reductions along a dim (ag_sum_dim, ag_mean_dim, ag_max_dim, ag_var_dim, ag_logsumexp)
// and the normalisations along a dim (ag_softmax_dim, ag_log_softmax): values against a
// naive loop, float64 gradient checks over every dim (negative too) with and without
// keepdim, float32 against float64, PyTorch's tie rule for max, fully -inf rows, errors,
// threads.
#include <stdlib.h>

#include "general_ops.h"

typedef enum { SUM, MEAN, MAX, VAR_UNBIASED, VAR_BIASED, LSE, SOFTMAX, LOG_SOFTMAX, N_KINDS } kind;
static const char *const names[] = {"sum_dim", "mean_dim", "max_dim", "var_dim(unbiased)",
                                    "var_dim(biased)", "logsumexp", "softmax_dim",
                                    "log_softmax"};

typedef struct {
    kind k;
    int dim;
    bool keepdim;
} red_case;

static ag_tensor *apply(ag_tape *tp, ag_tensor *x, const red_case *c) {
    switch (c->k) {
    case SUM: return ag_sum_dim(tp, x, c->dim, c->keepdim);
    case MEAN: return ag_mean_dim(tp, x, c->dim, c->keepdim);
    case MAX: return ag_max_dim(tp, x, c->dim, c->keepdim);
    case VAR_UNBIASED: return ag_var_dim(tp, x, c->dim, true, c->keepdim);
    case VAR_BIASED: return ag_var_dim(tp, x, c->dim, false, c->keepdim);
    case LSE: return ag_logsumexp(tp, x, c->dim, c->keepdim);
    case SOFTMAX: return ag_softmax_dim(tp, x, c->dim);
    default: return ag_log_softmax(tp, x, c->dim);
    }
}

static ag_tensor *fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return apply(tp, in[0], user);
}

// The naive value of output element (o, i) (or (o, j, i) for the normalisations).
static double naive(const ag_tensor *x, kind k, int d, size_t o, size_t j, size_t i) {
    size_t n = (size_t)x->shape[d], inner = 1;
    for (int q = d + 1; q < x->ndim; q++) inner *= (size_t)x->shape[q];
    double v[64], s = 0, m = -INFINITY;
    for (size_t t = 0; t < n; t++) {
        v[t] = ag_tensor_item(x, (o * n + t) * inner + i);
        s += v[t];
        m = fmax(m, v[t]);
    }
    double mean = s / (double)n, var = 0, se = 0;
    for (size_t t = 0; t < n; t++) var += (v[t] - mean) * (v[t] - mean), se += exp(v[t] - m);
    double lse = m + log(se);
    switch (k) {
    case SUM: return s;
    case MEAN: return mean;
    case MAX: return m;
    case VAR_UNBIASED: return var / (double)(n - 1);
    case VAR_BIASED: return var / (double)n;
    case LSE: return lse;
    case SOFTMAX: return exp(v[j] - lse);
    default: return v[j] - lse;
    }
}

static void test_values_match_naive_loops_along_every_dim(void) {
    ag_tensor *x = normal_tensor(AG_F64, 3, (int[]){3, 4, 5}, 1, 0, 2);
    ag_tape *tp = ag_tape_new();
    for (int k = 0; k < N_KINDS; k++)
        for (int d = 0; d < 3; d++) {
            red_case c = {(kind)k, d - 3, false};  // dims given negative
            ag_tensor *y = apply(tp, x, &c);
            size_t n = (size_t)x->shape[d], inner = 1, outer = 1;
            for (int q = 0; q < d; q++) outer *= (size_t)x->shape[q];
            for (int q = d + 1; q < 3; q++) inner *= (size_t)x->shape[q];
            bool normalises = k >= SOFTMAX;
            CHECK(y->numel == (normalises ? x->numel : x->numel / n));
            for (size_t o = 0; o < outer; o++)
                for (size_t j = 0; j < (normalises ? n : 1); j++)
                    for (size_t i = 0; i < inner; i++) {
                        size_t at = normalises ? (o * n + j) * inner + i : o * inner + i;
                        CHECK_NEAR(ag_tensor_item(y, at), naive(x, (kind)k, d, o, j, i), 1e-13);
                    }
        }
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_keepdim_keeps_the_dim_as_one(void) {
    ag_tensor *x = leaf(3, (int[]){2, 3, 4}, 2);
    ag_tape *tp = ag_tape_new();
    ag_tensor *a = ag_sum_dim(tp, x, 1, true), *b = ag_max_dim(tp, x, -1, false);
    CHECK(a->ndim == 3 && a->shape[0] == 2 && a->shape[1] == 1 && a->shape[2] == 4);
    CHECK(b->ndim == 2 && b->shape[0] == 2 && b->shape[1] == 3);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_gradcheck_and_f32_every_dim_with_and_without_keepdim(void) {
    const test_shape shapes[] = {{1, {5}}, {2, {3, 1}}, {3, {2, 3, 4}}, {4, {2, 1, 3, 2}}};
    for (int k = 0; k < N_KINDS; k++)
        for (int s = 0; s < 4; s++)
            for (int d = -shapes[s].ndim; d < shapes[s].ndim; d++)
                for (int keep = 0; keep < 2; keep++) {
                    int size = shapes[s].shape[d < 0 ? d + shapes[s].ndim : d];
                    if ((k == VAR_UNBIASED && size < 2) || (k >= SOFTMAX && keep)) continue;
                    red_case c = {(kind)k, d, keep != 0};
                    ag_tensor *x = requiring_grad(
                        random_tensor(AG_F64, shapes[s], 10 + (uint64_t)s, -2, 2));
                    char label[64];
                    snprintf(label, sizeof label, "%s shape %d dim %d keepdim %d", names[k], s,
                             d, keep);
                    CHECK(op_checks_pass(label, fn, &x, 1, &c));
                    ag_tensor_free(x);
                }
}

static void test_max_ties_send_the_gradient_to_the_first_index(void) {
    ag_tensor *x = requiring_grad(ag_tensor_from(AG_F64, 2, (int[]){2, 4},
                                                 (double[]){1, 3, 3, 2, 5, 5, 5, 5}));
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, ag_max_dim(tp, x, 1, false)));
    const double want[] = {0, 1, 0, 0, 1, 0, 0, 0};
    for (size_t k = 0; k < 8; k++) CHECK(ag_tensor_grad_item(x, k) == want[k]);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_max_of_a_row_with_nan_is_nan(void) {
    ag_tensor *x = ag_tensor_from(AG_F64, 2, (int[]){2, 3}, (double[]){1, NAN, 2, 1, 2, 3});
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_max_dim(tp, x, -1, false);
    CHECK(isnan(ag_tensor_item(y, 0)) && ag_tensor_item(y, 1) == 3);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// A fully -inf row (everything masked): logsumexp -inf, softmax zeros, log_softmax -inf,
// and zero (never NaN) gradients; a partly -inf row is an ordinary softmax over the rest.
// Its -inf entry j gets zero gradient from softmax (p_j = 0) but its own dy_j from
// log_softmax: dx_j = dy_j - p_j sum(dy) = dy_j (by hand; PyTorch 1.13 gives the same).
static void test_fully_minus_infinity_rows_give_zero_gradient(void) {
    ag_tensor *x = requiring_grad(ag_tensor_from(AG_F64, 2, (int[]){2, 3},
                                                 (double[]){-INFINITY, -INFINITY, -INFINITY,
                                                            0.5, -INFINITY, 1.5}));
    ag_tape *tp = ag_tape_new();
    for (int k = LSE; k <= LOG_SOFTMAX; k++) {
        ag_tensor_zero_grad(x);
        red_case c = {(kind)k, -1, false};
        ag_tensor *y = apply(tp, x, &c);
        if (k == LSE) CHECK(ag_tensor_item(y, 0) == -INFINITY);
        if (k == SOFTMAX) {
            for (size_t j = 0; j < 3; j++) CHECK(ag_tensor_item(y, j) == 0);
            CHECK(ag_tensor_item(y, 4) == 0);
            CHECK_NEAR(ag_tensor_item(y, 3) + ag_tensor_item(y, 5), 1, 1e-15);
        }
        if (k == LOG_SOFTMAX) CHECK(ag_tensor_item(y, 0) == -INFINITY);
        ag_tensor *dy = uniform_tensor(AG_F64, y->ndim, y->shape, 7, -1, 1);
        ag_backward_with(tp, y, dy);
        CHECK(grad_all_finite(x));
        for (size_t j = 0; j < 3; j++) CHECK(ag_tensor_grad_item(x, j) == 0);
        if (k == SOFTMAX) CHECK(ag_tensor_grad_item(x, 4) == 0);
        if (k == LOG_SOFTMAX) CHECK(ag_tensor_grad_item(x, 4) == ag_tensor_item(dy, 4));
        ag_tensor_free(dy);
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_large_logits_stay_finite(void) {
    ag_tensor *x =
        requiring_grad(ag_tensor_from(AG_F32, 1, (int[]){3}, (float[]){1000, 999, -1000}));
    ag_tape *tp = ag_tape_new();
    ag_tensor *l = ag_logsumexp(tp, x, 0, false);
    CHECK_NEAR(ag_tensor_item(l, 0), 1000 + log(1 + exp(-1.0)), 1e-6);
    ag_backward(tp, ag_add(tp, l, ag_sum(tp, ag_log_softmax(tp, x, 0))));
    CHECK(grad_all_finite(x));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// float32 softmax_dim and log_softmax keep their accuracy whatever the logits' common
// offset: at [1e4, 1e4 + 1] the probabilities sum to 1 (they summed to 0.99979, with
// exp(x - lse) and lse rounded to float) and log_softmax is exact to float rounding (it
// was off by 2e-4). Over offsets up to 1e4 the relative error against float64 on the same
// inputs stays at float rounding, a few units of 6e-8 (x_j - m rounded, then exp and the
// division; PyTorch about 2e-7; it was 4.8e-4 at 1e4).
static void test_float32_accuracy_does_not_depend_on_the_offset(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *x = ag_tensor_from(AG_F32, 1, (int[]){2}, (float[]){1e4f, 1e4f + 1});
    ag_tensor *p = ag_softmax_dim(tp, x, 0), *lp = ag_log_softmax(tp, x, 0);
    const double p0 = 1 / (1 + exp(1.0)), p1 = 1 / (1 + exp(-1.0));  // 0.26894, 0.73106
    CHECK(fabs(ag_tensor_item(p, 0) - p0) <= 3e-8 && fabs(ag_tensor_item(p, 1) - p1) <= 6e-8);
    CHECK(fabs(ag_tensor_item(p, 0) + ag_tensor_item(p, 1) - 1) <= 1.2e-7);
    CHECK(fabs(ag_tensor_item(lp, 0) - log(p0)) <= 1.2e-7);
    CHECK(fabs(ag_tensor_item(lp, 1) - log(p1)) <= 3e-8);
    ag_tensor_free(x);
    const double offsets[] = {0, 1e3, 1e4, -1e4};
    for (int o = 0; o < 4; o++) {
        ag_tensor *x32 = uniform_tensor(AG_F32, 2, (int[]){8, 16}, 40 + (uint64_t)o, -4, 4);
        for (size_t i = 0; i < x32->numel; i++)
            ag_tensor_set_item(x32, i, ag_tensor_item(x32, i) + offsets[o]);
        ag_tensor *x64 = ag_tensor_convert(x32, AG_F64);  // the same numbers, exactly
        ag_tensor *y32[2] = {ag_softmax_dim(tp, x32, 1), ag_log_softmax(tp, x32, 1)};
        ag_tensor *y64[2] = {ag_softmax_dim(tp, x64, 1), ag_log_softmax(tp, x64, 1)};
        double worst[2] = {0, 0};
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < x32->numel; i++) {
                double a = ag_tensor_item(y32[k], i), b = ag_tensor_item(y64[k], i);
                worst[k] = fmax(worst[k], fabs(a - b) / fmax(fabs(b), 1e-3));
            }
        if (worst[0] > 5e-7 || worst[1] > 5e-7)
            fprintf(stderr, "  offset %g: softmax %.2e, log_softmax %.2e relative\n",
                    offsets[o], worst[0], worst[1]);
        CHECK(worst[0] <= 5e-7 && worst[1] <= 5e-7);
        ag_tensor_free(x32), ag_tensor_free(x64);
    }
    ag_tape_free(tp);
}

// The worst relative error of a against b, over b's elements (relative to max(|b|, floor)).
static double worst_relative(const ag_tensor *a, const ag_tensor *b, const void *a_grad,
                             const void *b_grad, double floor) {
    double worst = 0;
    for (size_t i = 0; i < b->numel; i++) {
        double u = a_grad ? ((const float *)a_grad)[i] : ag_tensor_item(a, i);
        double v = b_grad ? ((const double *)b_grad)[i] : ag_tensor_item(b, i);
        worst = fmax(worst, fabs(u - v) / fmax(fabs(v), floor));
    }
    return worst;
}

// float32 sums along a long dim, against float64 on the same numbers: the mean of 2^18
// values near 100, and the variance (value and gradient) of 2^18 values 1e4 + 1e-2 u, both
// along a contiguous dim and a strided one. The sums ran in float: the mean was off by
// 1e-3 relative, the variance by far more than itself (its mean lost the offset's low
// bits). In double they are at float rounding (PyTorch's float32: about 1e-7).
static void test_float32_long_sums_match_float64(void) {
    const int n = 1 << 18;
    const double offsets[2] = {100, 1e4}, spreads[2] = {1, 1e-2};
    for (int layout = 0; layout < 2; layout++)
        for (int k = 0; k < 2; k++) {
            const int cols = layout ? 3 : 1;
            ag_tensor *u = uniform_tensor(AG_F64, 2, (int[]){n, cols}, 61 + (uint64_t)k, 0, 1);
            ag_tensor *x32 = ag_tensor_zeros(AG_F32, layout + 1, (int[]){n, cols});
            for (size_t i = 0; i < u->numel; i++)
                ((float *)x32->data)[i] = (float)(offsets[k] + spreads[k] * ag_tensor_item(u, i));
            ag_tensor *x64 = ag_tensor_convert(x32, AG_F64);  // the same numbers, exactly
            ag_tensor_set_requires_grad(x32, true);
            ag_tensor_set_requires_grad(x64, true);
            ag_tape *tp = ag_tape_new();
            ag_tensor *y32 = k ? ag_var_dim(tp, x32, 0, true, false) : ag_mean_dim(tp, x32, 0, false);
            ag_tensor *y64 = k ? ag_var_dim(tp, x64, 0, true, false) : ag_mean_dim(tp, x64, 0, false);
            ag_backward(tp, ag_sum(tp, y32));
            ag_backward(tp, ag_sum(tp, y64));
            double value = worst_relative(y32, y64, NULL, NULL, 0);
            // The variance's gradient 2 (x - mu) / (n - 1) crosses 0: relative to its scale.
            double grad = worst_relative(x32, x64, x32->grad, x64->grad, 2 * spreads[k] / n);
            if (value > 1e-6 || grad > 1e-6)
                fprintf(stderr, "  %s, %s dim: value %.2e, gradient %.2e relative\n",
                        k ? "var_dim" : "mean_dim", layout ? "strided" : "contiguous", value,
                        grad);
            CHECK(value <= 1e-6 && grad <= 1e-6);
            ag_tape_free(tp);
            ag_tensor_free(u), ag_tensor_free(x32), ag_tensor_free(x64);
        }
}

// float32 softmax_dim and log_softmax over 2^20 nearly equal logits (|x| < 1e-3), along a
// contiguous and a strided dim, values and gradients against float64 on the same numbers
// (normwise, in the max norm). The sum of the exps (and backward's sums) ran in float:
// softmax was off by 1e-3, log_softmax by 7e-5. In double they are at float rounding,
// about 2e-7.
static void test_float32_long_rows_match_float64(void) {
    const int n = 1 << 20;
    for (int layout = 0; layout < 2; layout++)
        for (int k = 0; k < 2; k++) {
            const int cols = layout ? 2 : 1;
            int shape[2] = {layout ? n : 1, layout ? cols : n};
            const int dim = layout ? 0 : 1;
            ag_tensor *x32 = uniform_tensor(AG_F32, 2, shape, 71 + (uint64_t)k, -1e-3, 1e-3);
            ag_tensor *dy32 = uniform_tensor(AG_F32, 2, shape, 81 + (uint64_t)k, -1, 1);
            ag_tensor *x64 = ag_tensor_convert(x32, AG_F64);  // the same numbers, exactly
            ag_tensor *dy64 = ag_tensor_convert(dy32, AG_F64);
            ag_tensor_set_requires_grad(x32, true);
            ag_tensor_set_requires_grad(x64, true);
            ag_tape *tp = ag_tape_new();
            ag_tensor *y32 = k ? ag_log_softmax(tp, x32, dim) : ag_softmax_dim(tp, x32, dim);
            ag_tensor *y64 = k ? ag_log_softmax(tp, x64, dim) : ag_softmax_dim(tp, x64, dim);
            ag_backward_with(tp, y32, dy32);
            ag_backward_with(tp, y64, dy64);
            double value = normwise_error(y32, y64, false);
            double grad = normwise_error(x32, x64, true);
            if (value > 5e-7 || grad > 5e-7)
                fprintf(stderr, "  %s, %s dim: value %.2e, gradient %.2e normwise\n",
                        k ? "log_softmax" : "softmax_dim", layout ? "strided" : "contiguous",
                        value, grad);
            CHECK(value <= 5e-7 && grad <= 5e-7);
            ag_tape_free(tp);
            ag_tensor_free(x32), ag_tensor_free(x64), ag_tensor_free(dy32), ag_tensor_free(dy64);
        }
}

// A +inf entry makes its whole row NaN, forward and backward, as in PyTorch and ag_softmax
// (softmax gave [nan, 0, 0], log_softmax [nan, -inf, -inf]); logsumexp is +inf there.
static void test_a_plus_infinity_entry_makes_the_row_nan(void) {
    const double inf = INFINITY;
    for (int f = 0; f < 2; f++) {
        ag_tensor *x64 =
            ag_tensor_from(AG_F64, 2, (int[]){2, 3}, (double[]){inf, 0, 0, 1, 2, 3});
        ag_tensor *x = requiring_grad(ag_tensor_convert(x64, f ? AG_F64 : AG_F32));
        ag_tape *tp = ag_tape_new();
        ag_tensor *y[3] = {ag_softmax_dim(tp, x, 1), ag_log_softmax(tp, x, 1),
                           ag_logsumexp(tp, x, 1, false)};
        for (int k = 0; k < 2; k++) {
            for (size_t j = 0; j < 3; j++) CHECK(isnan(ag_tensor_item(y[k], j)));
            for (size_t j = 3; j < 6; j++) CHECK(isfinite(ag_tensor_item(y[k], j)));
            ag_tensor_zero_grad(x);
            ag_tensor *dy = uniform_tensor(x->dtype, 2, (int[]){2, 3}, 5, -1, 1);
            ag_backward_with(tp, y[k], dy);
            for (size_t j = 0; j < 3; j++) CHECK(isnan(ag_tensor_grad_item(x, j)));
            for (size_t j = 3; j < 6; j++) CHECK(isfinite(ag_tensor_grad_item(x, j)));
            ag_tensor_free(dy);
        }
        CHECK(ag_tensor_item(y[2], 0) == inf);
        CHECK_NEAR(ag_tensor_item(y[2], 1), 3 + log(1 + exp(-1.0) + exp(-2.0)), 1e-6);
        ag_tape_free(tp);
        ag_tensor_free(x), ag_tensor_free(x64);
    }
}

static void test_impossible_reductions_are_errors(void) {
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){3, 1});
    ag_tensor *s = ag_tensor_zeros(AG_F64, 0, NULL);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(fails_with(ag_sum_dim(tp, x, 2, false),
                     "sum_dim: dim 2 is out of range for x [3,1] (expected -2 to 1)"));
    CHECK(fails_with(ag_mean_dim(tp, x, -3, true),
                     "mean_dim: dim -3 is out of range for x [3,1] (expected -2 to 1)"));
    CHECK(fails_with(ag_max_dim(tp, s, 0, false),
                     "max_dim: x [] is a scalar: it has no dim 0 to reduce"));
    CHECK(fails_with(ag_var_dim(tp, x, -1, true, false),
                     "var_dim: the unbiased variance needs at least 2 elements along dim -1 of x "
                     "[3,1]"));
    CHECK(fails_with(ag_softmax_dim(tp, s, 0), "softmax_dim: x [] is a scalar: it has no dim 0"));
    CHECK(fails_with(ag_log_softmax(tp, x, 5),
                     "log_softmax: dim 5 is out of range for x [3,1] (expected -2 to 1)"));
    testing_release_errors();
    CHECK(ag_var_dim(tp, x, -1, false, false) != NULL);  // biased: 0 for one element
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(s);
}

static void run_big(ag_tensor *x, float *out, int dim) {
    ag_tensor_zero_grad(x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *a = ag_sum_dim(tp, x, dim, true), *b = ag_var_dim(tp, x, dim, true, true);
    ag_tensor *c = ag_log_softmax(tp, x, dim);
    ag_tensor *y = ag_add(tp, ag_add(tp, ag_mul(tp, a, b), ag_max_dim(tp, x, dim, true)), c);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, y, y)));
    memcpy(out, x->grad, x->numel * sizeof *out);
    memcpy(out + x->numel, y->data, x->numel * sizeof *out);
    ag_tape_free(tp);
}

static void test_two_threads_are_bit_identical_to_one(void) {
    ag_tensor *x = requiring_grad(uniform_tensor(AG_F32, 3, (int[]){8, 300, 200}, 90, -2, 2));
    float *one = malloc(2 * x->numel * sizeof *one), *two = malloc(2 * x->numel * sizeof *two);
    for (int dim = 0; dim < 3; dim++) {
        ag_threads_set(1);
        run_big(x, one, dim);
        ag_threads_set(2);
        run_big(x, two, dim);
        CHECK(memcmp(one, two, 2 * x->numel * sizeof *one) == 0);
    }
    ag_threads_set(1);
    free(one);
    free(two);
    ag_tensor_free(x);
}

// float32 sums run in double: a mean that fits in float32 is finite even where the sum does
// not fit. PyTorch 1.13 sums float32 in float32: its mean of (3e38, 3e38, 1) is inf, and
// so is its sum of (3e38, 3e38, -3e38) (README, "Extreme values").
static void test_float32_sums_past_float_max_stay_finite(void) {
    const float big = 3e38f;
    ag_tensor *x = ag_tensor_from(AG_F32, 2, (int[]){2, 3}, (float[]){big, big, 1, big, big, -big});
    ag_tensor_set_requires_grad(x, true);
    ag_tape *tp = ag_tape_new();
    ag_tensor *m = ag_mean_dim(tp, x, 1, false), *s = ag_sum_dim(tp, x, 1, false);
    CHECK(ag_tensor_item(m, 0) == (float)((2.0 * big + 1) / 3));
    CHECK(ag_tensor_item(m, 1) == (float)(big / 3.0));
    CHECK(ag_tensor_item(s, 1) == big);
    CHECK(isinf(ag_tensor_item(s, 0)));  // 6e38 is no float: inf, as PyTorch's
    CHECK(ag_tensor_item(ag_mean(tp, x), 0) == (float)((3.0 * big + 1) / 6));
    ag_backward(tp, ag_sum(tp, m));
    for (size_t i = 0; i < 6; i++) CHECK(ag_tensor_grad_item(x, i) == (float)(1.0 / 3));
    ag_tensor_free(x);
    ag_tape_free(tp);
}

int main(void) {
    RUN(test_values_match_naive_loops_along_every_dim);
    RUN(test_keepdim_keeps_the_dim_as_one);
    RUN(test_gradcheck_and_f32_every_dim_with_and_without_keepdim);
    RUN(test_max_ties_send_the_gradient_to_the_first_index);
    RUN(test_max_of_a_row_with_nan_is_nan);
    RUN(test_fully_minus_infinity_rows_give_zero_gradient);
    RUN(test_large_logits_stay_finite);
    RUN(test_float32_accuracy_does_not_depend_on_the_offset);
    RUN(test_float32_long_sums_match_float64);
    RUN(test_float32_long_rows_match_float64);
    RUN(test_float32_sums_past_float_max_stay_finite);
    RUN(test_a_plus_infinity_entry_makes_the_row_nan);
    RUN(test_impossible_reductions_are_errors);
    RUN(test_two_threads_are_bit_identical_to_one);
    return testing_summary();
}
