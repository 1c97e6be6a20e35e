// Mixed-precision products (src/kernels/bf16_gemm.c) and autocast (ag_tape_set_autocast):
// operands rounded to bfloat16 as vcvtneps2bf16 rounds them, products summed in float32;
// the vdpbf16ps path and the portable path give the same bits; results stay within the
// rounding bound of bf16 operands against float64; the same for the matrix-vector
// products of decoding on bf16 copies of weights (src/kernels/gemv.c); ops recorded under autocast use them,
// float64 ops never do; a repeated training step under autocast allocates nothing.
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/kernels/bf16_gemm.h"
#include "../src/kernels/gemv.h"
#include "testing.h"

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static double uniform(ag_pcg32 *rng) { return 2.0 * ag_pcg32_double(rng) - 1.0; }

static void test_rounding_is_to_nearest_even_with_subnormals_flushed(void) {
    CHECK(agi_bf16_round(1.0f) == 0x3F80);
    CHECK(agi_bf16_round(bits_float(0x3F808000)) == 0x3F80);  // halfway: to the even 1
    CHECK(agi_bf16_round(bits_float(0x3F818000)) == 0x3F82);  // halfway: up to the even one
    CHECK(agi_bf16_round(bits_float(0x3F808001)) == 0x3F81);  // above halfway: up
    CHECK(agi_bf16_round(-2.5f) == 0xC020);
    CHECK(agi_bf16_round(FLT_MAX) == 0x7F80);                 // rounds up to infinity
    CHECK(agi_bf16_round(-INFINITY) == 0xFF80);
    CHECK(agi_bf16_round(bits_float(0x7F800001)) == 0x7FC0);  // a NaN stays a NaN, quiet
    CHECK(agi_bf16_round(bits_float(0xFFC12345)) == 0xFFC1);
    CHECK(agi_bf16_round(1e-40f) == 0x0000);                  // subnormal: a zero of its sign
    CHECK(agi_bf16_round(-1e-40f) == 0x8000);
    CHECK(agi_bf16_round(FLT_MIN) == 0x0080);
    CHECK(agi_bf16_value(0x3F80) == 1.0f && agi_bf16_value(0xC020) == -2.5f);
}

// A product both ways, on random values with, when `special`, some operands huge (their
// products overflow), tiny (their products underflow to subnormals, which the
// instruction flushes), exact zeros of either sign, infinities and NaNs.
typedef struct {
    bool ta, tb;
    int M, N, K;
    float alpha, beta;
    bool bias, special;
} product;

static float draw(ag_pcg32 *rng, bool special) {
    const float x = (float)uniform(rng);
    if (!special) return x;
    switch (ag_pcg32_bounded(rng, 16)) {
    case 0: return x * 3e19f;
    case 1: return x * 1e-19f;
    case 2: return x * 1e-36f;
    case 3: return ag_pcg32_bounded(rng, 2) ? 0.0f : -0.0f;
    case 4: return ag_pcg32_bounded(rng, 50) ? x : (ag_pcg32_bounded(rng, 2) ? INFINITY : NAN);
    default: return x;
    }
}

// C of the product by the path asked (native when `native`), into C (ldc = N + 2).
static void run(const product *p, const float *A, const float *B, const float *bias, float *C,
                bool native) {
    agi_bf16_native_enable(native);
    agi_gemm_bf16(p->ta, p->tb, p->M, p->N, p->K, p->alpha, A, (p->ta ? p->M : p->K) + 3, B,
                  (p->tb ? p->K : p->N) + 1, p->beta, C, p->N + 2, p->bias ? bias : NULL);
    agi_bf16_native_enable(true);
}

// Fills A, B, bias and C0 (the C both paths start from) for p.
static void fill(const product *p, ag_pcg32 *rng, float **A, float **B, float **bias,
                 float **C0, size_t *nc) {
    const size_t na = (size_t)((p->ta ? p->M : p->K) + 3) * (size_t)(p->ta ? p->K : p->M);
    const size_t nb = (size_t)((p->tb ? p->K : p->N) + 1) * (size_t)(p->tb ? p->N : p->K);
    *nc = (size_t)(p->N + 2) * (size_t)p->M;
    *A = malloc((na + 1) * sizeof(float));
    *B = malloc((nb + 1) * sizeof(float));
    *bias = malloc((size_t)p->N * sizeof(float));
    *C0 = malloc(*nc * sizeof(float));
    for (size_t i = 0; i < na; i++) (*A)[i] = draw(rng, p->special);
    for (size_t i = 0; i < nb; i++) (*B)[i] = draw(rng, p->special);
    for (int i = 0; i < p->N; i++) (*bias)[i] = (float)uniform(rng);
    for (size_t i = 0; i < *nc; i++) (*C0)[i] = (float)uniform(rng);
}

static bool same_bits(const float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]) != isnan(y[i]) || (!isnan(x[i]) && memcmp(&x[i], &y[i], sizeof x[i])))
            return false;
    return true;
}

// Without AVX512_BF16 there is one path: says so (for `what`).
static bool portable_only(const char *what) {
    if (!agi_bf16_native())
        printf("%s: no AVX512_BF16 on this CPU; the portable path is checked against float64 "
               "only\n", what);
    return !agi_bf16_native();
}

