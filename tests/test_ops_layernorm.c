// ag_layernorm: against a naive two-pass computation, normalised statistics,
// float64 gradient checks with and without weight and bias (E = 1 and a large
// mean with a tiny variance included), f32 against f64, errors, threads.
#include <stdlib.h>

#include "op_checks.h"

// Every input (x, w, b) requires grad.
static ag_tensor *normal(ag_dtype dt, int ndim, const int *shape, uint64_t seed, double mean,
                         double std) {
    return requiring_grad(normal_tensor(dt, ndim, shape, seed, mean, std));
}

static int E_of(const ag_tensor *x) { return x->shape[x->ndim - 1]; }

// y from the definition, in double (w, b may be NULL).
static void naive_layernorm(const ag_tensor *x, const ag_tensor *w, const ag_tensor *b,
                            double eps, double *y) {
    int E = E_of(x);
    for (size_t r = 0; r < x->numel / (size_t)E; r++) {
        double mean = 0, var = 0;
        for (int e = 0; e < E; e++) mean += ag_tensor_item(x, r * E + e) / E;
        for (int e = 0; e < E; e++) {
            double d = ag_tensor_item(x, r * E + e) - mean;
            var += d * d / E;
        }
        for (int e = 0; e < E; e++) {
            double v = (ag_tensor_item(x, r * E + e) - mean) / sqrt(var + eps);
            y[r * E + e] = v * (w ? ag_tensor_item(w, (size_t)e) : 1.0) +
                           (b ? ag_tensor_item(b, (size_t)e) : 0.0);
        }
    }
}

typedef struct {
    int ndim;
    int shape[4];
} shape_t;

