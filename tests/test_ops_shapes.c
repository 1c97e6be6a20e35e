// The shape ops: ag_transpose, ag_permute, ag_slice, ag_concat, ag_stack, ag_expand,
// ag_index_select and ag_gather. Values against index arithmetic, float64 gradient checks
// (negative dims, size-1 dims, repeated indices), float32 against float64, and the errors.
#include <stdlib.h>

#include "general_ops.h"

// Element (i0, i1, i2, i3) of t, padded on the left to 4 dims.
static double at4(const ag_tensor *t, int i0, int i1, int i2, int i3) {
    int s[4] = {1, 1, 1, 1}, idx[4] = {i0, i1, i2, i3};
    for (int d = 0; d < t->ndim; d++) s[4 - t->ndim + d] = t->shape[d];
    size_t k = 0;
    for (int d = 0; d < 4; d++) k = k * (size_t)s[d] + (size_t)idx[d];
    return ag_tensor_item(t, k);
}

static void test_transpose_swaps_two_dims(void) {
    ag_tensor *x = leaf(3, (int[]){2, 3, 4}, 1);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_transpose(tp, x, 0, -1);  // [4, 3, 2]
    CHECK(y->shape[0] == 4 && y->shape[1] == 3 && y->shape[2] == 2);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++) CHECK(at4(y, 0, c, b, a) == at4(x, 0, a, b, c));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_permute_moves_every_dim(void) {
    ag_tensor *x = leaf(4, (int[]){2, 3, 4, 5}, 2);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_permute(tp, x, (int[]){2, 0, 3, 1});  // [4, 2, 5, 3]
    CHECK(y->shape[0] == 4 && y->shape[1] == 2 && y->shape[2] == 5 && y->shape[3] == 3);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++)
                for (int d = 0; d < 5; d++) CHECK(at4(y, c, a, d, b) == at4(x, a, b, c, d));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_slice_takes_a_range_and_counts_negative_start_from_the_end(void) {
    ag_tensor *x = leaf(3, (int[]){2, 5, 3}, 3);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_slice(tp, x, 1, -3, 2);  // entries 2 and 3 of dim 1
    CHECK(y->shape[1] == 2);
    for (int a = 0; a < 2; a++)
        for (int j = 0; j < 2; j++)
            for (int c = 0; c < 3; c++) CHECK(at4(y, 0, a, j, c) == at4(x, 0, a, 2 + j, c));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static void test_concat_and_stack_place_inputs_side_by_side(void) {
    ag_tensor *a = leaf(2, (int[]){2, 3}, 4), *b = leaf(2, (int[]){2, 1}, 5);
    ag_tensor *c = leaf(2, (int[]){2, 3}, 6);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_concat(tp, (ag_tensor *[]){a, b}, 2, -1);  // [2, 4]
    ag_tensor *s = ag_stack(tp, (ag_tensor *[]){a, c}, 2, 1);    // [2, 2, 3]
    CHECK(y->shape[0] == 2 && y->shape[1] == 4);
    CHECK(s->ndim == 3 && s->shape[0] == 2 && s->shape[1] == 2 && s->shape[2] == 3);
    for (int r = 0; r < 2; r++) {
        for (int j = 0; j < 3; j++) {
            CHECK(at4(y, 0, 0, r, j) == at4(a, 0, 0, r, j));
            CHECK(at4(s, 0, r, 0, j) == at4(a, 0, 0, r, j));
            CHECK(at4(s, 0, r, 1, j) == at4(c, 0, 0, r, j));
        }
        CHECK(at4(y, 0, 0, r, 3) == at4(b, 0, 0, r, 0));
    }
    ag_tape_free(tp);
    ag_tensor *all[] = {a, b, c};
    free_tensors(all, 3);
}

static void test_expand_repeats_size_one_dims_and_adds_leading_ones(void) {
    ag_tensor *x = leaf(2, (int[]){3, 1}, 7);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_expand(tp, x, 3, (int[]){2, -1, 4});
    CHECK(y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 4);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++) CHECK(at4(y, 0, a, b, c) == at4(x, 0, 0, b, 0));
    ag_tape_free(tp);
    ag_tensor_free(x);
}

static ag_tensor *index_tensor(ag_dtype dt, int ndim, const int *shape, const int *values) {
    ag_tensor *t = ag_tensor_zeros(dt, ndim, shape);
    for (size_t i = 0; i < t->numel; i++) ag_tensor_set_item(t, i, values[i]);
    return t;
}

