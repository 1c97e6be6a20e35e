// ag_matmul: batched products with every transpose combination, against
// finite differences, a naive loop, float64, and under two threads.
#include <stdlib.h>

#include "op_checks.h"

typedef struct {
    bool ta, tb;
} flags;

static const flags all_flags[4] = {{false, false}, {false, true}, {true, false}, {true, true}};

// Operand shapes for C [lead..., M, N] = op(A) op(B) with inner size K.
static void operand_shapes(int nlead, const int lead[], int M, int K, int N, flags f,
                           int sa[], int sb[]) {
    for (int i = 0; i < nlead; i++) sa[i] = sb[i] = lead[i];
    sa[nlead] = f.ta ? K : M;
    sa[nlead + 1] = f.ta ? M : K;
    sb[nlead] = f.tb ? N : K;
    sb[nlead + 1] = f.tb ? K : N;
}

// With one input the same tensor is both operands.
static ag_tensor *matmul_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    const flags *f = user;
    return ag_matmul(tp, in[0], in[n - 1], f->ta, f->tb);
}

static bool gradcheck_matmul(int nlead, const int lead[], int M, int K, int N, flags f,
                             uint64_t seed) {
    int sa[4], sb[4];
    operand_shapes(nlead, lead, M, K, N, f, sa, sb);
    ag_tensor *in[2] = {random_leaf(AG_F64, nlead + 2, sa, seed),
                        random_leaf(AG_F64, nlead + 2, sb, seed + 1)};
    ag_gradcheck_result res;
    bool ok = ag_gradcheck(matmul_fn, in, 2, &f, NULL, &res);
    if (!ok)
        fprintf(stderr, "  matmul lead %d M %d K %d N %d ta %d tb %d\n", nlead, M, K, N, f.ta,
                f.tb);
    ag_tensor_free(in[0]);
    ag_tensor_free(in[1]);
    return ok;
}

static void test_gradcheck_2d_all_transpose_combinations(void) {
    const int sizes[][3] = {{3, 4, 5}, {1, 3, 2}, {5, 1, 4}, {4, 6, 1}};
    for (int s = 0; s < 4; s++)
        for (int c = 0; c < 4; c++)
            CHECK(gradcheck_matmul(0, NULL, sizes[s][0], sizes[s][1], sizes[s][2],
                                   all_flags[c], 10 + (uint64_t)(4 * s + c)));
}

static void test_gradcheck_3d_batched_all_transpose_combinations(void) {
    const int lead[] = {3};
    for (int c = 0; c < 4; c++) {
        CHECK(gradcheck_matmul(1, lead, 4, 5, 3, all_flags[c], 100 + (uint64_t)c));
        CHECK(gradcheck_matmul(1, lead, 1, 3, 2, all_flags[c], 110 + (uint64_t)c));
    }
}

static void test_gradcheck_4d_all_transpose_combinations(void) {
    const int lead[] = {2, 2};
    for (int c = 0; c < 4; c++)
        CHECK(gradcheck_matmul(2, lead, 3, 4, 2, all_flags[c], 200 + (uint64_t)c));
}

// Scores Q K^T: [B,h,T,d] x [B,h,S,d]^T -> [B,h,T,S], and the weighted sum
// A V: [B,h,T,S] x [B,h,S,d] -> [B,h,T,d], over the edges of attention shapes.
static void test_gradcheck_attention_shapes(void) {
    const int shapes[][5] = {
        // B, h, T, S, d
        {2, 3, 4, 6, 3},  // S != T, d not a multiple of 8
        {2, 2, 1, 5, 4},  // a single query
        {1, 1, 5, 5, 8},  // one head
        {2, 4, 3, 2, 3},  // E = 12, h = 4 -> d = 3
    };
    for (int i = 0; i < 4; i++) {
        const int *s = shapes[i];
        const int lead[] = {s[0], s[1]};
        CHECK(gradcheck_matmul(2, lead, s[2], s[4], s[3], all_flags[1], 300 + (uint64_t)i));
        CHECK(gradcheck_matmul(2, lead, s[2], s[3], s[4], all_flags[0], 310 + (uint64_t)i));
    }
}

