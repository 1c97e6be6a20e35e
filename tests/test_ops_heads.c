// ag_split_heads and ag_merge_heads: [B, T, E] <-> [B, h, T, d], against
// finite differences, a naive index loop, each other, float64, and threads.
#include <stdlib.h>

#include "op_checks.h"

typedef struct {
    int B, h, T, d;
} heads_shape;

static const heads_shape shapes[] = {
    {2, 4, 3, 3},  // E = 12, h = 4: d = 3, not a multiple of 8
    {2, 2, 1, 4},  // T = 1
    {1, 1, 4, 6},  // h = 1: the identity, reshaped
    {3, 6, 2, 1},  // d = 1
    {2, 3, 5, 8},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

static ag_tensor *split_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return ag_split_heads(tp, in[0], *(const int *)user);
}

static ag_tensor *merge_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    (void)user;
    return ag_merge_heads(tp, in[0]);
}

static void test_gradcheck_split_heads(void) {
    for (int i = 0; i < N_SHAPES; i++) {
        const heads_shape *s = &shapes[i];
        ag_tensor *x = random_leaf(AG_F64, 3, (int[]){s->B, s->T, s->h * s->d}, 10 + (uint64_t)i);
        CHECK(ag_gradcheck(split_fn, &x, 1, (void *)&s->h, NULL, NULL));
        ag_tensor_free(x);
    }
}

static void test_gradcheck_merge_heads(void) {
    for (int i = 0; i < N_SHAPES; i++) {
        const heads_shape *s = &shapes[i];
        ag_tensor *x = random_leaf(AG_F64, 4, (int[]){s->B, s->h, s->T, s->d}, 20 + (uint64_t)i);
        CHECK(ag_gradcheck(merge_fn, &x, 1, NULL, NULL, NULL));
        ag_tensor_free(x);
    }
}

// Flat offsets of element (b, j, t, i) in [B, T, h*d] and in [B, h, T, d].
static size_t at_bte(const heads_shape *s, int b, int j, int t, int i) {
    return (((size_t)b * s->T + (size_t)t) * s->h + (size_t)j) * s->d + (size_t)i;
}
static size_t at_bhtd(const heads_shape *s, int b, int j, int t, int i) {
    return (((size_t)b * s->h + (size_t)j) * s->T + (size_t)t) * s->d + (size_t)i;
}

static void test_forward_matches_naive_index_loop(void) {
    for (int k = 0; k < N_SHAPES; k++) {
        const heads_shape *s = &shapes[k];
        ag_tensor *x = random_leaf(AG_F64, 3, (int[]){s->B, s->T, s->h * s->d}, 30);
        ag_tensor *z = random_leaf(AG_F64, 4, (int[]){s->B, s->h, s->T, s->d}, 31);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_split_heads(tp, x, s->h), *m = ag_merge_heads(tp, z);
        CHECK(y->ndim == 4 && y->shape[0] == s->B && y->shape[1] == s->h &&
              y->shape[2] == s->T && y->shape[3] == s->d);
        CHECK(m->ndim == 3 && m->shape[0] == s->B && m->shape[1] == s->T &&
              m->shape[2] == s->h * s->d);
        for (int b = 0; b < s->B; b++)
            for (int j = 0; j < s->h; j++)
                for (int t = 0; t < s->T; t++)
                    for (int i = 0; i < s->d; i++) {
                        CHECK(ag_tensor_item(y, at_bhtd(s, b, j, t, i)) ==
                              ag_tensor_item(x, at_bte(s, b, j, t, i)));
                        CHECK(ag_tensor_item(m, at_bte(s, b, j, t, i)) ==
                              ag_tensor_item(z, at_bhtd(s, b, j, t, i)));
                    }
        ag_tape_free(tp);
        ag_tensor_free(x);
        ag_tensor_free(z);
    }
}

