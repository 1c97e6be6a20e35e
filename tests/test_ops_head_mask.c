// ag_head_mask: each head's elements times its mask entry, in both head layouts
// ([B, h, T, d] and [B, T, h*d]); float64 gradient checks of x and of the mask
// (h = 1, T = 1 included), f32 against f64, a NaN staying NaN, the error for a
// mask of the wrong length, and no heap allocation in a repeated step.
#include "op_checks.h"

// x is in[0], the mask in[1]; `heads` is passed for the 3-D layout.
static ag_tensor *head_mask_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return ag_head_mask(tp, in[0], in[1], *(const int *)user);
}

typedef struct {
    int ndim, shape[4], heads;
} hm_case;

static const hm_case cases[] = {
    {4, {2, 3, 4, 5}, 0},  // [B, h, T, d]
    {4, {2, 3, 4, 5}, 3},  // heads may be given for 4-D too
    {3, {2, 4, 6}, 3},     // [B, T, h*d], d = 2
    {3, {2, 1, 6}, 2},     // T = 1
    {4, {1, 1, 3, 2}, 0},  // h = 1
    {3, {3, 2, 4}, 4},     // d = 1
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static int heads_of(const hm_case *c) { return c->ndim == 4 ? c->shape[1] : c->heads; }

// The head of flat element i of x.
static int head_at(const hm_case *c, size_t i) {
    if (c->ndim == 4) return (int)(i / ((size_t)c->shape[2] * c->shape[3]) % (size_t)c->shape[1]);
    int d = c->shape[2] / c->heads;
    return (int)(i % (size_t)c->shape[2]) / d;
}

static void test_forward_multiplies_each_head_by_its_entry(void) {
    for (int k = 0; k < N_CASES; k++) {
        const hm_case *c = &cases[k];
        int h = heads_of(c);
        ag_tensor *x = uniform_tensor(AG_F64, c->ndim, c->shape, 1 + (uint64_t)k, -1, 1);
        ag_tensor *m = uniform_tensor(AG_F64, 1, &h, 2 + (uint64_t)k, -2, 2);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_head_mask(tp, x, m, c->heads);
        CHECK(y && ag_tensor_same_shape(y, x));
        for (size_t i = 0; y && i < x->numel; i++)
            CHECK(ag_tensor_item(y, i) ==
                  ag_tensor_item(x, i) * ag_tensor_item(m, (size_t)head_at(c, i)));
        ag_tape_free(tp);
        ag_tensor_free(x);
        ag_tensor_free(m);
    }
}

static void test_gradcheck_of_x_and_mask_in_both_layouts(void) {
    for (int k = 0; k < N_CASES; k++) {
        const hm_case *c = &cases[k];
        int h = heads_of(c);
        ag_tensor *in[2] = {random_leaf(AG_F64, c->ndim, c->shape, 10 + (uint64_t)k),
                            random_leaf(AG_F64, 1, &h, 20 + (uint64_t)k)};
        CHECK(ag_gradcheck(head_mask_fn, in, 2, (void *)&c->heads, NULL, NULL));
        // Only the mask, or only x, requiring grad.
        ag_tensor_set_requires_grad(in[0], false);
        CHECK(ag_gradcheck(head_mask_fn, in, 2, (void *)&c->heads, NULL, NULL));
        ag_tensor_set_requires_grad(in[0], true);
        ag_tensor_set_requires_grad(in[1], false);
        CHECK(ag_gradcheck(head_mask_fn, in, 2, (void *)&c->heads, NULL, NULL));
        ag_tensor_free(in[0]);
        ag_tensor_free(in[1]);
    }
}

// dmask[j] is the sum over head j of dy * x: with dy = 1 and a mask of zeros, the
// gradient still measures the head (what importance by gradient relies on).
static void test_mask_gradient_is_the_head_sum_of_dy_times_x_even_at_zero(void) {
    const hm_case *c = &cases[2];
    int h = heads_of(c);
    ag_tensor *x = uniform_tensor(AG_F64, c->ndim, c->shape, 30, -1, 1);
    ag_tensor *m = requiring_grad(ag_tensor_zeros(AG_F64, 1, &h));
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, ag_head_mask(tp, x, m, c->heads)));
    double want[4] = {0};
    for (size_t i = 0; i < x->numel; i++) want[head_at(c, i)] += ag_tensor_item(x, i);
    for (int j = 0; j < h; j++) CHECK_NEAR(ag_tensor_grad_item(m, (size_t)j), want[j], 1e-14);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(m);
}

