// Fused scaled-dot-product attention, flash-attention style: the scores are made block
// by block and never stored whole. Three layouts of the same computation:
//   heads apart:  q: [B, h, T, d], k: [B, h, S, d], v: [B, h, S, dv] -> o: [B, h, T, dv]
//   heads inside: q: [B, T, h*d], k: [B, S, h*d], v: [B, S, h*dv] -> o: [B, T, h*dv]
//   packed:       qkv: [B, T, 3*h*d] = [q | k | v] (self-attention) -> o: [B, T, h*d]
//   slice n = b*h + head, query i:  s_j = scale q_i.k_j + add_ij (-inf where masked),
//   P = softmax(s),  Pd_j = P_j keep_j / (1 - p)  (dropout),  o_i = sum_j Pd_j v_j.
// Gradient, with dO the upstream gradient and dPd = dO V^T:
//   dV = Pd^T dO,  dP_j = dPd_j keep_j / (1 - p),  and the softmax Jacobian gives
//   dS_j = P_j (dP_j - D_i) with D_i = sum_j P_j dP_j = sum_j Pd_j dPd_j = dO_i . o_i:
//   an O(dv) dot product per query instead of a sum over a stored row of S weights. Then
//   dQ = scale dS K,  dK = scale dS^T Q,  d add = dS.
//
// Forward, per block of queries: for each block of keys, S = scale Q_i K_j^T (gemm), the
// masks, then the online softmax: the running row max m grows to m', the running output
// and row sum l are rescaled by exp(m - m'), and P = exp(s - m') is added in (O += Pd V_j,
// gemm). At the end O /= l, and lse = m + log l is the one thing saved, [B, h, T].
// Backward walks the same blocks and recomputes P = exp(s - lse). A query with no
// visible key gets lse = +inf: its P is then exactly 0 everywhere, so its output and all
// its gradients are zero (as ag_softmax's fully masked row).
//
// Layouts: the slice (b, head) of an operand is a [rows, width] matrix whose rows are ld
// elements apart. Heads apart, it is one contiguous block (ld = width); heads inside, it
// is the column block [head*d, (head+1)*d) of batch b's rows (ld = h*d, or 3*h*d packed,
// where k and v start E and 2E columns in). BLAS takes the row stride as its leading
// dimension, so every layout runs the same code: a model can feed its projections
// ([B, T, E], or one [B, T, 3E] for self-attention) straight in, with no split_heads /
// merge_heads ops (and their tape memory) forward and backward. Only short sequences
// (one block) in the heads-inside layouts copy each slice into scratch while they work
// on it, because small products on strided rows are slow (see forward_slice_staged).
//
// Work is split with agi_parallel_for: forward over (slice, query block), backward over
// slices (b, head), since a slice's dK and dV gather from all its queries; one thread owns
// each unit and nothing races. Results do not depend on the thread count at all, except
// the gradient of a shared [T, S] additive mask, which sums over slices in a fixed order
// per thread count.
#include <string.h>

#include "op.h"

// The elementwise passes over score blocks cost about as much as the products: on x86-64
// they are compiled twice, for AVX2 and for the baseline, and the loader picks one at
// startup (function multiversioning). The functions they call must then be inlined into
// each version, hence INLINE. Results are the same bits either way (the same IEEE
// operations in the same order: the AVX2 version may not use FMA). clang 14 gives
// the resolver of a multiversioned function external linkage even when the function is
// static, so these carry R() names, or the f32 and f64 builds would clash at link time.
// Not under ThreadSanitizer: the loader runs the clones' resolver before the
// sanitizer's runtime is up, and the instrumented resolver crashes.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define AG_NO_CLONES
#endif
#endif
#ifdef __SANITIZE_THREAD__
#define AG_NO_CLONES
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute) && !defined(AG_NO_CLONES)
#if __has_attribute(target_clones) && __has_attribute(always_inline)
#define HOT __attribute__((target_clones("avx2", "default")))
#define INLINE static inline __attribute__((always_inline))
#endif
#endif
#ifndef HOT
#define HOT
#define INLINE static inline
#endif

// Block sizes, by measurement on a 2-core Zen 3 (bench/bench_mha.c): a block of scores
// stays in L2 next to its K, V blocks, and products this size still run near the sgemm
// peak. Short sequences take the whole key range at once (no rescaling at all).
enum { BLOCK_Q = 256, BLOCK_K = 256 };

// Where the slices of one operand live: slice n = b*h + head starts `offset` +
// b * batch + head * head elements into its tensor, and its rows are ld apart. A gradient
// has the layout of its tensor.
typedef struct {
    size_t offset;  // of the operand in its tensor: a column block of a packed qkv
    size_t batch, head;
    int ld;
} operand;

typedef struct {
    int B, h, T, S, d, dv;
    int qi, ki, vi;          // input index of q, k and v (all 0 when packed)
    operand q, k, v, o;      // o: the output
    double scale;  // never 0 (the constructor maps 0 to 1)
    bool causal;
    agi_mask_inputs masks;
    double p;  // dropout probability actually applied: 0 when not training
    uint64_t seed, site;
} attention_params;

