// Cross-entropy from logits, fused with log-softmax.
//   logits: [..., C], targets: numel/C ints -> y: []
//   per kept row r (target not ignore_index): m = max_c x[r, c], s = sum_c exp(x[r, c] - m),
//   lse[r] = m + log s;  y = (1 / N) sum over kept rows of lse[r] - x[r, t[r]],  N = kept rows
//   dx[r, c] = dy (softmax(x[r])[c] - [c == t[r]]) / N,
//   because d lse / dx[r, c] = exp(x[r, c] - lse[r]) = softmax(x[r])[c] = exp(x[r, c] - m) / s.
// An ignored row has no loss term: its gradient is 0 times its softmax, which is 0 unless the
// softmax is NaN (a NaN or +inf logit, or every logit -inf): then the row's gradient is NaN,
// as PyTorch's is (log_softmax's backward of a zero gradient), so that a NaN is not hidden.
// Stable: every exponent x - m is <= 0, so logits of +-1000 give a finite loss and gradient.
// If every target is ignored, N = 0 and the loss is 0 with a zero gradient but for such rows
// (PyTorch's loss is NaN there, 0/0).
//
// Forward saves m and 1 / s per row for backward. Each row's s is summed as row_sum says
// (in real for at most 16 classes, else in real lanes over groups of 256 classes added into
// double lanes: 16 roundings at most before the double). The loss is summed in double: m - x[t]
// row by row, and the logs as the log of the product of the s, so that a row costs no log.
// Rows are cut into chunks of CHUNK_ROWS, fixed whatever the thread count; a chunk sums its
// rows in fixed lanes and the chunks are added in order, so the loss does not depend on the
// thread count (rows are independent, so nothing else does either).
//
// Speed: in f32, exp(x - m) = 2^-((m - x) log2 e) by vecmath.h's agi_exp2f_neg, which
// vectorises (a libm call per logit does not). Rows of more than 16 classes vectorise along
// the row: the max and the sum in 16 lanes, combined in a fixed order. Narrower rows (the copy
// task's 11 classes) would leave most of a vector idle and need a horizontal sum per row, so
// with AVX-512 16 rows are loaded, transposed in registers and run as 16 lanes. The AVX-512
// code (chosen at run time; the portable code compiles everywhere) sums the rows' exps with
// fused multiply-adds, which the forward's speed needs and the portable code cannot assume:
// its s and so its loss can differ from the portable code's in the last bits (tested: within
// a few ulps), its m cannot; everything else, the backward included, is operation for
// operation the portable code. On one machine the bits do not depend on the thread count.
// f64 keeps libm: it is the reference precision.

#include "op.h"
#include "cross_entropy.h"
#include "../kernels/vecmath.h"

#if !defined(AG_REAL_F64) && defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target)
#define CE_AVX512 1
#include <immintrin.h>
#endif
#endif

#define CHUNK_ROWS 256  // a multiple of 16, the rows of one AVX-512 block
#define LANES 16
#define LOG2E_F 1.44269504088896340736f
#define ce_stats R(agi_ce_stats)

typedef struct {
    const int32_t *targets;  // a copy in tape memory
    int32_t ignore_index;
    size_t kept;             // N: rows whose target is not ignore_index
} cross_entropy_params;

// exp(x - m) for x <= m; and, for the sum s, which holds a 1 and cannot tell 2^-126 from 0,
// the same without the flush to 0.
AGI_INLINE real exp_below(real m, real x) {
#ifdef AG_REAL_F64
    return exp(x - m);
#else
    return agi_exp2f_neg((m - x) * LOG2E_F);
#endif
}
AGI_INLINE real exp_below_in_sum(real m, real x) {
#ifdef AG_REAL_F64
    return exp(x - m);
#else
    return agi_exp2f_neg_clamped((m - x) * LOG2E_F);
#endif
}

// The row maximum and sum: in class order for C <= LANES (as the AVX-512 lanes run them);
// above, in LANES interleaved parts combined by halves (lanes k and k + 8, then k and k + 4,
// ...), as the AVX-512 code combines them in registers.
AGI_INLINE real row_max(const real *restrict x, int C) {
    real m = x[0];
    if (C <= LANES) {
        for (int c = 1; c < C; c++) m = x[c] > m ? x[c] : m;
        return m;
    }
    real mv[LANES];
    for (int k = 0; k < LANES; k++) mv[k] = x[k];
    int c0 = LANES;
    for (; c0 <= C - LANES; c0 += LANES)  // c0 + LANES can pass INT_MAX
        for (int k = 0; k < LANES; k++) mv[k] = x[c0 + k] > mv[k] ? x[c0 + k] : mv[k];
    for (int k = 0; c0 + k < C; k++) mv[k] = x[c0 + k] > mv[k] ? x[c0 + k] : mv[k];
    for (int k = 0; k < LANES / 2; k++) mv[k] = mv[k + LANES / 2] > mv[k] ? mv[k + LANES / 2] : mv[k];
    for (int k = 0; k < LANES / 4; k++) mv[k] = mv[k + LANES / 4] > mv[k] ? mv[k + LANES / 4] : mv[k];
    for (int k = 0; k < LANES / 8; k++) mv[k] = mv[k + LANES / 8] > mv[k] ? mv[k + LANES / 8] : mv[k];
    return mv[1] > mv[0] ? mv[1] : mv[0];
}

