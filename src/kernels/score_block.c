// The elementwise passes over blocks of attention scores (see score_block.h). They cost
// about as much as the products around them, so they are written to vectorise.
#include "score_block.h"

#include <string.h>

#include "bf16_gemm.h"
#include "score_block_avx512.h"
#include "tile_gemm.h"
#include "vecmath.h"

// The loops are multiversioned (AGI_HOT, see vecmath.h).
#define HOT AGI_HOT
#define INLINE AGI_INLINE

// The exponential of the online softmax, where nearly all the non-gemm time goes.
#ifdef AG_REAL_F64
// float64 is the gradient-checking precision: libm's exp, as ag_softmax uses.
INLINE double exp_score(double x) { return exp(x); }
#else
// A score minus its row max is <= 0: below -87 (where expf turns denormal) and at -inf
// the result is exactly 0, as a masked score needs; a NaN stays NaN.
INLINE float exp_score(float x) { return x < -87.0f ? 0.0f : agi_expf(x); }
#endif

HOT static void R(score_mask_mv)(real *s, int ld, int bq, int bk, const agi_score_masks *m) {
    for (int r = 0; r < bq; r++) {
        real *sr = s + (size_t)r * ld;
        if (m->rel) {
            const real *b = m->rel - r;
            for (int c = 0; c < bk; c++) sr[c] += b[c];
        }
        if (m->add) {
            const real *a = m->add + (size_t)r * m->add_ld;
            for (int c = 0; c < bk; c++) sr[c] += a[c];
        }
        if (m->mask) {
            const uint8_t *mk = m->mask + (size_t)r * m->mask_ld;
            if (m->keeps)
                for (int c = 0; c < bk; c++) sr[c] = mk[c] ? sr[c] : -INFINITY;
            else
                for (int c = 0; c < bk; c++) sr[c] = mk[c] ? -INFINITY : sr[c];
        }
        if (m->kpm) {
            const uint8_t *kp = m->kpm;
            if (m->keeps)
                for (int c = 0; c < bk; c++) sr[c] = kp[c] ? sr[c] : -INFINITY;
            else
                for (int c = 0; c < bk; c++) sr[c] = kp[c] ? -INFINITY : sr[c];
        }
        if (m->causal)
            for (int c = m->causal_first + r > 0 ? m->causal_first + r : 0; c < bk; c++)
                sr[c] = -INFINITY;
        if (m->window) {
            for (int c = 0; c < bk && c < m->window_lo + r; c++) sr[c] = -INFINITY;
            for (int c = m->window_hi + r > 0 ? m->window_hi + r : 0; c < bk; c++)
                sr[c] = -INFINITY;
        }
    }
}

// max over x[0, n): eight running maxima, so that the loop vectorises.
INLINE real row_max(const real *x, int n) {
    real m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                 -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int u = 0; u < 8; u++) m[u] = x[c + u] > m[u] ? x[c + u] : m[u];
    for (; c < n; c++) m[0] = x[c] > m[0] ? x[c] : m[0];
    real mx = m[0];
    for (int u = 1; u < 8; u++) mx = m[u] > mx ? m[u] : mx;
    return mx;
}

