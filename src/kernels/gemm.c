// The one place that multiplies matrices: through the tile kernels (tile_gemm.c) where
// this CPU runs them, else through BLAS (sgemm / dgemm); under autocast, float32 products
// through the bf16 kernels (bf16_gemm.c) on every CPU. On an AVX-512 machine the tile
// kernels beat OpenBLAS on every product shape attograd makes but one, from per-head
// blocks to square products of 1536 (bench/bench_products.c prints the comparison; the
// README has the numbers), so they take every product there but that one; OpenBLAS
// takes them elsewhere.
// Compiled once per real type (see real.h).
#include "gemm.h"

#include <cblas.h>

#include "../core/parallel.h"
#include "../core/real.h"
#include "bf16_gemm.h"
#include "gemv.h"
#include "tile_gemm.h"

// Whether a product of M rows goes to attograd's own matrix-vector kernel (gemv.h): a
// few rows times B^T, float32, on a CPU that runs the tile kernels.
static bool own_gemv(bool ta, bool tb, int M) {
#ifndef AG_REAL_F64
    return tb && !ta && M <= AGI_GEMV_ROWS && agi_tile_gemm_available();
#else
    (void)ta, (void)tb, (void)M;
    return false;
#endif
}

// bias: NULL, or added to every row of C (beta is then 0).
static void blas(bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda,
                 const real *B, int ldb, real beta, const real *bias, real *C, int ldc) {
    // A few rows times B^T (a decode step's positions against a weight matrix [N, K]) are
    // dot products of B's rows, which a matrix-vector kernel reads in place: BLAS's gemm
    // first copies all of B into panels, most of a decode step's time (bench/README.md).
    // attograd's own (gemv.h) also adds the bias, without a pass that writes it into C.
    const bool gemv = tb && M <= AGI_GEMV_ROWS;
#ifndef AG_REAL_F64
    if (own_gemv(ta, tb, M)) {
        for (int i = 0; i < M; i++)
            agi_gemv_f32(N, K, alpha, B, ldb, A + (size_t)i * lda, beta, C + (size_t)i * ldc,
                         bias);
        return;
    }
#endif
    if (bias) {  // BLAS adds onto the bias rows
        for (int i = 0; i < M; i++)
            for (int c = 0; c < N; c++) C[(size_t)i * ldc + c] = bias[c];
        beta = 1;
    }
    if (gemv) {
        for (int i = 0; i < M; i++) {
            const real *x = ta ? A + i : A + (size_t)i * lda;
            const int incx = ta ? lda : 1;
#ifdef AG_REAL_F64
            cblas_dgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, x, incx, beta,
                        C + (size_t)i * ldc, 1);
#else
            cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, x, incx, beta,
                        C + (size_t)i * ldc, 1);
#endif
        }
        return;
    }
#ifdef AG_REAL_F64
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

typedef struct {
    bool ta, tb, by_rows;
    bool whole;  // a slice's units in one call (attograd's matrix-vector kernel, below)
    int chunk;   // rows or columns of C in a unit of the job (below)
    int M, N, K, lda, ldb, ldc;
    real alpha, beta;
    const real *A, *B, *bias;
    real *C;
} gemm_job;

// A BLAS job is cut into PARTS chunks of rows (or columns) of C, one BLAS call each,
// whatever the thread count: BLAS's kernels sum a row's products differently at the
// edges of their blocks, so a cut that moved with the thread count moved the last bits of
// C with it. Each chunk repacks the other operand, a cost that falls as chunks grow, so
// they are few, yet as many as the threads of most machines that take this path, and no
// smaller than MIN_CHUNK rows or columns, in multiples of 16 (whole blocks of the kernels).
enum { PARTS = 4, MIN_CHUNK = 64 };

static int chunk_of(int n) {
    const int c = (agi_tiles(n, PARTS) - 1) / 16 * 16 + 16;  // ceil(n / PARTS), rounded up
    return c > MIN_CHUNK ? c : MIN_CHUNK;
}

