// The tile kernels (src/kernels/tile_gemm.c) against BLAS, in float64 on odd sizes, and
// fused attention through them against fused attention through BLAS; decoding's
// matrix-vector kernel (src/kernels/gemv.c) against float64.
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../src/kernels/gemm.h"
#include "../src/kernels/gemv.h"
#include "../src/kernels/product_split.h"
#include "../src/kernels/tile_gemm.h"
#include "testing.h"

static double uniform(ag_pcg32 *rng) { return 2.0 * ag_pcg32_double(rng) - 1.0; }

// C = alpha op(A) op(B) + beta C both ways, with leading dimensions wider than the rows.
static double product_error(bool ta, bool tb, int M, int N, int K, double alpha, double beta,
                            ag_pcg32 *rng) {
    const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    const size_t na = (size_t)lda * (ta ? K : M), nb = (size_t)ldb * (tb ? N : K),
                 nc = (size_t)ldc * M;
    double *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B);
    double *C = malloc(nc * sizeof *C), *C2 = malloc(nc * sizeof *C2);
    for (size_t i = 0; i < na; i++) A[i] = uniform(rng);
    for (size_t i = 0; i < nb; i++) B[i] = uniform(rng);
    for (size_t i = 0; i < nc; i++) C[i] = C2[i] = uniform(rng);
    agi_tile_gemm_f64(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C2, ldc);
    double worst = 0;
    for (size_t i = 0; i < nc; i++) worst = fmax(worst, fabs(C[i] - C2[i]));
    free(A), free(B), free(C), free(C2);
    return worst;
}

static void test_products_equal_blas_on_odd_sizes(void) {
    if (!agi_tile_gemm_available()) {
        printf("tile kernels: not available on this CPU (no AVX-512F); BLAS is used\n");
        return;
    }
    ag_pcg32 rng = ag_pcg32_make(7, 1);
    const int sizes[] = {1, 7, 13, 16, 33, 64, 65};
    double worst = 0;
    for (int t = 0; t < 4; t++)
        for (int a = 0; a < 7; a++)
            for (int b = 0; b < 7; b++)
                for (int c = 0; c < 7; c++) {
                    const double beta = (a + b + c) % 2;
                    worst = fmax(worst, product_error(t & 1, t & 2, sizes[a], sizes[b],
                                                      sizes[c], 0.7, beta, &rng));
                }
    // Sums longer than one chunk of k (256), and bands past the first (64 columns).
    for (int t = 0; t < 4; t++)
        worst = fmax(worst, product_error(t & 1, t & 2, 37, 150, 600, -1.3, t % 2, &rng));
    // K = 0: C = beta C
    worst = fmax(worst, product_error(false, false, 5, 9, 0, 1.0, 1.0, &rng));
    worst = fmax(worst, product_error(true, true, 5, 9, 0, 1.0, 0.0, &rng));
    printf("tile kernels vs dgemm: worst abs difference %.2e\n", worst);
    CHECK(worst < 1e-13);
}

// Products large enough to take every path of the blocking (tile_gemm.c): A^T packed
// (N >= 256), B^T packed and B packed for rows far apart, more than one block of
// columns (256 doubles), more than one block of packed rows (1020 doubles) and of k (256),
// with the edges of every tile shape; on one thread and split over two (by columns, with
// op(A) packed once for all when it is given as A^T, and by rows with op(B) packed once
// for all).
static void test_large_products_equal_blas_on_every_path(void) {
    if (!agi_tile_gemm_available()) {
        printf("tile kernels: not available on this CPU (no AVX-512F); BLAS is used\n");
        return;
    }
    ag_pcg32 rng = ag_pcg32_make(7, 2);
    const int shapes[][3] = {{1100, 300, 517}, {37, 530, 300}, {300, 37, 530}, {1, 300, 700}};
    double worst = 0;
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        for (int s = 0; s < 4; s++)
            for (int t = 0; t < 4; t++)
                worst = fmax(worst, product_error(t & 1, t & 2, shapes[s][0], shapes[s][1],
                                                  shapes[s][2], 0.9, (s + t) % 2, &rng));
    }
    ag_threads_set(1);
    printf("large products vs dgemm: worst abs difference %.2e\n", worst);
    CHECK(worst < 1e-12);
}