static void test_gradient_reaches_only_operands_that_require_grad(void) {
    const int lead[] = {2};
    for (int c = 0; c < 4; c++) {
        for (int constant = 0; constant < 2; constant++) {
            int sa[3], sb[3];
            operand_shapes(1, lead, 3, 4, 5, all_flags[c], sa, sb);
            ag_tensor *in[] = {random_leaf(AG_F64, 3, sa, 400), random_leaf(AG_F64, 3, sb, 401)};
            ag_tensor_set_requires_grad(in[constant], false);
            CHECK(ag_gradcheck(matmul_fn, in, 2, (void *)&all_flags[c], NULL, NULL));
            CHECK(in[constant]->grad == NULL);
            ag_tensor_free(in[0]);
            ag_tensor_free(in[1]);
        }
    }
}

// op(X)[p, i, j] for X stored as [count, rows, cols].
static double op_at(const ag_tensor *x, bool trans, size_t p, int i, int j) {
    int rows = x->shape[x->ndim - 2], cols = x->shape[x->ndim - 1];
    size_t base = p * (size_t)rows * (size_t)cols;
    return trans ? ag_tensor_item(x, base + (size_t)j * cols + i)
                 : ag_tensor_item(x, base + (size_t)i * cols + j);
}

static void test_forward_matches_naive_loop(void) {
    const int lead3[] = {3}, lead4[] = {2, 3};
    for (int c = 0; c < 4; c++) {
        flags f = all_flags[c];
        for (int nlead = 0; nlead <= 2; nlead++) {
            const int *lead = nlead == 1 ? lead3 : lead4;
            int M = 5, K = 7, N = 3, sa[4], sb[4];
            operand_shapes(nlead, lead, M, K, N, f, sa, sb);
            ag_tensor *a = random_leaf(AG_F64, nlead + 2, sa, 500 + (uint64_t)c);
            ag_tensor *b = random_leaf(AG_F64, nlead + 2, sb, 510 + (uint64_t)c);
            ag_tape *tp = ag_tape_new();
            ag_tensor *y = ag_matmul(tp, a, b, f.ta, f.tb);
            CHECK(y && y->ndim == nlead + 2 && y->shape[nlead] == M && y->shape[nlead + 1] == N);
            for (int i = 0; y && i < nlead; i++) CHECK(y->shape[i] == lead[i]);
            size_t count = y ? y->numel / (size_t)(M * N) : 0;
            for (size_t p = 0; p < count; p++) {
                for (int i = 0; i < M; i++) {
                    for (int j = 0; j < N; j++) {
                        double s = 0;
                        for (int k = 0; k < K; k++) s += op_at(a, f.ta, p, i, k) * op_at(b, f.tb, p, k, j);
                        CHECK_NEAR(ag_tensor_item(y, (p * M + (size_t)i) * N + (size_t)j), s, 1e-13);
                    }
                }
            }
            ag_tape_free(tp);
            ag_tensor_free(a);
            ag_tensor_free(b);
        }
    }
}

// Runs y = matmul(a, b) and backward with the upstream gradient dy.
static ag_tensor *forward_backward(ag_tape *tp, ag_tensor *a, ag_tensor *b, flags f,
                                   uint64_t dy_seed) {
    ag_tensor *y = ag_matmul(tp, a, b, f.ta, f.tb);
    ag_tensor *dy = uniform_tensor(AG_F32, y->ndim, y->shape, dy_seed, -1, 1);
    ag_backward_with(tp, y, dy);  // converts dy to y's dtype
    ag_tensor_free(dy);
    return y;
}

