// Register-tiled matrix products without BLAS, from the small blocks of fused attention
// to a model's projections.
//
// A product of a 32 x 32 score block with a 16-wide head costs OpenBLAS about a
// microsecond of call overhead and packing before any arithmetic, and fused attention
// makes thousands of them per step: these kernels read small operands in place and keep
// a tile of C in vector registers through the whole sum. Large products pack their
// operands into panels that stay in the caches, and split over attograd's threads
// (tile_gemm.c says how). On CPUs with AVX-512 (16 floats or 8 doubles per register) they
// run near the FMA peak (bench/bench_products.c); elsewhere agi_tile_gemm_available() is
// false and callers use agi_gemm. Typed: each function exists as _f32 and _f64 (see
// src/core/real.h).
#ifndef ATTOGRAD_TILE_GEMM_H
#define ATTOGRAD_TILE_GEMM_H

#include <stdbool.h>

// True when this CPU runs the kernels (AVX-512 F, BW and VL, which also the score-block
// passes of score_block_avx512.c use) and they are not switched off (the environment
// variable AG_TILE_GEMM=0, or agi_tile_gemm_enable(false), which tests use to compare
// with the BLAS path).
bool agi_tile_gemm_available(void);
void agi_tile_gemm_enable(bool on);

// C[M, N] = alpha op(A) op(B) + beta C (+ 1 bias^T), row-major, as agi_gemm: op(A)[m, k] =
// A[m * lda + k] (ta false) or A[k * lda + m] (ta true), op(B)[k, n] = B[k * ldb + n] (tb
// false) or B[n * ldb + k] (tb true, turned into rows a block at a time on the stack);
// beta is 0 or 1 (with beta 0, C is written without being read); bias, when not NULL,
// holds N reals added to every row. Large products run on attograd's threads (inline when
// called from one of its jobs); the result does not depend on the thread count. Call only
// when available.
void agi_tile_gemm_f32(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc,
                       const float *bias);
void agi_tile_gemm_f64(bool ta, bool tb, int M, int N, int K, double alpha, const double *A,
                       int lda, const double *B, int ldb, double beta, double *C, int ldc,
                       const double *bias);

// dst[c, r] = src[r, c] for r < rows, c < cols: dst is [cols, rows] with rows ldd apart,
// so that a product with src^T can take it as B.
void agi_transpose_f32(float *dst, int ldd, const float *src, int lds, int rows, int cols);
void agi_transpose_f64(double *dst, int ldd, const double *src, int lds, int rows, int cols);

#endif
