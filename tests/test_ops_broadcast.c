// ag_add, ag_sub, ag_mul, ag_div, ag_where, ag_masked_fill and ag_matmul under numpy
// broadcasting: against a naive index computation, float64 gradient checks with size-1
// dims on either side and different ranks, float32 against float64, -inf masks without
// NaN gradients, errors, threads, and no allocation in a repeated step.
#include <stdlib.h>

#include "general_ops.h"

typedef ag_tensor *(*binary_fn)(ag_tape *, ag_tensor *, ag_tensor *);
typedef struct {
    const char *name;
    binary_fn fn;
    char op;
} binary_op;
static const binary_op binaries[] = {
    {"add", ag_add, '+'}, {"sub", ag_sub, '-'}, {"mul", ag_mul, '*'}, {"div", ag_div, '/'}};

// Pairs of shapes that broadcast: same, trailing part, size-1 on either side, ranks differ.
typedef struct {
    test_shape a, b;
} shape_pair;
static const shape_pair pairs[] = {
    {{2, {3, 4}}, {2, {3, 4}}},                  // same shape
    {{3, {2, 3, 4}}, {1, {4}}},                  // a bias
    {{3, {2, 3, 4}}, {2, {3, 4}}},               // a table of positions
    {{1, {4}}, {3, {2, 3, 4}}},                  // the small one first
    {{2, {3, 1}}, {1, {4}}},                     // a column against a row: both broadcast
    {{4, {2, 1, 3, 4}}, {4, {2, 3, 1, 1}}},      // size-1 dims on both sides
    {{4, {2, 3, 3, 4}}, {4, {2, 1, 3, 4}}},      // a [B,1,T,S] mask over [B,h,T,S]
    {{2, {1, 1}}, {3, {2, 2, 3}}},               // a [1,1] scalar-like
    {{0, {0}}, {2, {2, 3}}},                     // a true scalar
    {{1, {1}}, {1, {1}}},                        // one element each
};
#define N_PAIRS (int)(sizeof pairs / sizeof pairs[0])

// The flat index into t of output element k, by right-aligned broadcasting.
static size_t source_index(const ag_tensor *t, const ag_tensor *out, size_t k) {
    size_t idx = 0, stride = 1;
    for (int d = out->ndim - 1; d >= 0; d--) {
        size_t i = k % (size_t)out->shape[d];
        k /= (size_t)out->shape[d];
        int j = d - (out->ndim - t->ndim);
        if (j < 0) continue;
        if (t->shape[j] != 1) idx += i * stride;
        stride *= (size_t)t->shape[j];
    }
    return idx;
}

static double apply_op(char op, double a, double b) {
    return op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : a / b;
}

static void test_forward_matches_naive_broadcasting(void) {
    ag_tape *tp = ag_tape_new();
    for (int o = 0; o < 4; o++)
        for (int c = 0; c < N_PAIRS; c++) {
            ag_tensor *a = random_tensor(AG_F64, pairs[c].a, 1 + (uint64_t)c, -1, 1);
            ag_tensor *b = random_tensor(AG_F64, pairs[c].b, 2 + (uint64_t)c, 0.5, 2);
            ag_tensor *y = binaries[o].fn(tp, a, b);
            CHECK(y != NULL);
            for (size_t k = 0; y && k < y->numel; k++) {
                double ref = apply_op(binaries[o].op, ag_tensor_item(a, source_index(a, y, k)),
                                      ag_tensor_item(b, source_index(b, y, k)));
                CHECK(ag_tensor_item(y, k) == ref);
            }
            ag_tensor_free(a);
            ag_tensor_free(b);
        }
    ag_tape_free(tp);
}

static void test_output_shape_is_the_broadcast_shape(void) {
    ag_tape *tp = ag_tape_new();
    ag_tensor *a = ag_tensor_zeros(AG_F64, 2, (int[]){3, 1});
    ag_tensor *b = ag_tensor_zeros(AG_F64, 3, (int[]){2, 1, 4});
    ag_tensor *y = ag_add(tp, a, b);
    CHECK(y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 4);
    ag_tape_free(tp);
    ag_tensor_free(a);
    ag_tensor_free(b);
}

static ag_tensor *binary_case(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return ((const binary_op *)user)->fn(tp, in[0], in[1]);
}

