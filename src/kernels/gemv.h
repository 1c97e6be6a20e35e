// Matrix-vector products of decoding: one position's row times a weight matrix given as
// rows, y = alpha W x (+ beta y, + bias), on AVX-512 where the tile kernels run
// (agi_tile_gemm_available, which also switches this off). BLAS's sgemm packs all of W
// before it multiplies; its sgemv runs 256 bits wide and took a third of a small model's
// decode step (bench/README.md).
#ifndef ATTOGRAD_GEMV_H
#define ATTOGRAD_GEMV_H

// y[n] = alpha sum_k W[n ldw + k] x[k] + beta y[n] + bias[n] for n < N: beta 0 (y not
// read) or 1, bias NULL or N floats. Each y[n] is summed over k in the same order
// whatever N, the other rows and the caller's split of the rows: its 16 lanes of fused
// multiply-adds over k in order, then added in a fixed tree. Call only when
// agi_tile_gemm_available().
void agi_gemv_f32(int N, int K, float alpha, const float *W, int ldw, const float *x,
                  float beta, float *y, const float *bias);

#endif