// The exponential of the online softmax, where nearly all the non-gemm time goes.
#ifdef AG_REAL_F64
// float64 is the gradient-checking precision: libm's exp, as ag_softmax uses.
INLINE double exp_score(double x) { return exp(x); }
#else
// A float exp the compiler can vectorise (a libm call per score would cost as much as
// the two products together): exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln2 / 2,
// ln 2 split in two so that n ln2_hi is exact, and exp(r) by its Taylor series to r^7
// (truncation 5e-9 relative, below float's rounding). Arguments here are a score minus
// its row max, so <= 0; below -87 (where expf turns denormal) and at -inf the result is
// exactly 0, as a masked score needs.
INLINE float exp_score(float x) {
    float xc = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest integer
    float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
    float e = 1.0f / 5040;
    e = e * r + 1.0f / 720;
    e = e * r + 1.0f / 120;
    e = e * r + 1.0f / 24;
    e = e * r + 1.0f / 6;
    e = e * r + 0.5f;
    e = e * r + 1.0f;
    e = e * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;  // 2^n, n in [-126, 127]
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.0f ? 0.0f : e * two_n;
}
#endif

// Everything one call needs, shared read-only by the threads; per-thread scratch is
// carved out of `scratch` by part.
typedef struct {
    int h, T, S, d, dv;
    size_t slices;  // B * h
    int bq, bk, ld;  // block sizes; ld = row stride of a score block
    real scale;
    bool causal, mask_shared, add_shared;
    const uint8_t *mask, *kpm;
    const real *add;
    double p;  // 0: no dropout
    real keep_scale;  // 1 / (1 - p)
    uint64_t seed, site;
    operand Lq, Lk, Lv, Lo;  // layouts; the pointers below already include the offsets
    bool stage;  // work on contiguous copies of each slice (see forward_slice_staged)
    const real *q, *k, *v, *o, *dout;
    real *out, *lse;
    real *gq, *gk, *gv, *gadd;
    real **gadd_part;  // per part: where a shared additive mask's gradient goes
    int parts;
    unsigned char *scratch;
    size_t part_bytes;
} attn_job;

// One part's scratch: score blocks, per-row statistics, dropout masks of a query block,
// and when staging, contiguous copies of a slice's operands.
typedef struct {
    real *s, *pd, *dp;  // [bq, ld] each (pd and dp only in backward)
    real *m;            // running row max (forward)
    double *l, *D;      // running row sum (forward), dO . o (backward)
    uint8_t *keep;      // [bq, S] keep flags when dropout is on
    real *q, *k, *v, *o, *dout, *gq, *gk, *gv;  // staged slice: [T, d], [S, d], [S, dv],
                                                // [T, dv] (o forward, dout backward),
                                                // gq, gk, gv
} scratch;

static size_t round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

// The layout of one part's scratch (and its size, returned); pointers are filled in when
// `base` is non-NULL.
static size_t scratch_layout(const attn_job *J, bool backward, unsigned char *base,
                             scratch *sc) {
    size_t block = round64((size_t)J->bq * J->ld * sizeof(real));
    size_t rows = round64((size_t)J->bq * sizeof(double));
    size_t keep = J->p > 0 ? round64((size_t)J->bq * J->S) : 0;
    size_t at = 0;
    memset(sc, 0, sizeof *sc);
    if (base) sc->s = (real *)(base + at);
    at += block;
    if (backward) {
        if (base) sc->pd = (real *)(base + at);
        at += J->p > 0 ? block : 0;
        if (base) sc->dp = (real *)(base + at);
        at += block;
        if (base) sc->D = (double *)(base + at);
        at += rows;
    } else {
        if (base) sc->m = (real *)(base + at);
        at += rows;
        if (base) sc->l = (double *)(base + at);
        at += rows;
    }
    if (keep && base) sc->keep = base + at;
    at += keep;
    if (J->stage) {  // one block: T = bq, S = bk
        const size_t q = round64((size_t)J->T * J->d * sizeof(real)),
                     k = round64((size_t)J->S * J->d * sizeof(real)),
                     v = round64((size_t)J->S * J->dv * sizeof(real)),
                     o = round64((size_t)J->T * J->dv * sizeof(real));
        real **parts[] = {&sc->q, &sc->k, &sc->v, backward ? &sc->dout : &sc->o,
                          &sc->gq, &sc->gk, &sc->gv};
        const size_t sizes[] = {q, k, v, o, q, k, v};
        for (int i = 0; i < (backward ? 7 : 4); i++) {
            if (base) *parts[i] = (real *)(base + at);
            at += sizes[i];
        }
    }
    return at;
}

static scratch scratch_of(const attn_job *J, int part, bool backward) {
    scratch sc;
    scratch_layout(J, backward, J->scratch + (size_t)part * J->part_bytes, &sc);
    return sc;
}

// Element offset of slice n = b*h + head in an operand (its base pointer's offset aside).
static size_t slice_at(const operand *x, size_t n, int h) {
    return n / (size_t)h * x->batch + n % (size_t)h * x->head;
}

// One slice's operands as the kernels see them: where each starts, and its row stride.
// In place they point into the tensors; staged, into the part's scratch.
typedef struct {
    const real *q, *k, *v, *o, *dout;  // o, dout: the output and its gradient (backward)
    real *out, *gq, *gk, *gv;          // the output (forward); gradients, NULL if not wanted
    int ldq, ldk, ldv, ldo, lddo;      // gq, gk, gv have the strides of q, k, v; out of o
} slice_view;