static void test_index_select_and_gather_pick_by_index(void) {
    ag_tensor *x = leaf(2, (int[]){4, 3}, 8);
    ag_tensor *ix = index_tensor(AG_I64, 1, (int[]){5}, (int[]){3, 0, 3, 1, 2});
    ag_tensor *gx = index_tensor(AG_I32, 2, (int[]){2, 3}, (int[]){0, 2, 1, 1, 0, 0});
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_index_select(tp, x, 0, ix), *g = ag_gather(tp, x, 1, gx);
    for (int j = 0; j < 5; j++)
        for (int c = 0; c < 3; c++)
            CHECK(at4(y, 0, 0, j, c) == at4(x, 0, 0, (int)ag_tensor_item(ix, (size_t)j), c));
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 3; c++)
            CHECK(at4(g, 0, 0, r, c) ==
                  at4(x, 0, 0, r, (int)ag_tensor_item(gx, (size_t)(r * 3 + c))));
    // Repeated indices sum their gradients: row 3 is picked twice.
    ag_backward(tp, ag_sum(tp, y));
    CHECK(ag_tensor_grad_item(x, 9) == 2 && ag_tensor_grad_item(x, 0) == 1);
    ag_tape_free(tp);
    ag_tensor *all[] = {x, ix, gx};
    free_tensors(all, 3);
}

// The node keeps the index it checked: an entry changed between forward and backward
// (here to 1000, out of x's 4 rows) moved the gradient and wrote outside dx.
static void test_an_index_changed_after_the_forward_does_not_reach_backward(void) {
    ag_tensor *x = leaf(2, (int[]){4, 3}, 8);
    ag_tensor *ix = index_tensor(AG_I32, 1, (int[]){2}, (int[]){3, 1});
    ag_tensor *gx = index_tensor(AG_I64, 2, (int[]){1, 3}, (int[]){2, 0, 1});
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_add(tp, ag_sum(tp, ag_index_select(tp, x, 0, ix)),
                          ag_sum(tp, ag_gather(tp, x, 1, gx)));
    ag_tensor_set_item(ix, 0, 1000);
    ag_tensor_set_item(gx, 0, 1000);
    ag_backward(tp, y);
    // index_select's rows 3 and 1 (elements 9-11 and 3-5); gather's row 0 picks columns 2,
    // 0 and 1 (elements 0-2).
    const double want[12] = {1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1};
    for (int i = 0; i < 12; i++) CHECK(ag_tensor_grad_item(x, (size_t)i) == want[i]);
    ag_tape_free(tp);
    ag_tensor *all[] = {x, ix, gx};
    free_tensors(all, 3);
}

// ---- Gradient checks -------------------------------------------------------------------

typedef struct {
    int kind;  // 0 transpose, 1 permute, 2 slice, 3 concat, 4 stack, 5 expand, 6 index_select,
               // 7 gather
    int dim, a, b;
    int perm[4];
    int ndim, shape[4];
    ag_tensor *index;
} shape_case;

static ag_tensor *shape_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    const shape_case *c = user;
    switch (c->kind) {
    case 0: return ag_transpose(tp, in[0], c->a, c->b);
    case 1: return ag_permute(tp, in[0], c->perm);
    case 2: return ag_slice(tp, in[0], c->dim, c->a, c->b);
    case 3: return ag_concat(tp, in, n, c->dim);
    case 4: return ag_stack(tp, in, n, c->dim);
    case 5: return ag_expand(tp, in[0], c->ndim, c->shape);
    case 6: return ag_index_select(tp, in[0], c->dim, c->index);
    default: return ag_gather(tp, in[0], c->dim, c->index);
    }
}

static bool check_one(const char *label, shape_case c, int n, const test_shape *shapes,
                      uint64_t seed) {
    ag_tensor *in[AG_MAX_INPUTS * 2] = {0};
    for (int i = 0; i < n; i++)
        in[i] = requiring_grad(random_tensor(AG_F64, shapes[i], seed + (uint64_t)i, -1, 1));
    bool ok = op_checks_pass(label, shape_fn, in, n, &c);
    free_tensors(in, n);
    return ok;
}

static void test_transpose_and_permute_gradcheck(void) {
    test_shape s4 = {4, {2, 3, 1, 4}}, s2 = {2, {1, 5}};
    CHECK(check_one("transpose 1,3", (shape_case){0, 0, 1, 3, {0}, 0, {0}, NULL}, 1, &s4, 10));
    CHECK(check_one("transpose -1,-2", (shape_case){0, 0, -1, -2, {0}, 0, {0}, NULL}, 1, &s2, 11));
    CHECK(check_one("transpose 2,2", (shape_case){0, 0, 2, 2, {0}, 0, {0}, NULL}, 1, &s4, 12));
    CHECK(check_one("permute", (shape_case){1, 0, 0, 0, {3, -4, 1, 2}, 0, {0}, NULL}, 1, &s4, 13));
}

