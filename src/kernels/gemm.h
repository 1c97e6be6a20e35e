// Matrix products: through the tile kernels on CPUs that run them (tile_gemm.h), else
// through OpenBLAS (sgemm / dgemm).
#ifndef ATTOGRAD_GEMM_H
#define ATTOGRAD_GEMM_H

#include <stdbool.h>

// Row-major C[M,N] = alpha * op(A) op(B) + beta * C, with op(X) = X or X^T and
// leading dimensions (row strides) lda, ldb, ldc. Large products are split over
// attograd's threads: the tile kernels' results do not depend on the thread count; on
// the BLAS path (by rows of C, or columns when C has few rows, each slice a
// single-threaded BLAS call) they are deterministic for a given thread count.
void agi_gemm_f32(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);
void agi_gemm_f64(bool ta, bool tb, int M, int N, int K, double alpha, const double *A,
                  int lda, const double *B, int ldb, double beta, double *C, int ldc);

// C = alpha op(A) op(B) + 1 bias^T: the product with the N reals of bias added to every
// row (C is not read), in the product's own pass over C (a linear layer's forward).
void agi_gemm_bias_f32(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, const float *bias, float *C, int ldc);
void agi_gemm_bias_f64(bool ta, bool tb, int M, int N, int K, double alpha, const double *A,
                       int lda, const double *B, int ldb, const double *bias, double *C,
                       int ldc);

#endif