static slice_view view_in_place(const attn_job *J, size_t n) {
    const int h = J->h;
    const size_t qa = slice_at(&J->Lq, n, h), ka = slice_at(&J->Lk, n, h),
                 va = slice_at(&J->Lv, n, h), oa = slice_at(&J->Lo, n, h);
    slice_view x;
    x.q = J->q + qa;
    x.k = J->k + ka;
    x.v = J->v + va;
    x.o = J->o ? J->o + oa : NULL;
    x.dout = J->dout ? J->dout + oa : NULL;
    x.out = J->out ? J->out + oa : NULL;
    x.gq = J->gq ? J->gq + qa : NULL;
    x.gk = J->gk ? J->gk + ka : NULL;
    x.gv = J->gv ? J->gv + va : NULL;
    x.ldq = J->Lq.ld;
    x.ldk = J->Lk.ld;
    x.ldv = J->Lv.ld;
    x.ldo = x.lddo = J->Lo.ld;
    return x;
}

// dst[r, :w] = src[r, :w] for `rows` rows of width w, row strides ld_dst and ld_src;
// add_rows adds instead.
static void copy_rows(real *dst, int ld_dst, const real *src, int ld_src, int rows, int w) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * ld_dst, src + (size_t)r * ld_src, (size_t)w * sizeof *dst);
}
static void add_rows(real *dst, int ld_dst, const real *src, int ld_src, int rows, int w) {
    for (int r = 0; r < rows; r++) {
        real *d = dst + (size_t)r * ld_dst;
        const real *s = src + (size_t)r * ld_src;
        for (int c = 0; c < w; c++) d[c] += s[c];
    }
}

// The keys a query block [i0, i1) can see at all: with causality, none beyond i1 - 1.
static int key_end(const attn_job *J, int i1) { return J->causal && i1 < J->S ? i1 : J->S; }

// Row i of slice n of a [T, S] (shared) or [B*h, T, S] mask.
INLINE size_t mask_row(bool shared, size_t n, int T, int i) {
    return shared ? (size_t)i : n * (size_t)T + (size_t)i;
}

