// One query row's attention products (see score_row.h). In float on CPUs that run the
// tile kernels (agi_tile_gemm_available), the scores are the matrix-vector kernel's
// product of the keys, as rows, by the query (gemv.h), and the weighted sum runs 16
// columns a register with fused multiply-adds, as the tile kernels would have: their last
// bits differ from the portable loops' (on a given CPU results are the same every run).
// float64, the gradient-checking precision, and other CPUs take the portable loops.
#include "score_row.h"

#include "gemv.h"
#include "tile_gemm.h"
#include "vecmath.h"

#if !defined(AG_REAL_F64) && defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ROW_AVX512 1

// Columns 16 a register (the last chunk masked); keys c = 4i + r go to accumulator r,
// the four then summed as (a0 + a1) + (a2 + a3): four chains of additions, not one.
__attribute__((target("avx512f"))) static void weighted_sum_avx512(const float *p,
                                                                    const float *V, int ldv,
                                                                    int n, int dv, float *o) {
    for (ptrdiff_t e0 = 0; e0 < dv; e0 += 16) {  // an int would pass INT_MAX after the last
        const __mmask16 m = (__mmask16)(dv - e0 >= 16 ? 0xFFFF : (1u << (dv - e0)) - 1);
        const float *Ve = V + e0;
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps()};
        int c = 0;
        for (; c <= n - 4; c += 4)  // c + 4 <= n, which c + 4 might pass INT_MAX
            for (int r = 0; r < 4; r++)
                a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[c + r]),
                                       _mm512_maskz_loadu_ps(m, Ve + (size_t)(c + r) * ldv),
                                       a[r]);
        for (int r = 0; c < n; c++, r++)
            a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[c]),
                                   _mm512_maskz_loadu_ps(m, Ve + (size_t)c * ldv), a[r]);
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        _mm512_mask_storeu_ps(o + e0, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, o + e0), sum));
    }
}
#else
#define ROW_AVX512 0
#endif

// The portable loops, multiversioned (AGI_HOT, see vecmath.h) and compiled without FMA
// contraction, so that each version does the same operations in the same order. The
// partial sums are added level by level, written out: a loop over the levels is left
// rolled and runs through memory.
AGI_HOT static void R(row_scores_mv)(const real *q, const real *K, int ldk, int n, int d,
                                     real scale, real *s) {
    for (int c = 0; c < n; c++) {
        const real *k = K + (size_t)c * ldk;
        real a[16] = {0}, b[8], h[4];
        int e = 0;
        for (; e <= d - 16; e += 16)
            for (int u = 0; u < 16; u++) a[u] += q[e + u] * k[e + u];
        for (int u = 0; e < d; e++, u++) a[u] += q[e] * k[e];
        for (int u = 0; u < 8; u++) b[u] = a[u] + a[u + 8];
        for (int u = 0; u < 4; u++) h[u] = b[u] + b[u + 4];
        s[c] = scale * ((h[0] + h[2]) + (h[1] + h[3]));
    }
}

// Columns 16 at a time, summed over the keys in order in registers.
AGI_HOT static void R(row_weighted_sum_mv)(const real *p, const real *V, int ldv, int n,
                                           int dv, real *o) {
    for (ptrdiff_t e0 = 0; e0 < dv; e0 += 16) {
        const int w = dv - e0 < 16 ? dv - e0 : 16;
        real a[16] = {0};
        for (int c = 0; c < n; c++) {
            const real pc = p[c], *v = V + (size_t)c * ldv + e0;
            for (int u = 0; u < w; u++) a[u] += pc * v[u];
        }
        for (int u = 0; u < w; u++) o[e0 + u] += a[u];
    }
}

// Plain entry points: clang 14 names a multiversioned function's entry `<name>.ifunc`,
// which a caller in another file cannot link to (vecmath.h).
void R(agi_row_scores)(const real *q, const real *K, int ldk, int n, int d, real scale,
                       real *s) {
#if ROW_AVX512
    if (agi_tile_gemm_available()) {
        agi_gemv_f32(n, d, scale, K, ldk, q, 0, s, NULL);
        return;
    }
#endif
    R(row_scores_mv)(q, K, ldk, n, d, scale, s);
}

void R(agi_row_weighted_sum)(const real *p, const real *V, int ldv, int n, int dv, real *o) {
#if ROW_AVX512
    if (agi_tile_gemm_available()) {
        weighted_sum_avx512(p, V, ldv, n, dv, o);
        return;
    }
#endif
    R(row_weighted_sum_mv)(p, V, ldv, n, dv, o);
}