static void test_native_and_portable_paths_give_the_same_bits(void) {
    if (portable_only("bf16 products")) return;
    ag_pcg32 rng = ag_pcg32_make(5, 1);
    // ... and more than one chunk of k (512), block of columns (512) and of rows (2040).
    const int sizes[][3] = {{1, 1, 1},      {7, 13, 5},      {13, 33, 17},  {12, 32, 32},
                            {5, 17, 2},     {37, 150, 600},  {300, 65, 1100}, {25, 530, 77},
                            {2100, 40, 70}};
    bool same = true;
    int products = 0;
    for (int s = 0; s < 9; s++)
        for (int t = 0; t < 8; t++) {
            product p = {t & 1, t & 2, sizes[s][0], sizes[s][1], sizes[s][2],
                         t & 4 ? 0.7f : -1.0f, (float)((s + t) % 2), (s + t) % 3 == 0,
                         t & 4};
            if (p.bias) p.beta = 0;
            float *A, *B, *bias, *C0;
            size_t nc;
            fill(&p, &rng, &A, &B, &bias, &C0, &nc);
            float *C[2] = {malloc(nc * sizeof(float)), malloc(nc * sizeof(float))};
            for (int native = 0; native < 2; native++) {
                memcpy(C[native], C0, nc * sizeof(float));
                run(&p, A, B, bias, C[native], native);
            }
            same &= same_bits(C[0], C[1], nc);
            products++;
            free(A), free(B), free(bias), free(C0), free(C[0]), free(C[1]);
        }
    printf("bf16 products: %d products, vdpbf16ps and portable paths %s\n", products,
           same ? "bit-identical" : "DIFFER");
    CHECK(same);
}

// |C - A B| <= sum_k |a_k b_k| (2 u + u^2 + (K + 2) 2^-24) elementwise (u = 2^-8, the
// unit roundoff of bf16: each operand rounded once, then a float32 sum of K exact
// products and the final scaling, each rounded once), against float64 on the unrounded
// operands. The bound is met, and the errors are those of bf16 (well above float32's).
static void test_products_are_within_the_bf16_rounding_bound_of_float64(void) {
    ag_pcg32 rng = ag_pcg32_make(5, 2);
    const int sizes[][3] = {{7, 13, 5}, {40, 70, 600}, {33, 45, 1030}};
    double worst_ratio = 0, largest = 0;
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 4; t++) {
            product p = {t & 1, t & 2, sizes[s][0], sizes[s][1], sizes[s][2], 1, 0, false, false};
            const int lda = (p.ta ? p.M : p.K) + 3, ldb = (p.tb ? p.K : p.N) + 1, ldc = p.N + 2;
            float *A, *B, *bias, *C;
            size_t nc;
            fill(&p, &rng, &A, &B, &bias, &C, &nc);
            run(&p, A, B, bias, C, agi_bf16_native());
            const double u = ldexp(1, -8), g = (p.K + 2) * ldexp(1, -24);
            for (int i = 0; i < p.M; i++)
                for (int j = 0; j < p.N; j++) {
                    double exact = 0, sum_abs = 0;
                    for (int k = 0; k < p.K; k++) {
                        const double a = p.ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                        const double b = p.tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                        exact += a * b;
                        sum_abs += fabs(a * b);
                    }
                    const double err = fabs(C[(size_t)i * ldc + j] - exact);
                    worst_ratio = fmax(worst_ratio, err / (sum_abs * (2 * u + u * u + g)));
                    largest = fmax(largest, err / sum_abs);
                }
            free(A), free(B), free(bias), free(C);
        }
    printf("bf16 products vs float64: worst error %.2f of the bound, largest relative to "
           "sum |a b| %.1e\n", worst_ratio, largest);
    CHECK(worst_ratio <= 1);
    CHECK(largest > ldexp(1, -14));  // operands were rounded to 8 bits, not float32's 24
}

// The sums run in an order fixed by K: split over two threads a product gives the bits
// of one thread, on every split (product_split.c): by rows with op(B) packed once for all
// (700 x 300, 1100 x 200 with an odd K, and 40 x 64, too few columns to go round), by
// columns with op(A) packed once for all (30 x 900, and 60 x 700 with two chunks of k,
// the last odd).
static void test_products_are_the_same_bits_on_one_and_two_threads(void) {
    ag_pcg32 rng = ag_pcg32_make(5, 3);
    const int sizes[][3] = {{700, 300, 600}, {30, 900, 300}, {1100, 200, 301}, {40, 64, 700},
                            {60, 700, 515}};
    bool same = true;
    for (int s = 0; s < 5; s++)
        for (int t = 0; t < 4; t++) {
            product p = {t & 1, t & 2, sizes[s][0], sizes[s][1], sizes[s][2], 1, 0, true, false};
            float *A, *B, *bias, *C0;
            size_t nc;
            fill(&p, &rng, &A, &B, &bias, &C0, &nc);
            float *C[2] = {malloc(nc * sizeof(float)), malloc(nc * sizeof(float))};
            for (int threads = 1; threads <= 2; threads++) {
                ag_threads_set(threads);
                memcpy(C[threads - 1], C0, nc * sizeof(float));
                run(&p, A, B, bias, C[threads - 1], agi_bf16_native());
            }
            same &= memcmp(C[0], C[1], nc * sizeof(float)) == 0;
            free(A), free(B), free(bias), free(C0), free(C[0]), free(C[1]);
        }
    ag_threads_set(1);
    CHECK(same);
}