static void test_f32_matches_f64_within_1e_5(void) {
    const int lead[] = {2, 3};
    for (int c = 0; c < 4; c++) {
        for (int nlead = 0; nlead <= 2; nlead++) {
            int sa[4], sb[4];
            operand_shapes(nlead, lead, 9, 40, 7, all_flags[c], sa, sb);
            ag_tensor *in[] = {random_leaf(AG_F64, nlead + 2, sa, 600 + (uint64_t)c),
                               random_leaf(AG_F64, nlead + 2, sb, 610 + (uint64_t)c)};
            // The output and the gradients of both operands.
            CHECK(f32_vs_f64_error(matmul_fn, in, 2, (void *)&all_flags[c]) <= 1e-5);
            ag_tensor_free(in[0]);
            ag_tensor_free(in[1]);
        }
    }
}

static void test_tensor_used_as_both_operands_gets_summed_gradient(void) {
    // Y = X X^T (the Gram matrix), X^T X and X X, each batched and plain.
    const flags cases[] = {{false, true}, {true, false}, {false, false}};
    for (int c = 0; c < 3; c++) {
        bool square = !cases[c].ta && !cases[c].tb;
        int shape3[] = {2, 4, square ? 4 : 3};
        ag_tensor *x = random_leaf(AG_F64, 3, shape3, 700 + (uint64_t)c);
        CHECK(ag_gradcheck(matmul_fn, &x, 1, (void *)&cases[c], NULL, NULL));
        ag_tensor_free(x);
        int shape2[] = {3, square ? 3 : 5};
        x = random_leaf(AG_F64, 2, shape2, 710 + (uint64_t)c);
        CHECK(ag_gradcheck(matmul_fn, &x, 1, (void *)&cases[c], NULL, NULL));
        ag_tensor_free(x);
    }

    // The exact rule for Y = X X^T: dX = (dY + dY^T) X.
    int shape[] = {3, 2};
    ag_tensor *x = random_leaf(AG_F64, 2, shape, 720);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_matmul(tp, x, x, false, true);
    ag_tensor *dy = uniform_tensor(AG_F64, 2, y->shape, 721, -1, 1);
    ag_backward_with(tp, y, dy);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 2; k++) {
            double s = 0;
            for (int j = 0; j < 3; j++)
                s += (ag_tensor_item(dy, (size_t)(i * 3 + j)) + ag_tensor_item(dy, (size_t)(j * 3 + i))) *
                     ag_tensor_item(x, (size_t)(j * 2 + k));
            CHECK_NEAR(ag_tensor_grad_item(x, (size_t)(i * 2 + k)), s, 1e-13);
        }
    }
    ag_tape_free(tp);
    ag_tensor_free(dy);
    ag_tensor_free(x);
}

static void test_backward_adds_to_existing_gradients(void) {
    const int lead[] = {2};
    for (int c = 0; c < 4; c++) {
        int sa[3], sb[3];
        operand_shapes(1, lead, 3, 4, 5, all_flags[c], sa, sb);
        ag_tensor *a = random_leaf(AG_F64, 3, sa, 730), *b = random_leaf(AG_F64, 3, sb, 731);
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = forward_backward(tp, a, b, all_flags[c], 732);
        ag_tensor *a1 = ag_tensor_zeros(AG_F64, 3, sa), *b1 = ag_tensor_zeros(AG_F64, 3, sb);
        memcpy(a1->data, a->grad, a->numel * sizeof(double));
        memcpy(b1->data, b->grad, b->numel * sizeof(double));
        ag_tensor *dy = uniform_tensor(AG_F32, 3, y->shape, 732, -1, 1);
        ag_backward_with(tp, y, dy);  // the same upstream again: leaf gradients double
        for (size_t i = 0; i < a->numel; i++)
            CHECK_NEAR(ag_tensor_grad_item(a, i), 2 * ag_tensor_item(a1, i), 1e-14);
        for (size_t i = 0; i < b->numel; i++)
            CHECK_NEAR(ag_tensor_grad_item(b, i), 2 * ag_tensor_item(b1, i), 1e-14);
        ag_tape_free(tp);
        ag_tensor_free(dy);
        ag_tensor_free(a1);
        ag_tensor_free(b1);
        ag_tensor_free(a);
        ag_tensor_free(b);
    }
}