// The sum of a row of more than LANES classes runs in groups of GROUP classes: a group sums
// in real lanes (lane c % LANES), which then add into double lanes. A real lane adds at most
// GROUP / LANES = 16 terms of at most 1 (a relative error of 16 roundings at most); the double
// lanes carry the sum over any number of groups.
#define GROUP (LANES * LANES)

AGI_INLINE double row_sum(const real *restrict x, int C, real m) {
    if (C <= LANES) {  // at most 16 terms in [0, 1], one of them 1: 15 roundings at most
        real s = 0;
        for (int c = 0; c < C; c++) s += exp_below_in_sum(m, x[c]);
        return s;
    }
    double sd[LANES] = {0};
    for (ptrdiff_t g0 = 0; g0 < C; g0 += GROUP) {  // past INT_MAX after the last
        const ptrdiff_t g1 = C - g0 < GROUP ? C : g0 + GROUP;
        real sf[LANES] = {0};
        ptrdiff_t c0 = g0;
        for (; c0 + LANES <= g1; c0 += LANES)
            for (int k = 0; k < LANES; k++) sf[k] += exp_below_in_sum(m, x[c0 + k]);
        for (int k = 0; c0 + k < g1; k++) sf[k] += exp_below_in_sum(m, x[c0 + k]);
        for (int k = 0; k < LANES; k++) sd[k] += sf[k];
    }
    for (int k = 0; k < LANES / 2; k++) sd[k] += sd[k + LANES / 2];
    for (int k = 0; k < LANES / 4; k++) sd[k] += sd[k + LANES / 4];
    for (int k = 0; k < LANES / 8; k++) sd[k] += sd[k + LANES / 8];
    return sd[0] + sd[1];
}

// A chunk's part of the loss, sum over its kept rows of m - x[t] + log s, is summed in LANES
// lanes, row r of a chunk starting at r0 in lane (r - r0) % LANES (as the AVX-512 code's
// vectors hold them): lin[k] the sum of m - x[t], prod[k] the product of the s. A lane holds
// CHUNK_ROWS / LANES rows, so its product is at most C^16 < 2^496: no overflow. The lanes
// are combined in a fixed order, the products exactly (mantissas and exponents apart), so a
// chunk costs one log.
#define LN2 0.69314718055994530942

static double chunk_loss(const double lin[LANES], const double prod[LANES]) {
    double l[LANES], mant = 1;
    long long e2 = 0;
    for (int k = 0; k < LANES; k++) l[k] = lin[k];
    for (int k = 0; k < LANES / 2; k++) l[k] += l[k + LANES / 2];
    for (int k = 0; k < LANES / 4; k++) l[k] += l[k + LANES / 4];
    for (int k = 0; k < LANES / 8; k++) l[k] += l[k + LANES / 8];
    // Each factor's mantissa is taken in [1, 2): the product stays below 2^16 (no
    // overflow) and, every s being >= 1, log(mant) and e2 are both >= 0, so their sum does
    // not cancel: a small loss keeps the accuracy of its s. (Mantissas in [1/2, 1) put
    // -16 ln 2 into the log for the exponents to take back, an error of an ulp of 11.)
    for (int k = 0; k < LANES; k++) {
        int e;
        mant *= 2 * frexp(prod[k], &e);  // a NaN stays a NaN
        e2 += e - 1;
    }
    return (l[0] + l[1]) + (log(mant) + (double)e2 * LN2);
}

// One row of the forward: its stats, and its terms in lane k of the loss.
AGI_INLINE void forward_row(const real *x, const int32_t *targets, int32_t ignore_index, int C,
                            size_t r, int k, ce_stats *stats, double *lin, double *prod) {
    const real *xr = x + r * (size_t)C;
    const real m = row_max(xr, C);
    const double s = row_sum(xr, C, m);
    if (stats) stats[r] = (ce_stats){m, 1 / (real)s};
    const int32_t t = targets[r];
    if (t == ignore_index) return;
    lin[k] += (double)m - (double)xr[t];
    prod[k] *= s;
}

double R(agi_ce_forward_rows_hot)(const real *x, const int32_t *targets, int32_t ignore_index,
                                  int C, size_t r0, size_t r1, ce_stats *stats);