// Split over two threads (by columns with op(A) packed once for all: 40 x 600; by rows
// with op(B) packed once for all: 600 x 40), a NaN in op(A) makes its row of C NaN and a
// NaN in op(B) its column, on both paths, and every other element stays finite.
static void test_a_nan_stays_in_its_row_and_column_on_two_threads(void) {
    const int sizes[][2] = {{40, 600}, {600, 40}}, K = 515, nan_row = 37, nan_col = 29;
    bool ok = true;
    ag_threads_set(2);
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 4; t++)
            for (int native = 0; native <= agi_bf16_native(); native++) {
                const bool ta = t & 1, tb = t & 2;
                const int M = sizes[s][0], N = sizes[s][1];
                float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
                float *C = malloc(sizeof(float) * M * N);
                for (int i = 0; i < M * K; i++) A[i] = (float)(i % 7) - 3;
                for (int i = 0; i < K * N; i++) B[i] = (float)(i % 5) - 2;
                A[ta ? 300 * M + nan_row : nan_row * K + 300] = NAN;  // op(A)[nan_row][300]
                B[tb ? nan_col * K + 400 : 400 * N + nan_col] = NAN;  // op(B)[400][nan_col]
                agi_bf16_native_enable(native);
                agi_gemm_bf16(ta, tb, M, N, K, 1, A, ta ? M : K, B, tb ? K : N, 0, C, N, NULL);
                agi_bf16_native_enable(true);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++)
                        ok &= (bool)isnan(C[i * N + j]) == (i == nan_row || j == nan_col);
                free(A), free(B), free(C);
            }
    ag_threads_set(1);
    CHECK(ok);
}

// K = 0: C = beta C (+ bias); a NaN operand makes its row of C NaN, the other rows finite.
static void test_edges_empty_sums_and_nan(void) {
    float C[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {10, 20, 30}, A[2] = {0}, B[3] = {0};
    agi_gemm_bf16(false, false, 2, 3, 0, 1, A, 1, B, 3, 1, C, 3, NULL);
    CHECK(C[0] == 1 && C[5] == 6);
    agi_gemm_bf16(false, false, 2, 3, 0, 1, A, 1, B, 3, 0, C, 3, bias);
    CHECK(C[0] == 10 && C[5] == 30);
    float A2[4] = {NAN, 1, 2, 3}, B2[6] = {1, 2, 3, 4, 5, 6}, C2[6];
    agi_gemm_bf16(false, false, 2, 3, 2, 1, A2, 2, B2, 3, 0, C2, 3, NULL);
    CHECK(isnan(C2[0]) && isnan(C2[1]) && isnan(C2[2]));
    CHECK(C2[3] == 2 * 1 + 3 * 4 && C2[4] == 2 * 2 + 3 * 5 && C2[5] == 2 * 3 + 3 * 6);
}

// ag_linear on a tape under autocast: its forward and its gradients are the bf16
// products of the same operands (agi_gemm_bf16 called directly); the mode is the one in
// force when the op ran, whatever the tape says at backward; float64 ops ignore it.
static void test_autocast_runs_a_linear_layer_in_bf16_and_leaves_f64_alone(void) {
    ag_pcg32 rng = ag_pcg32_make(5, 4);
    const int M = 9, in = 37, out = 21;
    ag_tensor *x = ag_tensor_uniform(AG_F32, 2, (int[]){M, in}, &rng, -1, 1);
    ag_tensor *w = ag_tensor_uniform(AG_F32, 2, (int[]){out, in}, &rng, -1, 1);
    ag_tensor *dy = ag_tensor_uniform(AG_F32, 2, (int[]){M, out}, &rng, -1, 1);
    ag_tensor_set_requires_grad(x, true);
    ag_tensor_set_requires_grad(w, true);
    ag_tape *tp = ag_tape_new();
    CHECK(ag_tape_autocast(tp) == AG_AUTOCAST_OFF);
    CHECK(ag_tape_set_autocast(tp, AG_AUTOCAST_BF16) == AG_AUTOCAST_OFF);
    ag_tensor *y = ag_linear(tp, x, w, NULL);
    ag_tape_set_autocast(tp, AG_AUTOCAST_OFF);  // backward follows the op, not the tape
    ag_backward_with(tp, y, dy);
    const float *X = ag_tensor_f32(x), *W = ag_tensor_f32(w), *DY = ag_tensor_f32(dy);
    float *Y = calloc((size_t)M * out, sizeof(float)), *DX = calloc((size_t)M * in, sizeof(float));
    float *DW = calloc((size_t)out * in, sizeof(float));
    agi_gemm_bf16(false, true, M, out, in, 1, X, in, W, in, 0, Y, out, NULL);
    agi_gemm_bf16(false, false, M, in, out, 1, DY, out, W, in, 1, DX, in, NULL);
    agi_gemm_bf16(true, false, out, in, M, 1, DY, out, X, in, 1, DW, in, NULL);
    ag_tensor gx = ag_tensor_grad_view(x), gw = ag_tensor_grad_view(w);
    CHECK(memcmp(ag_tensor_f32(y), Y, sizeof(float) * M * out) == 0);
    CHECK(memcmp(ag_tensor_f32(&gx), DX, sizeof(float) * M * in) == 0);
    CHECK(memcmp(ag_tensor_f32(&gw), DW, sizeof(float) * out * in) == 0);
    // The same layer in float64 under autocast keeps float64's rounding (bf16 operands
    // would be off by about 1e-3).
    ag_tape_reset(tp);
    ag_tape_set_autocast(tp, AG_AUTOCAST_BF16);
    ag_tensor *x64 = ag_tensor_uniform(AG_F64, 2, (int[]){2, 3}, &rng, -1, 1);
    ag_tensor *w64 = ag_tensor_uniform(AG_F64, 2, (int[]){1, 3}, &rng, -1, 1);
    ag_tensor *y64 = ag_linear(tp, x64, w64, NULL);
    const double *a = ag_tensor_f64(x64), *b = ag_tensor_f64(w64);
    CHECK(fabs(ag_tensor_item(y64, 1) - (a[3] * b[0] + a[4] * b[1] + a[5] * b[2])) < 1e-15);
    ag_tape_free(tp);
    free(Y), free(DX), free(DW);
    ag_tensor_free(x), ag_tensor_free(w), ag_tensor_free(dy);
    ag_tensor_free(x64), ag_tensor_free(w64);
}

// A mode that is neither setting is refused, not taken as AG_AUTOCAST_OFF: the tape keeps
// the one it had.
static void test_an_unknown_autocast_mode_is_refused_and_the_setting_kept(void) {
    ag_tape *tp = ag_tape_new();
    ag_tape_set_autocast(tp, AG_AUTOCAST_BF16);
    testing_catch_errors();
    CHECK(ag_tape_set_autocast(tp, (ag_autocast)2) == AG_AUTOCAST_BF16);
    CHECK(testing_error_was("tape_set_autocast: mode 2 is neither AG_AUTOCAST_OFF (0) nor "
                            "AG_AUTOCAST_BF16 (1); the setting stays 1"));
    testing_release_errors();
    CHECK(ag_tape_autocast(tp) == AG_AUTOCAST_BF16);
    ag_tape_free(tp);
}

// Fused attention under autocast: its two products run in bf16 (the output and every
// gradient move by about bf16's rounding from float32's, no more), by the same bits on
// both paths.
static void attention_run(bool autocast, bool native, float *out[4], ag_pcg32 seed_rng) {
    ag_pcg32 rng = seed_rng;
    ag_tensor *q = ag_tensor_uniform(AG_F32, 4, (int[]){2, 3, 37, 16}, &rng, -1, 1);
    ag_tensor *k = ag_tensor_uniform(AG_F32, 4, (int[]){2, 3, 41, 16}, &rng, -1, 1);
    ag_tensor *v = ag_tensor_uniform(AG_F32, 4, (int[]){2, 3, 41, 8}, &rng, -1, 1);
    ag_tensor *up = ag_tensor_uniform(AG_F32, 4, (int[]){2, 3, 37, 8}, &rng, -1, 1);
    ag_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) ag_tensor_set_requires_grad(in[i], true);
    agi_bf16_native_enable(native);
    ag_tape *tp = ag_tape_new();
    ag_tape_set_autocast(tp, autocast ? AG_AUTOCAST_BF16 : AG_AUTOCAST_OFF);
    ag_attention_opts o = {.softmax = {.scale = 0.25, .causal = true}};
    ag_tensor *y = ag_attention(tp, q, k, v, &o);
    ag_backward(tp, ag_sum(tp, ag_mul(tp, y, up)));
    out[0] = malloc(y->numel * sizeof(float));
    memcpy(out[0], ag_tensor_f32(y), y->numel * sizeof(float));
    for (int i = 0; i < 3; i++) {
        ag_tensor g = ag_tensor_grad_view(in[i]);
        out[1 + i] = malloc(in[i]->numel * sizeof(float));
        memcpy(out[1 + i], ag_tensor_f32(&g), in[i]->numel * sizeof(float));
    }
    agi_bf16_native_enable(true);
    ag_tape_free(tp);
    for (int i = 0; i < 3; i++) ag_tensor_free(in[i]);
    ag_tensor_free(up);
}

