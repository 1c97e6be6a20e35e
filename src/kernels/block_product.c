// The products of attention's blocks (see block_product.h).
//
// A register tile holds MT rows by NT vectors of 16 floats of C: 8 x 2 (16 accumulators)
// or, one vector wide, 16 x 1 (16 accumulators); 16 independent sums cover the fused
// multiply-add's latency on two pipes. For each k it loads the NT vectors of row k of B
// and broadcasts the MT elements of column k of op(A), read in place (A's rows, or A^T's
// columns). Blocks of 32, 128 and 256 rows divide into whole tiles; other edges take 4-
// and 1-row tiles. The columns are the outer loop, so that a 32-column panel of B (a
// block of v or of k^T, at most 32 KB) stays in L1 while the rows of op(A) pass over it.
#include "block_product.h"

#include <stddef.h>
#include <stdlib.h>

#include "scratch.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f")))
#define ALWAYS_INLINE static inline __attribute__((always_inline))

// Rows of C from which a panel of B is packed first.
enum { VL = 16, PACK_MIN_ROWS = 64 };
_Static_assert(AGI_BLOCK_PRODUCT_MAX_K * 2 * VL * sizeof(float) <= AGI_SCRATCH_B_BYTES,
               "a packed panel fits the scratch");

ALWAYS_INLINE __mmask16 lanes(int n) {  // the first n lanes (all for n >= 16, none for n <= 0)
    return n >= VL ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

// c = alpha x (+ c when beta is 1) in lanes m.
TARGET ALWAYS_INLINE void store(float *c, __mmask16 m, __m512 x, __m512 alpha, float beta) {
    const __m512 y = _mm512_mul_ps(x, alpha);
    _mm512_mask_storeu_ps(c, m, beta != 0 ? _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, c)) : y);
}

// One step of the sum: acc[r][v] += op(A)[r][k] B[k][v], with a[r] + ak at op(A)[r][k]
// and b at row k of B.
TARGET ALWAYS_INLINE void step(const int MT, const int NT, __m512 *acc, const float *const *a,
                               size_t ak, const float *b, const __mmask16 *m) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m[0], b);
    const __m512 b1 = NT > 1 ? _mm512_maskz_loadu_ps(m[1], b + VL) : b0;
#pragma GCC unroll 16
    for (int r = 0; r < MT; r++) {
        const __m512 x = _mm512_set1_ps(a[r][ak]);
        acc[r * NT] = _mm512_fmadd_ps(x, b0, acc[r * NT]);
        if (NT > 1) acc[r * NT + 1] = _mm512_fmadd_ps(x, b1, acc[r * NT + 1]);
    }
}

// Rows [0, mr) (mr <= MT) by columns [0, nr) (nr <= NT VL) of C. TA, MT and NT are
// constants at every call, so the loops unroll and the accumulators stay in registers.
// Rows past mr read row 0 again (valid memory) and store nothing.
TARGET ALWAYS_INLINE void tile(const bool TA, const int MT, const int NT, int mr, int nr,
                               int K, const float *A, size_t lda, const float *B, size_t ldb,
                               float alpha, float beta, float *C, size_t ldc) {
    __m512 acc[16];
    const float *a[16];
    __mmask16 m[2];
#pragma GCC unroll 2
    for (int v = 0; v < NT; v++) m[v] = lanes(nr - v * VL);
#pragma GCC unroll 16
    for (int r = 0; r < MT; r++) {
        const int row = r < mr ? r : 0;
        a[r] = TA ? A + row : A + (size_t)row * lda;
        if (r < mr) {  // this tile's rows of C, often gradient rows far apart, in L1 by the
                       // end of the sum
            _mm_prefetch((const char *)(C + (size_t)r * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + (size_t)r * ldc + NT * VL - 1), _MM_HINT_T0);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < MT * NT; t++) acc[t] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int k = 0; k < K; k++)
        step(MT, NT, acc, a, TA ? (size_t)k * lda : (size_t)k, B + (size_t)k * ldb, m);
    const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 16
    for (int r = 0; r < MT; r++) {
        if (r >= mr) break;
#pragma GCC unroll 2
        for (int v = 0; v < NT; v++)
            store(C + (size_t)r * ldc + v * VL, m[v], acc[r * NT + v], va, beta);
    }
}