AGI_HOT double R(agi_ce_forward_rows_hot)(const real *x, const int32_t *targets,
                                          int32_t ignore_index, int C, size_t r0, size_t r1,
                                          ce_stats *stats) {
    double lin[LANES], prod[LANES];
    for (int k = 0; k < LANES; k++) lin[k] = 0, prod[k] = 1;
    for (size_t r = r0; r < r1; r++)
        forward_row(x, targets, ignore_index, C, r, (int)((r - r0) % LANES), stats, lin, prod);
    return chunk_loss(lin, prod);
}

double R(agi_ce_forward_rows_portable)(const real *x, const int32_t *targets,
                                       int32_t ignore_index, int C, size_t r0, size_t r1,
                                       ce_stats *stats) {
    return R(agi_ce_forward_rows_hot)(x, targets, ignore_index, C, r0, r1, stats);
}

// One row of the backward: dx += (exp(x - m) / s - [c == t]) g.
AGI_INLINE void backward_row(const real *restrict x, real *restrict dx, int C, int32_t t,
                             ce_stats st, real g) {
    for (int c = 0; c < C; c++) dx[c] += (exp_below(st.m, x[c]) * st.inv_s - (real)(c == t)) * g;
}

// ---- AVX-512: 16 rows of at most 16 classes as 16 lanes ----------------------------------
#ifdef CE_AVX512
#define AVX512 __attribute__((target("avx512f,avx512dq")))

// _mm512_max_ps(a, b) is a > b ? a : b lane by lane (b when either is NaN): exactly the
// portable code's select. agi_exp2f_neg_clamped and agi_exp2f_neg on 16 lanes, operation
// for operation:
AVX512 static inline __m512 exp2f_neg16_clamped(__m512 v) {
    const __m512 cap = _mm512_set1_ps(126.0f), shifter = _mm512_set1_ps(12582912.0f);
    const __m512 w = _mm512_min_ps(cap, v);  // cap < v ? cap : v: a NaN passes
    const __m512 t = _mm512_add_ps(w, shifter), n = _mm512_sub_ps(t, shifter);
    const __m512 f = _mm512_sub_ps(n, w), f2 = _mm512_mul_ps(f, f);
    const __m512 q01 = _mm512_add_ps(_mm512_set1_ps(0.693146977507089f),
                                     _mm512_mul_ps(f, _mm512_set1_ps(0.240222419210299f)));
    const __m512 q23 = _mm512_add_ps(_mm512_set1_ps(0.0555073379518662f),
                                     _mm512_mul_ps(f, _mm512_set1_ps(0.00967152336226525f)));
    const __m512 q4 = _mm512_set1_ps(0.00132647465924993f);
    const __m512 q = _mm512_add_ps(q01, _mm512_mul_ps(f2, _mm512_add_ps(q23, _mm512_mul_ps(f2, q4))));
    const __m512 p = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(f, q));
    const __m512i bits = _mm512_sub_epi32(_mm512_set1_epi32(0x4B400000 + 127), _mm512_castps_si512(t));
    return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(bits, 23)));
}

// The forward's sum takes exp(x - m) = 2^u, u = (x - m) log2(e), in fewer operations than
// the portable code's exp (10 against 16 for 16 logits, and every logit of the forward pays
// one): n = round(u) by vrndscaleps and f = u - n by vreduceps, 2^f by the same polynomial as
// agi_exp2f_neg by Horner's scheme in fused multiply-adds, times 2^n by vscalefps. Nothing is
// clamped: u = -inf gives f = 0 and 2^-inf = 0, a NaN stays a NaN, and below 2^-126 the
// terms are subnormal or 0 where the portable code's are 2^-126, which a sum holding a 1
// cannot tell apart. (u is not x log2(e) - m log2(e) in one fused multiply-subtract: m
// log2(e) rounded is off by up to 2^-10 at m = 1000, an error of 1e-4 in every exp.) A fused
// operation rounds once where the portable code rounds twice, so s can differ from the
// portable s by a few ulps; m cannot (a max is exact).
AVX512 static inline __m512 exp_below_max16(__m512 x, __m512 m) {
    const __m512 u = _mm512_mul_ps(_mm512_sub_ps(x, m), _mm512_set1_ps(LOG2E_F));
    const __m512 n = _mm512_roundscale_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_reduce_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 q = _mm512_fmadd_ps(f, _mm512_set1_ps(0.00132647465924993f), _mm512_set1_ps(0.00967152336226525f));
    q = _mm512_fmadd_ps(f, q, _mm512_set1_ps(0.0555073379518662f));
    q = _mm512_fmadd_ps(f, q, _mm512_set1_ps(0.240222419210299f));
    q = _mm512_fmadd_ps(f, q, _mm512_set1_ps(0.693146977507089f));
    return _mm512_scalef_ps(_mm512_fmadd_ps(f, q, _mm512_set1_ps(1.0f)), n);
}

AVX512 static inline __m512 exp2f_neg16(__m512 v) {
    const __m512 y = exp2f_neg16_clamped(v);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(v, _mm512_set1_ps(126.0f), _CMP_GT_OQ),
                              _mm512_setzero_ps());
}

