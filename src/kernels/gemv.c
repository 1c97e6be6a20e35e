// Matrix-vector products (gemv.h): rows of W in blocks of 16, each row's dot product with
// x in one vector accumulator (16 lanes, fused multiply-adds over k in order, the last
// chunk of k masked), the 16 accumulators of a block then reduced together by a tree of
// shuffles into one vector whose lane r is row r's sum: 16 results a store, about 2
// shuffles and adds a row instead of the 8 of a reduction each. Rows of a block past N
// read row 0 again and store nothing.
#include "gemv.h"

#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f")))

enum { ROWS = 16 };

// Lane r of the result is the sum of the lanes of a[r].
TARGET static inline __m512 sum_lanes_of_16(const __m512 a[ROWS]) {
    __m512 t[8], u[4], w[2];
    // Within each 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] for a pair a, b.
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    // Within each 128-bit lane: rows 4j .. 4j + 3, each the sum of its 4 lanes there.
    for (int j = 0; j < 4; j++)
        u[j] = _mm512_add_ps(
            _mm512_shuffle_ps(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
            _mm512_shuffle_ps(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    // The 128-bit lanes of u[j] added in pairs, then the pairs.
    for (int j = 0; j < 2; j++)
        w[j] = _mm512_add_ps(
            _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

TARGET void agi_gemv_f32(int N, int K, float alpha, const float *W, int ldw, const float *x,
                         float beta, float *y, const float *bias) {
    const __mmask16 tail = (__mmask16)((1u << (K % 16)) - 1);
    const int whole = K / 16 * 16;
    for (int n0 = 0; n0 < N; n0 += ROWS) {
        const int rows = N - n0 < ROWS ? N - n0 : ROWS;
        const float *w[ROWS];
        __m512 acc[ROWS];
        for (int r = 0; r < ROWS; r++) {
            w[r] = W + (size_t)(r < rows ? n0 + r : 0) * ldw;
            acc[r] = _mm512_setzero_ps();
        }
        for (int k = 0; k < whole; k += 16) {
            const __m512 xv = _mm512_loadu_ps(x + k);
            for (int r = 0; r < ROWS; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + k), xv, acc[r]);
        }
        if (tail) {
            const __m512 xv = _mm512_maskz_loadu_ps(tail, x + whole);
            for (int r = 0; r < ROWS; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w[r] + whole), xv, acc[r]);
        }
        const __mmask16 out = (__mmask16)(rows == ROWS ? 0xFFFF : (1u << rows) - 1);
        __m512 v = _mm512_mul_ps(sum_lanes_of_16(acc), _mm512_set1_ps(alpha));
        if (beta != 0) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(out, y + n0));
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(out, bias + n0));
        _mm512_mask_storeu_ps(y + n0, out, v);
    }
}
#else
void agi_gemv_f32(int N, int K, float alpha, const float *W, int ldw, const float *x,
                  float beta, float *y, const float *bias) {
    (void)N, (void)K, (void)alpha, (void)W, (void)ldw, (void)x, (void)beta, (void)y, (void)bias;
    abort();  // agi_tile_gemm_available() is false here: callers never come
}
#endif