// Calls matmul on fresh tensors of the given shapes and returns the error.
static const char *error_for(int na, const int sa[], ag_dtype da, int nb, const int sb[],
                             ag_dtype db, bool ta, bool tb) {
    ag_tensor *a = ag_tensor_zeros(da, na, sa), *b = ag_tensor_zeros(db, nb, sb);
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    ag_tensor *y = ag_matmul(tp, a, b, ta, tb);
    testing_release_errors();
    CHECK(y == NULL);
    CHECK(testing_error_count == 1);
    ag_tape_free(tp);
    ag_tensor_free(a);
    ag_tensor_free(b);
    return testing_last_error;
}

static void test_bad_shapes_report_one_line_naming_op_and_shapes(void) {
    CHECK(strcmp(error_for(2, (int[]){4, 8}, AG_F32, 2, (int[]){7, 3}, AG_F32, false, false),
                 "matmul: inner dimensions differ: [4,8] x [7,3]") == 0);
    CHECK(strcmp(error_for(2, (int[]){4, 8}, AG_F32, 2, (int[]){8, 3}, AG_F32, false, true),
                 "matmul: inner dimensions differ: [4,8] x [8,3]^T") == 0);
    CHECK(strcmp(error_for(2, (int[]){4, 8}, AG_F32, 2, (int[]){8, 3}, AG_F32, true, false),
                 "matmul: inner dimensions differ: [4,8]^T x [8,3]") == 0);
    CHECK(strcmp(error_for(3, (int[]){2, 4, 8}, AG_F32, 3, (int[]){3, 8, 5}, AG_F32, false,
                           false),
                 "matmul: batch dimensions do not broadcast: [2,4,8] x [3,8,5]") == 0);
    CHECK(strcmp(error_for(4, (int[]){2, 3, 4, 8}, AG_F32, 3, (int[]){2, 8, 5}, AG_F32, false,
                           false),
                 "matmul: batch dimensions do not broadcast: [2,3,4,8] x [2,8,5]") == 0);
    CHECK(strcmp(error_for(1, (int[]){8}, AG_F32, 2, (int[]){8, 5}, AG_F32, false, false),
                 "matmul: a must have 2 to 4 dimensions, got [8]") == 0);
    CHECK(strcmp(error_for(2, (int[]){4, 8}, AG_F32, 0, NULL, AG_F32, false, false),
                 "matmul: b must have 2 to 4 dimensions, got []") == 0);
    CHECK(strcmp(error_for(2, (int[]){4, 8}, AG_F32, 2, (int[]){8, 5}, AG_F64, false, false),
                 "matmul: dtypes differ: f32 [4,8] and f64 [8,5]") == 0);
    CHECK(strcmp(error_for(2, (int[]){4, 8}, AG_BOOL, 2, (int[]){8, 5}, AG_BOOL, false, false),
                 "matmul: a [4,8] must be f32 or f64, not bool") == 0);

    ag_tape *tp = ag_tape_new();
    ag_tensor *a = ag_tensor_zeros(AG_F32, 2, (int[]){4, 8});
    testing_catch_errors();
    CHECK(ag_matmul(tp, a, NULL, false, false) == NULL);
    CHECK(strcmp(testing_last_error, "matmul: b is NULL") == 0);
    testing_release_errors();
    ag_tensor_free(a);
    ag_tape_free(tp);
}

// Outputs and gradients of one run, copied out of the tape.
typedef struct {
    size_t ny, na, nb;
    float *y, *da, *db;
} run_result;

static run_result run_f32(ag_tensor *a, ag_tensor *b, flags f) {
    ag_tensor_zero_grad(a);
    ag_tensor_zero_grad(b);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = forward_backward(tp, a, b, f, 800);
    run_result r = {y->numel, a->numel, b->numel, malloc(y->numel * sizeof(float)),
                    malloc(a->numel * sizeof(float)), malloc(b->numel * sizeof(float))};
    memcpy(r.y, y->data, r.ny * sizeof(float));
    memcpy(r.da, a->grad, r.na * sizeof(float));
    memcpy(r.db, b->grad, r.nb * sizeof(float));
    ag_tape_free(tp);
    return r;
}