static void test_autocast_runs_attentions_two_products_in_bf16(void) {
    const size_t n[4] = {2 * 3 * 37 * 8, 2 * 3 * 37 * 16, 2 * 3 * 41 * 16, 2 * 3 * 41 * 8};
    const ag_pcg32 rng = ag_pcg32_make(5, 6);
    float *f32[4], *bf[2][4];
    attention_run(false, true, f32, rng);
    for (int native = 0; native < 2; native++) attention_run(true, native, bf[native], rng);
    double moved = 0, largest = 0;
    bool same = true;
    for (int t = 0; t < 4; t++) {
        for (size_t e = 0; e < n[t]; e++) {
            moved = fmax(moved, fabs(bf[1][t][e] - f32[t][e]));
            largest = fmax(largest, fabs(f32[t][e]));
        }
        same &= memcmp(bf[0][t], bf[1][t], n[t] * sizeof(float)) == 0;
    }
    printf("attention under autocast: largest change from f32 %.1e (largest value %.1f)\n",
           moved, largest);
    CHECK(moved > 1e-5 && moved < 0.05 * largest);  // bf16's rounding, and only that
    CHECK(same || !agi_bf16_native());
    for (int t = 0; t < 4; t++) free(f32[t]), free(bf[0][t]), free(bf[1][t]);
}

