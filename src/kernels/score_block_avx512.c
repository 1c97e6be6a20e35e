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
// 16 scores of a block, then across lanes (in float for 16 rows at once, in double for a
// row alone) and in double across blocks. These passes use fused
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

// Loads and stores of the lanes k: plain ones for all 16, which the loops below pass as
// a constant (masked stores of whole rows measured slower on this Zen 5).
TARGET ALWAYS_INLINE __m512 load16(__mmask16 k, const float *p) {
    return k == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(k, p);
}
TARGET ALWAYS_INLINE __m512 load16_or(__m512 src, __mmask16 k, const float *p) {
    return k == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_mask_loadu_ps(src, k, p);
}
TARGET ALWAYS_INLINE void store16(float *p, __mmask16 k, __m512 x) {
    if (k == 0xFFFF)
        _mm512_storeu_ps(p, x);
    else
        _mm512_mask_storeu_ps(p, k, x);
}

// Runs the statement(s) for c = 0, 16, ... < n with k the lanes of each chunk: the whole
// chunks with k constant, then the last one.
#define FOR_CHUNKS(c, k, n, ...)                                    \
    do {                                                            \
        int c = 0;                                                  \
        for (; c + 16 <= (n); c += 16) {                            \
            const __mmask16 k = (__mmask16)0xFFFF;                  \
            __VA_ARGS__                                             \
        }                                                           \
        if (c < (n)) {                                              \
            const __mmask16 k = lanes(c, n);                        \
            __VA_ARGS__                                             \
        }                                                           \
    } while (0)

// keep[c] / (1 - p) for 16 keep flags (bytes 0 or 1).
TARGET ALWAYS_INLINE __m512 keep_factor(const uint8_t *kp, __mmask16 k, float keep_scale) {
    const __m128i bytes = _mm_maskz_loadu_epi8(k, kp);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)),
                         _mm512_set1_ps(keep_scale));
}

// The sums in double of a row's 16 float lanes, added to *l: lanes 0-7 and 8-15 in
// float, then four doubles.
TARGET ALWAYS_INLINE void add_lanes(double *l, __m512 sum) {
    const __m256 halves =
        _mm256_add_ps(_mm512_castps512_ps256(sum),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1)));
    const __m256d wide = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(halves)),
                                       _mm256_cvtps_pd(_mm256_extractf128_ps(halves, 1)));
    double lanes4[4];
    _mm256_storeu_pd(lanes4, wide);
    *l += (lanes4[0] + lanes4[1]) + (lanes4[2] + lanes4[3]);
}

// A row that has nothing visible yet (its new max is -inf): zeros, or NaN for good when
// its scores are NaN only.
static void dead_row(float *sr, int bk, float *m, double *l) {
    bool nan = false;
    for (int c = 0; c < bk; c++) nan |= sr[c] != sr[c];
    for (int c = 0; c < bk; c++) sr[c] = nan ? NAN : 0;
    if (nan) *m = NAN, *l = NAN;
}

// Rescales what earlier blocks added to row r (l and its output row) by exp(m - m').
TARGET ALWAYS_INLINE void rescale_row(double *l, float *orow, int dv, float corr) {
    *l *= corr;
    for (int c = 0; c < dv; c++) orow[c] *= corr;
}

// exp(s - m) of row sr in place (times the keep factors of kr when not NULL); returns
// the 16 lane sums.
TARGET ALWAYS_INLINE __m512 exp_row(float *sr, int bk, float m, const uint8_t *kr,
                                    float keep_scale) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    FOR_CHUNKS(c, k, bk, {
        __m512 e = exp_scores(_mm512_sub_ps(load16(k, sr + c), vm));
        e = _mm512_maskz_mov_ps(k, e);
        sum = _mm512_add_ps(sum, e);
        if (kr) e = _mm512_mul_ps(e, keep_factor(kr + c, k, keep_scale));
        store16(sr + c, k, e);
    });
    return sum;
}