AVX512 static inline __m256 lo_half(__m512 v) { return _mm512_castps512_ps256(v); }
AVX512 static inline __m256 hi_half(__m512 v) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// Lane k of the result is lane k + half of v (half = 8, 4, 2, 1; the upper lanes are junk).
AVX512 static inline __m512 halves_down(__m512 v, int half) {
    return _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                  _mm512_set1_epi32(half)), v);
}
AVX512 static inline __m512d halves_down_pd(__m512d v, int half) {
    return _mm512_permutexvar_pd(_mm512_add_epi64(_mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7),
                                                  _mm512_set1_epi64(half)), v);
}

// v[k] = row k -> v[c] = column c, in 64 shuffles.
AVX512 static inline void transpose16(__m512 v[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        v[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));      // column 4L of rows i..i+3
        v[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));  // column 4L + 1
        v[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));  // column 4L + 2
        v[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));  // column 4L + 3
    }
    for (int j = 0; j < 4; j++) {  // 128-bit lane L of v[4i + j] is column 4L + j
        const __m512 a = _mm512_shuffle_f32x4(v[j], v[4 + j], 0x44);
        const __m512 b = _mm512_shuffle_f32x4(v[8 + j], v[12 + j], 0x44);
        const __m512 c = _mm512_shuffle_f32x4(v[j], v[4 + j], 0xEE);
        const __m512 d = _mm512_shuffle_f32x4(v[8 + j], v[12 + j], 0xEE);
        t[j] = _mm512_shuffle_f32x4(a, b, 0x88);
        t[4 + j] = _mm512_shuffle_f32x4(a, b, 0xDD);
        t[8 + j] = _mm512_shuffle_f32x4(c, d, 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(c, d, 0xDD);
    }
    for (int c = 0; c < 16; c++) v[c] = t[c];
}

// 16 rows of C <= 16 classes, transposed so that lane k is row r + k: m, s, the stats, and
// the loss lanes. A row is loaded as a whole vector (its lanes past C hold the next rows'
// logits, unused) while that stays below row r1: masked loads that miss the cache are slow
// (bench/README.md). A block's work is a few hundred operations but its max, exps and sum
// are chained; C is a constant in each copy (below), so the loops unroll, the max and the
// sum run as trees of pairs, and the next block's loads and shuffles overlap this block's
// chain.
#define AVX512_INLINE AVX512 static inline __attribute__((always_inline))

AVX512_INLINE void forward_block16(const float *x, const int32_t *targets, int32_t ignore_index,
                                   const int C, size_t r, size_t r1, ce_stats *stats,
                                   __m512d lin[2], __m512d prod[2], const bool whole) {
    const __mmask16 cols = (__mmask16)((1u << C) - 1);
    const size_t end = r1 * (size_t)C;
    __m512 v[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) {
        const size_t o = (r + (size_t)k) * (size_t)C;
        v[k] = whole || o + 16 <= end ? _mm512_loadu_ps(x + o) : _mm512_maskz_loadu_ps(cols, x + o);
    }
    transpose16(v);
    const __m512i t = _mm512_loadu_si512(targets + r);
    const __mmask16 kept = _mm512_cmpneq_epi32_mask(t, _mm512_set1_epi32(ignore_index));
    // x[r + k, t[r + k]] for the kept rows (an ignored row's target is not an index).
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i at = _mm512_add_epi32(_mm512_mullo_epi32(lane, _mm512_set1_epi32(C)), t);
    const __m512 xt = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), kept, at, x + r * (size_t)C, 4);
    __m512 e[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) e[c] = v[c];
#pragma GCC unroll 4
    for (int w = 1; w < C; w *= 2)
#pragma GCC unroll 8
        for (int c = 0; c + w < C; c += 2 * w) e[c] = _mm512_max_ps(e[c + w], e[c]);
    const __m512 m = e[0];
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) {
        e[c] = exp_below_max16(v[c], m);
    }
#pragma GCC unroll 4
    for (int w = 1; w < C; w *= 2)
#pragma GCC unroll 8
        for (int c = 0; c + w < C; c += 2 * w) e[c] = _mm512_add_ps(e[c], e[c + w]);
    const __m512 s = e[0];
    for (int h = 0; h < 2; h++) {
        const __mmask8 kh = (__mmask8)(kept >> (8 * h));
        const __m512d mh = _mm512_cvtps_pd(h ? hi_half(m) : lo_half(m));
        const __m512d xh = _mm512_cvtps_pd(h ? hi_half(xt) : lo_half(xt));
        const __m512d sh = _mm512_cvtps_pd(h ? hi_half(s) : lo_half(s));
        lin[h] = _mm512_mask_add_pd(lin[h], kh, lin[h], _mm512_sub_pd(mh, xh));
        prod[h] = _mm512_mask_mul_pd(prod[h], kh, prod[h], sh);
    }
    if (!stats) return;
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1), s);
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
    float *out = (float *)(stats + r);  // pairs {m, 1 / s}
    _mm512_storeu_ps(out, _mm512_permutex2var_ps(m, first, inv));
    _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(m, second, inv));
}