static void test_f32_agrees_with_f64(void) {
    for (int k = 0; k < N_CASES; k++) {
        const hm_case *c = &cases[k];
        int h = heads_of(c);
        ag_tensor *in[2] = {random_leaf(AG_F64, c->ndim, c->shape, 40 + (uint64_t)k),
                            random_leaf(AG_F64, 1, &h, 50 + (uint64_t)k)};
        CHECK(f32_vs_f64_error(head_mask_fn, in, 2, (void *)&c->heads) < 1e-6);
        ag_tensor_free(in[0]);
        ag_tensor_free(in[1]);
    }
}

// The mask's float32 gradient sums a head's B T d products dy * x: over 2^21 of them
// (x and dy in [0, 1)), in both layouts, against float64 on the same numbers. That sum ran
// in float, row by row into the gradient: 4e-6 off. In double it is at float rounding,
// about 5e-8.
static void test_f32_mask_gradient_of_long_heads_matches_f64(void) {
    const hm_case big[2] = {{4, {16, 2, 2048, 64}, 0}, {3, {16, 2048, 128}, 2}};
    for (int k = 0; k < 2; k++) {
        const hm_case *c = &big[k];
        const int h = heads_of(c);
        ag_tensor *x32 = uniform_tensor(AG_F32, c->ndim, c->shape, 111, 0, 1);
        ag_tensor *dy32 = uniform_tensor(AG_F32, c->ndim, c->shape, 112, 0, 1);
        ag_tensor *m32 = uniform_tensor(AG_F32, 1, &h, 113, 0.5, 1.5);
        ag_tensor *x64 = ag_tensor_convert(x32, AG_F64), *dy64 = ag_tensor_convert(dy32, AG_F64);
        ag_tensor *m64 = ag_tensor_convert(m32, AG_F64);  // the same numbers, exactly
        ag_tensor_set_requires_grad(m32, true);
        ag_tensor_set_requires_grad(m64, true);
        ag_tape *tp = ag_tape_new();
        ag_backward_with(tp, ag_head_mask(tp, x32, m32, c->heads), dy32);
        ag_backward_with(tp, ag_head_mask(tp, x64, m64, c->heads), dy64);
        const double e = normwise_error(m32, m64, true);
        if (e > 2e-7) fprintf(stderr, "  layout %d: the mask's gradient is %.2e off\n", k, e);
        CHECK(e <= 2e-7);
        ag_tape_free(tp);
        ag_tensor *all[6] = {x32, dy32, m32, x64, dy64, m64};
        for (int i = 0; i < 6; i++) ag_tensor_free(all[i]);
    }
}

// A NaN in x stays NaN even where its head's mask is 0 (0 * NaN), as in PyTorch.
static void test_a_nan_input_stays_nan_under_a_zero_entry(void) {
    ag_tensor *x = ag_tensor_from(AG_F64, 4, (int[]){1, 2, 1, 2}, (double[]){NAN, 1, 2, 3});
    ag_tensor *m = ag_tensor_from(AG_F64, 1, (int[]){2}, (double[]){0, 1});
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_head_mask(tp, x, m, 0);
    CHECK(isnan(ag_tensor_item(y, 0)));
    CHECK(ag_tensor_item(y, 1) == 0.0 && ag_tensor_item(y, 3) == 3.0);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(m);
}