// The max of row sr's scores in 16 lanes (NaN skipped: max takes its second operand),
// copying them to `saved` when it is not NULL: with `stream` (saved on 64-byte lines),
// the whole chunks by non-temporal stores. The kept scores are megabytes that backward
// reads only after the rest of the forward and the layers after it: stored through the
// cache, each line would first be read from memory for ownership, a wait the online
// softmax would pay (README); backward's probabilities pass prefetches them back.
TARGET ALWAYS_INLINE __m512 max_row(const float *sr, int bk, float *saved, bool stream) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    FOR_CHUNKS(c, k, bk, {
        const __m512 x = load16_or(mx, k, sr + c);
        if (saved && stream && k == (__mmask16)0xFFFF)
            _mm512_stream_ps(saved + c, x);
        else if (saved)
            store16(saved + c, k, x);
        mx = _mm512_max_ps(x, mx);
    });
    return mx;
}

// Lane r of the result: the max (or sum) of the 16 lanes of v[r], for 16 rows at once
// (30 shuffles and 15 operations, where a reduction a row takes 6 dependent steps).
// Pairs of lanes are combined first, then the four 128-bit quarters.
#define REDUCE16(OP, v, out)                                                                    \
    do {                                                                                        \
        __m512 w_[8], x_[4], y_[2];                                                            \
        for (int i_ = 0; i_ < 8; i_++) /* 128-bit quarter q: a0.a2, b0.b2, a1.a3, b1.b3 */    \
            w_[i_] = OP(_mm512_unpacklo_ps(v[2 * i_], v[2 * i_ + 1]),                          \
                        _mm512_unpackhi_ps(v[2 * i_], v[2 * i_ + 1]));                         \
        for (int i_ = 0; i_ < 4; i_++) /* quarter q: rows 4i..4i + 3 over its 4 lanes */       \
            x_[i_] = OP(_mm512_shuffle_ps(w_[2 * i_], w_[2 * i_ + 1], 0x44),                   \
                        _mm512_shuffle_ps(w_[2 * i_], w_[2 * i_ + 1], 0xEE));                  \
        for (int i_ = 0; i_ < 2; i_++) /* quarters 0 + 2 and 1 + 3 of x[2i], x[2i + 1] */      \
            y_[i_] = OP(_mm512_shuffle_f32x4(x_[2 * i_], x_[2 * i_ + 1], 0x44),                \
                        _mm512_shuffle_f32x4(x_[2 * i_], x_[2 * i_ + 1], 0xEE));               \
        out = OP(_mm512_shuffle_f32x4(y_[0], y_[1], 0x88),                                     \
                 _mm512_shuffle_f32x4(y_[0], y_[1], 0xDD));                                    \
    } while (0)

// max(a, b) with the operand order of max_row: a NaN in a is skipped.
TARGET ALWAYS_INLINE __m512 max_skip(__m512 a, __m512 b) { return _mm512_max_ps(b, a); }