// The whole blocks of rows [r, r1), for each C from 1 to 16 its own copy; returns the first row
// after them.
#define PREFETCH_BLOCKS 8
typedef size_t (*forward_blocks_fn)(const float *, const int32_t *, int32_t, size_t, size_t,
                                    ce_stats *, __m512d[2], __m512d[2]);
#define FORWARD_BLOCKS(n)                                                                     \
    AVX512 static size_t forward_blocks_##n(const float *x, const int32_t *targets,           \
                                            int32_t ignore_index, size_t r, size_t r1,        \
                                            ce_stats *stats, __m512d lin[2], __m512d prod[2]) { \
        for (; r + 16 <= r1; r += 16) {                                                       \
            for (int l = 0; l < n; l++)                                                       \
                _mm_prefetch((const char *)(x + (r + 16 * PREFETCH_BLOCKS) * n + 16 * l), _MM_HINT_T0); \
            if ((r + 15) * n + 16 <= r1 * n) /* every row's load whole: no test per row */    \
                forward_block16(x, targets, ignore_index, n, r, r1, stats, lin, prod, true);  \
            else                                                                              \
                forward_block16(x, targets, ignore_index, n, r, r1, stats, lin, prod, false); \
        }                                                                                     \
        return r;                                                                             \
    }
FORWARD_BLOCKS(1) FORWARD_BLOCKS(2) FORWARD_BLOCKS(3) FORWARD_BLOCKS(4)
FORWARD_BLOCKS(5) FORWARD_BLOCKS(6) FORWARD_BLOCKS(7) FORWARD_BLOCKS(8)
FORWARD_BLOCKS(9) FORWARD_BLOCKS(10) FORWARD_BLOCKS(11) FORWARD_BLOCKS(12)
FORWARD_BLOCKS(13) FORWARD_BLOCKS(14) FORWARD_BLOCKS(15) FORWARD_BLOCKS(16)
static const forward_blocks_fn forward_blocks[17] = {
    NULL, forward_blocks_1, forward_blocks_2, forward_blocks_3, forward_blocks_4,
    forward_blocks_5, forward_blocks_6, forward_blocks_7, forward_blocks_8, forward_blocks_9,
    forward_blocks_10, forward_blocks_11, forward_blocks_12, forward_blocks_13,
    forward_blocks_14, forward_blocks_15, forward_blocks_16};

// Rows of C > 16 classes along 16 lanes: m as row_max computes it, s in row_sum's lanes and
// groups (its exps by exp_below_max16). The max
// and the sum of a row each end in a chain of dependent steps (the halves); a group of rows
// takes all its maxima first, then all its sums, so that the chains of different rows overlap.
#define WIDE_GROUP 4

AVX512 static float wide_max(const float *x, int C) {
    const int rem = C % 16, c1 = C - rem;
    __m512 mv = _mm512_loadu_ps(x);
    for (int c0 = 16; c0 < c1; c0 += 16) mv = _mm512_max_ps(_mm512_loadu_ps(x + c0), mv);
    if (rem) {
        const __mmask16 tail = (__mmask16)((1u << rem) - 1);
        mv = _mm512_mask_max_ps(mv, tail, _mm512_maskz_loadu_ps(tail, x + c1), mv);
    }
    // Halves as row_max takes them: lane k against lane k + 8, then k + 4, k + 2, k + 1.
    for (int half = 8; half >= 1; half /= 2) mv = _mm512_max_ps(halves_down(mv, half), mv);
    return _mm512_cvtss_f32(mv);
}

AVX512 static double wide_sum(const float *x, int C, float m) {
    const __m512 mm = _mm512_set1_ps(m);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (ptrdiff_t g0 = 0; g0 < C; g0 += GROUP) {  // as row_sum: float lanes by groups
        const ptrdiff_t g1 = C - g0 < GROUP ? C : g0 + GROUP;
        __m512 sf = _mm512_setzero_ps();
        ptrdiff_t c0 = g0;
        for (; c0 + 16 <= g1; c0 += 16)
            sf = _mm512_add_ps(sf, exp_below_max16(_mm512_loadu_ps(x + c0), mm));
        if (c0 < g1) {
            const __mmask16 tail = (__mmask16)((1u << (g1 - c0)) - 1);
            const __m512 v = _mm512_maskz_loadu_ps(tail, x + c0);
            sf = _mm512_mask_add_ps(sf, tail, sf, exp_below_max16(v, mm));
        }
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(lo_half(sf)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(hi_half(sf)));
    }
    // And the sum's halves: lanes k and k + 8 are lo and hi; then k + 4, k + 2, k + 1.
    __m512d sv = _mm512_add_pd(lo, hi);
    for (int half = 4; half >= 1; half /= 2) sv = _mm512_add_pd(sv, halves_down_pd(sv, half));
    return _mm512_cvtsd_f64(sv);
}