// The sums run in the same order whatever the threads: a product split over two threads
// (along rows or columns, with or without the shared packing of op(A) or op(B), slices of
// rows packing their own blocks of op(B)) gives the bits of one thread.
static void test_products_are_the_same_bits_on_one_and_two_threads(void) {
    if (!agi_tile_gemm_available()) return;
    ag_pcg32 rng = ag_pcg32_make(3, 3);
    const int shapes[][3] = {{700, 300, 600}, {200, 900, 300}, {40, 64, 700}, {1100, 200, 300}};
    bool same = true;
    for (int s = 0; s < 4; s++)
        for (int t = 0; t < 4; t++) {
            const bool ta = t & 1, tb = t & 2;
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
            float *C[2] = {malloc(sizeof(float) * M * N), malloc(sizeof(float) * M * N)};
            for (int i = 0; i < M * K; i++) A[i] = (float)uniform(&rng);
            for (int i = 0; i < K * N; i++) B[i] = (float)uniform(&rng);
            for (int threads = 1; threads <= 2; threads++) {
                ag_threads_set(threads);
                agi_tile_gemm_f32(ta, tb, M, N, K, 1, A, ta ? M : K, B, tb ? K : N, 0,
                                  C[threads - 1], N, NULL);
            }
            same &= memcmp(C[0], C[1], sizeof(float) * M * N) == 0;
            free(A), free(B), free(C[0]), free(C[1]);
        }
    ag_threads_set(1);
    CHECK(same);
}

// Where the tile kernels are off (a CPU without AVX-512), products go through BLAS in
// chunks of C, split over the threads: the same bits on one and two threads, by rows
// (M >= N) and by columns, at sizes that are not a multiple of any chunk or kernel block,
// with a bias, and a few rows times B^T (the matrix-vector path). The chunks moved with
// the thread count, and OpenBLAS sums the rows at its blocks' edges in another order.
static void test_blas_products_are_the_same_bits_on_one_and_two_threads(void) {
    const bool tiles = agi_tile_gemm_available();
    agi_tile_gemm_enable(false);
    ag_pcg32 rng = ag_pcg32_make(3, 4);
    const int shapes[][3] = {{700, 300, 600}, {200, 900, 300}, {1100, 200, 300}, {3, 2304, 768},
                             {517, 517, 129}};
    bool same = true;
    for (int s = 0; s < 5; s++)
        for (int t = 0; t < 8; t++) {
            const bool ta = t & 1, tb = t & 2, with_bias = t & 4;
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
            float *bias = malloc(sizeof(float) * N);
            float *C[2] = {malloc(sizeof(float) * M * N), malloc(sizeof(float) * M * N)};
            for (int i = 0; i < M * K; i++) A[i] = (float)uniform(&rng);
            for (int i = 0; i < K * N; i++) B[i] = (float)uniform(&rng);
            for (int i = 0; i < N; i++) bias[i] = (float)uniform(&rng);
            for (int threads = 1; threads <= 2; threads++) {
                ag_threads_set(threads);
                agi_gemm_autocast_f32(AG_AUTOCAST_OFF, ta, tb, M, N, K, 1, A, ta ? M : K, B,
                                      tb ? K : N, 0, with_bias ? bias : NULL, C[threads - 1],
                                      N);
            }
            same &= memcmp(C[0], C[1], sizeof(float) * M * N) == 0;
            free(A), free(B), free(bias), free(C[0]), free(C[1]);
        }
    ag_threads_set(1);
    agi_tile_gemm_enable(tiles);
    CHECK(same);
}

