// Matrix products: through the tile kernels on CPUs that run them (tile_gemm.h), else
// through OpenBLAS (sgemm / dgemm).
#ifndef ATTOGRAD_GEMM_H
#define ATTOGRAD_GEMM_H

#include <stdbool.h>

#include "attograd/tape.h"  // ag_autocast

// Row-major C[M,N] = alpha * op(A) op(B) + beta * C, with op(X) = X or X^T and
// leading dimensions (row strides) lda, ldb, ldc. Large products are split over
// attograd's threads. The results do not depend on the thread count: the tile kernels'
// sums do not depend on the cut, and the BLAS path cuts a product into fixed chunks of
// rows of C (or columns when C has few rows), each a single-threaded BLAS call, whatever
// the thread count (gemm.c).
void agi_gemm_f32(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);
void agi_gemm_f64(bool ta, bool tb, int M, int N, int K, double alpha, const double *A,
                  int lda, const double *B, int ldb, double beta, double *C, int ldc);

// The same with the precision an op asks for its products (the tape's autocast): with
// AG_AUTOCAST_BF16, float32 products round their operands to bfloat16 and sum in float32
// (bf16_gemm.h); float64 products ignore it. bias NULL, or N reals added to every row
// in the product's own pass over C (a linear layer's forward): beta must then be 0 (the
// BLAS path writes the bias rows into C first).
void agi_gemm_autocast_f32(ag_autocast mode, bool ta, bool tb, int M, int N, int K,
                           float alpha, const float *A, int lda, const float *B, int ldb,
                           float beta, const float *bias, float *C, int ldc);
void agi_gemm_autocast_f64(ag_autocast mode, bool ta, bool tb, int M, int N, int K,
                           double alpha, const double *A, int lda, const double *B, int ldb,
                           double beta, const double *bias, double *C, int ldc);

#endif