static void free_result(run_result r) {
    free(r.y);
    free(r.da);
    free(r.db);
}

static bool bit_identical(run_result p, run_result q) {
    return memcmp(p.y, q.y, p.ny * sizeof(float)) == 0 &&
           memcmp(p.da, q.da, p.na * sizeof(float)) == 0 &&
           memcmp(p.db, q.db, p.nb * sizeof(float)) == 0;
}

static void test_two_threads_are_deterministic_and_match_one_thread(void) {
    struct {
        int nlead, lead[2], M, K, N;
        flags f;
    } cases[] = {
        {2, {2, 4}, 64, 32, 48, {false, true}},   // scores Q K^T
        {2, {2, 4}, 64, 48, 32, {false, false}},  // A V
        {1, {3, 0}, 96, 64, 80, {true, false}},   // an odd batch count
        {0, {0, 0}, 256, 128, 192, {true, true}},  // one product, split by rows
    };
    for (int c = 0; c < 4; c++) {
        int sa[4], sb[4];
        operand_shapes(cases[c].nlead, cases[c].lead, cases[c].M, cases[c].K, cases[c].N,
                       cases[c].f, sa, sb);
        ag_tensor *a = random_leaf(AG_F32, cases[c].nlead + 2, sa, 810 + (uint64_t)c);
        ag_tensor *b = random_leaf(AG_F32, cases[c].nlead + 2, sb, 820 + (uint64_t)c);
        ag_threads_set(1);
        run_result one = run_f32(a, b, cases[c].f);
        ag_threads_set(2);
        run_result two = run_f32(a, b, cases[c].f), again = run_f32(a, b, cases[c].f);
        ag_threads_set(1);
        CHECK(bit_identical(two, again));
        CHECK(normwise_error_f32(two.y, one.y, one.ny) <= 1e-6);
        CHECK(normwise_error_f32(two.da, one.da, one.na) <= 1e-6);
        CHECK(normwise_error_f32(two.db, one.db, one.nb) <= 1e-6);
        free_result(one);
        free_result(two);
        free_result(again);
        ag_tensor_free(a);
        ag_tensor_free(b);
    }
}

// user: q, k and the upstream gradient dy of the scores q k^T.
static void scores_step(ag_tape *tp, int step, void *user) {
    (void)step;
    ag_tensor *const *t = user;
    ag_backward_with(tp, ag_matmul(tp, t[0], t[1], false, true), t[2]);
}

// After the first step has sized the tape, a step allocates nothing, on one
// thread or two.
static void test_repeated_step_allocates_no_heap_memory(void) {
    ag_tensor *t[] = {random_leaf(AG_F32, 4, (int[]){2, 4, 64, 32}, 900),
                      random_leaf(AG_F32, 4, (int[]){2, 4, 48, 32}, 901),
                      uniform_tensor(AG_F32, 4, (int[]){2, 4, 64, 48}, 902, -1, 1)};
    CHECK(repeated_step_allocates_nothing(scores_step, t));
    for (int i = 0; i < 3; i++) ag_tensor_free(t[i]);
}

int main(void) {
    RUN(test_gradcheck_2d_all_transpose_combinations);
    RUN(test_gradcheck_3d_batched_all_transpose_combinations);
    RUN(test_gradcheck_4d_all_transpose_combinations);
    RUN(test_gradcheck_attention_shapes);
    RUN(test_gradient_reaches_only_operands_that_require_grad);
    RUN(test_forward_matches_naive_loop);
    RUN(test_f32_matches_f64_within_1e_5);
    RUN(test_tensor_used_as_both_operands_gets_summed_gradient);
    RUN(test_backward_adds_to_existing_gradients);
    RUN(test_bad_shapes_report_one_line_naming_op_and_shapes);
    RUN(test_two_threads_are_deterministic_and_match_one_thread);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
