// ag_linear: y = x w^T + b over 1-D to 4-D x, with and without bias, against
// finite differences, a naive loop, float64, and under two threads.
#include <stdlib.h>

#include "../src/kernels/tile_gemm.h"
#include "op_checks.h"

// inputs: x, w and optionally b. With one input it is both x and w.
static ag_tensor *linear_fn(ag_tape *tp, ag_tensor *const in[], int n, void *user) {
    (void)user;
    return ag_linear(tp, in[0], in[n > 1 ? 1 : 0], n > 2 ? in[2] : NULL);
}

// x: [*lead, in], w: [out, in], b: [out] when with_bias.
typedef struct {
    int ndim;        // of x
    int shape[4];    // of x; its last entry is `in`
    int out;
} linear_shape;

static const linear_shape gradcheck_shapes[] = {
    {1, {5}, 3},
    {2, {4, 5}, 3},
    {2, {1, 6}, 1},        // one row, one output
    {3, {2, 3, 12}, 4},    // [B, T, E]
    {3, {2, 1, 7}, 5},     // T = 1
    {4, {2, 2, 3, 4}, 6},  // [B, h, T, d]
};
#define N_GRADCHECK_SHAPES (int)(sizeof gradcheck_shapes / sizeof gradcheck_shapes[0])

static int features(const linear_shape *s) { return s->shape[s->ndim - 1]; }

static bool gradcheck_linear(const linear_shape *s, bool with_bias, uint64_t seed) {
    ag_tensor *in[3] = {random_leaf(AG_F64, s->ndim, s->shape, seed),
                        random_leaf(AG_F64, 2, (int[]){s->out, features(s)}, seed + 1),
                        random_leaf(AG_F64, 1, &s->out, seed + 2)};
    bool ok = ag_gradcheck(linear_fn, in, with_bias ? 3 : 2, NULL, NULL, NULL);
    if (!ok) fprintf(stderr, "  linear x ndim %d out %d bias %d\n", s->ndim, s->out, with_bias);
    for (int i = 0; i < 3; i++) ag_tensor_free(in[i]);
    return ok;
}

static void test_gradcheck_with_bias_on_1d_to_4d_x(void) {
    for (int i = 0; i < N_GRADCHECK_SHAPES; i++)
        CHECK(gradcheck_linear(&gradcheck_shapes[i], true, 10 + 3 * (uint64_t)i));
}

static void test_gradcheck_without_bias_on_1d_to_4d_x(void) {
    for (int i = 0; i < N_GRADCHECK_SHAPES; i++)
        CHECK(gradcheck_linear(&gradcheck_shapes[i], false, 50 + 3 * (uint64_t)i));
}

static void test_output_shape_and_inputs_recorded(void) {
    ag_tensor *x = random_leaf(AG_F64, 3, (int[]){2, 3, 5}, 90);
    ag_tensor *w = random_leaf(AG_F64, 2, (int[]){4, 5}, 91);
    ag_tensor *b = random_leaf(AG_F64, 1, (int[]){4}, 92);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_linear(tp, x, w, b), *z = ag_linear(tp, x, w, NULL);
    CHECK(y->ndim == 3 && y->shape[0] == 2 && y->shape[1] == 3 && y->shape[2] == 4);
    CHECK(ag_tensor_same_shape(y, z));
    CHECK(y->node->n_in == 3 && y->node->in[2] == b);
    CHECK(z->node->n_in == 2);  // no bias: no third input
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(w);
    ag_tensor_free(b);
}