// Block rows [i0, i0 + bq) x keys [j0, j0 + bk) of slice n: s (= scale q k^T on entry)
// += the additive mask, and -inf where a mask, the key padding or causality forbids it,
// in ag_softmax's order.
HOT static void R(mask_block)(const attn_job *J, size_t n, int i0, int bq, int j0, int bk,
                              real *s) {
    const int S = J->S;
    const uint8_t *kp = J->kpm ? J->kpm + n / (size_t)J->h * S + j0 : NULL;
    for (int r = 0; r < bq; r++) {
        const int i = i0 + r;
        real *sr = s + (size_t)r * J->ld;
        if (J->add) {
            const real *a = J->add + mask_row(J->add_shared, n, J->T, i) * S + j0;
            for (int c = 0; c < bk; c++) sr[c] += a[c];
        }
        if (J->mask) {
            const uint8_t *m = J->mask + mask_row(J->mask_shared, n, J->T, i) * S + j0;
            for (int c = 0; c < bk; c++) sr[c] = m[c] ? -INFINITY : sr[c];
        }
        if (kp)
            for (int c = 0; c < bk; c++) sr[c] = kp[c] ? -INFINITY : sr[c];
        if (J->causal)
            for (int c = i + 1 - j0 > 0 ? i + 1 - j0 : 0; c < bk; c++) sr[c] = -INFINITY;
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

// a . b over n elements, in double with fixed partial sums.
static double dot(const real *a, const real *b, int n) {
    double acc[4] = {0};
    int c = 0;
    for (; c + 4 <= n; c += 4)
        for (int u = 0; u < 4; u++) acc[u] += (double)a[c + u] * b[c + u];
    for (; c < n; c++) acc[0] += (double)a[c] * b[c];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// The keep flags of rows [i0, i0 + bq) of slice n, replayed as ag_dropout draws them on
// the weights [B, h, T, S].
static void replay_keep(const attn_job *J, size_t n, int i0, int bq, uint8_t *keep) {
    for (int r = 0; r < bq; r++)
        ag_dropout_row_mask(J->seed, J->site, J->p, n * (size_t)J->T + (size_t)(i0 + r), J->S,
                            keep + (size_t)r * J->S);
}

// ---- Forward -----------------------------------------------------------------------------

// The online-softmax step for a block of scores sc->s (bq queries by bk keys from key j0):
// raise each row's running max m to m', scale its running sum l and its output row in Oi
// ([bq, dv], rows ldo apart) by exp(m - m'), and turn the scores into exp(s - m') (times
// keep / (1 - p) with dropout), ready for Oi += s V_j.
HOT static void R(online_softmax_block)(const attn_job *J, const scratch *sc, int j0, int bq,
                                        int bk, real *Oi, int ldo) {
    const int dv = J->dv;
    for (int r = 0; r < bq; r++) {
        real *sr = sc->s + (size_t)r * J->ld;
        const real mx = row_max(sr, bk), m_old = sc->m[r];
        const real m_new = mx > m_old ? mx : m_old;
        if (m_new == -INFINITY) {  // nothing visible to this query yet
            for (int c = 0; c < bk; c++) sr[c] = 0;
            continue;
        }
        if (m_new != m_old && sc->l[r] > 0) {  // rescale what earlier blocks added
            const real corr = exp_score(m_old - m_new);
            sc->l[r] *= corr;
            real *o = Oi + (size_t)r * ldo;
            for (int c = 0; c < dv; c++) o[c] *= corr;
        }
        sc->m[r] = m_new;
        sc->l[r] += exp_sum(sr, bk, m_new);
        if (J->p > 0) {
            const uint8_t *kp = sc->keep + (size_t)r * J->S + j0;
            for (int c = 0; c < bk; c++) sr[c] *= (real)kp[c] * J->keep_scale;
        }
    }
}

// Queries [i0, i0 + bq) of slice n (operands x): their output rows and logsumexps.
static void forward_block(const attn_job *J, const slice_view *x, size_t n, int i0,
                          const scratch *sc) {
    const int T = J->T, d = J->d, dv = J->dv, ld = J->ld;
    const int ldq = x->ldq, ldk = x->ldk, ldv = x->ldv, ldo = x->ldo;
    const int bq = T - i0 < J->bq ? T - i0 : J->bq;
    const real *Qi = x->q + (size_t)i0 * ldq, *K = x->k, *V = x->v;
    real *Oi = x->out + (size_t)i0 * ldo;
    for (int r = 0; r < bq; r++) {
        memset(Oi + (size_t)r * ldo, 0, (size_t)dv * sizeof *Oi);
        sc->m[r] = -INFINITY;
        sc->l[r] = 0;
    }
    if (J->p > 0) replay_keep(J, n, i0, bq, sc->keep);
    const int kend = key_end(J, i0 + bq);
    for (int j0 = 0; j0 < kend; j0 += J->bk) {
        const int bk = kend - j0 < J->bk ? kend - j0 : J->bk;
        R(agi_gemm)(false, true, bq, bk, d, J->scale, Qi, ldq, K + (size_t)j0 * ldk, ldk, 0,
                    sc->s, ld);
        R(mask_block)(J, n, i0, bq, j0, bk, sc->s);
        R(online_softmax_block)(J, sc, j0, bq, bk, Oi, ldo);
        R(agi_gemm)(false, false, bq, dv, bk, 1, sc->s, ld, V + (size_t)j0 * ldv, ldv, 1, Oi,
                    ldo);
    }
    for (int r = 0; r < bq; r++) {
        real *o = Oi + (size_t)r * ldo;
        const double l = sc->l[r];
        if (l > 0) {
            const real inv = (real)(1.0 / l);
            for (int c = 0; c < dv; c++) o[c] *= inv;
        } else {
            for (int c = 0; c < dv; c++) o[c] = 0;  // exactly, whatever V holds
        }
        if (J->lse) J->lse[n * T + (size_t)(i0 + r)] = l > 0 ? sc->m[r] + (real)log(l) : INFINITY;
    }
}

// Staging. In the heads-inside layouts a slice's rows are scattered among the other
// heads' (a row stride of h*d or 3*h*d). On short sequences every product is small, and
// OpenBLAS then runs markedly slower on strided operands than on contiguous ones (B = 64,
// T = S = 32, h = 4, d = 16 on Zen 3: the products 15-55% slower, the whole op ~28%). A
// slice of one block is therefore staged: its operands are copied into the part's
// scratch, the kernels run there, and the results are copied (gradients added) back.
// That recovers about half of the difference (the first touch of the scattered rows
// remains). Longer sequences run in place: their products are large and reuse each row
// many times.
static void forward_slice_staged(const attn_job *J, size_t n, const scratch *sc) {
    const int T = J->T, d = J->d, dv = J->dv, kend = key_end(J, T);
    const slice_view x = view_in_place(J, n);
    slice_view st = {sc->q, sc->k, sc->v, NULL, NULL, sc->o, NULL, NULL, NULL, d, d, dv, dv, 0};
    copy_rows(sc->q, d, x.q, x.ldq, T, d);
    copy_rows(sc->k, d, x.k, x.ldk, kend, d);
    copy_rows(sc->v, dv, x.v, x.ldv, kend, dv);
    forward_block(J, &st, n, 0, sc);
    copy_rows(x.out, x.ldo, sc->o, dv, T, dv);
}

// Query blocks are independent, so the forward's unit of work is one (slice, query
// block): part k of P runs units [U k / P, U (k + 1) / P) with scratch k. (Backward's
// unit is a whole slice, whose key and value gradients gather from all its queries.)
static void forward_parts(int begin, int end, void *ctx) {
    const attn_job *J = ctx;
    const size_t blocks = (size_t)((J->T + J->bq - 1) / J->bq), units = J->slices * blocks;
    for (int part = begin; part < end; part++) {
        scratch sc = scratch_of(J, part, false);
        size_t lo = units * part / J->parts, hi = units * (part + 1) / J->parts;
        for (size_t u = lo; u < hi; u++) {
            const size_t n = u / blocks;
            if (J->stage) {  // one block per slice
                forward_slice_staged(J, n, &sc);
            } else {
                const slice_view x = view_in_place(J, n);
                forward_block(J, &x, n, (int)(u % blocks) * J->bq, &sc);
            }
        }
    }
}

// ---- Backward ------------------------------------------------------------------------------

// P = exp(s - lse), row by row: the forward's probabilities, recomputed.
HOT static void R(probs_block)(const attn_job *J, const real *lse, int bq, int bk,
                               real *P) {
    for (int r = 0; r < bq; r++) {
        real *pr = P + (size_t)r * J->ld;
        const real sub = lse[r];
        for (int c = 0; c < bk; c++) pr[c] = exp_score(pr[c] - sub);
    }
}

// Pd = P keep / (1 - p): the weights after dropout.
HOT static void R(dropout_block)(const attn_job *J, const scratch *sc, int j0, int bq, int bk,
                                 const real *P, real *Pd) {
    for (int r = 0; r < bq; r++) {
        const uint8_t *kp = sc->keep + (size_t)r * J->S + j0;
        const real *pr = P + (size_t)r * J->ld;
        real *dr = Pd + (size_t)r * J->ld;
        for (int c = 0; c < bk; c++) dr[c] = pr[c] * ((real)kp[c] * J->keep_scale);
    }
}

// dS = P (dP - D) in place of dPd = dO_i V_j^T, where dP = dPd keep / (1 - p) is the
// gradient of the weights before dropout.
HOT static void R(dscores_block)(const attn_job *J, const scratch *sc, int j0, int bq, int bk,
                                 const real *P, real *dS) {
    for (int r = 0; r < bq; r++) {
        const real *pr = P + (size_t)r * J->ld;
        real *sr = dS + (size_t)r * J->ld;
        const real D = (real)sc->D[r];
        if (J->p > 0) {
            const uint8_t *kp = sc->keep + (size_t)r * J->S + j0;
            for (int c = 0; c < bk; c++)
                sr[c] = pr[c] * (sr[c] * ((real)kp[c] * J->keep_scale) - D);
        } else {
            for (int c = 0; c < bk; c++) sr[c] = pr[c] * (sr[c] - D);
        }
    }
}

// The gradients of slice n (operands x). Its slices of gq, gk, gv belong to it alone: in
// the heads-inside layouts they are its own column blocks of rows shared with other heads.
static void backward_slice(const attn_job *J, const slice_view *x, size_t n,
                           const scratch *sc, real *gadd) {
    const int T = J->T, S = J->S, d = J->d, dv = J->dv, ld = J->ld;
    const int ldq = x->ldq, ldk = x->ldk, ldv = x->ldv, ldo = x->ldo, lddo = x->lddo;
    const real *Q = x->q, *K = x->k, *V = x->v, *O = x->o, *dO = x->dout;
    real *gQ = x->gq, *gK = x->gk, *gV = x->gv;
    const bool need_ds = gQ || gK || gadd;
    for (int i0 = 0; i0 < T; i0 += J->bq) {
        const int bq = T - i0 < J->bq ? T - i0 : J->bq;
        const real *Qi = Q + (size_t)i0 * ldq, *dOi = dO + (size_t)i0 * lddo;
        const real *lse = J->lse + n * T + i0;
        for (int r = 0; r < bq; r++)
            sc->D[r] = dot(dOi + (size_t)r * lddo, O + (size_t)(i0 + r) * ldo, dv);
        if (J->p > 0) replay_keep(J, n, i0, bq, sc->keep);
        const int kend = key_end(J, i0 + bq);
        for (int j0 = 0; j0 < kend; j0 += J->bk) {
            const int bk = kend - j0 < J->bk ? kend - j0 : J->bk;
            const real *Kj = K + (size_t)j0 * ldk, *Vj = V + (size_t)j0 * ldv;
            real *P = sc->s, *dS = sc->dp;
            R(agi_gemm)(false, true, bq, bk, d, J->scale, Qi, ldq, Kj, ldk, 0, P, ld);
            R(mask_block)(J, n, i0, bq, j0, bk, P);
            R(probs_block)(J, lse, bq, bk, P);
            if (gV) {  // dV_j += Pd^T dO_i
                const real *Pd = P;
                if (J->p > 0) {
                    R(dropout_block)(J, sc, j0, bq, bk, P, sc->pd);
                    Pd = sc->pd;
                }
                R(agi_gemm)(true, false, bk, dv, bq, 1, Pd, ld, dOi, lddo, 1,
                            gV + (size_t)j0 * ldv, ldv);
            }
            if (!need_ds) continue;
            R(agi_gemm)(false, true, bq, bk, dv, 1, dOi, lddo, Vj, ldv, 0, dS, ld);  // dPd
            R(dscores_block)(J, sc, j0, bq, bk, P, dS);
            if (gadd)
                for (int r = 0; r < bq; r++) {
                    const real *sr = dS + (size_t)r * ld;
                    real *ga = gadd + mask_row(J->add_shared, n, T, i0 + r) * S + j0;
                    for (int c = 0; c < bk; c++) ga[c] += sr[c];
                }
            if (gQ)  // dQ_i += scale dS K_j
                R(agi_gemm)(false, false, bq, d, bk, J->scale, dS, ld, Kj, ldk, 1,
                            gQ + (size_t)i0 * ldq, ldq);
            if (gK)  // dK_j += scale dS^T Q_i
                R(agi_gemm)(true, false, bk, d, bq, J->scale, dS, ld, Qi, ldq, 1,
                            gK + (size_t)j0 * ldk, ldk);
        }
    }
}

// Backward on a staged slice (see forward_slice_staged); keys past key_end are seen by
// no query, so they are neither copied nor given gradient. The saved output is read
// in place: only the dot products dO . o use it.
static void backward_slice_staged(const attn_job *J, size_t n, const scratch *sc,
                                  real *gadd) {
    const int T = J->T, d = J->d, dv = J->dv, kend = key_end(J, T);
    const slice_view x = view_in_place(J, n);
    slice_view st = {sc->q, sc->k, sc->v, x.o, sc->dout, NULL, x.gq ? sc->gq : NULL,
                     x.gk ? sc->gk : NULL, x.gv ? sc->gv : NULL, d, d, dv, x.ldo, dv};
    copy_rows(sc->q, d, x.q, x.ldq, T, d);
    copy_rows(sc->k, d, x.k, x.ldk, kend, d);
    copy_rows(sc->v, dv, x.v, x.ldv, kend, dv);
    copy_rows(sc->dout, dv, x.dout, x.lddo, T, dv);
    if (st.gq) memset(st.gq, 0, (size_t)T * d * sizeof(real));
    if (st.gk) memset(st.gk, 0, (size_t)kend * d * sizeof(real));
    if (st.gv) memset(st.gv, 0, (size_t)kend * dv * sizeof(real));
    backward_slice(J, &st, n, sc, gadd);
    if (st.gq) add_rows(x.gq, x.ldq, st.gq, d, T, d);
    if (st.gk) add_rows(x.gk, x.ldk, st.gk, d, kend, d);
    if (st.gv) add_rows(x.gv, x.ldv, st.gv, dv, kend, dv);
}

// Part k of P runs slices [N k / P, N (k + 1) / P) with scratch k.
static void backward_parts(int begin, int end, void *ctx) {
    const attn_job *J = ctx;
    for (int part = begin; part < end; part++) {
        scratch sc = scratch_of(J, part, true);
        real *gadd = J->gadd_part ? J->gadd_part[part] : J->gadd;
        size_t lo = J->slices * part / J->parts, hi = J->slices * (part + 1) / J->parts;
        for (size_t n = lo; n < hi; n++) {
            if (J->stage) {
                backward_slice_staged(J, n, &sc, gadd);
            } else {
                const slice_view x = view_in_place(J, n);
                backward_slice(J, &x, n, &sc, gadd);
            }
        }
    }
}

// ---- The op -------------------------------------------------------------------------------

// The operand at `offset` in a tensor's data or gradient (NULL without one).
static const real *data_at(const ag_tensor *t, size_t offset) {
    return (const real *)t->data + offset;
}
static real *grad_at(const ag_tensor *t, size_t offset) {
    return t->grad ? (real *)t->grad + offset : NULL;
}

static attn_job job_of(const ag_node *node) {
    const attention_params *p = node->params;
    attn_job J;
    memset(&J, 0, sizeof J);
    J.h = p->h;
    J.T = p->T;
    J.S = p->S;
    J.d = p->d;
    J.dv = p->dv;
    J.slices = (size_t)p->B * (size_t)p->h;
    J.bq = J.T < BLOCK_Q ? J.T : BLOCK_Q;
    J.bk = J.S < BLOCK_K ? J.S : BLOCK_K;
    J.ld = (J.bk + 15) / 16 * 16;  // 64-byte rows in float
    J.scale = (real)p->scale;
    J.causal = p->causal;
    J.mask_shared = p->masks.mask_shared;
    J.add_shared = p->masks.add_shared;
    if (p->masks.mask >= 0) J.mask = node->in[p->masks.mask]->data;
    if (p->masks.add >= 0) J.add = node->in[p->masks.add]->data;
    if (p->masks.kpm >= 0) J.kpm = node->in[p->masks.kpm]->data;
    J.p = p->p;
    J.keep_scale = p->p > 0 && p->p < 1 ? (real)(1.0 / (1.0 - p->p)) : 1;
    J.seed = p->seed;
    J.site = p->site;
    J.Lq = p->q;
    J.Lk = p->k;
    J.Lv = p->v;
    J.Lo = p->o;
    const bool strided = J.Lq.ld != J.d || J.Lk.ld != J.d || J.Lv.ld != J.dv || J.Lo.ld != J.dv;
    J.stage = strided && J.T <= BLOCK_Q && J.S <= BLOCK_K;
    J.q = data_at(node->in[p->qi], p->q.offset);
    J.k = data_at(node->in[p->ki], p->k.offset);
    J.v = data_at(node->in[p->vi], p->v.offset);
    return J;
}

// Flop-equivalents of one pass over all slices: the products, and ~25 per score for the
// masks, the exponential and the row sums.
static double work_of(const attn_job *J, int products) {
    double scores = (double)J->slices * J->T * J->S * (J->causal ? 0.5 : 1.0);
    return scores * (products * (J->d + J->dv) + 25.0);
}

// Scratch for each part: one part per thread, or one per unit of work when there are
// fewer units than threads.
static void scratch_alloc(ag_tape *tp, attn_job *J, bool backward, size_t units) {
    const int threads = ag_get_num_threads();
    J->parts = units < (size_t)threads ? (int)units : threads;
    scratch unused;
    J->part_bytes = scratch_layout(J, backward, NULL, &unused);
    J->scratch = ag_tape_alloc(tp, (size_t)J->parts * J->part_bytes);
}

static void attention_forward(ag_node *node) {
    const attention_params *p = node->params;
    attn_job J = job_of(node);
    J.out = node->out->data;
    if (p->p >= 1) {  // dropout keeps nothing: zeros, and no gradient to any input
        memset(J.out, 0, node->out->numel * sizeof(real));
        return;
    }
    if (node->recording) {
        J.lse = ag_tape_alloc(node->tape, J.slices * J.T * sizeof(real));
        node->saved = J.lse;
    }
    scratch_alloc(node->tape, &J, false, J.slices * (size_t)((J.T + J.bq - 1) / J.bq));
    agi_parallel_for(J.parts, work_of(&J, 2), forward_parts, &J);
}

static void attention_backward(ag_node *node) {
    const attention_params *p = node->params;
    if (p->p >= 1) return;
    attn_job J = job_of(node);
    J.o = node->out->data;
    J.dout = node->out->grad;
    J.lse = node->saved;
    J.gq = grad_at(node->in[p->qi], p->q.offset);
    J.gk = grad_at(node->in[p->ki], p->k.offset);
    J.gv = grad_at(node->in[p->vi], p->v.offset);
    J.gadd = p->masks.add >= 0 ? node->in[p->masks.add]->grad : NULL;
    if (!J.gq && !J.gk && !J.gv && !J.gadd) return;
    scratch_alloc(node->tape, &J, true, J.slices);
    // A shared [T, S] additive mask gathers gradient from every slice: part 0 adds into
    // it directly, every other part into a zeroed copy, summed in part order afterwards.
    const size_t plane = (size_t)J.T * J.S;
    if (J.gadd && J.add_shared && J.parts > 1) {
        J.gadd_part = ag_tape_alloc(node->tape, (size_t)J.parts * sizeof *J.gadd_part);
        J.gadd_part[0] = J.gadd;
        for (int k = 1; k < J.parts; k++) {
            J.gadd_part[k] = ag_tape_alloc(node->tape, plane * sizeof(real));
            memset(J.gadd_part[k], 0, plane * sizeof(real));
        }
    }
    agi_parallel_for(J.parts, work_of(&J, 5), backward_parts, &J);
    if (J.gadd_part)
        for (int k = 1; k < J.parts; k++)
            for (size_t e = 0; e < plane; e++) J.gadd[e] += J.gadd_part[k][e];
}

// One forward and backward for every layout; the packed one has its own name, so that a
// printed tape or profile shows which ran.
const ag_op R(agi_attention_op) = {"attention", attention_forward, attention_backward,
    "dV = Pd^T dO (Pd = dropout(P)); dS = P * (dP - rowsum(dO * O)), dP = dropout(dO V^T); dQ = scale dS K; dK = scale dS^T Q; dadd = dS"};
const ag_op R(agi_attention_packed_op) = {"attention_packed", attention_forward, attention_backward,
    "dV = Pd^T dO (Pd = dropout(P)); dS = P * (dP - rowsum(dO * O)), dP = dropout(dO V^T); dQ = scale dS K; dK = scale dS^T Q; dadd = dS"};

#if AG_ONCE
extern const ag_op agi_attention_op_f32, agi_attention_op_f64;
extern const ag_op agi_attention_packed_op_f32, agi_attention_packed_op_f64;

// Heads apart, [B, h, rows, width]: the slices one after another.
static operand heads_apart(int h, int rows, int width) {
    operand x = {0, (size_t)h * rows * width, (size_t)rows * width, width};
    return x;
}

// Heads inside the last dim, [B, rows, ld]: head j is the column block of width `width`
// at offset + j*width.
static operand heads_inside(size_t offset, int rows, int ld, int width) {
    operand x = {offset, (size_t)rows * ld, (size_t)width, ld};
    return x;
}

// Checks the options against the geometry in *p (which they complete), appends the masks
// to the inputs in[0, n_in) and records the node. `first` names the first input for
// messages ("q", "qkv"), `operands` describes q and k ("q [2,4,8] and k [2,5,8]").
static ag_tensor *attention_apply(ag_tape *tp, const char *op, const ag_op *impl,
                                  ag_tensor *in[AG_MAX_INPUTS], int n_in, attention_params *p,
                                  const ag_attention_opts *o, const char *first,
                                  const char *operands, int out_ndim, const int out_shape[]) {
    const ag_softmax_opts *so = &o->softmax;
    if (!(o->dropout >= 0 && o->dropout <= 1)) {  // also rejects NaN
        ag_error("%s: dropout p must be in [0, 1], got %g; %s %s", op, o->dropout, first,
                 agi_shape(in[0]));
        return NULL;
    }
    char subject[80];
    snprintf(subject, sizeof subject, "%s %s", first, agi_shape(in[0]));
    if (!agi_check_softmax_masks(op, so, in[0]->dtype, 4, (int[]){p->B, p->h, p->T, p->S},
                                 subject, operands, in, &n_in, &p->masks))
        return NULL;
    p->scale = so->scale == 0 ? 1.0 : so->scale;
    p->causal = so->causal;
    p->p = o->training ? o->dropout : 0.0;
    p->seed = o->seed;
    p->site = o->site;
    return ag_apply(tp, impl, n_in, in, out_ndim, out_shape, p, sizeof *p);
}

static bool check_qkv_types(const ag_tensor *q, const ag_tensor *k, const ag_tensor *v) {
    return agi_check_float("attention", "q", q) && agi_check_float("attention", "k", k) &&
           agi_check_float("attention", "v", v) && agi_check_same_dtype("attention", q, k) &&
           agi_check_same_dtype("attention", q, v);
}

// q [B, h, T, d], k [B, h, S, d], v [B, h, S, dv]; heads, if given, is h.
static bool heads_apart_geometry(const ag_tensor *q, const ag_tensor *k, const ag_tensor *v,
                                 int heads, attention_params *p) {
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] ||
        k->shape[1] != q->shape[1] || v->shape[1] != q->shape[1] ||
        k->shape[3] != q->shape[3] || v->shape[2] != k->shape[2]) {
        ag_error("attention: q %s, k %s and v %s must be [B, h, T, d], [B, h, S, d] and "
                 "[B, h, S, dv] with the same B, h, d and S",
                 agi_shape(q), agi_shape(k), agi_shape(v));
        return false;
    }
    if (heads != 0 && heads != q->shape[1]) {
        ag_error("attention: opts heads = %d, but q %s has %d heads (give 0 or h for "
                 "[B, h, T, d] inputs)",
                 heads, agi_shape(q), q->shape[1]);
        return false;
    }
    p->B = q->shape[0];
    p->h = q->shape[1];
    p->T = q->shape[2];
    p->S = k->shape[2];
    p->d = q->shape[3];
    p->dv = v->shape[3];
    p->q = heads_apart(p->h, p->T, p->d);
    p->k = heads_apart(p->h, p->S, p->d);
    p->v = heads_apart(p->h, p->S, p->dv);
    p->o = heads_apart(p->h, p->T, p->dv);
    return true;
}

// q [B, T, h*d], k [B, S, h*d], v [B, S, h*dv] with h = heads.
static bool heads_inside_geometry(const ag_tensor *q, const ag_tensor *k, const ag_tensor *v,
                                  int heads, attention_params *p) {
    if (heads < 1) {
        ag_error("attention: q %s, k %s and v %s are 3-D, [B, T, h*d], [B, S, h*d] and "
                 "[B, S, h*dv]: opts heads must give h >= 1, got %d",
                 agi_shape(q), agi_shape(k), agi_shape(v), heads);
        return false;
    }
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] ||
        v->shape[1] != k->shape[1] || k->shape[2] != q->shape[2] || q->shape[2] % heads ||
        v->shape[2] % heads) {
        ag_error("attention: q %s, k %s and v %s must be [B, T, h*d], [B, S, h*d] and "
                 "[B, S, h*dv] with the same B, S and h*d, for h = %d heads",
                 agi_shape(q), agi_shape(k), agi_shape(v), heads);
        return false;
    }
    p->B = q->shape[0];
    p->h = heads;
    p->T = q->shape[1];
    p->S = k->shape[1];
    p->d = q->shape[2] / heads;
    p->dv = v->shape[2] / heads;
    p->q = heads_inside(0, p->T, q->shape[2], p->d);
    p->k = heads_inside(0, p->S, k->shape[2], p->d);
    p->v = heads_inside(0, p->S, v->shape[2], p->dv);
    p->o = heads_inside(0, p->T, v->shape[2], p->dv);
    return true;
}

