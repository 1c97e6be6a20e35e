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

// bfloat16 weights for agi_gemv_bf16, packed so that the kernel reads them as one stream:
// blocks of 16 rows (the last one padded with zero rows), each block the 32-value chunks
// of k of its 16 rows in turn, chunk after chunk (K padded with zeros to a multiple of
// 32). agi_gemv_bf16_packed_len is the uint16_t elements of N rows of K; at most
// (N + 15) (K + 31).
size_t agi_gemv_bf16_packed_len(int N, int K);

// P (agi_gemv_bf16_packed_len(N, K) elements) = W [N, K] (row n at W + n ldw) rounded to
// bf16 (agi_bf16_round, elementwise) in the packed order. Blocks of rows are split over
// the threads; the bits do not depend on it.
void agi_gemv_bf16_pack(int N, int K, const float *W, size_t ldw, uint16_t *P);

// Y[M, N] = X W^T (+ 1 bias^T) with W [N, K] in bfloat16, packed by agi_gemv_bf16_pack,
// and X [M, K] float32 (row i at X + i ldx), rounded to bf16 as it is read: a few rows of
// a linear layer under autocast, reading half the bytes of its float32 weights. Each
// Y[i][n] is a float32 sum of exact products (vdpbf16ps's steps, bf16_gemm.c), 16 lanes
// over k then the fixed tree of agi_gemv_f32, plus bias[n]: the same bits on every CPU
// (the portable path where AVX512_BF16 is missing or agi_bf16_native_enable(false)) and
// for any thread count (the blocks of rows are split over the threads). Runs everywhere.
void agi_gemv_bf16(int M, int N, int K, const float *X, int ldx, const uint16_t *P,
                   const float *bias, float *Y, int ldy);

// agi_gemv_bf16 on W's packed copy P, which is first made agi_gemv_bf16_pack(N, K, W, K, P)
// block by block, each written only where it differs (a copy that may be stale): the
// check of a block puts it in the cache for its product, so a copy checked and used reads
// W and P once, and writes nothing when W has not changed.
void agi_gemv_bf16_checked(int M, int N, int K, const float *X, int ldx, const float *W,
                           uint16_t *P, const float *bias, float *Y, int ldy);

#endif