// An attention whose every row of weights is exactly one-hot (each query meets one key
// with a score 400 above the others'), under autocast: its output is that key's v, and
// nothing moves the weights, so dQ is 0 (the composed ops give exactly 0, float32's fused
// attention a few float32 roundings of dO . v). The fused backward's D = rowsum(dO * O)
// stands for the softmax's rowsum(P * dP), dP = dO V^T: with dO unrounded there, where dP's
// product rounds it to bf16, dP - D at the chosen key was dO's rounding times v (2^-9 of
// dO . v), and dQ that times 20.
static void test_autocast_attention_gives_no_dq_through_one_hot_weights(void) {
    enum { B = 2, T = 16, D = 16 };
    ag_pcg32 rng = ag_pcg32_make(21, 22);
    ag_tensor *q = ag_tensor_zeros(AG_F32, 4, (int[]){1, B, T, D});
    ag_tensor *k = ag_tensor_zeros(AG_F32, 4, (int[]){1, B, T, D});
    ag_tensor *v = ag_tensor_uniform(AG_F32, 4, (int[]){1, B, T, D}, &rng, -1, 1);
    ag_tensor *up = ag_tensor_uniform(AG_F32, 4, (int[]){1, B, T, D}, &rng, -1, 1);
    for (int r = 0; r < B * T; r++) {
        ag_tensor_f32(q)[r * D + (r * 7 + 3) % D] = 20;  // query r meets key (7 r + 3) % 16
        ag_tensor_f32(k)[r * D + r % D] = 20;
    }
    for (size_t e = 0; e < v->numel; e++)  // in bf16 already: O is exactly a v
        ag_tensor_f32(v)[e] = agi_bf16_value(agi_bf16_round(ag_tensor_f32(v)[e]));
    ag_tensor_set_requires_grad(q, true);
    double largest[2];
    for (int autocast = 0; autocast < 2; autocast++) {
        ag_tape *tp = ag_tape_new();
        ag_tape_set_autocast(tp, autocast ? AG_AUTOCAST_BF16 : AG_AUTOCAST_OFF);
        ag_attention_opts o = {.softmax = {.scale = 1.0}};
        ag_tensor *y = ag_attention(tp, q, k, v, &o);
        ag_backward(tp, ag_sum(tp, ag_mul(tp, y, up)));
        ag_tensor g = ag_tensor_grad_view(q);
        largest[autocast] = 0;
        for (size_t e = 0; e < q->numel; e++)
            largest[autocast] = fmax(largest[autocast], fabs(ag_tensor_f32(&g)[e]));
        ag_tape_free(tp);
    }
    printf("dQ through one-hot weights: largest %.1e in float32, %.1e under autocast\n",
           largest[0], largest[1]);
    CHECK(largest[0] < 1e-4 && largest[1] < 1e-4);
    ag_tensor_free(q), ag_tensor_free(k), ag_tensor_free(v), ag_tensor_free(up);
}

// ag_tape_check on a tape recorded under autocast: a linear layer, a product and an
// attention whose products ran on bf16 operands differ from their f64 twins by bf16's
// rounding (by far more than f32_vs_f64 where the softmax is peaked, as here), which is
// no error of their gradients: they pass. A node recorded before autocast was switched
// on is still held to float32's f32_vs_f64.
static void test_tape_check_passes_nodes_recorded_under_autocast(void) {
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    ag_tensor *x = ag_tensor_uniform(AG_F32, 2, (int[]){6, 16}, &rng, -1, 1);
    ag_tensor *w = ag_tensor_uniform(AG_F32, 2, (int[]){16, 16}, &rng, -1, 1);
    ag_tensor *b = ag_tensor_uniform(AG_F32, 1, (int[]){16}, &rng, -1, 1);
    ag_tensor *in[3] = {x, w, b};
    for (int i = 0; i < 3; i++) ag_tensor_set_requires_grad(in[i], true);
    ag_tape *tp = ag_tape_new();
    ag_tensor *h = ag_linear(tp, x, w, b);  // float32 products
    ag_tape_set_autocast(tp, AG_AUTOCAST_BF16);
    ag_tensor *y = ag_linear(tp, h, w, b);
    ag_tensor *z = ag_matmul(tp, y, w, false, true);
    ag_tensor *q = ag_reshape(tp, z, 4, (int[]){1, 2, 6, 8});
    ag_attention_opts o = {.softmax = {.scale = 0.03, .causal = true}};
    ag_tensor *a = ag_attention(tp, q, q, q, &o);
    // Keys and values that require no grad (a memory), with a peaked softmax.
    ag_tensor *q2 = ag_tensor_normal(AG_F32, 4, (int[]){1, 2, 16, 16}, &rng, 0, 5);
    ag_tensor *mem = ag_tensor_normal(AG_F32, 4, (int[]){1, 2, 40, 16}, &rng, 0, 5);
    ag_tensor_set_requires_grad(q2, true);
    ag_attention_opts peaked = {.softmax = {.scale = 0.25}};
    ag_add(tp, ag_sum(tp, a), ag_sum(tp, ag_attention(tp, q2, mem, mem, &peaked)));
    ag_tape_check_report r;
    const bool ok = ag_tape_check(tp, NULL, &r);
    if (!ok) ag_tape_check_print(&r, stderr);
    CHECK(ok && r.verdict == AG_CHECK_PASS);
    CHECK(r.n_nodes >= 5 && r.nodes[0].f32_vs_f64 >= 0 && r.nodes[0].f32_vs_f64 <= 1e-4);
    CHECK(r.n_nodes == 9 && r.nodes[4].f32_vs_f64 > 1e-4);  // the attention's bf16 weights
    ag_tape_check_report_free(&r);
    // From bf16 inputs a linear or matmul node's products are exact in f32 (its twin's
    // agree to a few 1e-8): only attention, which rounds its weights inside, is held to
    // the looser bound. A bound tighter than their agreement fails the linear and matmul
    // nodes and still passes the attention.
    ag_tape_check_opts tight = ag_tape_check_defaults();
    tight.f32_vs_f64 = 1e-10;
    ag_tape_check(tp, &tight, &r);
    CHECK(r.n_nodes == 9);
    for (int i = 1; i <= 2; i++)
        CHECK(!r.nodes[i].f32_agrees && r.nodes[i].f32_vs_f64 < 1e-6 &&
              strstr(r.nodes[i].fd.reason, "more than f32_vs_f64 1e-10") != NULL);
    CHECK(r.nodes[4].f32_agrees && r.nodes[4].f32_vs_f64 > 1e-4);
    ag_tape_check_report_free(&r);
    ag_tape_free(tp);
    for (int i = 0; i < 3; i++) ag_tensor_free(in[i]);
    ag_tensor_free(q2), ag_tensor_free(mem);
}