// x = exp(x - sub) in place; returns the sum, in double with eight fixed partial sums
// (a float sum over a long row would drift; one double chain would be slow).
INLINE double exp_sum(real *x, int n, real sub) {
    double acc[8] = {0};
    int c = 0;
    for (; c + 8 <= n; c += 8)
        for (int u = 0; u < 8; u++) {
            x[c + u] = exp_score(x[c + u] - sub);
            acc[u] += x[c + u];
        }
    for (; c < n; c++) {
        x[c] = exp_score(x[c] - sub);
        acc[0] += x[c];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

HOT static void R(online_softmax_block_mv)(real *s, int ld, int bq, int bk, real *m,
                                           double *l, real *o, int ldo, int dv,
                                           const uint8_t *keep, int ldkeep, real keep_scale,
                                           real *saved) {
    for (int r = 0; r < bq; r++) {
        real *sr = s + (size_t)r * ld;
        if (saved) memcpy(saved + (size_t)r * ld, sr, (size_t)bk * sizeof *sr);
        const real mx = row_max(sr, bk), m_old = m[r];
        const real m_new = mx > m_old ? mx : m_old;
        if (m_new == -INFINITY) {
            // Nothing visible to this query yet, or NaN scores only (the max skips NaN):
            // those poison the row for good (m = l = NaN).
            bool nan = false;
            for (int c = 0; c < bk; c++) nan |= sr[c] != sr[c];
            for (int c = 0; c < bk; c++) sr[c] = nan ? (real)NAN : 0;
            if (nan) m[r] = (real)NAN, l[r] = NAN;
            continue;
        }
        if (m_new != m_old && l[r] > 0) {  // rescale what earlier blocks added
            const real corr = exp_score(m_old - m_new);
            l[r] *= corr;
            real *orow = o + (size_t)r * ldo;
            for (int c = 0; c < dv; c++) orow[c] *= corr;
        }
        m[r] = m_new;
        l[r] += exp_sum(sr, bk, m_new);
        if (keep) {
            const uint8_t *kp = keep + (size_t)r * ldkeep;
            for (int c = 0; c < bk; c++) sr[c] *= (real)kp[c] * keep_scale;
        }
    }
}

HOT static void R(probs_block_mv)(const real *s, real *P, int ld, int bq, int bk,
                                  const real *mx, const real *lsum) {
    for (int r = 0; r < bq; r++) {
        const real *sr = s + (size_t)r * ld;
        real *pr = P + (size_t)r * ld;
        const real m = mx[r], ls = lsum[r];
        for (int c = 0; c < bk; c++) pr[c] = exp_score((sr[c] - m) - ls);
    }
}

HOT static void R(dropout_block_mv)(const real *P, real *Pd, int ld, int bq, int bk,
                                    const uint8_t *keep, int ldkeep, real keep_scale) {
    for (int r = 0; r < bq; r++) {
        const uint8_t *kp = keep + (size_t)r * ldkeep;
        const real *pr = P + (size_t)r * ld;
        real *dr = Pd + (size_t)r * ld;
        for (int c = 0; c < bk; c++) dr[c] = pr[c] * ((real)kp[c] * keep_scale);
    }
}

HOT static void R(dscores_block_mv)(const real *P, real *dS, int ld, int bq, int bk,
                                    const double *D, const uint8_t *keep, int ldkeep,
                                    real keep_scale) {
    for (int r = 0; r < bq; r++) {
        const real *pr = P + (size_t)r * ld;
        real *sr = dS + (size_t)r * ld;
        const real Dr = (real)D[r];
        if (keep) {
            const uint8_t *kp = keep + (size_t)r * ldkeep;
            for (int c = 0; c < bk; c++)
                sr[c] = pr[c] * (sr[c] * ((real)kp[c] * keep_scale) - Dr);
        } else {
            for (int c = 0; c < bk; c++) sr[c] = pr[c] * (sr[c] - Dr);
        }
    }
}

// The entry points: plain functions that call the multiversioned ones, because clang 14
// names a multiversioned function's entry `<name>.ifunc`, which a caller in another
// file (seeing a plain declaration) cannot link to. One call per block costs nothing.
void R(agi_score_mask)(real *s, int ld, int bq, int bk, const agi_score_masks *m) {
    R(score_mask_mv)(s, ld, bq, bk, m);
}

// In float, on AVX-512 CPUs, the passes of score_block_avx512.c.
#ifdef AG_REAL_F64
#define AVX512 false
#else
#define AVX512 agi_tile_gemm_available()
#endif

void R(agi_online_softmax_block)(real *s, int ld, int bq, int bk, real *m, double *l, real *o,
                                 int ldo, int dv, const uint8_t *keep, int ldkeep,
                                 real keep_scale, real *saved) {
#ifndef AG_REAL_F64
    if (AVX512) {
        agi_online_softmax_block_avx512(s, ld, bq, bk, m, l, o, ldo, dv, keep, ldkeep,
                                        keep_scale, saved);
        return;
    }
#endif
    R(online_softmax_block_mv)(s, ld, bq, bk, m, l, o, ldo, dv, keep, ldkeep, keep_scale,
                               saved);
}

void R(agi_probs_block)(const real *s, real *P, int ld, int bq, int bk, const real *mx,
                        const real *lsum) {
#ifndef AG_REAL_F64
    if (AVX512) {
        agi_probs_block_avx512(s, P, ld, bq, bk, mx, lsum);
        return;
    }
#endif
    R(probs_block_mv)(s, P, ld, bq, bk, mx, lsum);
}

void R(agi_dropout_block)(const real *P, real *Pd, int ld, int bq, int bk,
                          const uint8_t *keep, int ldkeep, real keep_scale) {
    R(dropout_block_mv)(P, Pd, ld, bq, bk, keep, ldkeep, keep_scale);
}

void R(agi_dscores_block)(const real *P, real *dS, int ld, int bq, int bk, const double *D,
                          const uint8_t *keep, int ldkeep, real keep_scale) {
#ifndef AG_REAL_F64
    if (AVX512) {
        agi_dscores_block_avx512(P, dS, ld, bq, bk, D, keep, ldkeep, keep_scale);
        return;
    }
#endif
    R(dscores_block_mv)(P, dS, ld, bq, bk, D, keep, ldkeep, keep_scale);
}

static inline double a_value(real x, bool bf16) {
    return bf16 ? agi_bf16_value(agi_bf16_round((float)x)) : (double)x;
}

// a_r . b_r over n elements for each row, in double with fixed partial sums.
HOT static void R(rows_dot_mv)(const real *a, int lda, const real *b, int ldb, int rows, int n,
                               bool bf16_a, double *out) {
    for (int r = 0; r < rows; r++) {
        const real *x = a + (size_t)r * lda, *y = b + (size_t)r * ldb;
        double acc[4] = {0};
        int c = 0;
        for (; c <= n - 4; c += 4)  // c + 4 <= n, which c + 4 might pass INT_MAX
            for (int u = 0; u < 4; u++) acc[u] += a_value(x[c + u], bf16_a) * y[c + u];
        for (; c < n; c++) acc[0] += a_value(x[c], bf16_a) * y[c];
        out[r] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    }
}

void R(agi_rows_dot)(const real *a, int lda, const real *b, int ldb, int rows, int n,
                     bool bf16_a, double *out) {
#ifndef AG_REAL_F64
    if (AVX512 && !bf16_a) {
        agi_rows_dot_avx512(a, lda, b, ldb, rows, n, out);
        return;
    }
#endif
    R(rows_dot_mv)(a, lda, b, ldb, rows, n, bf16_a, out);
}

void R(agi_score_grad_add)(const real *dS, int ld, int bq, int bk, real *g, size_t ldg) {
    for (int r = 0; r < bq; r++) {
        const real *sr = dS + (size_t)r * ld;
        real *gr = ldg == (size_t)-1 ? g - r : g + (size_t)r * ldg;
        for (int c = 0; c < bk; c++) gr[c] += sr[c];
    }
}