// A in place with rows a multiple of 4 KB apart is packed into panels (its rows evicted
// each other in L1): the same bits as the same values with rows 4 bytes further apart,
// which are read in place, on 1 thread and on 3 (whose slices of rows pack their own; 2
// cut 300 columns by columns and copy it whole once for both), with more rows than one
// packed block holds (2100), op(B) both ways, and K past one chunk; f64 against dgemm.
static void test_rows_4k_apart_give_the_same_bits_as_rows_read_in_place(void) {
    if (!agi_tile_gemm_available()) return;
    ag_pcg32 rng = ag_pcg32_make(5, 5);
    const int M = 2100, N = 300, K = 1000;
    float *A[2] = {malloc(sizeof(float) * M * 1024), malloc(sizeof(float) * M * 1025)};
    float *B = malloc(sizeof(float) * K * N), *C[2] = {malloc(sizeof(float) * M * N),
                                                        malloc(sizeof(float) * M * N)};
    for (int r = 0; r < M; r++)
        for (int k = 0; k < 1025; k++) {
            float v = (float)uniform(&rng);
            if (k < 1024) A[0][(size_t)r * 1024 + k] = v;
            A[1][(size_t)r * 1025 + k] = k < 1024 ? A[0][(size_t)r * 1024 + k] : v;
        }
    for (int i = 0; i < K * N; i++) B[i] = (float)uniform(&rng);
    bool same = true;
    for (int threads = 1; threads <= 3; threads++)
        for (int tb = 0; tb < 2; tb++) {
            ag_threads_set(threads);
            for (int w = 0; w < 2; w++)
                agi_tile_gemm_f32(false, tb, M, N, K, 1, A[w], w ? 1025 : 1024, B, tb ? K : N, 0,
                                  C[w], N, NULL);
            same &= memcmp(C[0], C[1], sizeof(float) * M * N) == 0;
        }
    ag_threads_set(1);
    CHECK(same);
    free(A[0]), free(A[1]), free(B), free(C[0]), free(C[1]);
    // float64: rows of 512 doubles; against dgemm.
    const int lda = 512, Kd = 300, Md = 100, Nd = 260;
    double *Ad = malloc(sizeof(double) * Md * lda), *Bd = malloc(sizeof(double) * Kd * Nd);
    double *Cd = malloc(sizeof(double) * Md * Nd), *Cb = malloc(sizeof(double) * Md * Nd);
    for (int i = 0; i < Md * lda; i++) Ad[i] = uniform(&rng);
    for (int i = 0; i < Kd * Nd; i++) Bd[i] = uniform(&rng);
    agi_tile_gemm_f64(false, false, Md, Nd, Kd, 1, Ad, lda, Bd, Nd, 0, Cd, Nd, NULL);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Md, Nd, Kd, 1, Ad, lda, Bd, Nd, 0,
                Cb, Nd);
    double worst = 0;
    for (int i = 0; i < Md * Nd; i++) worst = fmax(worst, fabs(Cd[i] - Cb[i]));
    CHECK(worst < 1e-12);
    ag_threads_set(2);  // cut by columns: copied once for both slices
    agi_tile_gemm_f64(false, false, Md, Nd, Kd, 1, Ad, lda, Bd, Nd, 0, Cb, Nd, NULL);
    ag_threads_set(1);
    CHECK(memcmp(Cd, Cb, sizeof(double) * Md * Nd) == 0);
    free(Ad), free(Bd), free(Cd), free(Cb);
}

// A product with a bias (a linear layer's forward: the bias added as the product is
// stored) through the tile kernels against the BLAS path, which adds the product onto
// bias rows.
static void test_product_with_bias_equals_blas(void) {
    ag_pcg32 rng = ag_pcg32_make(9, 1);
    const int sizes[][3] = {{1, 7, 5}, {33, 65, 13}, {300, 40, 600}, {8, 200, 64}};
    double worst = 0;
    for (int s = 0; s < 4; s++)
        for (int tb = 0; tb < 2; tb++) {
            const int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
            double *A = malloc(sizeof(double) * M * K), *B = malloc(sizeof(double) * K * N);
            double *bias = malloc(sizeof(double) * N), *C[2];
            for (int i = 0; i < M * K; i++) A[i] = uniform(&rng);
            for (int i = 0; i < K * N; i++) B[i] = uniform(&rng);
            for (int i = 0; i < N; i++) bias[i] = uniform(&rng);
            for (int pass = 0; pass < 2; pass++) {
                agi_tile_gemm_enable(pass == 0);
                C[pass] = malloc(sizeof(double) * M * N);
                agi_gemm_autocast_f64(AG_AUTOCAST_OFF, false, tb, M, N, K, 1, A, K, B, tb ? K : N,
                                      0, bias, C[pass], N);
            }
            agi_tile_gemm_enable(true);
            for (int i = 0; i < M * N; i++) worst = fmax(worst, fabs(C[0][i] - C[1][i]));
            free(A), free(B), free(bias), free(C[0]), free(C[1]);
        }
    printf("product with bias, tiles vs BLAS: worst abs difference %.2e\n", worst);
    CHECK(worst < 1e-12);
}