// A training step of a pre-LN block under autocast (its products packed in bf16 into the
// threads' scratch, the attention's included): once the first step has sized the tape and
// the scratch, another allocates nothing, on one thread and on two.
static void test_a_repeated_autocast_training_step_allocates_nothing(void) {
    ag_pcg32 rng = ag_pcg32_make(9, 3);
    ag_params *ps = ag_params_new(AG_F32);
    ag_block b;
    ag_block_config bc = {.d_model = 128, .num_heads = 4, .dim_feedforward = 512,
                          .activation = AG_ACT_GELU, .norm_first = true, .dropout = 0.1};
    CHECK(ag_block_init(&b, ps, "h.0", &bc, &rng));
    ag_optim_config oc = ag_optim_defaults(AG_ADAMW);
    ag_optim *opt = ag_optim_new(ps, &oc);
    ag_tensor *x = ag_tensor_uniform(AG_F32, 3, (int[]){4, 128, 128}, &rng, -1, 1);
    ag_tensor *up = ag_tensor_uniform(AG_F32, 3, (int[]){4, 128, 128}, &rng, -1, 1);
    ag_tape *tp = ag_tape_new();
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        ag_memory_stats before = ag_memory_usage();
        for (int step = 0; step < 4; step++) {
            if (step == 1) before = ag_memory_usage();
            ag_tape_reset(tp);
            ag_tape_set_autocast(tp, AG_AUTOCAST_BF16);
            ag_params_zero_grad(ps);
            ag_block_opts o = {.causal = true, .training = true, .dropout_seed = (uint64_t)step};
            ag_backward(tp, ag_sum(tp, ag_mul(tp, ag_block_forward(tp, &b, x, &o), up)));
            ag_params_clip_grad_norm(ps, 1.0);
            ag_optim_step(opt);
        }
        ag_memory_stats after = ag_memory_usage();
        CHECK(after.allocations == before.allocations);
        CHECK(after.bytes_live == before.bytes_live);
    }
    ag_threads_set(1);
    ag_tape_free(tp);
    ag_optim_free(opt);
    ag_tensor_free(x), ag_tensor_free(up);
    ag_params_free(ps);
}

// ---- Matrix-vector products on bf16 weights (agi_gemv_bf16) ----------------------------

// Y [M, N] = X [M, K] W^T + bias by the path asked, W (rows K + 3 apart) rounded to its
// packed bf16 copy, X's rows K + 1 apart, Y's N + 2.
typedef struct {
    int M, N, K;
    bool bias, special;
} gemv_case;

typedef struct {
    float *X, *W, *bias;
    uint16_t *W16;
    size_t ny;
} gemv_data;

static gemv_data gemv_fill(const gemv_case *c, ag_pcg32 *rng) {
    gemv_data d;
    const size_t nx = (size_t)c->M * (size_t)(c->K + 1), nw = (size_t)c->N * (size_t)(c->K + 3);
    d.X = malloc((nx + 1) * sizeof(float));
    d.W = malloc((nw + 1) * sizeof(float));
    d.W16 = malloc((agi_gemv_bf16_packed_len(c->N, c->K) + 1) * sizeof(uint16_t));
    d.bias = malloc((size_t)c->N * sizeof(float));
    d.ny = (size_t)c->M * (size_t)(c->N + 2);
    for (size_t i = 0; i < nx; i++) d.X[i] = draw(rng, c->special);
    for (size_t i = 0; i < nw; i++) d.W[i] = draw(rng, c->special);
    agi_gemv_bf16_pack(c->N, c->K, d.W, (size_t)c->K + 3, d.W16);
    for (int i = 0; i < c->N; i++) d.bias[i] = (float)uniform(rng);
    return d;
}

static void gemv_free(gemv_data *d) { free(d->X), free(d->W), free(d->W16), free(d->bias); }

static void gemv_run(const gemv_case *c, const gemv_data *d, float *Y, bool native) {
    agi_bf16_native_enable(native);
    agi_gemv_bf16(c->M, c->N, c->K, d->X, c->K + 1, d->W16, c->bias ? d->bias : NULL, Y,
                  c->N + 2);
    agi_bf16_native_enable(true);
}

static const int gemv_sizes[][3] = {{1, 1, 1},  {1, 16, 32},  {2, 17, 33}, {3, 40, 31},
                                    {4, 33, 64}, {1, 300, 77}, {1, 5, 0},   {2, 70, 1030}};