static void test_merge_undoes_split_exactly(void) {
    for (int k = 0; k < N_SHAPES; k++) {
        const heads_shape *s = &shapes[k];
        ag_tensor *x = random_leaf(AG_F32, 3, (int[]){s->B, s->T, s->h * s->d}, 40);
        ag_tensor *z = random_leaf(AG_F32, 4, (int[]){s->B, s->h, s->T, s->d}, 41);
        ag_tape *tp = ag_tape_new();
        ag_tensor *x2 = ag_merge_heads(tp, ag_split_heads(tp, x, s->h));
        ag_tensor *z2 = ag_split_heads(tp, ag_merge_heads(tp, z), s->h);
        CHECK(ag_tensor_same_shape(x, x2) && ag_tensor_same_shape(z, z2));
        CHECK(memcmp(x->data, x2->data, x->numel * sizeof(float)) == 0);
        CHECK(memcmp(z->data, z2->data, z->numel * sizeof(float)) == 0);
        // ... and so do their gradients: d(merge(split(x)))/dx is the identity.
        ag_backward_with(tp, x2, x);
        CHECK(memcmp(x->grad, x->data, x->numel * sizeof(float)) == 0);
        ag_tape_free(tp);
        ag_tensor_free(x);
        ag_tensor_free(z);
    }
}

// merge(split(x)): both ops, forward and backward.
static ag_tensor *split_merge_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    return ag_merge_heads(tp, ag_split_heads(tp, in[0], *(const int *)user));
}

static void test_f32_matches_f64_within_1e_5(void) {
    for (int k = 0; k < N_SHAPES; k++) {
        const heads_shape *s = &shapes[k];
        ag_tensor *x = random_leaf(AG_F64, 3, (int[]){s->B, s->T, s->h * s->d}, 50);
        CHECK(f32_vs_f64_error(split_merge_fn, &x, 1, (void *)&s->h) <= 1e-5);
        CHECK(f32_vs_f64_error(split_fn, &x, 1, (void *)&s->h) <= 1e-5);
        ag_tensor_free(x);
    }
}

// y = split(x) + split(x): x feeds two nodes, so its gradient is the sum.
static ag_tensor *split_twice_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    int h = *(const int *)user;
    return ag_add(tp, ag_split_heads(tp, in[0], h), ag_split_heads(tp, in[0], h));
}

static ag_tensor *merge_twice_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)n;
    (void)user;
    return ag_add(tp, ag_merge_heads(tp, in[0]), ag_merge_heads(tp, in[0]));
}