// The online-softmax step on 16 rows at once: the row maxima, their new running max and
// the rescaling of earlier blocks as vectors of 16 rows; only the exponentials go row by
// row. The row sums run in 16 float lanes each, then reduce across lanes in float (four
// steps) before they are added to l in double.
TARGET static void online_softmax_rows16(float *s, int ld, int bk, float *m, double *l,
                                         float *o, int ldo, int dv, const uint8_t *keep,
                                         int ldkeep, float keep_scale, float *saved,
                                         bool stream) {
    __m512 v[16];
    for (int r = 0; r < 16; r++)
        v[r] = max_row(s + (size_t)r * ld, bk, saved ? saved + (size_t)r * ld : NULL, stream);
    __m512 row_max;
    REDUCE16(max_skip, v, row_max);
    const __m512 m_old = _mm512_loadu_ps(m);
    const __m512 m_new = _mm512_max_ps(row_max, m_old);  // a NaN m_old stays
    const __mmask16 dead = _mm512_cmp_ps_mask(m_new, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    const __mmask16 moved = _mm512_cmp_ps_mask(m_new, m_old, _CMP_NEQ_UQ);
    const __mmask16 summed =
        (__mmask16)(_mm512_cmp_pd_mask(_mm512_loadu_pd(l), _mm512_setzero_pd(), _CMP_GT_OQ) |
                    (unsigned)_mm512_cmp_pd_mask(_mm512_loadu_pd(l + 8), _mm512_setzero_pd(),
                                                 _CMP_GT_OQ)
                        << 8);
    const __mmask16 rescale = (__mmask16)(moved & summed & ~dead);
    float mn[16], corr[16];
    _mm512_storeu_ps(mn, m_new);
    if (rescale) {
        _mm512_storeu_ps(corr, exp_scores(_mm512_sub_ps(m_old, m_new)));
        for (int r = 0; r < 16; r++)
            if (rescale >> r & 1) rescale_row(l + r, o + (size_t)r * ldo, dv, corr[r]);
    }
    _mm512_mask_storeu_ps(m, (__mmask16)~dead, m_new);
    for (int r = 0; r < 16; r++) {
        float *sr = s + (size_t)r * ld;
        if (dead >> r & 1) {
            dead_row(sr, bk, m + r, l + r);
            v[r] = _mm512_setzero_ps();
        } else {
            v[r] = exp_row(sr, bk, mn[r], keep ? keep + (size_t)r * ldkeep : NULL, keep_scale);
        }
    }
    __m512 sums;
    REDUCE16(_mm512_add_ps, v, sums);
    const __mmask8 live_lo = (__mmask8)~dead, live_hi = (__mmask8)(~dead >> 8);
    _mm512_mask_storeu_pd(l, live_lo,
                          _mm512_add_pd(_mm512_loadu_pd(l),
                                        _mm512_cvtps_pd(_mm512_castps512_ps256(sums))));
    _mm512_mask_storeu_pd(
        l + 8, live_hi,
        _mm512_add_pd(_mm512_loadu_pd(l + 8),
                      _mm512_cvtps_pd(_mm256_castpd_ps(
                          _mm512_extractf64x4_pd(_mm512_castps_pd(sums), 1)))));
}

TARGET void agi_online_softmax_block_avx512(float *s, int ld, int bq, int bk, float *m,
                                            double *l, float *o, int ldo, int dv,
                                            const uint8_t *keep, int ldkeep,
                                            float keep_scale, float *saved) {
    // Every row of saved starts a 64-byte line when the first does and ld is a multiple
    // of 16 (the kept blocks' layout, src/ops/attention_job.c).
    const bool stream = saved && (uintptr_t)saved % 64 == 0 && ld % 16 == 0;
    int r = 0;
    for (; r + 16 <= bq; r += 16)
        online_softmax_rows16(s + (size_t)r * ld, ld, bk, m + r, l + r, o + (size_t)r * ldo,
                              ldo, dv, keep ? keep + (size_t)r * ldkeep : NULL, ldkeep,
                              keep_scale, saved ? saved + (size_t)r * ld : NULL, stream);
    for (; r < bq; r++) {  // the last rows, one at a time
        float *sr = s + (size_t)r * ld;
        const float m_old = m[r],
                    row_max = _mm512_reduce_max_ps(
                        max_row(sr, bk, saved ? saved + (size_t)r * ld : NULL, stream));
        const float m_new = row_max > m_old ? row_max : m_old;
        if (m_new == -INFINITY) {
            dead_row(sr, bk, m + r, l + r);
            continue;
        }
        if (m_new != m_old && l[r] > 0)
            rescale_row(l + r, o + (size_t)r * ldo, dv,
                        _mm512_cvtss_f32(exp_scores(_mm512_set1_ps(m_old - m_new))));
        m[r] = m_new;
        add_lanes(l + r, exp_row(sr, bk, m_new, keep ? keep + (size_t)r * ldkeep : NULL,
                                 keep_scale));
    }
    // Non-temporal stores are weakly ordered: fenced before another thread (backward on
    // the pool) can read the block.
    if (stream) _mm_sfence();
}

TARGET void agi_probs_block_avx512(const float *s, float *P, int ld, int bq, int bk,
                                   const float *mx, const float *lsum) {
    for (int r = 0; r < bq; r++) {
        const float *sr = s + (size_t)r * ld;
        float *pr = P + (size_t)r * ld;
        const __m512 m = _mm512_set1_ps(mx[r]), ls = _mm512_set1_ps(lsum[r]);
        if (s != P)  // kept scores, read in order, from memory when they are many
            for (int c = 0; c < bk; c += 16)
                _mm_prefetch((const char *)(sr + PREFETCH_FLOATS + c), _MM_HINT_T0);
        FOR_CHUNKS(c, k, bk, {
            const __m512 x = _mm512_sub_ps(_mm512_sub_ps(load16(k, sr + c), m), ls);
            store16(pr + c, k, exp_scores(x));
        });
    }
}

TARGET void agi_dscores_block_avx512(const float *P, float *dS, int ld, int bq, int bk,
                                     const double *D, const uint8_t *keep, int ldkeep,
                                     float keep_scale) {
    for (int r = 0; r < bq; r++) {
        const float *pr = P + (size_t)r * ld;
        float *sr = dS + (size_t)r * ld;
        const __m512 d = _mm512_set1_ps((float)D[r]);
        FOR_CHUNKS(c, k, bk, {
            __m512 dp = load16(k, sr + c);
            if (keep)
                dp = _mm512_mul_ps(dp, keep_factor(keep + (size_t)r * ldkeep + c, k, keep_scale));
            const __m512 p = load16(k, pr + c);
            store16(sr + c, k, _mm512_mul_ps(p, _mm512_sub_ps(dp, d)));
        });
    }
}

// a_r . b_r in 8 double lanes.
TARGET ALWAYS_INLINE __m512d dot_lanes(const float *x, const float *y, int n) {
    __m512d acc = _mm512_setzero_pd();
    int c = 0;
    for (; c <= n - 8; c += 8)  // c + 8 <= n, which c + 8 might pass INT_MAX
        acc = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + c)),
                              _mm512_cvtps_pd(_mm256_loadu_ps(y + c)), acc);
    if (c < n) {
        const __mmask8 k = (__mmask8)((1u << (n - c)) - 1);
        acc = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, x + c)),
                              _mm512_cvtps_pd(_mm256_maskz_loadu_ps(k, y + c)), acc);
    }
    return acc;
}

