// The elementwise functions: ag_neg, ag_exp, ag_log, ag_sqrt, ag_pow, ag_abs, ag_clamp,
// ag_sigmoid, ag_tanh, ag_silu. Values against libm, float64 gradient checks away from
// kinks, float32 against float64, NaN in -> NaN out, PyTorch's gradient at the kinks,
// errors, threads.
#include <stdlib.h>

#include "general_ops.h"

typedef enum { NEG, EXP, LOG, SQRT, POW, ABS, CLAMP, SIGMOID, TANH, SILU, N_FNS } fn_kind;
static const char *const names[] = {"neg", "exp", "log", "sqrt", "pow", "abs", "clamp",
                                    "sigmoid", "tanh", "silu"};

typedef struct {
    fn_kind kind;
    double p, lo, hi;
} fn_case;

static ag_tensor *apply_fn(ag_tape *tp, ag_tensor *x, const fn_case *c) {
    switch (c->kind) {
    case NEG: return ag_neg(tp, x);
    case EXP: return ag_exp(tp, x);
    case LOG: return ag_log(tp, x);
    case SQRT: return ag_sqrt(tp, x);
    case POW: return ag_pow(tp, x, c->p);
    case ABS: return ag_abs(tp, x);
    case CLAMP: return ag_clamp(tp, x, c->lo, c->hi);
    case SIGMOID: return ag_sigmoid(tp, x);
    case TANH: return ag_tanh(tp, x);
    default: return ag_silu(tp, x);
    }
}

static double reference(double x, const fn_case *c) {
    switch (c->kind) {
    case NEG: return -x;
    case EXP: return exp(x);
    case LOG: return log(x);
    case SQRT: return sqrt(x);
    case POW: return pow(x, c->p);
    case ABS: return fabs(x);
    case CLAMP: return fmin(fmax(x, c->lo), c->hi);
    case SIGMOID: return 1 / (1 + exp(-x));
    case TANH: return tanh(x);
    default: return x / (1 + exp(-x));
    }
}

static ag_tensor *fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return apply_fn(tp, in[0], user);
}

// Inputs in (0.2, 3) for log, sqrt and fractional pow; elsewhere (-3, 3) kept 0.05 from 0
// and from clamp's bounds (the kinks, where finite differences straddle two slopes).
static ag_tensor *input_for(const fn_case *c, int ndim, const int *shape, uint64_t seed) {
    bool positive = c->kind == LOG || c->kind == SQRT || (c->kind == POW && c->p != floor(c->p));
    double lo = positive ? 0.2 : -3;
    ag_tensor *x = requiring_grad(uniform_tensor(AG_F64, ndim, shape, seed, lo, 3));
    for (size_t i = 0; i < x->numel; i++) {
        double v = ag_tensor_item(x, i);
        if (fabs(v) < 0.05 || fabs(v - c->lo) < 0.05 || fabs(v - c->hi) < 0.05)
            ag_tensor_set_item(x, i, v + 0.1);
    }
    return x;
}