static void test_gradient_reaches_only_inputs_that_require_grad(void) {
    for (int learn = 0; learn < 3; learn++) {
        ag_tensor *in[] = {random_leaf(AG_F64, 3, (int[]){2, 3, 5}, 100),
                           random_leaf(AG_F64, 2, (int[]){4, 5}, 101),
                           random_leaf(AG_F64, 1, (int[]){4}, 102)};
        for (int i = 0; i < 3; i++) ag_tensor_set_requires_grad(in[i], i == learn);
        CHECK(ag_gradcheck(linear_fn, in, 3, NULL, NULL, NULL));
        // gradcheck leaves the gradients as it found them (none): a backward of our own.
        ag_tape *tp = ag_tape_new();
        ag_backward(tp, ag_sum(tp, linear_fn(tp, in, 3, NULL)));
        for (int i = 0; i < 3; i++) {
            CHECK((in[i]->grad != NULL) == (i == learn));
            ag_tensor_free(in[i]);
        }
        ag_tape_free(tp);
    }
}

static void test_forward_matches_naive_loop(void) {
    for (int s = 0; s < N_GRADCHECK_SHAPES; s++) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const linear_shape *ls = &gradcheck_shapes[s];
            int in = features(ls), out = ls->out;
            ag_tensor *x = random_leaf(AG_F64, ls->ndim, ls->shape, 110);
            ag_tensor *w = random_leaf(AG_F64, 2, (int[]){out, in}, 111);
            ag_tensor *b = random_leaf(AG_F64, 1, &out, 112);
            ag_tape *tp = ag_tape_new();
            ag_tensor *y = ag_linear(tp, x, w, with_bias ? b : NULL);
            size_t rows = x->numel / (size_t)in;
            CHECK(y->numel == rows * (size_t)out);
            for (size_t r = 0; r < rows; r++) {
                for (int o = 0; o < out; o++) {
                    double acc = with_bias ? ag_tensor_item(b, (size_t)o) : 0.0;
                    for (int i = 0; i < in; i++)
                        acc += ag_tensor_item(x, r * (size_t)in + (size_t)i) *
                               ag_tensor_item(w, (size_t)o * (size_t)in + (size_t)i);
                    CHECK_NEAR(ag_tensor_item(y, r * (size_t)out + (size_t)o), acc, 1e-13);
                }
            }
            ag_tape_free(tp);
            ag_tensor_free(x);
            ag_tensor_free(w);
            ag_tensor_free(b);
        }
    }
}

// y = linear(x, w, b) and backward with a random upstream gradient.
static ag_tensor *forward_backward(ag_tape *tp, ag_tensor *x, ag_tensor *w, ag_tensor *b,
                                   uint64_t dy_seed) {
    ag_tensor *y = ag_linear(tp, x, w, b);
    ag_tensor *dy = uniform_tensor(AG_F32, y->ndim, y->shape, dy_seed, -1, 1);
    ag_backward_with(tp, y, dy);
    ag_tensor_free(dy);
    return y;
}

static void test_f32_matches_f64_within_1e_5(void) {
    const linear_shape shapes[] = {
        {2, {7, 33}, 5},
        {3, {4, 100, 48}, 24},  // 400 rows: a long bias-gradient sum
        {4, {2, 3, 5, 9}, 17},
    };
    for (int s = 0; s < 3; s++) {
        int in = features(&shapes[s]), out = shapes[s].out;
        ag_tensor *x[] = {random_leaf(AG_F64, shapes[s].ndim, shapes[s].shape, 200),
                          random_leaf(AG_F64, 2, (int[]){out, in}, 201),
                          random_leaf(AG_F64, 1, &out, 202)};
        // The output and the gradients of x, w and b.
        CHECK(f32_vs_f64_error(linear_fn, x, 3, NULL) <= 1e-5);
        for (int i = 0; i < 3; i++) ag_tensor_free(x[i]);
    }
}

