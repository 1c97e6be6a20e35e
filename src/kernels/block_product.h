// The products of fused attention's blocks, in float: a fast path beside the tile kernels
// (tile_gemm.h) for products whose sum fits one chunk of k, on one thread.
//
// An attention block is a product of 16 to 256 rows by a head's 16 to 128 columns (or
// the reverse), with a sum of a head's width or a block's length: thousands a step, each
// a few microseconds at most. The tile kernels' 12-row tiles leave edge rows on 32-, 128-
// and 256-row blocks, and each call plans its blocking and asks the thread pool first;
// here the register tiles are 8 rows by 32 columns, or 16 rows by 16 columns where the
// product is one vector wide, and a call goes straight to them.
#ifndef ATTOGRAD_BLOCK_PRODUCT_H
#define ATTOGRAD_BLOCK_PRODUCT_H

#include <stdbool.h>

// The longest sum agi_block_product_f32 takes.
enum { AGI_BLOCK_PRODUCT_MAX_K = 256 };

// C[M, N] = alpha op(A) B + beta C, row-major: op(A)[m, k] = A[m * lda + k] (ta false) or
// A[k * lda + m] (ta true), B[k, n] = B[k * ldb + n]; beta is 0 or 1 (with beta 0, C is
// written without being read); 0 <= K <= AGI_BLOCK_PRODUCT_MAX_K. Each element is the sum
// over k in order, one fused multiply-add a step from zero, times alpha, plus C when beta
// is 1: the arithmetic of the tile kernels, so the same inputs give the same bits. Call
// only when agi_tile_gemm_available().
void agi_block_product_f32(bool ta, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc);

#endif