static const shape_t shapes[] = {
    {1, {5}},           // one row
    {2, {3, 6}},        // [T, E]
    {3, {2, 3, 8}},     // [B, T, E]
    {4, {2, 2, 3, 4}},  // 4-D
    {2, {4, 1}},        // E = 1: the output is b
    {3, {2, 1, 7}},     // T = 1
    {2, {2, 70}},       // E > 64: dw and db span two blocks of columns
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

// w and b with the right width for x; mean 1 so w = 0 is never near.
static ag_tensor *weight(const ag_tensor *x, ag_dtype dt, uint64_t seed) {
    return normal(dt, 1, &x->shape[x->ndim - 1], seed, 1.0, 0.5);
}

static void test_forward_matches_naive_two_pass_computation(void) {
    for (int c = 0; c < N_SHAPES; c++) {
        ag_tensor *x = normal(AG_F64, shapes[c].ndim, shapes[c].shape, 1 + (uint64_t)c, 0.5, 2.0);
        ag_tensor *w = weight(x, AG_F64, 2), *b = weight(x, AG_F64, 3);
        double *ref = malloc(x->numel * sizeof *ref);
        ag_tape *tp = ag_tape_new();
        for (int affine = 0; affine < 4; affine++) {
            ag_tensor *wi = affine & 1 ? w : NULL, *bi = affine & 2 ? b : NULL;
            ag_tensor *y = ag_layernorm(tp, x, wi, bi, 1e-5);
            naive_layernorm(x, wi, bi, 1e-5, ref);
            for (size_t k = 0; k < x->numel; k++) CHECK_NEAR(ag_tensor_item(y, k), ref[k], 1e-13);
        }
        ag_tape_free(tp);
        free(ref);
        ag_tensor_free(x);
        ag_tensor_free(w);
        ag_tensor_free(b);
    }
}

static void test_rows_have_mean_zero_and_variance_one_with_unit_weight_and_zero_bias(void) {
    const int shape[] = {6, 32};
    const int E = 32;
    ag_tensor *x = normal(AG_F64, 2, shape, 4, 3.0, 5.0);
    ag_tensor *w = ag_tensor_ones(AG_F64, 1, &E), *b = ag_tensor_zeros(AG_F64, 1, &E);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_layernorm(tp, x, w, b, 1e-5);
    for (int r = 0; r < 6; r++) {
        double mean = 0, var = 0;
        for (int e = 0; e < E; e++) mean += ag_tensor_item(y, (size_t)(r * E + e)) / E;
        for (int e = 0; e < E; e++) {
            double d = ag_tensor_item(y, (size_t)(r * E + e)) - mean;
            var += d * d / E;
        }
        CHECK_NEAR(mean, 0.0, 1e-14);
        CHECK_NEAR(var, 1.0, 1e-6);  // var / (var + eps) with var ~ 25
    }
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(w);
    ag_tensor_free(b);
}

static void test_e_equals_one_outputs_the_bias(void) {
    const int shape[] = {5, 1}, one = 1;
    ag_tensor *x = normal(AG_F64, 2, shape, 5, 0.0, 1.0);
    ag_tensor *w = normal(AG_F64, 1, &one, 6, 1.0, 0.5), *b = normal(AG_F64, 1, &one, 7, 0, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_layernorm(tp, x, w, b, 1e-5);
    ag_backward(tp, ag_sum(tp, y));
    for (size_t k = 0; k < 5; k++) {
        CHECK(ag_tensor_item(y, k) == ag_tensor_item(b, 0));  // x - mean is exactly 0
        CHECK(ag_tensor_grad_item(x, k) == 0.0);
    }
    CHECK(ag_tensor_grad_item(w, 0) == 0.0);
    CHECK(ag_tensor_grad_item(b, 0) == 5.0);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(w);
    ag_tensor_free(b);
}

// ---- Gradient checks (float64) --------------------------------------------------------

typedef struct {
    bool w, b;
    double eps;
} ln_case;

// inputs: x, then w when used, then b when used.
static ag_tensor *layernorm_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const ln_case *c = user;
    ag_tensor *w = c->w ? in[1] : NULL, *b = c->b ? in[c->w ? 2 : 1] : NULL;
    return ag_layernorm(tp, in[0], w, b, c->eps);
}

static bool gradcheck(ag_tensor *x, ag_tensor *w, ag_tensor *b, double eps) {
    ln_case c = {w != NULL, b != NULL, eps};
    ag_tensor *in[3] = {x};
    int n = 1;
    if (w) in[n++] = w;
    if (b) in[n++] = b;
    bool ok = ag_gradcheck(layernorm_fn, in, n, &c, NULL, NULL);
    if (!ok)
        fprintf(stderr, "  layernorm x %s w %d b %d eps %g\n",
                ag_tensor_shape_str(x, (char[64]){0}, 64), w != NULL, b != NULL, eps);
    return ok;
}

static void test_gradcheck_with_and_without_weight_and_bias(void) {
    for (int c = 0; c < N_SHAPES; c++) {
        ag_tensor *x = normal(AG_F64, shapes[c].ndim, shapes[c].shape, 10 + (uint64_t)c, 0.3, 1.5);
        ag_tensor *w = weight(x, AG_F64, 11), *b = weight(x, AG_F64, 12);
        for (int affine = 0; affine < 4; affine++)
            CHECK(gradcheck(x, affine & 1 ? w : NULL, affine & 2 ? b : NULL, 1e-5));
        ag_tensor_free(x);
        ag_tensor_free(w);
        ag_tensor_free(b);
    }
}

static void test_gradcheck_on_large_mean_tiny_variance_input(void) {
    const int xs[] = {3, 4, 8};
    ag_tensor *x = normal(AG_F64, 3, xs, 20, 100.0, 1e-3);  // x = 100 + 1e-3 * noise
    ag_tensor *w = weight(x, AG_F64, 21), *b = weight(x, AG_F64, 22);
    CHECK(gradcheck(x, w, b, 1e-5));
    CHECK(gradcheck(x, NULL, NULL, 1e-5));
    ag_tensor_free(x);
    ag_tensor_free(w);
    ag_tensor_free(b);
}

static void test_weight_or_bias_alone_may_require_grad(void) {
    const int xs[] = {2, 3, 5};
    ag_tensor *x = normal(AG_F64, 3, xs, 23, 0.0, 1.0);
    ag_tensor *w = weight(x, AG_F64, 24), *b = weight(x, AG_F64, 25);
    ag_tensor_set_requires_grad(x, false);
    CHECK(gradcheck(x, w, b, 1e-5));
    ag_tensor_set_requires_grad(w, false);
    CHECK(gradcheck(x, w, b, 1e-5));
    ag_tensor_free(x);
    ag_tensor_free(w);
    ag_tensor_free(b);
}

// ---- float32 -------------------------------------------------------------------------

// |f32 - f64| <= 1e-5 |f64| + 1e-6 for every element of y and of the gradients
// of x, w and b.
static void check_f32_against_f64(int ndim, const int *shape, double mean, double std,
                                  uint64_t seed) {
    ag_tensor *x = normal(AG_F64, ndim, shape, seed, mean, std);
    ag_tensor *in[] = {x, weight(x, AG_F64, seed + 1), weight(x, AG_F64, seed + 2)};
    ln_case c = {true, true, 1e-5};
    CHECK(f32_close_to_f64(layernorm_fn, in, 3, &c, 1e-5, 1e-6));
    for (int i = 0; i < 3; i++) ag_tensor_free(in[i]);
}

static void test_float32_matches_float64(void) {
    for (int c = 0; c < N_SHAPES; c++)
        check_f32_against_f64(shapes[c].ndim, shapes[c].shape, 0.5, 2.0, 40 + 4 * (uint64_t)c);
    const int wide[] = {4, 16, 512};  // long rows, many rows summed into dw and db
    check_f32_against_f64(3, wide, 0.5, 2.0, 70);
}

// Backward sums dw and db by blocks of rows, then the blocks in order: over several blocks
// with a short last one, with rows not a multiple of the sum lanes, and with each affine
// combination (partial sums for dw or db alone), f32 stays close to f64 and f64 passes
// gradcheck.
static void test_dw_and_db_over_many_row_blocks(void) {
    const int xs[] = {3, 131, 19}, small[] = {130, 3};
    ag_tensor *x = normal(AG_F64, 3, xs, 90, 0.5, 2.0);
    ag_tensor *w = weight(x, AG_F64, 91), *b = weight(x, AG_F64, 92);
    for (int affine = 0; affine < 4; affine++) {
        ln_case c = {affine & 1, affine & 2, 1e-5};
        ag_tensor *in[3] = {x};
        int n = 1;
        if (c.w) in[n++] = w;
        if (c.b) in[n++] = b;
        CHECK(f32_close_to_f64(layernorm_fn, in, n, &c, 1e-5, 1e-6));
    }
    ag_tensor_free(x), ag_tensor_free(w), ag_tensor_free(b);
    x = normal(AG_F64, 2, small, 93, 0.5, 2.0);
    w = weight(x, AG_F64, 94), b = weight(x, AG_F64, 95);
    CHECK(gradcheck(x, w, b, 1e-5));
    CHECK(gradcheck(x, NULL, b, 1e-5));
    ag_tensor_free(x), ag_tensor_free(w), ag_tensor_free(b);
}

static void test_float32_is_accurate_for_large_mean_tiny_variance(void) {
    const int xs[] = {4, 6, 64};
    check_f32_against_f64(3, xs, 100.0, 1e-3, 80);
}

// ---- The tape, errors, threads --------------------------------------------------------

static void test_no_grad_mode_gives_the_same_output_and_saves_nothing(void) {
    const int xs[] = {8, 64};
    ag_tensor *x = normal(AG_F32, 2, xs, 90, 0.0, 1.0);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_layernorm(tp, x, NULL, NULL, 1e-5);
    size_t recorded = ag_tape_usage(tp).bytes_used;
    CHECK(y->node && y->node->saved);
    ag_tape *tp2 = ag_tape_new();
    ag_tape_set_grad_enabled(tp2, false);
    ag_tensor *z = ag_layernorm(tp2, x, NULL, NULL, 1e-5);
    CHECK(z->node == NULL);
    CHECK(memcmp(y->data, z->data, x->numel * sizeof(float)) == 0);
    // The saved statistics (2 doubles a row) and the node are all recording adds.
    CHECK(recorded - ag_tape_usage(tp2).bytes_used <= 8 * 16 + 512);
    ag_tape_free(tp);
    ag_tape_free(tp2);
    ag_tensor_free(x);
}

static void check_error(ag_tensor *x, ag_tensor *w, ag_tensor *b, double eps,
                        const char *expected) {
    testing_catch_errors();
    ag_tape *tp = ag_tape_new();
    CHECK(ag_layernorm(tp, x, w, b, eps) == NULL);
    CHECK(testing_error_count == 1);
    if (strcmp(testing_last_error, expected) != 0) {
        fprintf(stderr, "  message:  %s\n  expected: %s\n", testing_last_error, expected);
        CHECK(!"error message");
    }
    ag_tape_free(tp);
    testing_release_errors();
}

static void test_bad_inputs_report_op_and_shapes(void) {
    const int xs[] = {2, 3, 4}, five = 5, four = 4, two[] = {2, 4};
    ag_tensor *x = normal(AG_F64, 3, xs, 100, 0, 1);
    ag_tensor *w5 = normal(AG_F64, 1, &five, 101, 0, 1), *w2d = normal(AG_F64, 2, two, 102, 0, 1);
    ag_tensor *b32 = normal(AG_F32, 1, &four, 103, 0, 1);
    ag_tensor *m = ag_tensor_zeros(AG_BOOL, 1, &four);
    check_error(x, w5, NULL, 1e-5, "layernorm: w [5] does not match x [2,3,4] (expected [4])");
    check_error(x, NULL, w2d, 1e-5, "layernorm: b [2,4] does not match x [2,3,4] (expected [4])");
    check_error(x, NULL, b32, 1e-5, "layernorm: dtypes differ: f64 [2,3,4] and f32 [4]");
    check_error(x, m, NULL, 1e-5, "layernorm: w [4] must be f32 or f64, not bool");
    check_error(m, NULL, NULL, 1e-5, "layernorm: x [4] must be f32 or f64, not bool");
    check_error(x, NULL, NULL, -1.0, "layernorm: eps must be finite and >= 0, got -1; x [2,3,4]");
    check_error(NULL, NULL, NULL, 1e-5, "layernorm: x is NULL");
    ag_tensor *all[] = {x, w5, w2d, b32, m};
    for (int i = 0; i < 5; i++) ag_tensor_free(all[i]);
}

static void run_big(ag_tensor *x, ag_tensor *w, ag_tensor *b, const ag_tensor *dy, float *out) {
    ag_tensor *ins[] = {x, w, b};
    for (int i = 0; i < 3; i++) ag_tensor_zero_grad(ins[i]);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_layernorm(tp, x, w, b, 1e-5);
    ag_backward_with(tp, y, dy);
    size_t n = x->numel, E = w->numel;
    memcpy(out, y->data, n * sizeof *out);
    memcpy(out + n, x->grad, n * sizeof *out);
    memcpy(out + 2 * n, w->grad, E * sizeof *out);
    memcpy(out + 2 * n + E, b->grad, E * sizeof *out);
    ag_tape_free(tp);
}

static void test_two_threads_are_bit_identical_run_to_run_and_to_one_thread(void) {
    const int xs[] = {32, 64, 96};  // big enough to split rows and columns
    ag_tensor *x = normal(AG_F32, 3, xs, 110, 0.5, 2.0);
    ag_tensor *w = weight(x, AG_F32, 111), *b = weight(x, AG_F32, 112);
    ag_tensor *dy = normal(AG_F32, 3, xs, 113, 0, 1);
    size_t len = 2 * x->numel + 2 * 96;
    float *one = malloc(len * sizeof *one), *a = malloc(len * sizeof *a),
          *c = malloc(len * sizeof *c);
    run_big(x, w, b, dy, one);
    ag_threads_set(2);
    run_big(x, w, b, dy, a);
    run_big(x, w, b, dy, c);
    ag_threads_set(1);
    CHECK(memcmp(a, c, len * sizeof *a) == 0);
    // dw and db sum fixed blocks of rows, then the blocks in order: the thread count
    // does not change a bit.
    CHECK(memcmp(a, one, len * sizeof *a) == 0);
    free(one);
    free(a);
    free(c);
    ag_tensor *all[] = {x, w, b, dy};
    for (int i = 0; i < 4; i++) ag_tensor_free(all[i]);
}

// user: x, w, b and the upstream gradient dy.
static void layernorm_step(ag_tape *tp, int step, void *user) {
    (void)step;
    ag_tensor *const *t = user;
    ag_backward_with(tp, ag_layernorm(tp, t[0], t[1], t[2], 1e-5), t[3]);
}

// After the first step has sized the tape, a step allocates nothing, on one thread
// or two.
static void test_repeated_step_allocates_no_heap_memory(void) {
    const int xs[] = {32, 64, 96};
    ag_tensor *x = normal(AG_F32, 3, xs, 120, 0.5, 2.0);
    ag_tensor *t[] = {x, weight(x, AG_F32, 122), weight(x, AG_F32, 123),
                      normal(AG_F32, 3, xs, 121, 0, 1)};
    CHECK(repeated_step_allocates_nothing(layernorm_step, t));
    for (int i = 0; i < 4; i++) ag_tensor_free(t[i]);
}

// The statistics run in double: a float32 row of +-1e20 is normalised. PyTorch 1.13's float32
// LayerNorm squares in float32, its variance overflows to inf, and it returns the bias
// (0.1, 0, -0.2, 0.3); a row of 3e38 gives it NaN, here the bias (README, "Extreme values").
// The values are PyTorch float64's for the same row.
static void test_float32_rows_whose_squares_overflow_float_are_normalised(void) {
    ag_tensor *x = ag_tensor_from(AG_F32, 2, (int[]){2, 4},
                                  (float[]){1e20f, -1e20f, 3e19f, 0, 3e38f, 3e38f, 3e38f, 3e38f});
    ag_tensor *w = ag_tensor_from(AG_F32, 1, (int[]){4}, (float[]){1, 2, -1, 0.5f});
    ag_tensor *b = ag_tensor_from(AG_F32, 1, (int[]){4}, (float[]){0.1f, 0, -0.2f, 0.3f});
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_layernorm(tp, x, w, b, 1e-5);
    const double want[4] = {1.3866160613331746, -2.990513014036462, -0.5129606685275849,
                            0.24783988857873585};
    for (size_t e = 0; e < 4; e++) {
        CHECK_NEAR(ag_tensor_item(y, e), want[e], 1e-6);
        CHECK(ag_tensor_item(y, 4 + e) == ag_tensor_item(b, e));
    }
    ag_tensor_free(x);
    ag_tensor_free(w);
    ag_tensor_free(b);
    ag_tape_free(tp);
}

int main(void) {
    RUN(test_forward_matches_naive_two_pass_computation);
    RUN(test_rows_have_mean_zero_and_variance_one_with_unit_weight_and_zero_bias);
    RUN(test_e_equals_one_outputs_the_bias);
    RUN(test_gradcheck_with_and_without_weight_and_bias);
    RUN(test_gradcheck_on_large_mean_tiny_variance_input);
    RUN(test_weight_or_bias_alone_may_require_grad);
    RUN(test_float32_matches_float64);
    RUN(test_float32_is_accurate_for_large_mean_tiny_variance);
    RUN(test_float32_rows_whose_squares_overflow_float_are_normalised);
    RUN(test_dw_and_db_over_many_row_blocks);
    RUN(test_no_grad_mode_gives_the_same_output_and_saves_nothing);
    RUN(test_bad_inputs_report_op_and_shapes);
    RUN(test_two_threads_are_bit_identical_run_to_run_and_to_one_thread);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