// Whole blocks in registers and the edges element by element, in both precisions.
static void test_transpose(void) {
    const int sizes[][2] = {{5, 7}, {16, 16}, {8, 8}, {37, 50}, {64, 19}, {1, 33}};
    for (int t = 0; t < 6; t++) {
        const int rows = sizes[t][0], cols = sizes[t][1], lds = cols + 3, ldd = rows + 5;
        double *s64 = malloc(sizeof(double) * rows * lds);
        double *d64 = malloc(sizeof(double) * cols * ldd);
        float *s32 = malloc(sizeof(float) * rows * lds), *d32 = malloc(sizeof(float) * cols * ldd);
        for (int i = 0; i < rows * lds; i++) s64[i] = s32[i] = (float)i;
        agi_transpose_f64(d64, ldd, s64, lds, rows, cols);
        agi_transpose_f32(d32, ldd, s32, lds, rows, cols);
        bool same = true;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                same &= d64[c * ldd + r] == s64[r * lds + c] &&
                        d32[c * ldd + r] == s32[r * lds + c];
        CHECK(same);
        free(s64), free(d64), free(s32), free(d32);
    }
}

// ag_attention forward and backward, heads apart and packed, with masks and dropout,
// once through the tile kernels and once through BLAS.
static double attention_error(ag_dtype dt, int B, int h, int T, int S, int d, int dv,
                              bool causal, double p, bool packed) {
    ag_pcg32 rng = ag_pcg32_make(11, (uint64_t)(T * 100 + d));
    ag_tensor *in[3];
    int n_in = packed ? 1 : 3;
    if (packed) {
        in[0] = ag_tensor_uniform(dt, 3, (int[]){B, T, 3 * h * d}, &rng, -3, 3);
    } else {
        in[0] = ag_tensor_uniform(dt, 4, (int[]){B, h, T, d}, &rng, -3, 3);
        in[1] = ag_tensor_uniform(dt, 4, (int[]){B, h, S, d}, &rng, -3, 3);
        in[2] = ag_tensor_uniform(dt, 4, (int[]){B, h, S, dv}, &rng, -1, 1);
    }
    ag_tensor *up = NULL;
    double *out[2], *grads[2][3];
    for (int pass = 0; pass < 2; pass++) {
        agi_tile_gemm_enable(pass == 0);
        for (int i = 0; i < n_in; i++) {
            ag_tensor_set_requires_grad(in[i], true);
            ag_tensor_zero_grad(in[i]);
        }
        ag_tape *tp = ag_tape_new();
        ag_attention_opts o = {.softmax = {.scale = 1 / sqrt(d), .causal = causal},
                               .heads = h, .dropout = p, .training = p > 0, .seed = 3};
        ag_tensor *y = packed ? ag_attention_packed(tp, in[0], &o)
                              : ag_attention(tp, in[0], in[1], in[2], &o);
        if (!up) up = ag_tensor_uniform(dt, y->ndim, y->shape, &rng, -1, 1);
        ag_tensor *loss = ag_sum(tp, ag_mul(tp, y, up));
        ag_backward(tp, loss);
        out[pass] = malloc(y->numel * sizeof(double));
        for (size_t e = 0; e < y->numel; e++) out[pass][e] = ag_tensor_item(y, e);
        for (int i = 0; i < n_in; i++) {
            ag_tensor g = ag_tensor_grad_view(in[i]);
            grads[pass][i] = malloc(in[i]->numel * sizeof(double));
            for (size_t e = 0; e < in[i]->numel; e++) grads[pass][i][e] = ag_tensor_item(&g, e);
        }
        ag_tape_free(tp);
    }
    agi_tile_gemm_enable(true);
    double worst = 0;
    for (size_t e = 0; e < up->numel; e++) worst = fmax(worst, fabs(out[0][e] - out[1][e]));
    for (int i = 0; i < n_in; i++)
        for (size_t e = 0; e < in[i]->numel; e++)
            worst = fmax(worst, fabs(grads[0][i][e] - grads[1][i][e]));
    for (int pass = 0; pass < 2; pass++) {
        free(out[pass]);
        for (int i = 0; i < n_in; i++) free(grads[pass][i]);
    }
    for (int i = 0; i < n_in; i++) ag_tensor_free(in[i]);
    ag_tensor_free(up);
    return worst;
}

