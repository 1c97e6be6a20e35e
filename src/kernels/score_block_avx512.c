// The float32 score-block passes of score_block.c written for AVX-512 (16 floats a
// register), for CPUs that run the tile kernels (agi_tile_gemm_available). At the
// demo's shapes the exponentials of the online softmax took as long as both products
// of the forward; here each block row costs a few vector operations per 16 scores.
//
// exp(x) for the scores minus their row maximum (x <= 0, or NaN, or -inf): n = round(x
// log2 e), r = x - n ln2 (ln2 in two parts, fused multiply-adds), e^r by its Taylor series
// to r^7 (truncation below 1e-8 relative for |r| <= ln2 / 2), times 2^n with scalef.
// Below -87 (where expf turns denormal) and at -inf the result is exactly 0, as a masked
// score needs; a NaN stays NaN. Sums of a row run in 16 float lanes, each over at most
// 16 scores of a block, then in double across lanes and blocks. These passes use fused
// multiply-adds, so their last bits differ from the other CPUs' (for a given CPU and
// thread count results are still the same every run).
#include "score_block_avx512.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <math.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

// How far ahead the probabilities of kept scores prefetch them (a prefetch never faults:
// past the last block is fine).
enum { PREFETCH_FLOATS = 2048 };
#define ALWAYS_INLINE static inline __attribute__((always_inline))

TARGET ALWAYS_INLINE __m512 exp_scores(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    const __m512 xc = _mm512_max_ps(lo, x);  // a NaN x is kept (max takes the second)
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);  // false for NaN
    return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_scalef_ps(p, n));
}

// Lanes [0, n - c) of 16 (all for n - c >= 16).
ALWAYS_INLINE __mmask16 lanes(int c, int n) {
    return n - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - c)) - 1);
}

// keep[c] / (1 - p) for 16 keep flags (bytes 0 or 1).
TARGET ALWAYS_INLINE __m512 keep_factor(const uint8_t *kp, __mmask16 k, float keep_scale) {
    const __m128i bytes = _mm_maskz_loadu_epi8(k, kp);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)),
                         _mm512_set1_ps(keep_scale));
}

TARGET void agi_online_softmax_block_avx512(float *s, int ld, int bq, int bk, float *m,
                                            double *l, float *o, int ldo, int dv,
                                            const uint8_t *keep, int ldkeep,
                                            float keep_scale, float *saved) {
    for (int r = 0; r < bq; r++) {
        float *sr = s + (size_t)r * ld;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int c = 0; c < bk; c += 16) {  // NaN skipped: max takes its second operand
            const __mmask16 k = lanes(c, bk);
            const __m512 x = _mm512_mask_loadu_ps(mx, k, sr + c);
            if (saved) _mm512_mask_storeu_ps(saved + (size_t)r * ld + c, k, x);
            mx = _mm512_max_ps(x, mx);
        }
        const float m_old = m[r], row_max = _mm512_reduce_max_ps(mx);
        const float m_new = row_max > m_old ? row_max : m_old;
        if (m_new == -INFINITY) {
            // Nothing visible to this query yet, or NaN scores only: those poison the row
            // for good (m = l = NaN).
            bool nan = false;
            for (int c = 0; c < bk; c++) nan |= sr[c] != sr[c];
            for (int c = 0; c < bk; c++) sr[c] = nan ? NAN : 0;
            if (nan) m[r] = NAN, l[r] = NAN;
            continue;
        }
        if (m_new != m_old && l[r] > 0) {  // rescale what earlier blocks added
            const float corr = _mm512_cvtss_f32(exp_scores(_mm512_set1_ps(m_old - m_new)));
            l[r] *= corr;
            float *orow = o + (size_t)r * ldo;
            for (int c = 0; c < dv; c++) orow[c] *= corr;
        }
        m[r] = m_new;
        const __m512 vm = _mm512_set1_ps(m_new);
        __m512 sum = _mm512_setzero_ps();
        for (int c = 0; c < bk; c += 16) {
            const __mmask16 k = lanes(c, bk);
            __m512 e = exp_scores(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sr + c), vm));
            e = _mm512_maskz_mov_ps(k, e);
            sum = _mm512_add_ps(sum, e);
            if (keep)
                e = _mm512_mul_ps(e, keep_factor(keep + (size_t)r * ldkeep + c, k, keep_scale));
            _mm512_mask_storeu_ps(sr + c, k, e);
        }
        const __m256 halves =
            _mm256_add_ps(_mm512_castps512_ps256(sum),
                          _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1)));
        const __m256d wide = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(halves)),
                                           _mm256_cvtps_pd(_mm256_extractf128_ps(halves, 1)));
        double lanes4[4];
        _mm256_storeu_pd(lanes4, wide);
        l[r] += (lanes4[0] + lanes4[1]) + (lanes4[2] + lanes4[3]);
    }
}

