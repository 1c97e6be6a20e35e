// The one place that calls BLAS. Compiled once per real type (see real.h).
#include "gemm.h"

#include <cblas.h>

#include "../core/parallel.h"
#include "../core/real.h"

static void blas(bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda,
                 const real *B, int ldb, real beta, real *C, int ldc) {
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
    int M, N, K, lda, ldb, ldc;
    real alpha, beta;
    const real *A, *B;
    real *C;
} gemm_job;

static void gemm_slice(int begin, int end, void *arg) {
    const gemm_job *j = arg;
    if (j->by_rows) {
        // Rows [begin, end) of C need rows of op(A): row i of A, or column i of A^T.
        const real *A = j->ta ? j->A + begin : j->A + (size_t)begin * j->lda;
        blas(j->ta, j->tb, end - begin, j->N, j->K, j->alpha, A, j->lda, j->B, j->ldb,
             j->beta, j->C + (size_t)begin * j->ldc, j->ldc);
    } else {
        const real *B = j->tb ? j->B + (size_t)begin * j->ldb : j->B + begin;
        blas(j->ta, j->tb, j->M, end - begin, j->K, j->alpha, j->A, j->lda, B, j->ldb,
             j->beta, j->C + begin, j->ldc);
    }
}

void R(agi_gemm)(bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda,
                 const real *B, int ldb, real beta, real *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {  // an empty sum: C = beta * C (and exactly 0 for beta = 0)
        for (int i = 0; i < M; i++)
            for (int k = 0; k < N; k++)
                C[(size_t)i * ldc + k] = beta == 0 ? 0 : beta * C[(size_t)i * ldc + k];
        return;
    }
    gemm_job j = {ta, tb, M >= N, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C};
    double work = 2.0 * M * N * K;
    agi_parallel_for(j.by_rows ? M : N, work, gemm_slice, &j);
}