AVX512 static double forward_rows_avx512(const float *x, const int32_t *targets,
                                         int32_t ignore_index, int C, size_t r0, size_t r1,
                                         ce_stats *stats) {
    double lin[LANES], prod[LANES];
    for (int k = 0; k < LANES; k++) lin[k] = 0, prod[k] = 1;
    size_t r = r0;
    if (C <= 16) {
        __m512d lv[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
        __m512d pv[2] = {_mm512_set1_pd(1), _mm512_set1_pd(1)};
        r = forward_blocks[C](x, targets, ignore_index, r, r1, stats, lv, pv);
        for (int h = 0; h < 2; h++) _mm512_storeu_pd(lin + 8 * h, lv[h]), _mm512_storeu_pd(prod + 8 * h, pv[h]);
        for (; r < r1; r++)
            forward_row(x, targets, ignore_index, C, r, (int)((r - r0) % LANES), stats, lin, prod);
    } else {
        while (r < r1) {
            const int g = r1 - r < WIDE_GROUP ? (int)(r1 - r) : WIDE_GROUP;
            float m[WIDE_GROUP];
            double s[WIDE_GROUP];
            // The next group's rows, fetched while this group computes.
            const size_t ahead = r + (size_t)g, stop = r1 - ahead < WIDE_GROUP ? r1 : ahead + WIDE_GROUP;
            for (const float *p = x + ahead * (size_t)C; p < x + stop * (size_t)C; p += 16)
                _mm_prefetch((const char *)p, _MM_HINT_T0);
            for (int i = 0; i < g; i++) m[i] = wide_max(x + (r + i) * (size_t)C, C);
            for (int i = 0; i < g; i++) s[i] = wide_sum(x + (r + i) * (size_t)C, C, m[i]);
            for (int i = 0; i < g; i++, r++) {
                if (stats) stats[r] = (ce_stats){m[i], 1 / (float)s[i]};
                const int32_t t = targets[r];
                if (t == ignore_index) continue;
                const int k = (int)((r - r0) % LANES);
                lin[k] += (double)m[i] - (double)x[r * (size_t)C + (size_t)t];
                prod[k] *= s[i];
            }
        }
    }
    return chunk_loss(lin, prod);
}

// Backward of 16 rows of C <= 16 classes, flat: their 16 C logits are C whole vectors, and
// each element's row statistics, target test and kept test come from 16-lane tables by one
// permute (element 16 j + l of the block is row (16 j + l) / C, class (16 j + l) % C). No lane
// idles and nothing is transposed; element by element, the operations of backward_row.
AVX512 static void backward_block16(const float *x, float *dx, const int32_t *targets,
                                    int32_t ignore_index, int C, size_t r,
                                    const ce_stats *stats, float g) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i even = _mm512_add_epi32(lane, lane), odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512 st0 = _mm512_loadu_ps((const float *)(stats + r));  // pairs {m, 1 / s}
    const __m512 st1 = _mm512_loadu_ps((const float *)(stats + r) + 16);
    const __m512 m = _mm512_permutex2var_ps(st0, even, st1), inv = _mm512_permutex2var_ps(st0, odd, st1);
    const __m512i t = _mm512_loadu_si512(targets + r);
    const __m512i kept = _mm512_maskz_set1_epi32(_mm512_cmpneq_epi32_mask(t, _mm512_set1_epi32(ignore_index)), 1);
    const __m512 log2e = _mm512_set1_ps(LOG2E_F), one = _mm512_set1_ps(1.0f), gv = _mm512_set1_ps(g);
    const __m512i cv = _mm512_set1_epi32(C);
    const size_t o = r * (size_t)C;
    __m512i idx = lane;  // 16 j + l
    for (int j = 0; j < C; j++, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16))) {
        // row = idx / C and class = idx % C for idx < 256, by a float division that is exact
        // after truncation (idx and C are small integers).
        const __m512i row = _mm512_cvttps_epi32(_mm512_div_ps(_mm512_cvtepi32_ps(idx), _mm512_cvtepi32_ps(cv)));
        const __m512i cls = _mm512_sub_epi32(idx, _mm512_mullo_epi32(row, cv));
        const __m512i row_kept = _mm512_permutexvar_epi32(row, kept);
        const __mmask16 keep = _mm512_test_epi32_mask(row_kept, row_kept);
        const __mmask16 is_t = _mm512_cmpeq_epi32_mask(cls, _mm512_permutexvar_epi32(row, t));
        const __m512 xv = _mm512_loadu_ps(x + o + 16 * (size_t)j);
        const __m512 e = exp2f_neg16(_mm512_mul_ps(_mm512_sub_ps(_mm512_permutexvar_ps(row, m), xv), log2e));
        const __m512 p = _mm512_mul_ps(e, _mm512_permutexvar_ps(row, inv));
        const __m512 d = _mm512_mul_ps(_mm512_sub_ps(p, _mm512_maskz_mov_ps(is_t, one)), gv);
        const __m512 dxv = _mm512_loadu_ps(dx + o + 16 * (size_t)j);
        _mm512_storeu_ps(dx + o + 16 * (size_t)j, _mm512_mask_add_ps(dxv, keep, dxv, d));
    }
}