TARGET void agi_probs_block_avx512(const float *s, float *P, int ld, int bq, int bk,
                                   const float *lse) {
    for (int r = 0; r < bq; r++) {
        const float *sr = s + (size_t)r * ld;
        float *pr = P + (size_t)r * ld;
        const __m512 sub = _mm512_set1_ps(lse[r]);
        if (s != P)  // kept scores, read in order, from memory when they are many
            for (int c = 0; c < bk; c += 16)
                _mm_prefetch((const char *)(sr + PREFETCH_FLOATS + c), _MM_HINT_T0);
        for (int c = 0; c < bk; c += 16) {
            const __mmask16 k = lanes(c, bk);
            const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, sr + c), sub);
            _mm512_mask_storeu_ps(pr + c, k, exp_scores(x));
        }
    }
}

TARGET void agi_dscores_block_avx512(const float *P, float *dS, int ld, int bq, int bk,
                                     const double *D, const uint8_t *keep, int ldkeep,
                                     float keep_scale) {
    for (int r = 0; r < bq; r++) {
        const float *pr = P + (size_t)r * ld;
        float *sr = dS + (size_t)r * ld;
        const __m512 d = _mm512_set1_ps((float)D[r]);
        for (int c = 0; c < bk; c += 16) {
            const __mmask16 k = lanes(c, bk);
            __m512 dp = _mm512_maskz_loadu_ps(k, sr + c);
            if (keep)
                dp = _mm512_mul_ps(dp, keep_factor(keep + (size_t)r * ldkeep + c, k, keep_scale));
            const __m512 p = _mm512_maskz_loadu_ps(k, pr + c);
            _mm512_mask_storeu_ps(sr + c, k, _mm512_mul_ps(p, _mm512_sub_ps(dp, d)));
        }
    }
}

TARGET void agi_rows_dot_avx512(const float *a, int lda, const float *b, int ldb, int rows,
                                int n, double *out) {
    for (int r = 0; r < rows; r++) {
        const float *x = a + (size_t)r * lda, *y = b + (size_t)r * ldb;
        __m512d acc = _mm512_setzero_pd();
        for (int c = 0; c < n; c += 8) {
            const __mmask8 k = n - c >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << (n - c)) - 1);
            const __m512d xd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, x + c));
            const __m512d yd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, y + c));
            acc = _mm512_fmadd_pd(xd, yd, acc);
        }
        out[r] = _mm512_reduce_add_pd(acc);
    }
}

#else
// No AVX-512 here: agi_tile_gemm_available() is false, so these are never called.
void agi_online_softmax_block_avx512(float *s, int ld, int bq, int bk, float *m, double *l,
                                     float *o, int ldo, int dv, const uint8_t *keep,
                                     int ldkeep, float keep_scale, float *saved) {
    (void)s, (void)ld, (void)bq, (void)bk, (void)m, (void)l, (void)o, (void)ldo, (void)dv;
    (void)keep, (void)ldkeep, (void)keep_scale, (void)saved;
}
void agi_probs_block_avx512(const float *s, float *P, int ld, int bq, int bk,
                            const float *lse) {
    (void)s, (void)P, (void)ld, (void)bq, (void)bk, (void)lse;
}
void agi_dscores_block_avx512(const float *P, float *dS, int ld, int bq, int bk,
                              const double *D, const uint8_t *keep, int ldkeep,
                              float keep_scale) {
    (void)P, (void)dS, (void)ld, (void)bq, (void)bk, (void)D, (void)keep, (void)ldkeep;
    (void)keep_scale;
}
void agi_rows_dot_avx512(const float *a, int lda, const float *b, int ldb, int rows, int n,
                         double *out) {
    (void)a, (void)lda, (void)b, (void)ldb, (void)rows, (void)n, (void)out;
}
#endif