// In float64 the tile kernels are the only difference; in float32 the AVX-512 passes over
// the scores (exp, sums, score gradients) are too, so the two agree to float32's rounding.
static void test_attention_through_tiles_equals_blas(void) {
    if (!agi_tile_gemm_available()) {
        printf("tile kernels: not available on this CPU (no AVX-512F); BLAS is used\n");
        return;
    }
    const int Ts[] = {1, 7, 33, 65, 300}, ds[] = {1, 13, 64};
    for (int f = 0; f < 2; f++) {
        const ag_dtype dt = f ? AG_F32 : AG_F64;
        double worst = 0;
        for (int t = 0; t < 5; t++)
            for (int k = 0; k < 3; k++) {
                const int T = Ts[t], d = ds[k];
                worst = fmax(worst, attention_error(dt, 2, 2, T, T, d, d, false, 0, false));
                worst = fmax(worst, attention_error(dt, 1, 2, T, T + 5, d, d + 3, false, 0.2,
                                                    false));
                worst = fmax(worst, attention_error(dt, 2, 3, T, T, d, d, true, 0, true));
                worst = fmax(worst, attention_error(dt, 1, 2, T, T, d, d, true, 0.1, true));
            }
        printf("attention %s, tiles vs BLAS: worst abs difference %.2e\n", f ? "f32" : "f64",
               worst);
        CHECK(worst < (f ? 5e-5 : 1e-12));
    }
}

// y = alpha W x + beta y + bias against float64, on row and column counts around the
// kernel's blocks of 16 rows and 16 lanes: within float32's rounding of a sum of K terms.
static void test_matrix_vector_products_are_within_float_rounding_of_float64(void) {
    if (!agi_tile_gemm_available()) return;
    ag_pcg32 rng = ag_pcg32_make(4, 4);
    const int Ns[] = {1, 5, 16, 17, 40, 130}, Ks[] = {1, 7, 16, 17, 64, 300};
    double worst = 0;  // of the error over its bound
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int v = 0; v < 3; v++) {  // plain; beta 1; a bias
                const int N = Ns[a], K = Ks[b], ldw = K + 3;
                const float alpha = 0.75f, beta = v == 1 ? 1.0f : 0.0f;
                float *W = malloc(sizeof(float) * N * ldw), *x = malloc(sizeof(float) * K);
                float *y = malloc(sizeof(float) * N), *bias = malloc(sizeof(float) * N);
                for (int i = 0; i < N * ldw; i++) W[i] = (float)uniform(&rng);
                for (int i = 0; i < K; i++) x[i] = (float)uniform(&rng);
                for (int i = 0; i < N; i++) {
                    y[i] = (float)uniform(&rng);
                    bias[i] = (float)uniform(&rng);
                }
                double *want = malloc(sizeof(double) * N), *scale = malloc(sizeof(double) * N);
                for (int n = 0; n < N; n++) {
                    double sum = 0, mag = 0;
                    for (int k = 0; k < K; k++) {
                        sum += (double)W[n * ldw + k] * x[k];
                        mag += fabs((double)W[n * ldw + k] * x[k]);
                    }
                    want[n] = alpha * sum + (v == 1 ? y[n] : 0) + (v == 2 ? bias[n] : 0);
                    scale[n] = alpha * mag + fabs(y[n]) + fabs(bias[n]);
                }
                agi_gemv_f32(N, K, alpha, W, ldw, x, beta, y, v == 2 ? bias : NULL);
                for (int n = 0; n < N; n++)
                    worst = fmax(worst, fabs(y[n] - want[n]) / ((K + 3) * 0x1p-24 * scale[n]));
                free(W), free(x), free(y), free(bias), free(want), free(scale);
            }
    printf("matrix-vector products vs float64: worst error %.2f of the bound\n", worst);
    CHECK(worst <= 1);
}