static void test_tensor_used_as_input_and_weight_gets_summed_gradient(void) {
    // linear(x, x) = x x^T: x is both the input and the weight.
    ag_tensor *x = random_leaf(AG_F64, 2, (int[]){4, 4}, 300);
    CHECK(ag_gradcheck(linear_fn, &x, 1, NULL, NULL, NULL));
    ag_tensor *b = random_leaf(AG_F64, 1, (int[]){4}, 301);
    ag_tensor *in[] = {x, x, b};
    CHECK(ag_gradcheck(linear_fn, in, 3, NULL, NULL, NULL));

    // The exact rule: dx = (dy + dy^T) x.
    ag_tensor_zero_grad(x);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_linear(tp, x, x, NULL);
    ag_tensor *dy = uniform_tensor(AG_F64, 2, y->shape, 302, -1, 1);
    ag_backward_with(tp, y, dy);
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 4; k++) {
            double s = 0;
            for (int j = 0; j < 4; j++)
                s += (ag_tensor_item(dy, (size_t)(i * 4 + j)) + ag_tensor_item(dy, (size_t)(j * 4 + i))) *
                     ag_tensor_item(x, (size_t)(j * 4 + k));
            CHECK_NEAR(ag_tensor_grad_item(x, (size_t)(i * 4 + k)), s, 1e-13);
        }
    }
    ag_tape_free(tp);
    ag_tensor_free(dy);
    ag_tensor_free(b);
    ag_tensor_free(x);
}

static void test_backward_adds_to_existing_gradients(void) {
    ag_tensor *x = random_leaf(AG_F64, 3, (int[]){2, 3, 5}, 310);
    ag_tensor *w = random_leaf(AG_F64, 2, (int[]){4, 5}, 311);
    ag_tensor *b = random_leaf(AG_F64, 1, (int[]){4}, 312);
    ag_tensor *leaves[] = {x, w, b};
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = forward_backward(tp, x, w, b, 313);
    double once[3][30];
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < leaves[t]->numel; i++) once[t][i] = ag_tensor_grad_item(leaves[t], i);
    ag_tensor *dy = uniform_tensor(AG_F32, 3, y->shape, 313, -1, 1);
    ag_backward_with(tp, y, dy);  // the same upstream again: leaf gradients double
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < leaves[t]->numel; i++)
            CHECK_NEAR(ag_tensor_grad_item(leaves[t], i), 2 * once[t][i], 1e-14);
    ag_tape_free(tp);
    ag_tensor_free(dy);
    for (int t = 0; t < 3; t++) ag_tensor_free(leaves[t]);
}

// Calls linear on fresh tensors (b_ndim < 0: no bias) and returns the error.
static const char *error_for(ag_dtype dx, int x_ndim, const int xs[], ag_dtype dw, int w_ndim,
                             const int ws[], ag_dtype db, int b_ndim, const int bs[]) {
    ag_tensor *x = ag_tensor_zeros(dx, x_ndim, xs), *w = ag_tensor_zeros(dw, w_ndim, ws);
    ag_tensor *b = b_ndim >= 0 ? ag_tensor_zeros(db, b_ndim, bs) : NULL;
    ag_tape *tp = ag_tape_new();
    testing_catch_errors();
    ag_tensor *y = ag_linear(tp, x, w, b);
    testing_release_errors();
    CHECK(y == NULL);
    CHECK(testing_error_count == 1);
    ag_tape_free(tp);
    ag_tensor_free(x);
    ag_tensor_free(w);
    ag_tensor_free(b);
    return testing_last_error;
}