ag_tensor *ag_attention(ag_tape *tp, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                        const ag_attention_opts *opts) {
    static const ag_attention_opts plain;
    const ag_attention_opts *o = opts ? opts : &plain;
    if (!check_qkv_types(q, k, v)) return NULL;
    attention_params p;
    memset(&p, 0, sizeof p);
    int shape[4];
    if (q->ndim == 4 && k->ndim == 4 && v->ndim == 4) {
        if (!heads_apart_geometry(q, k, v, o->heads, &p)) return NULL;
        shape[0] = p.B, shape[1] = p.h, shape[2] = p.T, shape[3] = p.dv;
    } else if (q->ndim == 3 && k->ndim == 3 && v->ndim == 3) {
        if (!heads_inside_geometry(q, k, v, o->heads, &p)) return NULL;
        shape[0] = p.B, shape[1] = p.T, shape[2] = p.h * p.dv;
    } else {
        ag_error("attention: q %s, k %s and v %s must be [B, h, T, d], [B, h, S, d] and "
                 "[B, h, S, dv], or [B, T, h*d], [B, S, h*d] and [B, S, h*dv]",
                 agi_shape(q), agi_shape(k), agi_shape(v));
        return NULL;
    }
    p.qi = 0, p.ki = 1, p.vi = 2;
    ag_tensor *in[AG_MAX_INPUTS] = {q, k, v};
    char operands[160];
    snprintf(operands, sizeof operands, "q %s and k %s", agi_shape(q), agi_shape(k));
    return attention_apply(tp, "attention",
                           agi_pick(q, &agi_attention_op_f32, &agi_attention_op_f64), in, 3,
                           &p, o, "q", operands, q->ndim, shape);
}