// A row's result does not depend on which rows are computed with it: the rows in one
// call, in pieces starting anywhere, and through agi_gemm_f32 (one row times W^T) on one
// and two threads give the same bits; a NaN in x reaches every row.
static void test_matrix_vector_rows_do_not_depend_on_the_split(void) {
    if (!agi_tile_gemm_available()) return;
    ag_pcg32 rng = ag_pcg32_make(6, 2);
    enum { N = 2304, K = 768 };
    float *W = malloc(sizeof(float) * N * K), x[K], *y[4];
    for (int i = 0; i < N * K; i++) W[i] = (float)uniform(&rng);
    for (int i = 0; i < K; i++) x[i] = (float)uniform(&rng);
    for (int i = 0; i < 4; i++) y[i] = malloc(sizeof(float) * N);
    agi_gemv_f32(N, K, 1, W, K, x, 0, y[0], NULL);
    const int cuts[] = {0, 5, 23, 1000, 1001, N};
    for (int c = 0; c + 1 < 6; c++)
        agi_gemv_f32(cuts[c + 1] - cuts[c], K, 1, W + (size_t)cuts[c] * K, K, x, 0,
                     y[1] + cuts[c], NULL);
    for (int threads = 1; threads <= 2; threads++) {
        ag_threads_set(threads);
        agi_gemm_f32(false, true, 1, N, K, 1, x, K, W, K, 0, y[1 + threads], N);
    }
    ag_threads_set(1);
    for (int i = 1; i < 4; i++) CHECK(memcmp(y[0], y[i], sizeof(float) * N) == 0);
    x[100] = NAN;
    agi_gemv_f32(N, K, 1, W, K, x, 0, y[0], NULL);
    bool all_nan = true;
    for (int n = 0; n < N; n++) all_nan &= isnan(y[0][n]);
    CHECK(all_nan);
    free(W);
    for (int i = 0; i < 4; i++) free(y[i]);
}

// agi_gemm's beta other than 0 and 1 (the kernels themselves take only those): C scaled
// by it on every path, the tile kernels, the matrix-vector one and bf16, as dgemm does.
// The tile and bf16 kernels added C unscaled.
static void test_products_scale_c_by_any_beta(void) {
    ag_pcg32 rng = ag_pcg32_make(11, 5);
    const int shapes[][4] = {{3, 5, 7, 0}, {2, 40, 33, 1}, {37, 150, 600, 0}, {13, 70, 300, 1}};
    double worst = 0, worst_bf16 = 0;
    for (int s = 0; s < 4; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        const bool tb = shapes[s][3];
        double *A = malloc(sizeof(double) * M * K), *B = malloc(sizeof(double) * K * N);
        double *C = malloc(sizeof(double) * M * N), *C2 = malloc(sizeof(double) * M * N);
        float *Af = malloc(sizeof(float) * M * K), *Bf = malloc(sizeof(float) * K * N);
        float *Cf = malloc(sizeof(float) * M * N), *Cf2 = malloc(sizeof(float) * M * N);
        for (int i = 0; i < M * K; i++) Af[i] = (float)(A[i] = uniform(&rng));
        for (int i = 0; i < K * N; i++) Bf[i] = (float)(B[i] = uniform(&rng));
        for (int i = 0; i < M * N; i++) Cf[i] = (float)(C[i] = C2[i] = uniform(&rng));
        agi_gemm_f64(false, tb, M, N, K, 0.7, A, K, B, tb ? K : N, -0.5, C, N);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 0.7, A,
                    K, B, tb ? K : N, -0.5, C2, N);
        for (int i = 0; i < M * N; i++) worst = fmax(worst, fabs(C[i] - C2[i]));
        // bf16: the product with beta 0, plus 0.5 C (C2 keeps C's first values)
        for (int i = 0; i < M * N; i++) C2[i] = Cf2[i] = Cf[i];
        agi_gemm_autocast_f32(AG_AUTOCAST_BF16, false, tb, M, N, K, 1, Af, K, Bf, tb ? K : N,
                              0.5f, NULL, Cf, N);
        agi_gemm_autocast_f32(AG_AUTOCAST_BF16, false, tb, M, N, K, 1, Af, K, Bf, tb ? K : N, 0,
                              NULL, Cf2, N);
        for (int i = 0; i < M * N; i++)
            worst_bf16 = fmax(worst_bf16, fabs(Cf[i] - (Cf2[i] + 0.5 * C2[i])));
        free(A), free(B), free(C), free(C2), free(Af), free(Bf), free(Cf), free(Cf2);
    }
    printf("beta -0.5 vs dgemm: worst abs difference %.2e; bf16 beta 0.5: %.2e\n", worst,
           worst_bf16);
    CHECK(worst < 1e-13);
    CHECK(worst_bf16 < 1e-5);
}

