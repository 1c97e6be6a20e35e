// Matrix-vector products of decoding: one position's row times a weight matrix given as
// rows, y = alpha W x (+ beta y, + bias), on AVX-512 where the tile kernels run
// (agi_tile_gemm_available, which also switches this off). BLAS's sgemm packs all of W
// before it multiplies; its sgemv runs 256 bits wide and took a third of a small model's
// decode step (bench/README.md).
#ifndef ATTOGRAD_GEMV_H
#define ATTOGRAD_GEMV_H

#include <stddef.h>
#include <stdint.h>

// Rows of X up to which a product X W^T runs as matrix-vector products, one a row of X
// (a decode step's positions: 1, or a short prompt's few).
enum { AGI_GEMV_ROWS = 4 };

// y[n] = alpha sum_k W[n ldw + k] x[k] + beta y[n] + bias[n] for n < N: beta 0 (y not
// read) or 1, bias NULL or N floats. Each y[n] is summed over k in the same order
// whatever N, the other rows and the caller's split of the rows: its 16 lanes of fused
// multiply-adds over k in order, then added in a fixed tree. Call only when
// agi_tile_gemm_available().
void agi_gemv_f32(int N, int K, float alpha, const float *W, int ldw, const float *x,
                  float beta, float *y, const float *bias);

// Y[M, N] = X W^T (+ 1 bias^T) with W [N, K] in bfloat16 (row n at W + n ldw: copies
// made by agi_bf16_round, bf16_weights.h) and X [M, K] float32 (row i at X + i ldx),
// rounded to bf16 as it is read: a few rows of a linear layer under autocast, reading
// half the bytes of its float32 weights. Each Y[i][n] is a float32 sum of exact products
// (vdpbf16ps's steps, bf16_gemm.c), 16 lanes over k then the fixed tree of agi_gemv_f32,
// plus bias[n]: the same bits on every CPU (the portable path where AVX512_BF16 is
// missing or agi_bf16_native_enable(false)) and for any thread count (the rows of W are
// split over the threads in blocks of 16). Runs everywhere.
void agi_gemv_bf16(int M, int N, int K, const float *X, int ldx, const uint16_t *W, size_t ldw,
                   const float *bias, float *Y, int ldy);

#endif