static void test_slice_gradcheck_over_dims(void) {
    test_shape s = {3, {3, 5, 4}};
    CHECK(check_one("slice dim 0", (shape_case){2, 0, 1, 2, {0}, 0, {0}, NULL}, 1, &s, 20));
    CHECK(check_one("slice dim -2", (shape_case){2, -2, 2, 3, {0}, 0, {0}, NULL}, 1, &s, 21));
    CHECK(check_one("slice last, one", (shape_case){2, 2, -1, 1, {0}, 0, {0}, NULL}, 1, &s, 22));
    CHECK(check_one("slice whole", (shape_case){2, 1, 0, 5, {0}, 0, {0}, NULL}, 1, &s, 23));
}

static void test_concat_and_stack_gradcheck(void) {
    test_shape cs[] = {{3, {2, 1, 3}}, {3, {2, 4, 3}}, {3, {2, 2, 3}}};
    CHECK(check_one("concat dim 1", (shape_case){3, 1, 0, 0, {0}, 0, {0}, NULL}, 3, cs, 30));
    test_shape ss[] = {{2, {2, 3}}, {2, {2, 3}}, {2, {2, 3}}};
    for (int d = -3; d <= 2; d++) {
        char label[32];
        snprintf(label, sizeof label, "stack dim %d", d);
        CHECK(check_one(label, (shape_case){4, d, 0, 0, {0}, 0, {0}, NULL}, 3, ss, 31));
    }
}

static void test_concat_and_stack_of_more_inputs_than_a_node_takes(void) {
    test_shape s[11];
    for (int i = 0; i < 11; i++) s[i] = (test_shape){2, {2, 1 + i % 3}};
    CHECK(check_one("concat 11", (shape_case){3, 1, 0, 0, {0}, 0, {0}, NULL}, 11, s, 40));
    for (int i = 0; i < 11; i++) s[i] = (test_shape){2, {2, 3}};
    CHECK(check_one("stack 11", (shape_case){4, 0, 0, 0, {0}, 0, {0}, NULL}, 11, s, 41));
    CHECK(check_one("stack 11 last", (shape_case){4, -1, 0, 0, {0}, 0, {0}, NULL}, 11, s, 42));
}

static void test_expand_gradcheck(void) {
    test_shape s1 = {2, {3, 1}}, s2 = {1, {1}}, s3 = {3, {1, 2, 1}};
    CHECK(check_one("expand [3,1]", (shape_case){5, 0, 0, 0, {0}, 3, {2, 3, 4}, NULL}, 1, &s1, 50));
    CHECK(check_one("expand [1]", (shape_case){5, 0, 0, 0, {0}, 2, {3, 2}, NULL}, 1, &s2, 51));
    CHECK(check_one("expand [1,2,1]",
                    (shape_case){5, 0, 0, 0, {0}, 4, {2, -1, 2, 3}, NULL}, 1, &s3, 52));
}

static void test_index_select_and_gather_gradcheck(void) {
    ag_tensor *ix = index_tensor(AG_I32, 1, (int[]){4}, (int[]){2, 2, 0, 1});
    test_shape s = {3, {2, 3, 4}};
    CHECK(check_one("index_select dim 1", (shape_case){6, 1, 0, 0, {0}, 0, {0}, ix}, 1, &s, 60));
    CHECK(check_one("index_select dim -1", (shape_case){6, -1, 0, 0, {0}, 0, {0}, ix}, 1, &s, 61));
    ag_tensor *gx =
        index_tensor(AG_I64, 3, (int[]){2, 2, 3}, (int[]){0, 1, 2, 1, 0, 0, 2, 2, 1, 0, 1, 2});
    CHECK(check_one("gather dim 1", (shape_case){7, 1, 0, 0, {0}, 0, {0}, gx}, 1, &s, 62));
    ag_tensor *gl =
        index_tensor(AG_I64, 3, (int[]){2, 3, 2}, (int[]){3, 3, 0, 1, 2, 2, 1, 0, 3, 3, 0, 0});
    CHECK(check_one("gather dim -1", (shape_case){7, -1, 0, 0, {0}, 0, {0}, gl}, 1, &s, 63));
    ag_tensor *all[] = {ix, gx, gl};
    free_tensors(all, 3);
}