static void test_errors_name_the_mask_and_x(void) {
    ag_tensor *x4 = ag_tensor_zeros(AG_F64, 4, (int[]){2, 3, 4, 5});
    ag_tensor *x3 = ag_tensor_zeros(AG_F64, 3, (int[]){2, 4, 6});
    ag_tensor *m2 = ag_tensor_zeros(AG_F64, 1, (int[]){2});
    ag_tensor *m3f = ag_tensor_zeros(AG_F32, 1, (int[]){3});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(!ag_head_mask(tp, x4, m2, 0));
    CHECK(strcmp(testing_last_error,
                 "head_mask: mask [2] must be [3], one entry per head of x [2,3,4,5]") == 0);
    CHECK(!ag_head_mask(tp, x3, m2, 3));
    CHECK(strcmp(testing_last_error,
                 "head_mask: mask [2] must be [3], one entry per head of x [2,4,6]") == 0);
    CHECK(!ag_head_mask(tp, x3, m2, 5));
    CHECK(strcmp(testing_last_error,
                 "head_mask: the last dim of x [2,4,6] is not divisible by 5 heads") == 0);
    CHECK(!ag_head_mask(tp, x4, m2, 2));
    CHECK(strcmp(testing_last_error, "head_mask: heads 2 does not fit x [2,3,4,5]") == 0);
    CHECK(!ag_head_mask(tp, x3, m2, 0));
    CHECK(!ag_head_mask(tp, x4, m3f, 0));  // dtypes differ
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x4);
    ag_tensor_free(x3);
    ag_tensor_free(m2);
    ag_tensor_free(m3f);
}

typedef struct {
    ag_tensor *x, *m;
} step_data;

static void masked_step(ag_tape *tp, int step, void *user) {
    (void)step;
    step_data *d = user;
    ag_backward(tp, ag_sum(tp, ag_head_mask(tp, d->x, d->m, 8)));
}

static void test_repeated_step_allocates_nothing(void) {
    step_data d = {random_leaf(AG_F32, 3, (int[]){4, 256, 512}, 60),
                   random_leaf(AG_F32, 1, (int[]){8}, 61)};
    CHECK(repeated_step_allocates_nothing(masked_step, &d));
    ag_tensor_free(d.x);
    ag_tensor_free(d.m);
}

// Threads split the rows; the mask's gradient is summed on one thread: bit-identical.
static void test_two_threads_give_identical_results(void) {
    ag_tensor *x = random_leaf(AG_F64, 4, (int[]){4, 8, 128, 64}, 70);
    ag_tensor *m = random_leaf(AG_F64, 1, (int[]){8}, 71);
    double g[2][8], y0[2];
    for (int t = 1; t <= 2; t++) {
        ag_threads_set(t);
        ag_tensor_zero_grad(x);
        ag_tensor_zero_grad(m);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_head_mask(tp, x, m, 0);
        ag_backward(tp, ag_sum(tp, ag_mul(tp, y, y)));
        y0[t - 1] = ag_tensor_item(y, 12345);
        for (int j = 0; j < 8; j++) g[t - 1][j] = ag_tensor_grad_item(m, (size_t)j);
        ag_tape_free(tp);
    }
    ag_threads_set(1);
    CHECK(y0[0] == y0[1]);
    CHECK(memcmp(g[0], g[1], sizeof g[0]) == 0);
    ag_tensor_free(x);
    ag_tensor_free(m);
}

int main(void) {
    RUN(test_forward_multiplies_each_head_by_its_entry);
    RUN(test_gradcheck_of_x_and_mask_in_both_layouts);
    RUN(test_mask_gradient_is_the_head_sum_of_dy_times_x_even_at_zero);
    RUN(test_f32_agrees_with_f64);
    RUN(test_f32_mask_gradient_of_long_heads_matches_f64);
    RUN(test_a_nan_input_stays_nan_under_a_zero_entry);
    RUN(test_errors_name_the_mask_and_x);
    RUN(test_repeated_step_allocates_nothing);
    RUN(test_two_threads_give_identical_results);
    return testing_summary();
}