ag_tensor *ag_attention_packed(ag_tape *tp, ag_tensor *qkv, const ag_attention_opts *opts) {
    if (!agi_check_float("attention_packed", "qkv", qkv)) return NULL;
    const int h = opts ? opts->heads : 0;
    if (qkv->ndim != 3 || h < 1 || qkv->shape[2] % (3 * h) != 0) {
        ag_error("attention_packed: qkv %s must be [B, T, 3*h*d] with opts heads = h >= 1, "
                 "got heads = %d",
                 agi_shape(qkv), h);
        return NULL;
    }
    // q, k and v are the column blocks [0, E), [E, 2E) and [2E, 3E) of each row.
    const int W = qkv->shape[2], E = W / 3;
    attention_params p;
    memset(&p, 0, sizeof p);
    p.B = qkv->shape[0];
    p.h = h;
    p.T = p.S = qkv->shape[1];
    p.d = p.dv = E / h;
    p.q = heads_inside(0, p.T, W, p.d);
    p.k = heads_inside((size_t)E, p.T, W, p.d);
    p.v = heads_inside(2 * (size_t)E, p.T, W, p.d);
    p.o = heads_inside(0, p.T, E, p.d);
    p.qi = p.ki = p.vi = 0;
    ag_tensor *in[AG_MAX_INPUTS] = {qkv};
    char operands[80];
    snprintf(operands, sizeof operands, "qkv %s", agi_shape(qkv));
    int shape[3] = {p.B, p.T, E};
    return attention_apply(
        tp, "attention_packed",
        agi_pick(qkv, &agi_attention_packed_op_f32, &agi_attention_packed_op_f64), in, 1, &p,
        opts, "qkv", operands, 3, shape);
}
#endif