// The index dtypes the gradchecks above leave out: an i64 index_select along dim 0 and an
// i32 gather along dims 0 and -1 (repeated indices, whose gradients add up).
static void test_index_select_i64_and_gather_i32_gradcheck(void) {
    ag_tensor *ix = index_tensor(AG_I64, 1, (int[]){3}, (int[]){1, 0, 1});
    test_shape s = {3, {2, 3, 4}};
    CHECK(check_one("index_select i64 dim 0", (shape_case){6, 0, 0, 0, {0}, 0, {0}, ix}, 1, &s,
                    64));
    ag_tensor *g0 =
        index_tensor(AG_I32, 3, (int[]){2, 2, 3}, (int[]){1, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 1});
    CHECK(check_one("gather i32 dim 0", (shape_case){7, 0, 0, 0, {0}, 0, {0}, g0}, 1, &s, 65));
    ag_tensor *gl =
        index_tensor(AG_I32, 3, (int[]){2, 3, 2}, (int[]){3, 3, 0, 1, 2, 2, 1, 0, 3, 3, 0, 0});
    CHECK(check_one("gather i32 dim -1", (shape_case){7, -1, 0, 0, {0}, 0, {0}, gl}, 1, &s, 66));
    ag_tensor *all[] = {ix, g0, gl};
    free_tensors(all, 3);
}

// ---- Errors ---------------------------------------------------------------------------------