static bool bf16_is_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }

// The packed copy holds W[n][k] rounded (agi_bf16_round) at block n / 16, chunk k / 32,
// row n % 16, place k % 32, and zeros in the rows past N and the values past K: on both
// paths (a NaN a NaN on each), on one thread and two.
static void test_packing_rounds_each_weight_into_its_place_and_pads_with_zeros(void) {
    ag_pcg32 rng = ag_pcg32_make(5, 10);
    // The last is work enough for two threads.
    const int sizes[][2] = {{1, 1},   {16, 32},   {17, 33},  {40, 31},
                            {300, 77}, {33, 1030}, {500, 700}};
    bool placed = true, same = true;
    for (int s = 0; s < 7; s++) {
        const int N = sizes[s][0], K = sizes[s][1], ldw = K + 3;
        const size_t len = agi_gemv_bf16_packed_len(N, K);
        CHECK(len == (size_t)((N + 15) / 16 * 16) * (size_t)((K + 31) / 32 * 32));
        float *W = malloc((size_t)N * ldw * sizeof *W);
        for (size_t i = 0; i < (size_t)N * ldw; i++) W[i] = draw(&rng, true);
        uint16_t *P[3] = {malloc(len * 2), malloc(len * 2), malloc(len * 2)};
        for (int run = 0; run < 3; run++) {  // native, portable, native on two threads
            agi_bf16_native_enable(run != 1);
            ag_threads_set(run == 2 ? 2 : 1);
            agi_gemv_bf16_pack(N, K, W, (size_t)ldw, P[run]);
        }
        agi_bf16_native_enable(true);
        ag_threads_set(1);
        const int C = (K + 31) / 32;
        for (int n = 0; n < (N + 15) / 16 * 16; n++)
            for (int k = 0; k < C * 32; k++) {
                const size_t at = (((size_t)(n / 16) * C + k / 32) * 16 + n % 16) * 32 + k % 32;
                const uint16_t want =
                    n < N && k < K ? agi_bf16_round(W[(size_t)n * ldw + k]) : 0;
                for (int run = 0; run < 3; run++) {
                    const uint16_t got = P[run][at];
                    placed &= got == want || (bf16_is_nan(got) && bf16_is_nan(want));
                }
                same &= P[0][at] == P[2][at];
            }
        same &= memcmp(P[0], P[2], len * 2) == 0;
        free(P[0]), free(P[1]), free(P[2]), free(W);
    }
    CHECK(placed);
    CHECK(same);
}

// A copy checked on its way into the product (agi_gemv_bf16_checked) comes out as the
// packing of the weights, whatever it held (stale values, a changed weight, garbage in
// the padding), and the product is that of a fresh copy: the same bits, on both paths,
// for one row of X and three, on one thread and two.
static void test_checked_products_mend_a_stale_copy_to_the_bits_of_a_fresh_one(void) {
    ag_pcg32 rng = ag_pcg32_make(5, 11);
    const int sizes[][2] = {{17, 33}, {40, 31}, {500, 700}};  // the last for two threads
    bool mended = true, same = true;
    for (int s = 0; s < 3; s++)
        for (int run = 0; run < 4; run++) {
            const int N = sizes[s][0], K = sizes[s][1], M = run & 1 ? 3 : 1;
            const size_t len = agi_gemv_bf16_packed_len(N, K);
            float *W = malloc((size_t)N * K * sizeof *W), *X = malloc((size_t)M * K * 4),
                  *Y[2] = {malloc((size_t)M * N * 4), malloc((size_t)M * N * 4)};
            uint16_t *fresh = malloc(len * 2), *stale = malloc(len * 2);
            for (size_t i = 0; i < (size_t)N * K; i++) W[i] = draw(&rng, false);
            for (size_t i = 0; i < (size_t)M * K; i++) X[i] = draw(&rng, false);
            agi_gemv_bf16_pack(N, K, W, (size_t)K, stale);
            W[(size_t)(N - 1) * K] *= 3;  // a weight changed since
            stale[1] ^= 0x40, stale[len - 1] = 0x3F80;  // a stale value, padding not zero
            agi_gemv_bf16_pack(N, K, W, (size_t)K, fresh);
            agi_bf16_native_enable(run < 2);
            ag_threads_set(run & 2 ? 2 : 1);
            agi_gemv_bf16(M, N, K, X, K, fresh, NULL, Y[0], N);
            agi_gemv_bf16_checked(M, N, K, X, K, W, stale, NULL, Y[1], N);
            agi_bf16_native_enable(true);
            ag_threads_set(1);
            mended &= memcmp(fresh, stale, len * 2) == 0;
            same &= memcmp(Y[0], Y[1], (size_t)M * N * 4) == 0;
            free(W), free(X), free(Y[0]), free(Y[1]), free(fresh), free(stale);
        }
    CHECK(mended);
    CHECK(same);
}

// Both paths, on every tail of k (K mod 32) and of rows (N mod 16), with huge, tiny,
// zero, infinite and NaN operands: the same bits.
static void test_matrix_vector_products_native_and_portable_give_the_same_bits(void) {
    if (portable_only("bf16 matrix-vector products")) return;
    ag_pcg32 rng = ag_pcg32_make(5, 7);
    bool same = true;
    for (int s = 0; s < 8; s++)
        for (int t = 0; t < 4; t++) {
            gemv_case c = {gemv_sizes[s][0], gemv_sizes[s][1], gemv_sizes[s][2], t & 1, t & 2};
            gemv_data d = gemv_fill(&c, &rng);
            float *Y[2] = {calloc(d.ny, sizeof(float)), calloc(d.ny, sizeof(float))};
            for (int native = 0; native < 2; native++) gemv_run(&c, &d, Y[native], native);
            same &= same_bits(Y[0], Y[1], d.ny);
            free(Y[0]), free(Y[1]);
            gemv_free(&d);
        }
    CHECK(same);
}