AVX512 static void backward_rows_avx512(const float *x, float *dx, const int32_t *targets,
                                        int32_t ignore_index, int C, size_t rows, size_t r0,
                                        size_t r1, const ce_stats *stats, float g) {
    const __mmask16 cols = (__mmask16)((1u << C) - 1);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 log2e = _mm512_set1_ps(LOG2E_F), one = _mm512_set1_ps(1.0f), gv = _mm512_set1_ps(g);
    const size_t end = rows * (size_t)C;
    size_t r = r0;
    for (; r + 16 <= r1; r += 16) backward_block16(x, dx, targets, ignore_index, C, r, stats, g);
    for (; r < r1; r++) {
        const int32_t t = targets[r];
        if (t == ignore_index) continue;
        const size_t o = r * (size_t)C;
        const bool whole = o + 16 <= end;  // whole-vector loads while in bounds (see above)
        const __m512 xv = whole ? _mm512_loadu_ps(x + o) : _mm512_maskz_loadu_ps(cols, x + o);
        const __m512 dxv = whole ? _mm512_loadu_ps(dx + o) : _mm512_maskz_loadu_ps(cols, dx + o);
        const __m512 e = exp2f_neg16(_mm512_mul_ps(_mm512_sub_ps(_mm512_set1_ps(stats[r].m), xv), log2e));
        const __m512 p = _mm512_mul_ps(e, _mm512_set1_ps(stats[r].inv_s));
        const __mmask16 is_t = _mm512_cmpeq_epi32_mask(lane, _mm512_set1_epi32(t));
        const __m512 d = _mm512_mul_ps(_mm512_sub_ps(p, _mm512_maskz_mov_ps(is_t, one)), gv);
        // Only the row's own lanes are stored: the next row may be another thread's.
        _mm512_mask_storeu_ps(dx + o, cols, _mm512_add_ps(dxv, d));
    }
}

static bool have_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}

bool agi_ce_forward_rows_avx512_f32(const float *x, const int32_t *targets,
                                    int32_t ignore_index, int C, size_t r0, size_t r1,
                                    agi_ce_stats_f32 *stats, double *loss) {
    if (!have_avx512()) return false;
    *loss = forward_rows_avx512(x, targets, ignore_index, C, r0, r1, stats);
    return true;
}

bool agi_ce_backward_rows_avx512_f32(const float *x, float *dx, const int32_t *targets,
                                     int32_t ignore_index, int C, size_t rows, size_t r0,
                                     size_t r1, const agi_ce_stats_f32 *stats, float g) {
    if (C > LANES || !have_avx512()) return false;
    backward_rows_avx512(x, dx, targets, ignore_index, C, rows, r0, r1, stats, g);
    return true;
}
#elif !defined(AG_REAL_F64)
bool agi_ce_forward_rows_avx512_f32(const float *x, const int32_t *targets,
                                    int32_t ignore_index, int C, size_t r0, size_t r1,
                                    agi_ce_stats_f32 *stats, double *loss) {
    (void)x, (void)targets, (void)ignore_index, (void)C, (void)r0, (void)r1, (void)stats;
    (void)loss;
    return false;
}

bool agi_ce_backward_rows_avx512_f32(const float *x, float *dx, const int32_t *targets,
                                     int32_t ignore_index, int C, size_t rows, size_t r0,
                                     size_t r1, const agi_ce_stats_f32 *stats, float g) {
    (void)x, (void)dx, (void)targets, (void)ignore_index, (void)C, (void)rows, (void)r0;
    (void)r1, (void)stats, (void)g;
    return false;
}
#endif

// ---- The op ------------------------------------------------------------------------------

typedef struct {
    const real *x;
    const int32_t *targets;
    int32_t ignore_index;
    int C;
    size_t rows;
    ce_stats *stats;  // per row: written by forward when recording, read by backward
    double *part;     // forward: each chunk's part of the summed loss
    real *dx;         // backward only
    real g;           // backward only: dy / N
    bool kept, ignored;  // backward only: whether some rows are kept, some ignored
} ce_job;

static void forward_chunks(size_t begin, size_t end, void *ctx) {
    const ce_job *j = ctx;
    for (size_t ch = begin; ch < end; ch++) {
        const size_t r0 = ch * CHUNK_ROWS, r1 = r0 + CHUNK_ROWS < j->rows ? r0 + CHUNK_ROWS : j->rows;
#ifdef CE_AVX512
        if (agi_ce_forward_rows_avx512_f32(j->x, j->targets, j->ignore_index, j->C, r0, r1,
                                           j->stats, &j->part[ch]))
            continue;
#endif
        j->part[ch] = R(agi_ce_forward_rows_hot)(j->x, j->targets, j->ignore_index, j->C, r0,
                                                 r1, j->stats);
    }
}