static void test_gradcheck_and_f32_every_pair_every_op(void) {
    for (int o = 0; o < 4; o++)
        for (int c = 0; c < N_PAIRS; c++) {
            ag_tensor *in[] = {random_tensor(AG_F64, pairs[c].a, 10 + (uint64_t)c, -1, 1),
                               random_tensor(AG_F64, pairs[c].b, 20 + (uint64_t)c, 0.5, 2)};
            requiring_grad(in[0]);
            requiring_grad(in[1]);
            char label[64];
            snprintf(label, sizeof label, "%s pair %d", binaries[o].name, c);
            CHECK(op_checks_pass(label, binary_case, in, 2, (void *)&binaries[o]));
            free_tensors(in, 2);
        }
}

static void test_one_operand_alone_may_require_grad(void) {
    for (int side = 0; side < 2; side++) {
        ag_tensor *in[] = {leaf(3, (int[]){2, 3, 4}, 30), leaf(2, (int[]){3, 1}, 31)};
        ag_tensor_set_requires_grad(in[side], false);
        CHECK(op_checks_pass("mul one side", binary_case, in, 2, (void *)&binaries[2]));
        free_tensors(in, 2);
    }
}

static void test_same_tensor_on_both_sides_gets_both_gradients(void) {
    ag_tensor *x = leaf(2, (int[]){2, 3}, 32);
    ag_tape *tp = ag_tape_new();
    ag_backward(tp, ag_sum(tp, ag_mul(tp, x, x)));
    for (size_t k = 0; k < x->numel; k++)
        CHECK_NEAR(ag_tensor_grad_item(x, k), 2 * ag_tensor_item(x, k), 1e-15);
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// ---- where and masked_fill -------------------------------------------------------------

static ag_tensor *where_case(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return ag_where(tp, user, in[0], in[1]);
}

static void test_where_picks_and_routes_gradients_with_broadcasting(void) {
    const int cs[] = {2, 1, 4};
    ag_tensor *cond = bool_mask(3, cs, 0.5, 40);
    ag_tensor *in[] = {leaf(2, (int[]){3, 4}, 41), leaf(3, (int[]){2, 3, 1}, 42)};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_where(tp, cond, in[0], in[1]);
    CHECK(y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 4);
    for (size_t k = 0; k < y->numel; k++) {
        bool c = ag_tensor_item(cond, source_index(cond, y, k)) != 0;
        const ag_tensor *src = c ? in[0] : in[1];
        CHECK(ag_tensor_item(y, k) == ag_tensor_item(src, source_index(src, y, k)));
    }
    ag_tape_free(tp);
    CHECK(op_checks_pass("where", where_case, in, 2, cond));
    free_tensors(in, 2);
    ag_tensor_free(cond);
}

typedef struct {
    ag_tensor *mask;
    double value;
} fill_case;

static ag_tensor *masked_fill_case(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const fill_case *c = user;
    return ag_masked_fill(tp, in[0], c->mask, c->value);
}

static void test_masked_fill_gradcheck_with_a_broadcast_mask(void) {
    const int ms[] = {2, 1, 3, 5};
    fill_case c = {bool_mask(4, ms, 0.4, 50), 0.25};
    ag_tensor *x = leaf(4, (int[]){2, 3, 3, 5}, 51);
    CHECK(op_checks_pass("masked_fill", masked_fill_case, &x, 1, &c));
    ag_tensor_free(x);
    ag_tensor_free(c.mask);
}

// A -inf fill feeding a softmax: masked places get weight 0 and exactly 0 gradient.
static ag_tensor *masked_softmax(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const fill_case *c = user;
    return ag_softmax_dim(tp, ag_masked_fill(tp, in[0], c->mask, -INFINITY), -1);
}

static void test_masked_fill_with_minus_infinity_gives_no_nan_gradient(void) {
    const int ms[] = {1, 3, 4};  // a [1,T,S] mask over [B,T,S], one row fully masked
    fill_case c = {bool_mask(3, ms, 0.4, 52), -INFINITY};
    uint8_t *m = c.mask->data;
    for (int s = 0; s < 4; s++) m[4 + s] = 1;
    m[0] = 0;
    ag_tensor *x = leaf(3, (int[]){2, 3, 4}, 53);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = masked_softmax(tp, &x, 1, &c);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, y, y)));
    CHECK(grad_all_finite(x));
    for (size_t k = 0; k < x->numel; k++)
        if (m[k % 12]) {
            CHECK(ag_tensor_item(y, k) == 0);
            CHECK(ag_tensor_grad_item(x, k) == 0);
        }
    ag_tape_free(tp);
    CHECK(op_checks_pass("masked_fill -inf + softmax", masked_softmax, &x, 1, &c));
    ag_tensor_free(x);
    ag_tensor_free(c.mask);
}

// ---- matmul broadcasting --------------------------------------------------------------

typedef struct {
    bool ta, tb;
} mm_flags;