static void test_bad_shapes_report_one_line_naming_op_and_shapes(void) {
    const ag_dtype f = AG_F32;
    CHECK(strcmp(error_for(f, 2, (int[]){4, 6}, f, 2, (int[]){3, 5}, f, -1, NULL),
                 "linear: x [4,6] has 6 features but w [3,5] expects 5") == 0);
    CHECK(strcmp(error_for(f, 3, (int[]){2, 4, 5}, f, 2, (int[]){3, 5}, f, 1, (int[]){4}),
                 "linear: bias [4] must be [3] for w [3,5]") == 0);
    CHECK(strcmp(error_for(f, 2, (int[]){4, 5}, f, 2, (int[]){3, 5}, f, 2, (int[]){1, 3}),
                 "linear: bias [1,3] must be [3] for w [3,5]") == 0);
    CHECK(strcmp(error_for(f, 2, (int[]){4, 5}, f, 1, (int[]){5}, f, -1, NULL),
                 "linear: w must have 2 dimensions, got [5]") == 0);
    CHECK(strcmp(error_for(f, 0, NULL, f, 2, (int[]){3, 1}, f, -1, NULL),
                 "linear: x must have 1 to 4 dimensions, got []") == 0);
    CHECK(strcmp(error_for(f, 2, (int[]){4, 5}, AG_F64, 2, (int[]){3, 5}, f, -1, NULL),
                 "linear: dtypes differ: f32 [4,5] and f64 [3,5]") == 0);
    CHECK(strcmp(error_for(f, 2, (int[]){4, 5}, f, 2, (int[]){3, 5}, AG_F64, 1, (int[]){3}),
                 "linear: dtypes differ: f32 [4,5] and f64 [3]") == 0);
    CHECK(strcmp(error_for(f, 2, (int[]){4, 5}, AG_BOOL, 2, (int[]){3, 5}, f, -1, NULL),
                 "linear: w [3,5] must be f32 or f64, not bool") == 0);
}

static void test_two_threads_are_deterministic_and_match_one_thread(void) {
    const linear_shape shapes[] = {
        {2, {512, 128}, 96},
        {4, {2, 4, 64, 96}, 80},
        {3, {3, 40, 256}, 200},  // 120 rows: each thread its rows of dW
        {2, {999, 64}, 192},     // an odd row count split for dW
    };
    for (int s = 0; s < 4; s++) {
        int in = features(&shapes[s]), out = shapes[s].out;
        ag_tensor *leaves[] = {random_leaf(AG_F32, shapes[s].ndim, shapes[s].shape, 400),
                               random_leaf(AG_F32, 2, (int[]){out, in}, 401),
                               random_leaf(AG_F32, 1, &out, 402)};
        // Output and the three gradients of runs with 1, 2 and again 2 threads.
        float *got[3][4];
        for (int run = 0; run < 3; run++) {
            ag_threads_set(run == 0 ? 1 : 2);
            for (int t = 0; t < 3; t++) ag_tensor_zero_grad(leaves[t]);
            ag_tape *tp = ag_tape_new();
            ag_tensor *y = forward_backward(tp, leaves[0], leaves[1], leaves[2], 403);
            for (int t = 0; t < 4; t++) {
                const ag_tensor *src = t < 3 ? leaves[t] : y;
                size_t bytes = src->numel * sizeof(float);
                got[run][t] = malloc(bytes);
                memcpy(got[run][t], t < 3 ? src->grad : src->data, bytes);
            }
            ag_tape_free(tp);
        }
        ag_threads_set(1);
        for (int t = 0; t < 4; t++) {
            size_t n = t < 3 ? leaves[t]->numel : leaves[0]->numel / (size_t)in * (size_t)out;
            CHECK(memcmp(got[1][t], got[2][t], n * sizeof(float)) == 0);
            CHECK(normwise_error_f32(got[1][t], got[0][t], n) <= 1e-6);
            for (int run = 0; run < 3; run++) free(got[run][t]);
        }
        for (int t = 0; t < 3; t++) ag_tensor_free(leaves[t]);
    }
}