// |y - W x| <= sum_k |w_k x_k| (2 u + u^2 + (K + 1) 2^-24), the bound of the products
// above, against float64 on the unrounded operands: met, with bf16's errors.
static void test_matrix_vector_products_are_within_the_bf16_rounding_bound_of_float64(void) {
    ag_pcg32 rng = ag_pcg32_make(5, 8);
    double worst_ratio = 0, largest = 0;
    for (int s = 0; s < 8; s++) {
        gemv_case c = {gemv_sizes[s][0], gemv_sizes[s][1], gemv_sizes[s][2], false, false};
        if (c.K == 0) continue;
        gemv_data d = gemv_fill(&c, &rng);
        float *Y = calloc(d.ny, sizeof(float));
        gemv_run(&c, &d, Y, agi_bf16_native());
        const double u = ldexp(1, -8), g = (c.K + 1) * ldexp(1, -24);
        for (int i = 0; i < c.M; i++)
            for (int n = 0; n < c.N; n++) {
                double exact = 0, sum_abs = 0;
                for (int k = 0; k < c.K; k++) {
                    const double p = (double)d.X[(size_t)i * (c.K + 1) + k] *
                                     d.W[(size_t)n * (c.K + 3) + k];
                    exact += p;
                    sum_abs += fabs(p);
                }
                const double err = fabs(Y[(size_t)i * (c.N + 2) + n] - exact);
                worst_ratio = fmax(worst_ratio, err / (sum_abs * (2 * u + u * u + g)));
                largest = fmax(largest, err / sum_abs);
            }
        free(Y);
        gemv_free(&d);
    }
    printf("bf16 matrix-vector products vs float64: worst error %.2f of the bound, largest "
           "relative to sum |w x| %.1e\n", worst_ratio, largest);
    CHECK(worst_ratio <= 1);
    CHECK(largest > ldexp(1, -14));
}

// Rows of W split over two threads give the bits of one; K = 0 gives the bias; a NaN in x
// makes its row of Y NaN and leaves the other rows finite.
static void test_matrix_vector_products_threads_empty_sums_and_nan(void) {
    ag_pcg32 rng = ag_pcg32_make(5, 9);
    gemv_case c = {2, 900, 700, true, false};
    gemv_data d = gemv_fill(&c, &rng);
    float *Y[2] = {calloc(d.ny, sizeof(float)), calloc(d.ny, sizeof(float))};
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        gemv_run(&c, &d, Y[threads - 1], agi_bf16_native());
    }
    ag_threads_set(1);
    CHECK(memcmp(Y[0], Y[1], d.ny * sizeof(float)) == 0);
    free(Y[0]), free(Y[1]);
    gemv_free(&d);
    const float X[6] = {1, NAN, 2, 3, 4, 5}, bias[2] = {10, 20};
    const float W[6] = {1, 1, 1, 2, 2, 2};
    uint16_t *P = malloc(agi_gemv_bf16_packed_len(2, 3) * sizeof *P);
    agi_gemv_bf16_pack(2, 3, W, 3, P);
    float Yn[4];
    agi_gemv_bf16(2, 2, 3, X, 3, P, bias, Yn, 2);
    CHECK(isnan(Yn[0]) && isnan(Yn[1]) && Yn[2] == 22 && Yn[3] == 44);
    agi_gemv_bf16(2, 2, 0, X, 3, P, bias, Yn, 2);
    CHECK(Yn[0] == 10 && Yn[1] == 20 && Yn[2] == 10 && Yn[3] == 20);
    free(P);
}

int main(void) {
    RUN(test_packing_rounds_each_weight_into_its_place_and_pads_with_zeros);
    RUN(test_checked_products_mend_a_stale_copy_to_the_bits_of_a_fresh_one);
    RUN(test_matrix_vector_products_native_and_portable_give_the_same_bits);
    RUN(test_matrix_vector_products_are_within_the_bf16_rounding_bound_of_float64);
    RUN(test_matrix_vector_products_threads_empty_sums_and_nan);
    RUN(test_rounding_is_to_nearest_even_with_subnormals_flushed);
    RUN(test_native_and_portable_paths_give_the_same_bits);
    RUN(test_products_are_within_the_bf16_rounding_bound_of_float64);
    RUN(test_products_are_the_same_bits_on_one_and_two_threads);
    RUN(test_edges_empty_sums_and_nan);
    RUN(test_a_nan_stays_in_its_row_and_column_on_two_threads);
    RUN(test_autocast_runs_a_linear_layer_in_bf16_and_leaves_f64_alone);
    RUN(test_an_unknown_autocast_mode_is_refused_and_the_setting_kept);
    RUN(test_autocast_runs_attentions_two_products_in_bf16);
    RUN(test_autocast_attention_gives_no_dq_through_one_hot_weights);
    RUN(test_tape_check_passes_nodes_recorded_under_autocast);
    RUN(test_a_repeated_autocast_training_step_allocates_nothing);
    return testing_summary();
}
