// Products in mixed precision (autocast): float32 operands rounded to bfloat16, products
// summed in float32, float32 results. On CPUs with AVX512_BF16 the sums run on
// vdpbf16ps; elsewhere a portable path computes the same bits (bf16_gemm.c says how).
#ifndef ATTOGRAD_BF16_GEMM_H
#define ATTOGRAD_BF16_GEMM_H

#include <stdbool.h>
#include <stdint.h>

// C[M, N] = alpha op(A) op(B) + beta C (+ 1 bias^T), the arguments as agi_tile_gemm's
// (tile_gemm.h): row-major, op(X) = X or X^T, beta 0 or 1 (with beta 0 C is not read),
// bias NULL or N floats added to every row. Each operand is rounded to bfloat16 (to
// nearest even, subnormals to zero) and each element of C is a float32 sum of exact
// products, in an order fixed by K alone: the result depends neither on the thread count
// nor on the path.
void agi_gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc,
                   const float *bias);

// True when this CPU runs the vdpbf16ps path (AVX512_BF16 with AVX-512 F and BW) and it
// is not switched off (the environment variable AG_BF16_NATIVE=0, or
// agi_bf16_native_enable(false), which tests use to compare the two paths).
bool agi_bf16_native(void);
void agi_bf16_native_enable(bool on);

// x rounded to bfloat16 as vcvtneps2bf16 does: to nearest even, a subnormal to a zero of
// its sign, a NaN to a quiet NaN.
uint16_t agi_bf16_round(float x);
float agi_bf16_value(uint16_t h);

#endif