// Rows [i0, i1) of C by the columns [j, j + nr) of one panel of B (rows ldb apart).
TARGET ALWAYS_INLINE void rows_of_panel(const bool TA, int i0, int i1, int j, int nr, int K,
                                        float alpha, const float *A, size_t lda,
                                        const float *Bj, size_t ldb, float beta, float *C,
                                        size_t ldc) {
    for (int i = i0; i < i1;) {
        const int mr = i1 - i;
        const float *Ai = TA ? A + i : A + (size_t)i * lda;
        float *Ci = C + (size_t)i * ldc + j;
        if (nr > VL) {
            if (mr >= 8) tile(TA, 8, 2, 8, nr, K, Ai, lda, Bj, ldb, alpha, beta, Ci, ldc);
            else if (mr > 1) tile(TA, 4, 2, mr, nr, K, Ai, lda, Bj, ldb, alpha, beta, Ci, ldc);
            else tile(TA, 1, 2, 1, nr, K, Ai, lda, Bj, ldb, alpha, beta, Ci, ldc);
            i += mr >= 8 ? 8 : mr > 4 ? 4 : mr;
        } else {
            if (mr > 8) tile(TA, 16, 1, mr, nr, K, Ai, lda, Bj, ldb, alpha, beta, Ci, ldc);
            else if (mr > 4) tile(TA, 8, 1, mr, nr, K, Ai, lda, Bj, ldb, alpha, beta, Ci, ldc);
            else if (mr > 1) tile(TA, 4, 1, mr, nr, K, Ai, lda, Bj, ldb, alpha, beta, Ci, ldc);
            else tile(TA, 1, 1, 1, nr, K, Ai, lda, Bj, ldb, alpha, beta, Ci, ldc);
            i += mr > 16 ? 16 : mr;
        }
    }
}

// Columns [j, j + nr) of rows [0, K) of B into dst, rows 2 VL apart (lanes past nr zero).
TARGET static void pack_panel(const float *B, size_t ldb, int K, int nr, float *dst) {
    const __mmask16 m0 = lanes(nr), m1 = lanes(nr - VL);
    for (int k = 0; k < K; k++) {
        _mm512_store_ps(dst + (size_t)k * 2 * VL, _mm512_maskz_loadu_ps(m0, B + (size_t)k * ldb));
        _mm512_store_ps(dst + (size_t)k * 2 * VL + VL,
                        _mm512_maskz_loadu_ps(m1, B + (size_t)k * ldb + VL));
    }
}

// Wide products (scores: many panels of k^T, a short sum) go a band of 8 or 16 rows at a
// time across all the panels, the band's rows of op(A) staying in L1. Narrow ones (a
// head's width of columns, a block's length of sum) go a panel at a time down all the
// rows; a panel whose rows lie far apart (v, k or q in place, rows of all heads apart)
// is first copied into contiguous rows, so that it stays in L1 for every band.
TARGET ALWAYS_INLINE void panels(const bool TA, int M, int N, int K, float alpha,
                                 const float *A, size_t lda, const float *B, size_t ldb,
                                 float beta, float *C, size_t ldc) {
    if (N > 4 * VL) {
        const int band = 16;
        for (ptrdiff_t i = 0; i < M; i += band) {  // an int would pass INT_MAX after the last
            const int i1 = M - i < band ? M : i + band;
            for (ptrdiff_t j = 0; j < N; j += 2 * VL) {
                const int nr = N - j < 2 * VL ? N - j : 2 * VL;
                rows_of_panel(TA, i, i1, j, nr, K, alpha, A, lda, B + j, ldb, beta, C, ldc);
            }
        }
        return;
    }
    const bool pack = M >= PACK_MIN_ROWS && ldb > (size_t)(4 * VL);
    float *buf = pack ? agi_scratch_b() : NULL;
    for (ptrdiff_t j = 0; j < N; j += 2 * VL) {
        const int nr = N - j < 2 * VL ? N - j : 2 * VL;
        if (pack) {
            pack_panel(B + j, ldb, K, nr, buf);
            rows_of_panel(TA, 0, M, j, nr, K, alpha, A, lda, buf, 2 * VL, beta, C, ldc);
        } else {
            rows_of_panel(TA, 0, M, j, nr, K, alpha, A, lda, B + j, ldb, beta, C, ldc);
        }
    }
}

TARGET static void block_product_avx512(bool ta, int M, int N, int K, float alpha,
                                        const float *A, size_t lda, const float *B, size_t ldb,
                                        float beta, float *C, size_t ldc) {
    if (ta) panels(true, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else panels(false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void agi_block_product_f32(bool ta, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    block_product_avx512(ta, M, N, K, alpha, A, (size_t)lda, B, (size_t)ldb, beta, C,
                         (size_t)ldc);
}

#else
// No AVX-512 here: agi_tile_gemm_available() is false, so this is never called.
void agi_block_product_f32(bool ta, int M, int N, int K, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc) {
    (void)ta, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
    (void)beta, (void)C, (void)ldc;
    abort();
}
#endif