// The split of a product over threads at extents within a tile of INT_MAX, its slices
// recorded instead of computed: they cover every row (column) once, in whole tiles. The
// tile count (M + 11) / 12 and the end of the last slice, its tile count times 12, passed
// INT_MAX there, and the slices came out empty or ran past M.
static _Atomic long long split_covered;
static _Atomic int split_bad;

static void record_part(const agi_product_split *s, int m0, int m1, int n0, int n1) {
    const bool rows = s->by_rows;
    const int b = rows ? m0 : n0, e = rows ? m1 : n1, n = rows ? s->M : s->N;
    const int tile = rows ? s->mr : s->nr;
    if (b < 0 || b % tile || e <= b || e > n || (e < n && e % tile) ||
        (rows ? n0 != 0 || n1 != s->N : m0 != 0 || m1 != s->M))
        split_bad++;
    split_covered += (long long)e - b;
}

static void no_panels(const agi_product_split *s, int begin, int end) {
    (void)s, (void)begin, (void)end;
    split_bad++;
}

static void test_split_covers_extents_near_int_max(void) {
    ag_threads_set(2);
    const int extents[] = {INT_MAX, INT_MAX - 3, INT_MAX - 31};
    for (int e = 0; e < 3; e++)
        for (int rows = 0; rows < 2; rows++) {
            agi_product_split s = {rows ? extents[e] : 1, rows ? 40 : extents[e], 8, 12, 32,
                                   false, false, false, 0, 0, INT_MAX, record_part, no_panels,
                                   no_panels, false, NULL, NULL};
            split_covered = 0;
            split_bad = 0;
            agi_product_run(&s, 1e15);
            CHECK(s.by_rows == (bool)rows);
            CHECK(split_bad == 0);
            CHECK(split_covered == extents[e]);
        }
    ag_threads_set(1);
}

int main(void) {
    RUN(test_products_equal_blas_on_odd_sizes);
    RUN(test_large_products_equal_blas_on_every_path);
    RUN(test_products_are_the_same_bits_on_one_and_two_threads);
    RUN(test_blas_products_are_the_same_bits_on_one_and_two_threads);
    RUN(test_rows_4k_apart_give_the_same_bits_as_rows_read_in_place);
    RUN(test_product_with_bias_equals_blas);
    RUN(test_transpose);
    RUN(test_attention_through_tiles_equals_blas);
    RUN(test_matrix_vector_products_are_within_float_rounding_of_float64);
    RUN(test_matrix_vector_rows_do_not_depend_on_the_split);
    RUN(test_products_scale_c_by_any_beta);
    RUN(test_split_covers_extents_near_int_max);
    return testing_summary();
}