static void gemm_slice(size_t begin, size_t end, void *arg) {
    const gemm_job *j = arg;
    const int n = j->by_rows ? j->M : j->N, chunk = j->chunk;
    for (int c = (int)begin; c < (int)end; c = j->whole ? (int)end : c + 1) {
        const int last = j->whole ? (int)end : c + 1;
        const size_t lo = (size_t)c * chunk, hi = (size_t)agi_tile_end(last, chunk, n);
        // Rows [lo, hi) of C need rows of op(A): row i of A, or column i of A^T; columns
        // of C columns of op(B): column i of B, or row i of B^T.
        const real *A = j->A, *B = j->B;
        int M = j->M, N = j->N;
        real *C = j->C;
        if (j->by_rows) {
            A = j->ta ? A + lo : A + lo * j->lda;
            C += lo * j->ldc;
            M = (int)(hi - lo);
        } else {
            B = j->tb ? B + lo * j->ldb : B + lo;
            C += lo;
            N = (int)(hi - lo);
        }
        const real *bias = j->bias && !j->by_rows ? j->bias + lo : j->bias;
        blas(j->ta, j->tb, M, N, j->K, j->alpha, A, j->lda, B, j->ldb, j->beta, bias, C,
             j->ldc);
    }
}

// Every entry point: C = alpha op(A) op(B) + beta C, plus the bias on every row when
// bias is not NULL (then beta is 0).
static void gemm(ag_autocast mode, bool ta, bool tb, int M, int N, int K, real alpha,
                 const real *A, int lda, const real *B, int ldb, real beta, const real *bias,
                 real *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {  // an empty sum: C = beta * C (and exactly 0 for beta = 0), plus the bias
        for (int i = 0; i < M; i++)
            for (int k = 0; k < N; k++)
                C[(size_t)i * ldc + k] = (beta == 0 ? 0 : beta * C[(size_t)i * ldc + k]) +
                                         (bias ? bias[k] : 0);
        return;
    }
    // The tile and bf16 kernels take beta 0 (C not read) or 1 (C added as it is); any
    // other scales C first, one pass, so that every path computes the same product.
    if (beta != 0 && beta != 1) {
        for (int i = 0; i < M; i++)
            for (int k = 0; k < N; k++) C[(size_t)i * ldc + k] *= beta;
        beta = 1;
    }
#ifndef AG_REAL_F64
    if (mode == AG_AUTOCAST_BF16) {
        agi_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
        return;
    }
#else
    (void)mode;
#endif
    // A few rows times B^T (generation's one position against a weight matrix) are dot
    // products of B's rows, which BLAS's matrix-vector kernel runs in place; the tile
    // kernels would first turn all of B into rows for almost no arithmetic.
    if (agi_tile_gemm_available() && !(tb && M <= AGI_GEMV_ROWS)) {
        R(agi_tile_gemm)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
        return;
    }
    const bool by_rows = M >= N;
    // attograd's own matrix-vector kernel (a decode step's few rows times W^T, blas())
    // gives each column of C the same bits however the columns are cut: its slices stay
    // fine, for the threads, and each is one call, as a decode step's many small products
    // would otherwise pay a call per chunk.
    const bool own = own_gemv(ta, tb, M);
    const int n = by_rows ? M : N, chunk = own ? 16 : chunk_of(n);
    gemm_job j = {ta, tb, by_rows, own, chunk, M, N, K, lda, ldb, ldc,
                  alpha, beta, A, B, bias, C};
    agi_parallel_for((size_t)agi_tiles(n, chunk), 2.0 * M * N * K, gemm_slice, &j);
}

void R(agi_gemm)(bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda,
                 const real *B, int ldb, real beta, real *C, int ldc) {
    gemm(AG_AUTOCAST_OFF, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, NULL, C, ldc);
}

void R(agi_gemm_autocast)(ag_autocast mode, bool ta, bool tb, int M, int N, int K, real alpha,
                          const real *A, int lda, const real *B, int ldb, real beta,
                          const real *bias, real *C, int ldc) {
    gemm(mode, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, bias, C, ldc);
}