static void test_misuse_is_one_line_naming_the_op_and_shapes(void) {
    ag_tensor *x = ag_tensor_zeros(AG_F64, 3, (int[]){2, 3, 4});
    ag_tensor *y = ag_tensor_zeros(AG_F64, 3, (int[]){2, 5, 5});
    ag_tensor *bad = index_tensor(AG_I64, 1, (int[]){3}, (int[]){0, 7, 1});
    ag_tensor *fidx = ag_tensor_zeros(AG_F64, 1, (int[]){2});
    ag_tensor *four = ag_tensor_zeros(AG_F64, 4, (int[]){1, 1, 1, 1});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(fails_with(ag_concat(tp, (ag_tensor *[]){x, y}, 2, 1),
                     "concat: shapes differ outside dim 1: [2,3,4] vs [2,5,5]"));
    CHECK(fails_with(ag_stack(tp, (ag_tensor *[]){x, y}, 2, 0),
                     "stack: shapes differ: [2,3,4] vs [2,5,5]"));
    CHECK(fails_with(ag_concat(tp, (ag_tensor *[]){x}, 0, 0),
                     "concat: needs at least one tensor, got n 0"));
    CHECK(fails_with(ag_transpose(tp, x, 0, 3),
                     "transpose: dim 3 is out of range for x [2,3,4] (expected -3 to 2)"));
    ag_tensor *scalar = ag_tensor_zeros(AG_F64, 0, NULL);  // "expected 0 to 0" before
    CHECK(fails_with(ag_transpose(tp, scalar, 0, 0), "transpose: x [] is a scalar: it has no dim 0"));
    ag_tensor_free(scalar);
    CHECK(fails_with(ag_permute(tp, x, (int[]){0, 0, 1}),
                     "permute: (0,0,1) is not a permutation of the 3 dims of x [2,3,4]"));
    CHECK(fails_with(ag_slice(tp, x, 2, 3, 2),
                     "slice: [3, 3 + 2) is outside dim 2 of x [2,3,4] (size 4)"));
    CHECK(fails_with(ag_expand(tp, x, 3, (int[]){2, 2, 4}),
                     "expand: x [2,3,4] does not broadcast to [2,2,4]"));
    CHECK(fails_with(ag_index_select(tp, x, 1, bad),
                     "index_select: index 7 at position 1 is out of range for dim 1 of x [2,3,4]"));
    CHECK(fails_with(ag_index_select(tp, x, 0, fidx),
                     "index_select: index [2] must be i32 or i64, not f64"));
    CHECK(fails_with(ag_gather(tp, x, 1, bad),
                     "gather: index [3] does not fit x [2,3,4] (same dims, each at most x's "
                     "except dim 1)"));
    CHECK(fails_with(ag_stack(tp, (ag_tensor *[]){four}, 1, 0),
                     "stack: xs[0] [1,1,1,1] already has 4 dims, the most a tensor has"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor *all[] = {x, y, bad, fidx, four};
    free_tensors(all, 5);
}

// A NULL array or shape is called NULL, not a count or a shape it is not; a length or a
// -1 that cannot be is named for what it is.
static void test_a_null_array_or_shape_is_reported_as_null(void) {
    ag_tensor *x = ag_tensor_zeros(AG_F64, 2, (int[]){3, 4});
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(fails_with(ag_concat(tp, NULL, 2, 0), "concat: the tensor array xs is NULL (n 2)"));
    CHECK(fails_with(ag_stack(tp, NULL, 2, 0), "stack: the tensor array xs is NULL (n 2)"));
    CHECK(fails_with(ag_stack(tp, (ag_tensor *[]){x}, -1, 0),
                     "stack: needs at least one tensor, got n -1"));
    CHECK(fails_with(ag_expand(tp, x, 2, NULL), "expand: the shape is NULL (ndim 2, x [3,4])"));
    CHECK(fails_with(ag_expand(tp, x, 1, (int[]){4}),
                     "expand: cannot expand x [3,4] to 1 dims: the target needs 2 to 4"));
    CHECK(fails_with(ag_expand(tp, x, 3, (int[]){-1, 3, 4}),
                     "expand: -1 at dim 0 of [-1,3,4] is a new leading dim, where x [3,4] has "
                     "no size to keep"));
    CHECK(fails_with(ag_permute(tp, x, NULL), "permute: perm is NULL (x [3,4])"));
    CHECK(fails_with(ag_reshape(tp, x, 2, NULL), "reshape: shape is NULL for 2 dimensions "
                                                 "(x [3,4])"));
    CHECK(fails_with(ag_slice(tp, x, 1, 0, 0),
                     "slice: length 0 along dim 1 of x [3,4]; it must be >= 1"));
    testing_release_errors();
    ag_tape_free(tp);
    ag_tensor_free(x);
}

// permute, slice, concat and index_select of a large tensor, forward and backward.
static void run_big(ag_tensor *x, ag_tensor *index, float *out) {
    ag_tensor_zero_grad(x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *p = ag_permute(tp, x, (int[]){2, 0, 1});
    ag_tensor *s = ag_slice(tp, x, 1, 3, 500);
    ag_tensor *c = ag_concat(tp, (ag_tensor *[]){s, x}, 2, 1);
    ag_tensor *i = ag_index_select(tp, x, 1, index);
    ag_tensor *parts[] = {ag_sum(tp, ag_mul(tp, p, p)), ag_sum(tp, ag_mul(tp, c, c)),
                          ag_sum(tp, ag_mul(tp, i, i))};
    ag_backward(tp, ag_add(tp, ag_add(tp, parts[0], parts[1]), parts[2]));
    size_t n = x->numel, off = 0;
    memcpy(out, x->grad, n * sizeof *out);
    off += n;
    ag_tensor *ys[] = {p, c, i};
    for (int k = 0; k < 3; k++) {
        memcpy(out + off, ys[k]->data, ys[k]->numel * sizeof *out);
        off += ys[k]->numel;
    }
    ag_tape_free(tp);
}

static void test_two_threads_are_bit_identical_to_one(void) {
    ag_tensor *x = requiring_grad(uniform_tensor(AG_F32, 3, (int[]){8, 600, 64}, 90, -1, 1));
    int values[700];
    for (int k = 0; k < 700; k++) values[k] = (k * 37) % 600;
    ag_tensor *index = index_tensor(AG_I32, 1, (int[]){700}, values);
    size_t len = x->numel * 2 + (size_t)8 * (500 + 600) * 64 + (size_t)8 * 700 * 64;
    float *one = malloc(len * sizeof *one), *two = malloc(len * sizeof *two);
    run_big(x, index, one);
    ag_threads_set(2);
    run_big(x, index, two);
    ag_threads_set(1);
    CHECK(memcmp(one, two, len * sizeof *one) == 0);
    free(one);
    free(two);
    ag_tensor_free(x);
    ag_tensor_free(index);
}

int main(void) {
    RUN(test_transpose_swaps_two_dims);
    RUN(test_permute_moves_every_dim);
    RUN(test_slice_takes_a_range_and_counts_negative_start_from_the_end);
    RUN(test_concat_and_stack_place_inputs_side_by_side);
    RUN(test_expand_repeats_size_one_dims_and_adds_leading_ones);
    RUN(test_index_select_and_gather_pick_by_index);
    RUN(test_transpose_and_permute_gradcheck);
    RUN(test_slice_gradcheck_over_dims);
    RUN(test_concat_and_stack_gradcheck);
    RUN(test_concat_and_stack_of_more_inputs_than_a_node_takes);
    RUN(test_expand_gradcheck);
    RUN(test_index_select_and_gather_gradcheck);
    RUN(test_index_select_i64_and_gather_i32_gradcheck);
    RUN(test_an_index_changed_after_the_forward_does_not_reach_backward);
    RUN(test_misuse_is_one_line_naming_the_op_and_shapes);
    RUN(test_a_null_array_or_shape_is_reported_as_null);
    RUN(test_two_threads_are_bit_identical_to_one);
    return testing_summary();
}