void R(agi_ce_backward_rows_hot)(size_t begin, size_t end, void *ctx);
AGI_HOT void R(agi_ce_backward_rows_hot)(size_t begin, size_t end, void *ctx) {
    const ce_job *j = ctx;
    const size_t C = (size_t)j->C;
    for (size_t r = begin; r < end; r++)
        if (j->targets[r] != j->ignore_index)
            backward_row(j->x + r * C, j->dx + r * C, j->C, j->targets[r], j->stats[r], j->g);
}

void R(agi_ce_backward_rows_portable)(const real *x, real *dx, const int32_t *targets,
                                      int32_t ignore_index, int C, size_t rows, size_t r0,
                                      size_t r1, const ce_stats *stats, real g) {
    ce_job j = {x, targets, ignore_index, C, rows, (ce_stats *)stats, NULL, dx, g, true, false};
    R(agi_ce_backward_rows_hot)(r0, r1, &j);
}

// Whether softmax(x) is NaN for a row of C logits.
static bool softmax_nan(const real *x, int C) {
    bool finite = false;
    for (int c = 0; c < C; c++) {
        if (isnan(x[c]) || x[c] == (real)INFINITY) return true;
        finite |= x[c] != -(real)INFINITY;
    }
    return !finite;
}

// The ignored rows of [begin, end) whose gradient is NaN (see the top): their gradient
// gets a NaN added.
static void ignored_rows_nan(const ce_job *j, size_t begin, size_t end) {
    const size_t C = (size_t)j->C;
    for (size_t r = begin; r < end; r++)
        if (j->targets[r] == j->ignore_index && softmax_nan(j->x + r * C, j->C))
            for (size_t c = 0; c < C; c++) j->dx[r * C + c] += (real)NAN;
}

static void backward_rows(size_t begin, size_t end, void *ctx) {
    const ce_job *j = ctx;
    if (j->ignored) ignored_rows_nan(j, begin, end);
    if (!j->kept) return;
#ifdef CE_AVX512
    if (agi_ce_backward_rows_avx512_f32(j->x, j->dx, j->targets, j->ignore_index, j->C,
                                        j->rows, begin, end, j->stats, j->g))
        return;
#endif
    R(agi_ce_backward_rows_hot)(begin, end, ctx);
}

static void cross_entropy_forward(ag_node *n) {
    const cross_entropy_params *p = n->params;
    const ag_tensor *logits = n->in[0];
    ce_job j = {logits->data, p->targets, p->ignore_index, agi_last(logits), agi_rows(logits),
                NULL, NULL, NULL, 0, false, false};
    const size_t chunks = (j.rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    j.part = ag_tape_alloc(n->tape, chunks * sizeof *j.part);
    if (n->recording) n->saved = j.stats = ag_tape_alloc(n->tape, j.rows * sizeof *j.stats);
    // Work: about 20 flop-equivalents per logit, most of it the exp.
    agi_parallel_for(chunks, 20.0 * (double)logits->numel, forward_chunks, &j);
    double total = 0;
    for (size_t ch = 0; ch < chunks; ch++) total += j.part[ch];
    ((real *)n->out->data)[0] = p->kept ? (real)(total / (double)p->kept) : 0;
}

static void cross_entropy_backward(ag_node *n) {
    const cross_entropy_params *p = n->params;
    const ag_tensor *logits = n->in[0];
    if (!logits->grad) return;
    ce_job j = {logits->data, p->targets, p->ignore_index, agi_last(logits), agi_rows(logits),
                n->saved, NULL, logits->grad,
                p->kept ? (real)((double)((const real *)n->out->grad)[0] / (double)p->kept) : 0,
                p->kept > 0, p->kept < agi_rows(logits)};
    agi_parallel_for(j.rows, 20.0 * (double)logits->numel, backward_rows, &j);
}

const ag_op R(agi_cross_entropy_op) = {"cross_entropy", cross_entropy_forward, cross_entropy_backward,
    "dx = dy * (softmax(x) - onehot(target)) / N"};

#if AG_ONCE
ag_tensor *ag_cross_entropy(ag_tape *tp, ag_tensor *logits, const int32_t *targets,
                            size_t n_targets, int32_t ignore_index) {
    size_t kept;
    int32_t *copy = agi_targets_copy("cross_entropy", "logits", logits, tp, targets, n_targets,
                                     ignore_index, &kept);
    if (!copy) return NULL;
    cross_entropy_params p = {copy, ignore_index, kept};
    return ag_op_apply(tp, agi_pick(logits, &agi_cross_entropy_op_f32, &agi_cross_entropy_op_f64),
                    1, &logits, 0, NULL, &p, sizeof p);
}
#endif