static ag_tensor *matmul_case(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    const mm_flags *f = user;
    return ag_matmul(tp, in[0], in[1], f->ta, f->tb);
}

static void test_matmul_broadcasts_leading_dims(void) {
    // [B,h,T,d] x [d,S]; [B,1,T,d] x [1,h,d,S]; [h,T,d] x [B,h,d,S]; transposed operands.
    const test_shape as[] = {{4, {2, 3, 4, 5}}, {4, {2, 1, 4, 5}}, {3, {3, 4, 5}},
                             {4, {2, 3, 5, 4}}, {3, {2, 4, 5}}};
    const test_shape bs[] = {{2, {5, 6}}, {4, {1, 3, 5, 6}}, {4, {2, 3, 5, 6}},
                             {2, {6, 5}}, {2, {5, 6}}};
    const mm_flags fs[] = {{false, false}, {false, false}, {false, false}, {true, true},
                           {false, false}};
    for (int c = 0; c < 5; c++) {
        ag_tensor *in[] = {requiring_grad(random_tensor(AG_F64, as[c], 60 + (uint64_t)c, -1, 1)),
                           requiring_grad(random_tensor(AG_F64, bs[c], 70 + (uint64_t)c, -1, 1))};
        char label[32];
        snprintf(label, sizeof label, "matmul case %d", c);
        CHECK(op_checks_pass(label, matmul_case, in, 2, (void *)&fs[c]));
        free_tensors(in, 2);
    }
}

static void test_matmul_broadcast_equals_explicit_expand(void) {
    ag_tensor *a = leaf(4, (int[]){2, 3, 4, 5}, 80), *b = leaf(2, (int[]){5, 6}, 81);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y1 = ag_matmul(tp, a, b, false, false);
    ag_tensor *y2 = ag_matmul(tp, a, ag_expand(tp, b, 4, (int[]){2, 3, 5, 6}), false, false);
    CHECK(normwise_error(y1, y2, false) < 1e-15);
    ag_tape_free(tp);
    ag_tensor_free(a);
    ag_tensor_free(b);
}

// ---- Errors -------------------------------------------------------------------------------

// float32 gradients of a broadcast operand, summed over many rows, against float64 on the
// same numbers (max-norm relative error), with dy in [0, 1): a bias b [4] over [2^18, 4]
// through add, mul, expand and where (b where the condition holds, x elsewhere), and a
// one-element b over [2^20] through add. Those sums ran in float: the bias's gradient was 1e-5 to 3e-5 off, the scalar's
// 3e-7 (PyTorch's float32 on a bias over 1e6 rows: 1e-7). In double they are at float
// rounding, below 5e-8.
static ag_tensor *broadcast_case(ag_tape *tp, int c, ag_tensor *x, ag_tensor *b,
                                 ag_tensor *cond) {
    switch (c) {
    case 0: return ag_add(tp, x, b);
    case 1: return ag_mul(tp, x, b);
    case 2: return ag_add(tp, x, b);  // b has one element
    case 3: return ag_expand(tp, b, x->ndim, x->shape);
    default: return ag_where(tp, cond, b, x);
    }
}

static void test_float32_broadcast_gradient_sums_match_float64(void) {
    const int rows = 1 << 18;
    for (int c = 0; c < 5; c++) {
        const bool scalar = c == 2;
        const int xshape[2] = {scalar ? 4 * rows : rows, 4}, bshape[1] = {scalar ? 1 : 4};
        ag_tensor *x32 = uniform_tensor(AG_F32, scalar ? 1 : 2, xshape, 101, -1, 1);
        ag_tensor *b32 = uniform_tensor(AG_F32, 1, bshape, 102, -1, 1);
        ag_tensor *dy32 = uniform_tensor(AG_F32, scalar ? 1 : 2, xshape, 103, 0, 1);
        ag_tensor *x64 = ag_tensor_convert(x32, AG_F64), *b64 = ag_tensor_convert(b32, AG_F64);
        ag_tensor *dy64 = ag_tensor_convert(dy32, AG_F64);  // the same numbers, exactly
        ag_tensor *cond = ag_tensor_zeros(AG_BOOL, 2, xshape);
        for (size_t i = 0; i < cond->numel; i++) ((uint8_t *)cond->data)[i] = i % 3 != 0;
        ag_tensor_set_requires_grad(b32, true);
        ag_tensor_set_requires_grad(b64, true);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y32 = broadcast_case(tp, c, x32, b32, cond);
        ag_tensor *y64 = broadcast_case(tp, c, x64, b64, cond);
        ag_backward_with(tp, y32, dy32);
        ag_backward_with(tp, y64, dy64);
        const double e = normwise_error(b32, b64, true);
        if (e > 2e-7) fprintf(stderr, "  case %d: the gradient is %.2e off\n", c, e);
        CHECK(e <= 2e-7);
        ag_tape_free(tp);
        ag_tensor *all[7] = {x32, b32, dy32, x64, b64, dy64, cond};
        for (int k = 0; k < 7; k++) ag_tensor_free(all[k]);
    }
}