// Eight rows' dot products at once: lane r of the result is the sum of the lanes of
// acc[r] (pairs of lanes first, then the 128-bit quarters), 14 shuffles and 7 adds where
// a reduction a row takes 6 dependent steps.
TARGET ALWAYS_INLINE __m512d sum_lanes8(const __m512d acc[8]) {
    __m512d p[4], q[2];
    for (int i = 0; i < 4; i++)  // quarter k: rows 2i, 2i + 1 over its 2 lanes
        p[i] = _mm512_add_pd(_mm512_unpacklo_pd(acc[2 * i], acc[2 * i + 1]),
                             _mm512_unpackhi_pd(acc[2 * i], acc[2 * i + 1]));
    for (int i = 0; i < 2; i++)  // quarters 0 + 2 and 1 + 3 of p[2i], p[2i + 1]
        q[i] = _mm512_add_pd(_mm512_shuffle_f64x2(p[2 * i], p[2 * i + 1], 0x44),
                             _mm512_shuffle_f64x2(p[2 * i], p[2 * i + 1], 0xEE));
    return _mm512_add_pd(_mm512_shuffle_f64x2(q[0], q[1], 0x88),
                         _mm512_shuffle_f64x2(q[0], q[1], 0xDD));
}

TARGET void agi_rows_dot_avx512(const float *a, int lda, const float *b, int ldb, int rows,
                                int n, double *out) {
    int r = 0;
    for (; r + 8 <= rows; r += 8) {
        __m512d acc[8];
        for (int i = 0; i < 8; i++)
            acc[i] = dot_lanes(a + (size_t)(r + i) * lda, b + (size_t)(r + i) * ldb, n);
        _mm512_storeu_pd(out + r, sum_lanes8(acc));
    }
    for (; r < rows; r++)
        out[r] = _mm512_reduce_add_pd(dot_lanes(a + (size_t)r * lda, b + (size_t)r * ldb, n));
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
                            const float *mx, const float *lsum) {
    (void)s, (void)P, (void)ld, (void)bq, (void)bk, (void)mx, (void)lsum;
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