// The output and the three gradients of x [M, in] times w [out, in] plus b, on `threads`
// threads: their values in one array (output, dX, dW, db).
static double *linear_results(ag_dtype dt, int M, int in, int out, int threads, size_t *n) {
    ag_tensor *t[] = {random_leaf(dt, 2, (int[]){M, in}, 410),
                      random_leaf(dt, 2, (int[]){out, in}, 411),
                      random_leaf(dt, 1, &out, 412)};
    ag_threads_set(threads);
    ag_tape *tp = ag_tape_new();
    ag_tensor *y = ag_linear(tp, t[0], t[1], t[2]);
    ag_tensor *dy = uniform_tensor(dt, 2, y->shape, 413, -1, 1);
    ag_backward_with(tp, y, dy);
    *n = y->numel + t[0]->numel + t[1]->numel + t[2]->numel;
    double *r = malloc(*n * sizeof *r), *at = r;
    for (size_t e = 0; e < y->numel; e++) *at++ = ag_tensor_item(y, e);
    for (int i = 0; i < 3; i++)
        for (size_t e = 0; e < t[i]->numel; e++) *at++ = ag_tensor_grad_item(t[i], e);
    ag_tape_free(tp);
    ag_threads_set(1);
    ag_tensor_free(dy);
    for (int i = 0; i < 3; i++) ag_tensor_free(t[i]);
    return r;
}

// Through BLAS (AG_TILE_GEMM=0, or a CPU without AVX-512) as through the tile kernels, one
// and two threads give the same bits, as README says of both paths. A layer of fewer
// than 256 rows large enough to split cut its dX and dW products into one part a thread:
// products of other extents on two threads, which OpenBLAS sums differently at the edges
// of its blocks (dX of [255, 129] x [77, 129] differed in the last bits).
static void test_blas_path_gives_the_same_bits_on_one_and_two_threads(void) {
    const bool tiles = agi_tile_gemm_available();
    const int shapes[][3] = {{255, 129, 77}, {100, 300, 200}, {37, 64, 300}};
    for (int pass = 0; pass < 2; pass++) {
        agi_tile_gemm_enable(pass == 0 && tiles);
        for (int s = 0; s < 3; s++)
            for (int f = 0; f < 2; f++) {
                const ag_dtype dt = f ? AG_F64 : AG_F32;
                size_t n1, n2;
                double *one = linear_results(dt, shapes[s][0], shapes[s][1], shapes[s][2], 1, &n1);
                double *two = linear_results(dt, shapes[s][0], shapes[s][1], shapes[s][2], 2, &n2);
                CHECK(n1 == n2 && memcmp(one, two, n1 * sizeof *one) == 0);
                free(one), free(two);
            }
    }
    agi_tile_gemm_enable(tiles);
}

// user: x, w, b and the upstream gradient dy.
static void linear_step(ag_tape *tp, int step, void *user) {
    (void)step;
    ag_tensor *const *t = user;
    ag_backward_with(tp, ag_linear(tp, t[0], t[1], t[2]), t[3]);
}

// After the first step has sized the tape, a step allocates nothing, on one
// thread or two.
static void test_repeated_step_allocates_no_heap_memory(void) {
    ag_tensor *all[] = {random_leaf(AG_F32, 3, (int[]){4, 64, 32}, 500),
                        random_leaf(AG_F32, 2, (int[]){48, 32}, 501),
                        random_leaf(AG_F32, 1, (int[]){48}, 502),
                        uniform_tensor(AG_F32, 3, (int[]){4, 64, 48}, 503, -1, 1)};
    CHECK(repeated_step_allocates_nothing(linear_step, all));
    for (int i = 0; i < 4; i++) ag_tensor_free(all[i]);
}

int main(void) {
    RUN(test_gradcheck_with_bias_on_1d_to_4d_x);
    RUN(test_gradcheck_without_bias_on_1d_to_4d_x);
    RUN(test_output_shape_and_inputs_recorded);
    RUN(test_gradient_reaches_only_inputs_that_require_grad);
    RUN(test_forward_matches_naive_loop);
    RUN(test_f32_matches_f64_within_1e_5);
    RUN(test_tensor_used_as_input_and_weight_gets_summed_gradient);
    RUN(test_backward_adds_to_existing_gradients);
    RUN(test_bad_shapes_report_one_line_naming_op_and_shapes);
    RUN(test_two_threads_are_deterministic_and_match_one_thread);
    RUN(test_blas_path_gives_the_same_bits_on_one_and_two_threads);
    RUN(test_repeated_step_allocates_no_heap_memory);
    return testing_summary();
}