static void test_tensor_used_twice_gets_summed_gradient(void) {
    const heads_shape *s = &shapes[0];
    ag_tensor *x = random_leaf(AG_F64, 3, (int[]){s->B, s->T, s->h * s->d}, 60);
    CHECK(ag_gradcheck(split_twice_fn, &x, 1, (void *)&s->h, NULL, NULL));
    ag_tensor *z = random_leaf(AG_F64, 4, (int[]){s->B, s->h, s->T, s->d}, 61);
    CHECK(ag_gradcheck(merge_twice_fn, &z, 1, NULL, NULL, NULL));

    // Exactly twice the permuted upstream gradient.
    ag_tensor_zero_grad(x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = split_twice_fn(tp, &x, 1, (void *)&s->h);
    ag_tensor *dy = uniform_tensor(AG_F64, 4, y->shape, 62, -1, 1);
    ag_backward_with(tp, y, dy);
    for (int b = 0; b < s->B; b++)
        for (int j = 0; j < s->h; j++)
            for (int t = 0; t < s->T; t++)
                for (int i = 0; i < s->d; i++)
                    CHECK(ag_tensor_grad_item(x, at_bte(s, b, j, t, i)) ==
                          2 * ag_tensor_item(dy, at_bhtd(s, b, j, t, i)));
    ag_tape_free(tp);
    ag_tensor_free(dy);
    ag_tensor_free(x);
    ag_tensor_free(z);
}

static const char *split_error(ag_dtype dt, int ndim, const int shape[], int heads) {
    ag_tensor *x = ag_tensor_zeros(dt, ndim, shape);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(ag_split_heads(tp, x, heads) == NULL);
    testing_release_errors();
    CHECK(testing_error_count == 1);
    ag_tape_free(tp);
    ag_tensor_free(x);
    return testing_last_error;
}

static const char *merge_error(ag_dtype dt, int ndim, const int shape[]) {
    ag_tensor *x = ag_tensor_zeros(dt, ndim, shape);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    CHECK(ag_merge_heads(tp, x) == NULL);
    testing_release_errors();
    CHECK(testing_error_count == 1);
    ag_tape_free(tp);
    ag_tensor_free(x);
    return testing_last_error;
}

static void test_bad_shapes_report_one_line_naming_op_and_shapes(void) {
    CHECK(strcmp(split_error(AG_F32, 3, (int[]){2, 3, 12}, 5),
                 "split_heads: E = 12 is not divisible by 5 heads: x [2,3,12]") == 0);
    CHECK(strcmp(split_error(AG_F32, 3, (int[]){2, 3, 12}, 0),
                 "split_heads: heads must be >= 1, got 0 for x [2,3,12]") == 0);
    CHECK(strcmp(split_error(AG_F32, 4, (int[]){2, 3, 4, 12}, 4),
                 "split_heads: x [B, T, E] must have 3 dimensions, got [2,3,4,12]") == 0);
    CHECK(strcmp(split_error(AG_BOOL, 3, (int[]){2, 3, 12}, 4),
                 "split_heads: x [2,3,12] must be f32 or f64, not bool") == 0);
    CHECK(strcmp(merge_error(AG_F64, 3, (int[]){2, 3, 12}),
                 "merge_heads: x [B, h, T, d] must have 4 dimensions, got [2,3,12]") == 0);
    CHECK(strcmp(merge_error(AG_BOOL, 4, (int[]){2, 3, 4, 5}),
                 "merge_heads: x [2,3,4,5] must be f32 or f64, not bool") == 0);
}

static void test_two_threads_are_deterministic_and_match_one_thread(void) {
    const int B = 8, T = 128, E = 256, h = 8;  // 262144 elements: large enough to split
    ag_tensor *x = random_leaf(AG_F32, 3, (int[]){B, T, E}, 70);
    ag_tensor *dy = uniform_tensor(AG_F32, 3, (int[]){B, T, E}, 71, -1, 1);
    size_t bytes = x->numel * sizeof(float);
    float *got[3][3];  // split output, merge output, x's gradient; per run
    for (int run = 0; run < 3; run++) {
        ag_threads_set(run == 0 ? 1 : 2);
        ag_tensor_zero_grad(x);
        ag_tape *tp = ag_tape_new();
        ag_tensor *s = ag_split_heads(tp, x, h), *m = ag_merge_heads(tp, s);
        ag_backward_with(tp, m, dy);
        const void *src[3] = {s->data, m->data, x->grad};
        for (int k = 0; k < 3; k++) {
            got[run][k] = malloc(bytes);
            memcpy(got[run][k], src[k], bytes);
        }
        ag_tape_free(tp);
    }
    ag_threads_set(1);
    CHECK(memcmp(got[1][1], x->data, bytes) == 0);  // merge(split(x)) = x
    CHECK(memcmp(got[1][2], dy->data, bytes) == 0);  // and passes dy through
    for (int k = 0; k < 3; k++) {
        CHECK(memcmp(got[1][k], got[2][k], bytes) == 0);
        // Moving elements involves no rounding: one thread gives the same bits.
        CHECK(memcmp(got[0][k], got[1][k], bytes) == 0);
        for (int run = 0; run < 3; run++) free(got[run][k]);
    }
    ag_tensor_free(x);
    ag_tensor_free(dy);
}

// user: x [B, T, E] and the upstream gradient dy of merge(split(x, 8 heads)).
static void split_merge_step(ag_tape *tp, int step, void *user) {
    (void)step;
    ag_tensor *const *t = user;
    ag_backward_with(tp, ag_merge_heads(tp, ag_split_heads(tp, t[0], 8)), t[1]);
}

// After the first step has sized the tape, a step allocates nothing, on one
// thread or two.
static void test_repeated_step_allocates_no_heap_memory(void) {
    ag_tensor *t[] = {random_leaf(AG_F32, 3, (int[]){8, 128, 256}, 80),
                      uniform_tensor(AG_F32, 3, (int[]){8, 128, 256}, 81, -1, 1)};
    CHECK(repeated_step_allocates_nothing(split_merge_step, t));
    ag_tensor_free(t[0]);
    ag_tensor_free(t[1]);
}

int main(void) {
    RUN(test_gradcheck_split_heads);
    RUN(test_gradcheck_merge_heads);
    RUN(test_forward_matches_naive_index_loop);
    RUN(test_merge_undoes_split_exactly);
    RUN(test_f32_matches_f64_within_1e_5);
    RUN(test_tensor_used_twice_gets_summed_gradient);
    RUN(test_bad_shapes_report_one_line_naming_op_and_shapes);
    RUN(test_two_threads_are_deterministic_and_match_one_thread);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