static void test_shapes_that_do_not_broadcast_are_one_line_errors(void) {
    ag_tensor *a = ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 4});
    ag_tensor *b = ag_tensor_zeros(AG_F64, 2, (int[]){5, 4});
    ag_tensor *f = ag_tensor_zeros(AG_F32, 1, (int[]){4});
    ag_tensor *m = ag_tensor_zeros(AG_BOOL, 2, (int[]){3, 1});
    ag_tensor *wide = ag_tensor_zeros(AG_BOOL, 4, (int[]){2, 2, 3, 4});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(fails_with(ag_add(tp, a, b), "add: shapes [2,3,4] and [5,4] do not broadcast"));
    CHECK(fails_with(ag_div(tp, b, a), "div: shapes [5,4] and [2,3,4] do not broadcast"));
    CHECK(fails_with(ag_sub(tp, a, f), "sub: dtypes differ: f64 [2,3,4] and f32 [4]"));
    CHECK(fails_with(ag_mul(tp, a, m), "mul: b [3,1] must be f32 or f64, not bool"));
    CHECK(fails_with(ag_where(tp, m, a, b),
                     "where: shapes [3,1] and [2,3,4] and [5,4] do not broadcast"));
    CHECK(fails_with(ag_where(tp, a, a, a), "where: cond [2,3,4] must be bool, not f64"));
    CHECK(fails_with(ag_masked_fill(tp, a, wide, 0),
                     "masked_fill: mask [2,2,3,4] does not broadcast to x [2,3,4] (the output "
                     "keeps x's shape)"));
    CHECK(fails_with(ag_masked_fill(tp, a, NULL, 0), "masked_fill: mask is NULL"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor *all[] = {a, b, f, m, wide};
    free_tensors(all, 5);
}

// ---- Threads and memory --------------------------------------------------------------------

// y = a * b + c, a [B,T,E], b [E], c [B,T,E]: forward and both gradients, copied out.
static void run_big(ag_tensor *const in[], float *out) {
    for (int i = 0; i < 3; i++) ag_tensor_zero_grad(in[i]);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_add(tp, ag_mul(tp, in[0], in[1]), in[2]);
    ag_backward_with(tp, y, in[3]);
    size_t n = in[0]->numel, E = in[1]->numel;
    memcpy(out, y->data, n * sizeof *out);
    memcpy(out + n, in[0]->grad, n * sizeof *out);
    memcpy(out + 2 * n, in[1]->grad, E * sizeof *out);
    memcpy(out + 2 * n + E, in[2]->grad, n * sizeof *out);
    ag_tape_free(tp);
}

static void test_two_threads_are_bit_identical_to_one(void) {
    const int s[] = {16, 128, 384}, e = 384;
    ag_tensor *in[] = {requiring_grad(uniform_tensor(AG_F32, 3, s, 90, -1, 1)),
                       requiring_grad(uniform_tensor(AG_F32, 1, &e, 91, -1, 1)),
                       requiring_grad(uniform_tensor(AG_F32, 3, s, 92, -1, 1)),
                       uniform_tensor(AG_F32, 3, s, 93, -1, 1)};
    size_t len = 3 * in[0]->numel + (size_t)e;
    float *one = malloc(len * sizeof *one), *two = malloc(len * sizeof *two);
    run_big(in, one);
    ag_threads_set(2);
    run_big(in, two);
    ag_threads_set(1);
    CHECK(memcmp(one, two, len * sizeof *one) == 0);
    free(one);
    free(two);
    free_tensors(in, 4);
}

static void broadcast_step(ag_tape *tp, int step, void *user) {
    (void)step;
    ag_tensor *const *t = user;
    ag_tensor *y = ag_div(tp, ag_sub(tp, ag_mul(tp, t[0], t[1]), t[2]), t[3]);
    y = ag_masked_fill(tp, ag_matmul(tp, y, t[4], false, false), t[5], -INFINITY);
    ag_backward(tp, ag_sum(tp, ag_softmax_dim(tp, y, -1)));
}

static void test_repeated_step_allocates_no_heap_memory(void) {
    ag_tensor *t[] = {leaf(3, (int[]){4, 64, 32}, 100), leaf(1, (int[]){32}, 101),
                      leaf(2, (int[]){64, 1}, 102),
                      uniform_tensor(AG_F64, 1, (int[]){32}, 103, 1, 2),
                      leaf(2, (int[]){32, 48}, 104), bool_mask(3, (int[]){1, 64, 48}, 0.3, 105)};
    CHECK(repeated_step_allocates_nothing(broadcast_step, t));
    free_tensors(t, 6);
}

// d(a / b)/db = -a / b^2 taken as (a / b) / b, as PyTorch's div_tensor_other_backward: b^2
// first underflows to 0 (a NaN 0 / 0 at a = 0, where PyTorch gives -0) or overflows to inf
// (0 where the gradient is -1e-10). Each of the four loops: both operands full, b alone
// broadcast, a alone broadcast, both. Expected values by hand (-a / b^2, dy = 1), and as
// PyTorch 1.13 gives them.
static void test_div_gradient_of_a_tiny_or_huge_divisor_is_finite(void) {
    for (int dti = 0; dti < 2; dti++) {
        const ag_dtype dt = dti ? AG_F64 : AG_F32;
        const double tiny = dti ? 1e-300 : 1e-30, huge = dti ? 1e200 : 1e20,
                     top = dti ? 1e300 : 1e30, want = dti ? -1e-100 : -1e-10;
        ag_tensor *a = requiring_grad(ag_tensor_from(AG_F64, 1, (int[]){3},
                                                     (double[]){0, top, 3}));
        ag_tensor *b = requiring_grad(ag_tensor_from(AG_F64, 1, (int[]){3},
                                                     (double[]){tiny, huge, 2}));
        ag_tensor *a32 = requiring_grad(ag_tensor_convert(a, dt));
        ag_tensor *b32 = requiring_grad(ag_tensor_convert(b, dt));
        ag_tensor *zero1 = requiring_grad(ag_tensor_zeros(dt, 1, (int[]){1}));
        ag_tensor *zeros3 = ag_tensor_zeros(dt, 1, (int[]){3});
        ag_tensor *tiny1 = requiring_grad(ag_tensor_zeros(dt, 1, (int[]){1}));
        ag_tensor_fill(tiny1, tiny);
        ag_tape *tp = ag_tape_new();
        ag_backward(tp, ag_sum(tp, ag_div(tp, a32, b32)));  // both full
        CHECK(ag_tensor_grad_item(b32, 0) == 0);
        CHECK(fabs(ag_tensor_grad_item(b32, 1) / want - 1) < 1e-6);  // relative: want is tiny
        CHECK_NEAR(ag_tensor_grad_item(b32, 2), -0.75, 1e-6);
        ag_tensor_zero_grad(b32);
        ag_backward(tp, ag_sum(tp, ag_div(tp, zero1, b32)));  // a broadcast: 0 / b
        CHECK(ag_tensor_grad_item(b32, 0) == 0);
        ag_backward(tp, ag_sum(tp, ag_div(tp, zeros3, tiny1)));  // b broadcast: 0 / tiny
        CHECK(ag_tensor_grad_item(tiny1, 0) == 0);
        ag_tensor_zero_grad(tiny1);
        ag_backward(tp, ag_sum(tp, ag_div(tp, zero1, tiny1)));  // both broadcast
        CHECK(ag_tensor_grad_item(tiny1, 0) == 0);
        ag_tape_free(tp);
        ag_tensor *t[] = {a, b, a32, b32, zero1, zeros3, tiny1};
        free_tensors(t, 7);
    }
}

int main(void) {
    RUN(test_forward_matches_naive_broadcasting);
    RUN(test_output_shape_is_the_broadcast_shape);
    RUN(test_gradcheck_and_f32_every_pair_every_op);
    RUN(test_one_operand_alone_may_require_grad);
    RUN(test_same_tensor_on_both_sides_gets_both_gradients);
    RUN(test_where_picks_and_routes_gradients_with_broadcasting);
    RUN(test_masked_fill_gradcheck_with_a_broadcast_mask);
    RUN(test_masked_fill_with_minus_infinity_gives_no_nan_gradient);
    RUN(test_matmul_broadcasts_leading_dims);
    RUN(test_matmul_broadcast_equals_explicit_expand);
    RUN(test_div_gradient_of_a_tiny_or_huge_divisor_is_finite);
    RUN(test_float32_broadcast_gradient_sums_match_float64);
    RUN(test_shapes_that_do_not_broadcast_are_one_line_errors);
    RUN(test_two_threads_are_bit_identical_to_one);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