static const fn_case cases[] = {
    {NEG, 0, 0, 0},     {EXP, 0, 0, 0},       {LOG, 0, 0, 0},     {SQRT, 0, 0, 0},
    {POW, 2, 0, 0},     {POW, 3, 0, 0},       {POW, -1.5, 0, 0},  {POW, 0.5, 0, 0},
    {ABS, 0, 0, 0},     {CLAMP, 0, -1, 0.5},  {CLAMP, 0, -INFINITY, 1}, {SIGMOID, 0, 0, 0},
    {TANH, 0, 0, 0},    {SILU, 0, 0, 0},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static void test_forward_matches_libm(void) {
    ag_tape *tp = ag_tape_new();
    for (int c = 0; c < N_CASES; c++) {
        ag_tensor *x = input_for(&cases[c], 2, (int[]){3, 7}, 1 + (uint64_t)c);
        ag_tensor *y = apply_fn(tp, x, &cases[c]);
        for (size_t k = 0; k < x->numel; k++)
            CHECK_NEAR(ag_tensor_item(y, k), reference(ag_tensor_item(x, k), &cases[c]), 1e-15);
        ag_tensor_free(x);
    }
    ag_tape_free(tp);
}

static void test_gradcheck_and_f32_over_shapes(void) {
    const test_shape shapes[] = {{0, {0}}, {1, {1}}, {2, {3, 5}}, {4, {2, 1, 3, 2}}};
    for (int c = 0; c < N_CASES; c++)
        for (int s = 0; s < 4; s++) {
            ag_tensor *x = input_for(&cases[c], shapes[s].ndim, shapes[s].shape,
                                     10 + (uint64_t)(4 * c + s));
            char label[64];
            snprintf(label, sizeof label, "%s p=%g shape %d", names[cases[c].kind], cases[c].p, s);
            CHECK(op_checks_pass(label, fn, &x, 1, (void *)&cases[c]));
            ag_tensor_free(x);
        }
}

static void test_nan_in_gives_nan_out(void) {
    ag_tensor *x = ag_tensor_from(AG_F64, 1, (int[]){1}, (double[]){NAN});
    ag_tape *tp = ag_tape_new();
    for (int c = 0; c < N_CASES; c++) CHECK(isnan(ag_tensor_item(apply_fn(tp, x, &cases[c]), 0)));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// PyTorch's choices at the kinks: abs'(0) = 0; clamp passes the gradient at both bounds;
// pow with p = 0 has zero gradient even at x = 0.
// PyTorch takes x^0.5 as sqrt and x^-0.5 as 1/sqrt, in forward and in the x^(p-1) of
// backward: at -inf that is NaN, where C's pow gives +inf or 0, and -0 keeps its sign.
// The values are torch 1.13's for x = [-inf, -0, 0, -2, 4, inf], output then gradient
// (a zero gradient's sign is not compared: gradients here are sums started from +0).
static void test_square_root_exponents_are_pytorchs_at_infinities_and_signed_zeros(void) {
    const double xs[6] = {-INFINITY, -0.0, 0.0, -2, 4, INFINITY};
    const double p[3] = {0.5, -0.5, 1.5};
    const double y[3][6] = {{NAN, -0.0, 0.0, NAN, 2, INFINITY},
                            {NAN, -INFINITY, INFINITY, NAN, 0.5, 0.0},
                            {INFINITY, 0.0, 0.0, NAN, 8, INFINITY}};
    const double g[3][6] = {{NAN, -INFINITY, INFINITY, NAN, 0.25, 0.0},
                            {-0.0, -INFINITY, -INFINITY, NAN, -0.0625, -0.0},
                            {NAN, -0.0, 0.0, NAN, 3, INFINITY}};
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < 3; c++) {
            ag_dtype dt = d ? AG_F32 : AG_F64;
            ag_tensor *x64 = ag_tensor_from(AG_F64, 1, (int[]){6}, xs);
            ag_tensor *x = requiring_grad(ag_tensor_convert(x64, dt));
            ag_tape *tp = ag_tape_new();
            ag_tensor *out = ag_pow(tp, x, p[c]);
            ag_backward(tp, ag_sum(tp, out));
            for (size_t k = 0; k < 6; k++) {
                double a = ag_tensor_item(out, k), b = ag_tensor_grad_item(x, k);
                CHECK(isnan(y[c][k]) ? isnan(a) : a == y[c][k] && !signbit(a) == !signbit(y[c][k]));
                CHECK(isnan(g[c][k]) ? isnan(b) : b == g[c][k]);
            }
            ag_tape_free(tp);
            ag_tensor_free(x);
            ag_tensor_free(x64);
        }
}

// pow's gradient is grouped dy * (p x^(p-1)), as PyTorch's pow_backward: in f32, dy * p
// first overflows for a large dy where the gradient is finite. torch 1.13, float32:
// x = [2, 4, 0.5], p = -2 (then 3), dy = [3e38, -3e38, 3e38] gives x.grad =
// [-7.500000013744389e+37, 9.375000017180487e+36] and, for p = 3 at 0.5, 2.2499999027112688e+38.
static void test_pow_gradient_of_a_large_upstream_is_finite_in_f32(void) {
    const float dys[2] = {3e38f, -3e38f};
    ag_tensor *x = requiring_grad(ag_tensor_from(AG_F32, 1, (int[]){2}, (float[]){2, 4}));
    ag_tensor *dy = ag_tensor_from(AG_F32, 1, (int[]){2}, dys);
    ag_tape *tp = ag_tape_new();
    ag_backward_with(tp, ag_pow(tp, x, -2), dy);
    CHECK(ag_tensor_grad_item(x, 0) == (double)-7.500000013744389e+37f);
    CHECK(ag_tensor_grad_item(x, 1) == (double)9.375000017180487e+36f);
    ag_tape_reset(tp);
    ag_tensor *h = requiring_grad(ag_tensor_from(AG_F32, 1, (int[]){1}, (float[]){0.5f}));
    ag_tensor *dh = ag_tensor_from(AG_F32, 1, (int[]){1}, dys);
    ag_backward_with(tp, ag_pow(tp, h, 3), dh);
    CHECK(ag_tensor_grad_item(h, 0) == (double)2.2499999027112688e+38f);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(dy);
    ag_tensor_free(h);
    ag_tensor_free(dh);
}

static void test_gradients_at_the_kinks_are_pytorchs(void) {
    ag_tensor *x = requiring_grad(ag_tensor_from(AG_F64, 1, (int[]){4}, (double[]){0, -1, 0.5, 2}));
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, ag_abs(tp, x)));
    CHECK(ag_tensor_grad_item(x, 0) == 0 && ag_tensor_grad_item(x, 1) == -1);
    ag_tensor_zero_grad(x);
    ag_backward(tp, ag_sum(tp, ag_clamp(tp, x, -1, 0.5)));
    CHECK(ag_tensor_grad_item(x, 0) == 1 && ag_tensor_grad_item(x, 1) == 1);
    CHECK(ag_tensor_grad_item(x, 2) == 1 && ag_tensor_grad_item(x, 3) == 0);
    ag_tensor_zero_grad(x);
    ag_backward(tp, ag_sum(tp, ag_pow(tp, x, 0)));
    for (size_t k = 0; k < 4; k++) CHECK(ag_tensor_grad_item(x, k) == 0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// torch.clamp(x, min=2, max=1) in PyTorch 1.13: min(max(x, lo), hi) is hi everywhere (a
// NaN stays NaN), and no x lies in [lo, hi], so the gradient is 0 everywhere.
static void test_clamp_with_lo_above_hi_gives_hi_as_pytorch(void) {
    for (int f = 0; f < 2; f++) {
        ag_tensor *x64 =
            ag_tensor_from(AG_F64, 1, (int[]){6}, (double[]){-3, 0, 1.5, 3, 5, NAN});
        ag_tensor *x = requiring_grad(ag_tensor_convert(x64, f ? AG_F64 : AG_F32));
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_clamp(tp, x, 2, 1);
        for (size_t k = 0; k < 5; k++) CHECK(ag_tensor_item(y, k) == 1);
        CHECK(isnan(ag_tensor_item(y, 5)));
        ag_backward(tp, ag_sum(tp, y));
        for (size_t k = 0; k < 6; k++) CHECK(ag_tensor_grad_item(x, k) == 0);
        ag_tape_free(tp);
        ag_tensor_free(x), ag_tensor_free(x64);
    }
}

static void test_sigmoid_and_silu_are_finite_for_huge_inputs(void) {
    ag_tensor *x = requiring_grad(ag_tensor_from(AG_F32, 1, (int[]){2}, (float[]){-1000, 1000}));
    ag_tape *tp = ag_tape_new();
    ag_tensor *s = ag_sigmoid(tp, x), *u = ag_silu(tp, x);
    CHECK(ag_tensor_item(s, 0) == 0 && ag_tensor_item(s, 1) == 1);
    CHECK(ag_tensor_item(u, 0) == 0 && ag_tensor_item(u, 1) == 1000);
    ag_backward(tp, ag_sum(tp, ag_add(tp, s, u)));
    CHECK(grad_all_finite(x));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// float32 sigmoid, tanh and SiLU run on a vectorised exp: against the exact value (double
// libm, rounded once) for one float in 4096 over the whole range, within 1e-6 relative; a
// result near or below FLT_MIN may also be off by what its denormal spacing allows (times
// |x| for SiLU = x sigmoid(x)). The ends are exact, a NaN stays NaN.
static void test_f32_sigmoid_tanh_silu_match_libm_over_the_float_range(void) {
    int n = 1 << 20;
    ag_tensor *x = ag_tensor_zeros(AG_F32, 1, &n);
    float *xs = ag_tensor_f32(x);
    for (uint32_t i = 0; i < (uint32_t)n; i++) {
        uint32_t bits = i << 12 | (i * 2654435761u) >> 20;  // every sign, exponent, mantissa
        memcpy(&xs[i], &bits, sizeof bits);
    }
    ag_tape *tp = ag_tape_new();
    const fn_kind kinds[] = {SIGMOID, TANH, SILU};
    for (int f = 0; f < 3; f++) {
        const fn_case c = {kinds[f], 0, 0, 0};
        const float *y = ag_tensor_f32(apply_fn(tp, x, &c));
        long bad = 0;
        for (int i = 0; i < n; i++) {
            double v = xs[i], ref = (float)reference(v, &c);
            if (isnan(ref) || isinf(ref)) {
                bad += !(isnan(ref) ? isnan(y[i]) : y[i] == ref);
                continue;
            }
            double err = fabs(y[i] - ref);
            double tol = 1e-6 * fabs(ref) + 0x1p-126 * 1e-6 + (kinds[f] == SILU ? fabs(v) : 1) *
                         0x1p-149;
            bad += !(err <= tol);
        }
        if (bad) fprintf(stderr, "  %s: %ld of %d floats off\n", names[kinds[f]], bad, n);
        CHECK(bad == 0);
    }
    float ends[] = {-INFINITY, INFINITY, -1000, 1000, 0.0f, -0.0f, NAN};
    ag_tensor *e = ag_tensor_from(AG_F32, 1, (int[]){7}, ends);
    const float *s = ag_tensor_f32(ag_sigmoid(tp, e)), *t = ag_tensor_f32(ag_tanh(tp, e));
    const float *u = ag_tensor_f32(ag_silu(tp, e));
    CHECK(s[0] == 0 && s[1] == 1 && s[2] == 0 && s[3] == 1 && s[4] == 0.5f && isnan(s[6]));
    CHECK(t[0] == -1 && t[1] == 1 && t[2] == -1 && t[3] == 1 && isnan(t[6]));
    CHECK(t[4] == 0 && !signbit(t[4]) && t[5] == 0 && signbit(t[5]));  // tanh keeps -0
    CHECK(u[1] == INFINITY && u[2] == 0 && u[3] == 1000 && isnan(u[6]));
    ag_tape_free(tp);
    ag_tensor_free(x), ag_tensor_free(e);
}

// A leaf requiring grad holding every float from `from` to `to` in order, then `extra`
// zeros for the caller to set; *n: its length.
static ag_tensor *every_float(float from, float to, int extra, int *n) {
    *n = extra;
    for (float v = from; v <= to; v = nextafterf(v, INFINITY)) *n += 1;
    ag_tensor *x = requiring_grad(ag_tensor_zeros(AG_F32, 1, n));
    float *xs = ag_tensor_f32(x);
    int i = 0;
    for (float v = from; v <= to; v = nextafterf(v, INFINITY)) xs[i++] = v;
    return x;
}

// float32 exp near its overflow: every float from 80 up to ln(FLT_MAX) = 88.72284 within
// 1e-6 relative of libm's exp in double (rounded to float), and its gradient e^x (dy = 1)
// the same; +inf above. The vectorised exp stops at 88, where 2^n leaves the float exponents,
// and gave e^88 = 1.65e38 for every x in (88, 88.72]: e^88.5 came out 0.61 of its value.
static void test_f32_exp_matches_libm_up_to_its_overflow(void) {
    const float to = 88.7228394f;
    int n;
    ag_tensor *x = every_float(80.0f, to, 2, &n);  // and two above: the next float and 89
    float *xs = ag_tensor_f32(x);
    xs[n - 2] = nextafterf(to, INFINITY);
    xs[n - 1] = 89.0f;
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_exp(tp, x);
    ag_backward(tp, ag_sum(tp, y));
    const float *ys = ag_tensor_f32(y), *gs = x->grad;
    long bad = 0;
    for (int k = 0; k < n - 2; k++) {
        const double ref = (float)exp((double)xs[k]);
        // (float)e^88.7228394 is already +inf: equal then
        bad += !(ys[k] == ref || fabs(ys[k] - ref) <= 1e-6 * ref) ||
               !(gs[k] == ref || fabs(gs[k] - ref) <= 1e-6 * ref);
    }
    if (bad) fprintf(stderr, "  %ld of %d floats off, e.g. exp(88.5) = %g\n", bad, n - 2,
                     (double)ys[(int)((n - 2) * (88.5 - 80) / (88.7228394 - 80))]);
    CHECK(bad == 0);
    CHECK(ys[n - 2] == INFINITY && ys[n - 1] == INFINITY);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// And at the other end: below -87.34 e^x is a denormal float, which libm gives (and
// PyTorch); the vectorised exp gave 0 for every x in [-103.97, -87.34], so exp(-90) was 0
// and log(exp(-90)) -inf. Every float from -104 to -80 within 1e-6 relative of libm
// (rounded to float) or its denormal spacing 2^-149, value and gradient; -inf gives 0.
static void test_f32_exp_matches_libm_down_to_its_underflow(void) {
    int n;
    ag_tensor *x = every_float(-104.0f, -80.0f, 1, &n);  // and -inf
    float *xs = ag_tensor_f32(x);
    xs[n - 1] = -INFINITY;
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_exp(tp, x);
    ag_backward(tp, ag_sum(tp, y));
    const float *ys = ag_tensor_f32(y), *gs = x->grad;
    long bad = 0;
    for (int k = 0; k < n - 1; k++) {
        const double ref = (float)exp((double)xs[k]), tol = 1e-6 * ref + 0x1p-149;
        bad += !(fabs(ys[k] - ref) <= tol) || !(fabs(gs[k] - ref) <= tol);
    }
    if (bad) fprintf(stderr, "  %ld of %d floats off, e.g. exp(-90) = %g\n", bad, n - 1,
                     (double)ys[(int)((n - 1) * (-90.0 + 104) / 24)]);
    CHECK(bad == 0);
    CHECK(ys[n - 1] == 0 && gs[n - 1] == 0);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_bad_arguments_are_errors(void) {
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){2, 3});
    ag_tensor *i = ag_tensor_zeros(AG_I32, 1, (int[]){2});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(fails_with(ag_clamp(tp, x, NAN, 1), "clamp: a bound is NaN: [nan, 1]; x [2,3]"));
    CHECK(fails_with(ag_pow(tp, x, NAN), "pow: exponent must be finite, got nan; x [2,3]"));
    CHECK(fails_with(ag_exp(tp, i), "exp: x [2] must be f32 or f64, not i32"));
    CHECK(fails_with(ag_tanh(tp, NULL), "tanh: x is NULL"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(i);
}

static void run_big(ag_tensor *x, const ag_tensor *dy, float *out) {
    ag_tensor_zero_grad(x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_silu(tp, ag_exp(tp, ag_tanh(tp, x)));
    ag_backward_with(tp, y, dy);
    memcpy(out, y->data, x->numel * sizeof *out);
    memcpy(out + x->numel, x->grad, x->numel * sizeof *out);
    ag_tape_free(tp);
}

static void test_two_threads_are_bit_identical_to_one(void) {
    const int s[] = {64, 4099};  // not a multiple of the chunk
    ag_tensor *x = requiring_grad(uniform_tensor(AG_F32, 2, s, 90, -2, 2));
    ag_tensor *dy = uniform_tensor(AG_F32, 2, s, 91, -1, 1);
    float *one = malloc(2 * x->numel * sizeof *one), *two = malloc(2 * x->numel * sizeof *two);
    run_big(x, dy, one);
    ag_threads_set(2);
    run_big(x, dy, two);
    ag_threads_set(1);
    CHECK(memcmp(one, two, 2 * x->numel * sizeof *one) == 0);
    free(one);
    free(two);
    ag_tensor_free(x);
    ag_tensor_free(dy);
}

int main(void) {
    RUN(test_forward_matches_libm);
    RUN(test_gradcheck_and_f32_over_shapes);
    RUN(test_nan_in_gives_nan_out);
    RUN(test_square_root_exponents_are_pytorchs_at_infinities_and_signed_zeros);
    RUN(test_gradients_at_the_kinks_are_pytorchs);
    RUN(test_pow_gradient_of_a_large_upstream_is_finite_in_f32);
    RUN(test_clamp_with_lo_above_hi_gives_hi_as_pytorch);
    RUN(test_sigmoid_and_silu_are_finite_for_huge_inputs);
    RUN(test_f32_sigmoid_tanh_silu_match_libm_over_the_float_range);
    RUN(test_f32_exp_matches_libm_up_to_its_overflow);
    RUN(test_f32_exp_matches_libm_down_to_its_underflow);
    RUN(test_bad_arguments_are_errors);
    RUN(test_two_threads_are_bit_identical_to_one);
    return testing_summary();
}
