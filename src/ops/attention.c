// Fused scaled-dot-product attention, flash-attention style: the scores are made block
// by block and never stored whole. Three layouts of the same computation:
//   heads apart:  q: [B, h, T, d], k: [B, h, S, d], v: [B, h, S, dv] -> o: [B, h, T, dv]
//   heads inside: q: [B, T, h*d], k: [B, S, h*d], v: [B, S, h*dv] -> o: [B, T, h*dv]
//   packed:       qkv: [B, T, 3*h*d] = [q | k | v] (self-attention) -> o: [B, T, h*d]
//   slice n = b*h + head, query i:  s_j = scale q_i.k_j + b(head, j - i) + add_ij, -inf
//   where masked (b: the position bias, see pos_bias.c),
//   P = softmax(s),  Pd_j = P_j keep_j / (1 - p)  (dropout),  o_i = sum_j Pd_j v_j.
// Gradient, with dO the upstream gradient and dPd = dO V^T:
//   dV = Pd^T dO,  dP_j = dPd_j keep_j / (1 - p),  and the softmax Jacobian gives
//   dS_j = P_j (dP_j - D_i) with D_i = sum_j P_j dP_j = sum_j Pd_j dPd_j = dO_i . o_i:
//   an O(dv) dot product per query instead of a sum over a stored row of S weights. Then
//   dQ = scale dS K,  dK = scale dS^T Q,  d add = dS,  d b(head, r) = sum_{j-i=r} dS_ij.
//
// Forward, per block of queries: for each block of keys, S = scale Q_i K_j^T (gemm), the
// masks, then the online softmax: the running row max m grows to m', the running output
// and row sum l are rescaled by exp(m - m'), and P = exp(s - m') is added in (O += Pd V_j,
// gemm). At the end O /= l, and m and log l are saved, [B, h, T] each (with the scores,
// see below): apart, not as one logsumexp m + log l, which in the real type loses log l
// once |m| is large (an additive mask of -1e9 or finfo.min on every key, or any score
// beyond 2^24 in f32), and exp(s - (m + log l)) would then be 1 for every key of a row.
// One query a slice without a backward (a decode step against a KV cache) takes the
// products as dot products on k and v in place (src/kernels/score_row.h), the rest as
// above: for a few dozen keys the tile products' transposes and packing cost more than
// the arithmetic. Backward walks the same blocks and takes P = exp((s - m) - log l) from
// the scores, which forward kept when they fit (ATTN_KEEP_KEYS; the online softmax copies
// each block as it reads it) and which backward otherwise makes again. A query with no
// visible key gets m = +inf: its P is then exactly 0 everywhere, so its output and all
// its gradients are zero (as ag_softmax's fully masked row). A NaN score (a NaN in q or
// k, or +inf - +inf) makes l, hence the row's output and log l, NaN; backward then gives
// NaN where the composed ops do.
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
// kv slices (b, kv head), since a kv slice's dK and dV gather from all the queries of the
// heads that read it (one head, or with grouped-query attention the h / h_kv heads of its
// group, which read k and v in place: no repeated copies); one thread owns each unit and
// nothing races. Results do not depend on the thread count at all, except
// the gradients of an additive mask shared by slices and of a position table, which sum
// over slices in a fixed order per thread count.
//
// The elementwise passes over score blocks (masks, online softmax, probabilities, score
// gradients) are kernels in src/kernels/score_block.c; the job, its scratch and the slice
// views are in attention_job.c. This file is the computation and the op.
#include <limits.h>
#include <string.h>

#include "attention_job.h"

// The keys a query block [i0, i1) can see at all (agi_scores_keys): blocks of keys
// outside are never read, so with a window W time and memory grow as T * W, not T * S.
static int key_end(const attn_job *J, int i0, int i1, int *begin) {
    int b, e;
    agi_scores_keys(J->mi, J->S, i0, i1, &b, &e);
    if (begin) *begin = b;
    return e;
}

// The kept scores of keys [j0, ...) for query block [i0, ...) of slice n, whose first
// visible key is kbegin; NULL when forward keeps none.
static real *kept_block(const attn_job *J, size_t n, int i0, int j0, int kbegin) {
    if (!J->kept) return NULL;
    const size_t block = ((n * (size_t)J->kept_nqb + (size_t)(i0 / J->bq)) * J->kept_nkb +
                          (size_t)((j0 - kbegin) / J->bk));
    return J->kept + block * J->bq * J->ld;
}

// ---- Forward -----------------------------------------------------------------------------

// Queries [i0, i0 + bq) of slice n (operands x): their output rows and logsumexps.
static void forward_block(const attn_job *J, const slice_view *x, size_t n, int i0,
                          const scratch *sc) {
    const int T = J->T, d = J->d, dv = J->dv, ld = J->ld, ldv = x->ldv, ldo = x->ldo;
    const int bq = T - i0 < J->bq ? T - i0 : J->bq;
    int ldq, ldk;
    const real *Qi = R(agi_attn_queries)(J, sc, x->q, x->ldq, i0, bq, &ldq);
    real *Oi = x->out + (size_t)i0 * ldo;
    // The first block's product writes the output rows (the online softmax reads them only
    // once a row's sum l is positive, after that product); a row that no key reaches is
    // its zero weights times V at the end (zeroed when no block was read). The dot
    // products of one row add into zeros.
    for (int r = 0; r < bq; r++) {
        if (J->row) memset(Oi + (size_t)r * ldo, 0, (size_t)dv * sizeof *Oi);
        sc->m[r] = -INFINITY;
        sc->l[r] = 0;
    }
    if (J->p > 0) R(agi_attn_replay_keep)(J, n, i0, bq, sc->keep);
    int kbegin;
    const int kend = key_end(J, i0, i0 + bq, &kbegin);
    for (ptrdiff_t j0 = kbegin; j0 < kend; j0 += J->bk) {  // past INT_MAX after the last
        const int bk = kend - j0 < J->bk ? (int)(kend - j0) : J->bk;
        const real *Kj = R(agi_attn_keys)(J, sc, x->k, x->ldk, NULL, 0, j0, bk, true, &ldk);
        const real *Vj = x->v + (size_t)j0 * ldv;
        if (J->row)
            R(agi_row_scores)(Qi, Kj, ldk, bk, d, J->scale, sc->s);
        else
            R(agi_attn_product)(J, false, true, bq, bk, d, J->scale, Qi, ldq, Kj, ldk, sc->kt,
                                sc->ldt, 0, sc->s, ld);
        const agi_score_masks mk = R(agi_attn_masks_at)(J, n, i0, j0);
        R(agi_score_mask)(sc->s, ld, bq, bk, &mk);
        R(agi_online_softmax_block)(sc->s, ld, bq, bk, sc->m, sc->l, Oi, ldo, dv,
                                    J->p > 0 ? sc->keep + j0 : NULL, J->S, J->keep_scale,
                                    kept_block(J, n, i0, j0, kbegin));
        if (J->row)
            R(agi_row_weighted_sum)(sc->s, Vj, ldv, bk, dv, Oi);
        else
            R(agi_attn_product)(J, false, false, bq, dv, bk, 1, sc->s, ld, Vj, ldv, NULL, 0,
                                j0 == kbegin ? 0 : 1, Oi, ldo);
    }
    for (int r = 0; r < bq; r++) {
        real *o = Oi + (size_t)r * ldo;
        const double l = sc->l[r];
        if (l != 0) {  // NaN included: a NaN score makes the row NaN
            const real inv = (real)(1.0 / l);
            for (int c = 0; c < dv; c++) o[c] *= inv;
        } else {
            // Every weight 0: o holds 0 * V, NaN where the keys read hold a NaN or an
            // infinite v (as the composed product), else a zero made exactly 0.
            const bool read = kbegin < kend;
            for (int c = 0; c < dv; c++) o[c] = read && o[c] != o[c] ? o[c] : 0;
        }
        if (J->row_max) {
            J->row_max[n * T + (size_t)(i0 + r)] = l != 0 ? sc->m[r] : INFINITY;
            J->row_log_sum[n * T + (size_t)(i0 + r)] = l != 0 ? (real)log(l) : 0;
        }
    }
}

// Staging, for BLAS (the tile kernels read strided rows at full speed). In the
// heads-inside layouts a slice's rows are scattered among the other heads' (a row stride
// of h*d or 3*h*d), and OpenBLAS runs small products markedly slower on strided operands
// (bench/README.md). A slice of one block is therefore copied into the part's scratch,
// computed there, and its results copied (gradients added) back. Longer sequences run in
// place: their products are large and reuse each row many times.
static void forward_slice_staged(const attn_job *J, size_t n, const scratch *sc) {
    const int T = J->T, d = J->d, dv = J->dv, kend = key_end(J, 0, T, NULL);
    const slice_view x = R(agi_attn_view)(J, n);
    slice_view st = {sc->q, sc->k, sc->v, NULL, NULL, sc->o, NULL, NULL, NULL, d, d, dv, dv, 0};
    R(agi_copy_rows)(sc->q, d, x.q, x.ldq, T, d);
    R(agi_copy_rows)(sc->k, d, x.k, x.ldk, kend, d);
    R(agi_copy_rows)(sc->v, dv, x.v, x.ldv, kend, dv);
    forward_block(J, &st, n, 0, sc);
    R(agi_copy_rows)(x.out, x.ldo, sc->o, dv, T, dv);
}

// Fetches rows [0, rows) of width w of an operand (rows ld apart) into the cache.
static void prefetch_rows(const real *x, int ld, int rows, int w) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < w; c += 64 / (int)sizeof(real))
            __builtin_prefetch(x + (size_t)r * ld + c, 0, 2);
}

// Unit u's queries, and when it starts a slice whose keys fit a block, its keys and
// values, asked for while the unit before it computes. In the heads-inside layouts a
// slice's rows are pieces of 64 to 256 bytes, a row stride of 3 E apart, which the
// products would otherwise read first from L3 or memory (README, "MultiheadAttention's
// shares"). A unit of fewer than PREFETCH_MIN_ROWS queries is over too soon for the
// prefetches to pay.
enum { PREFETCH_MIN_ROWS = 64 };
static void prefetch_unit(const attn_job *J, size_t u, size_t blocks) {
    const int i0 = (int)(u % blocks) * J->bq, bq = J->T - i0 < J->bq ? J->T - i0 : J->bq;
    if (bq < PREFETCH_MIN_ROWS) return;
    const slice_view x = R(agi_attn_view)(J, u / blocks);
    prefetch_rows(x.q + (size_t)i0 * x.ldq, x.ldq, bq, J->d);
    int kbegin;
    const int kend = key_end(J, i0, i0 + bq, &kbegin);
    if (i0 == 0 && kend - kbegin <= J->bk) {
        prefetch_rows(x.k + (size_t)kbegin * x.ldk, x.ldk, kend - kbegin, J->d);
        prefetch_rows(x.v + (size_t)kbegin * x.ldv, x.ldv, kend - kbegin, J->dv);
    }
}

// Query blocks are independent, so the forward's unit of work is one (slice, query
// block): part k of P runs units [U k / P, U (k + 1) / P) with scratch k. (Backward's
// unit is a whole slice, whose key and value gradients gather from all its queries.)
static void forward_parts(size_t begin, size_t end, void *ctx) {
    const attn_job *J = ctx;
    const size_t blocks = (size_t)((J->T + J->bq - 1) / J->bq), units = J->slices * blocks;
    for (int part = (int)begin; part < (int)end; part++) {  // of J->parts
        scratch sc = R(agi_attn_scratch_of)(J, part, false);
        size_t lo = units * part / J->parts, hi = units * (part + 1) / J->parts;
        for (size_t u = lo; u < hi; u++) {
            const size_t n = u / blocks;
            if (u + 1 < hi) prefetch_unit(J, u + 1, blocks);
            if (J->stage) {  // one block per slice
                forward_slice_staged(J, n, &sc);
            } else {
                const slice_view x = R(agi_attn_view)(J, n);
                forward_block(J, &x, n, (int)(u % blocks) * J->bq, &sc);
            }
        }
    }
}

// ---- Backward ------------------------------------------------------------------------------

// dS into the additive mask's gradient g (row stride add_at.st), but nothing at the keys
// a boolean mask, key padding, causality or a window masks: the entry there changes
// nothing. dS is 0 there (P = 0) unless the row is NaN (a NaN score or a NaN upstream
// gradient), whose 0 * NaN would put a NaN on it, as PyTorch's masked_fill of key padding
// over attn_mask never does (ag_softmax's backward does the same). P, no longer needed,
// receives the masks.
static void add_mask_grad(const attn_job *J, size_t n, ptrdiff_t i0, ptrdiff_t j0, int bq,
                          int bk, real *P, const real *dS, real *g) {
    const int ld = J->ld;
    agi_score_masks mk = R(agi_attn_masks_at)(J, n, (int)i0, (int)j0);
    mk.add = NULL;
    mk.rel = NULL;
    for (int r = 0; r < bq; r++) memset(P + (size_t)r * ld, 0, (size_t)bk * sizeof *P);
    R(agi_score_mask)(P, ld, bq, bk, &mk);
    const size_t st = J->mi->add_at.st;
    for (int r = 0; r < bq; r++) {
        const real *sr = dS + (size_t)r * ld, *pr = P + (size_t)r * ld;
        real *gr = g + (size_t)r * st;
        for (int c = 0; c < bk; c++)
            if (pr[c] == 0) gr[c] += sr[c];
    }
}

// The gradients of slice n (operands x). Its slices of gq, gk, gv belong to it alone: in
// the heads-inside layouts they are its own column blocks of rows shared with other heads.
// With RoPE the products see rotated q and k, and their gradients are rotated back into
// gq (per query block) and gk (per key block).
static void backward_slice(const attn_job *J, const slice_view *x, size_t n,
                           const scratch *sc, real *gadd, real *grel) {
    const int T = J->T, S = J->S, d = J->d, dv = J->dv, ld = J->ld;
    const int ldq = x->ldq, ldk = x->ldk, ldv = x->ldv, ldo = x->ldo, lddo = x->lddo;
    real *gQ = x->gq, *gK = x->gk, *gV = x->gv;
    const bool need_ds = gQ || gK || gadd || grel;
    for (ptrdiff_t i0 = 0; i0 < T; i0 += J->bq) {  // past INT_MAX after the last block
        const int bq = T - i0 < J->bq ? (int)(T - i0) : J->bq;
        int ldqi, ldkj;
        const real *Qi = R(agi_attn_queries)(J, sc, x->q, ldq, i0, bq, &ldqi);
        const real *dOi = x->dout + (size_t)i0 * lddo;
        const real *mx = J->row_max + n * T + i0, *lsum = J->row_log_sum + n * T + i0;
        real *gQi = J->rope ? sc->gqr : gQ ? gQ + (size_t)i0 * ldq : NULL;
        const int ldgq = J->rope ? d : ldq;
        if (gQ && J->rope) memset(sc->gqr, 0, (size_t)bq * d * sizeof(real));
        R(agi_rows_dot)(dOi, lddo, x->o + (size_t)i0 * ldo, ldo, bq, dv, J->bf16, sc->D);
        if (J->p > 0) R(agi_attn_replay_keep)(J, n, i0, bq, sc->keep);
        // A NaN row's weights are NaN at masked keys too: no key is skipped for its block,
        // whose scores are then all made again (forward kept only the visible keys').
        bool nan_row = false;
        for (int r = 0; r < bq; r++) nan_row |= mx[r] != mx[r] || lsum[r] != lsum[r];
        int kbegin = 0;
        const int kend = nan_row ? S : key_end(J, i0, i0 + bq, &kbegin);
        for (ptrdiff_t j0 = kbegin; j0 < kend; j0 += J->bk) {
            const int bk = kend - j0 < J->bk ? (int)(kend - j0) : J->bk;
            const real *kept = nan_row ? NULL : kept_block(J, n, i0, j0, kbegin);
            const real *Kj =
                R(agi_attn_keys)(J, sc, x->k, ldk, x->v, ldv, j0, bk, !kept, &ldkj);
            const real *Vj = x->v + (size_t)j0 * ldv;
            real *P = sc->s, *dS = sc->dp;
            if (kept) {
                R(agi_probs_block)(kept, P, ld, bq, bk, mx, lsum);
            } else {
                R(agi_attn_product)(J, false, true, bq, bk, d, J->scale, Qi, ldqi, Kj, ldkj,
                                    sc->kt, sc->ldt, 0, P, ld);
                const agi_score_masks mk = R(agi_attn_masks_at)(J, n, i0, j0);
                R(agi_score_mask)(P, ld, bq, bk, &mk);
                R(agi_probs_block)(P, P, ld, bq, bk, mx, lsum);
            }
            if (gV) {  // dV_j += Pd^T dO_i
                const real *Pd = P;
                if (J->p > 0) {
                    R(agi_dropout_block)(P, dS, ld, bq, bk, sc->keep + j0, J->S,
                                        J->keep_scale);
                    Pd = dS;  // until dPd takes its place below
                }
                R(agi_attn_product)(J, true, false, bk, dv, bq, 1, Pd, ld, dOi, lddo, NULL, 0, 1,
                                    gV + (size_t)j0 * ldv, ldv);
            }
            if (!need_ds) continue;
            R(agi_attn_product)(J, false, true, bq, bk, dv, 1, dOi, lddo, Vj, ldv, sc->vt,
                                sc->ldt, 0, dS, ld);  // dPd
            R(agi_dscores_block)(P, dS, ld, bq, bk, sc->D, J->p > 0 ? sc->keep + j0 : NULL,
                                J->S, J->keep_scale);
            if (gadd) {
                real *g = gadd + agi_mask_at(&J->mi->add_at, n, i0) + j0;
                add_mask_grad(J, n, i0, j0, bq, bk, P, dS, g);
            }
            if (grel)  // along the diagonals: score (i, j) is relative position j - i
                R(agi_score_grad_add)(dS, ld, bq, bk, grel + n % (size_t)J->h * (T + S - 1) +
                                      (size_t)(T - 1 + j0 - i0), (size_t)-1);
            if (gQ)  // dQ_i += scale dS K_j
                R(agi_attn_product)(J, false, false, bq, d, bk, J->scale, dS, ld, Kj, ldkj, NULL,
                                    0, 1, gQi, ldgq);
            if (gK && J->rope) {  // dK_j += R_j^T (scale dS^T Q_i)
                R(agi_attn_product)(J, true, false, bk, d, bq, J->scale, dS, ld, Qi, ldqi, NULL,
                                    0, 0, sc->gkr, d);
                R(agi_rope_rows)(J->rope, J->rope_T, j0, d, sc->gkr, d, gK + (size_t)j0 * ldk,
                                 ldk, bk, -1, true);
            } else if (gK) {  // dK_j += scale dS^T Q_i
                R(agi_attn_product)(J, true, false, bk, d, bq, J->scale, dS, ld, Qi, ldqi, NULL,
                                    0, 1, gK + (size_t)j0 * ldk, ldk);
            }
        }
        if (gQ && J->rope)  // dQ_i += R_i^T (the rotated queries' gradient)
            R(agi_rope_rows)(J->rope_q, J->rope_qT, J->rope_q0 + i0, d, sc->gqr, d,
                             gQ + (size_t)i0 * ldq, ldq, bq, -1, true);
    }
}

// Backward on a staged slice (see forward_slice_staged); keys past key_end are seen by
// no query, so they are neither copied nor given gradient. The saved output is read
// in place: only the dot products dO . o use it.
static void backward_slice_staged(const attn_job *J, size_t n, const scratch *sc,
                                  real *gadd, real *grel) {
    const int T = J->T, d = J->d, dv = J->dv, kend = key_end(J, 0, T, NULL);
    const slice_view x = R(agi_attn_view)(J, n);
    slice_view st = {sc->q, sc->k, sc->v, x.o, sc->dout, NULL, x.gq ? sc->gq : NULL,
                     x.gk ? sc->gk : NULL, x.gv ? sc->gv : NULL, d, d, dv, x.ldo, dv};
    R(agi_copy_rows)(sc->q, d, x.q, x.ldq, T, d);
    R(agi_copy_rows)(sc->k, d, x.k, x.ldk, kend, d);
    R(agi_copy_rows)(sc->v, dv, x.v, x.ldv, kend, dv);
    R(agi_copy_rows)(sc->dout, dv, x.dout, x.lddo, T, dv);
    if (st.gq) memset(st.gq, 0, (size_t)T * d * sizeof(real));
    if (st.gk) memset(st.gk, 0, (size_t)kend * d * sizeof(real));
    if (st.gv) memset(st.gv, 0, (size_t)kend * dv * sizeof(real));
    backward_slice(J, &st, n, sc, gadd, grel);
    if (st.gq) R(agi_add_rows)(x.gq, x.ldq, st.gq, d, T, d);
    if (st.gk) R(agi_add_rows)(x.gk, x.ldk, st.gk, d, kend, d);
    if (st.gv) R(agi_add_rows)(x.gv, x.ldv, st.gv, dv, kend, dv);
}

// The keys a slice's backward reads when its operands are worth asking for ahead: a slice
// of one block of at least PREFETCH_MIN_ROWS queries (as the forward's, prefetch_unit);
// -1 when they are not. The same for every slice of a job.
static int backward_prefetch_keys(const attn_job *J) {
    const int S = key_end(J, 0, J->T, NULL);
    return J->T < PREFETCH_MIN_ROWS || J->T > J->bq || S > J->bk ? -1 : S;
}

// Slice n's operands that the products and dO . o read in place (S keys), asked for
// while the slice before it computes.
static void prefetch_slice_backward(const attn_job *J, size_t n, int S) {
    const int T = J->T;
    const slice_view x = R(agi_attn_view)(J, n);
    prefetch_rows(x.dout, x.lddo, T, J->dv);
    prefetch_rows(x.o, x.ldo, T, J->dv);
    prefetch_rows(x.q, x.ldq, T, J->d);
    prefetch_rows(x.k, x.ldk, S, J->d);
    prefetch_rows(x.v, x.ldv, S, J->dv);
}

// Part k of P runs slices [N k / P, N (k + 1) / P) with scratch k.
static void backward_parts(size_t begin, size_t end, void *ctx) {
    const attn_job *J = ctx;
    for (int part = (int)begin; part < (int)end; part++) {  // of J->parts
        scratch sc = R(agi_attn_scratch_of)(J, part, true);
        real *gadd = J->gadd_part ? J->gadd_part[part] : J->gadd;
        real *grel = J->grel_part ? J->grel_part[part] : NULL;
        // Units of work are kv slices: the query heads of one group add into the same
        // dK and dV, so one part runs them all, in order (no race, no copies).
        const size_t units = J->slices / (size_t)J->group;
        const size_t lo = units * part / J->parts * J->group,
                     hi = units * (part + 1) / J->parts * J->group;
        const int ahead = backward_prefetch_keys(J);
        for (size_t n = lo; n < hi; n++) {
            if (ahead >= 0 && n + 1 < hi) prefetch_slice_backward(J, n + 1, ahead);
            if (J->stage) {
                backward_slice_staged(J, n, &sc, gadd, grel);
            } else {
                const slice_view x = R(agi_attn_view)(J, n);
                backward_slice(J, &x, n, &sc, gadd, grel);
            }
        }
    }
}

// ---- The op -------------------------------------------------------------------------------

// Flop-equivalents of one pass over all slices: the products, and ~25 per score for the
// masks, the exponential and the row sums.
static double work_of(const attn_job *J, int products) {
    double keys = J->S * (J->causal ? 0.5 : 1.0);
    if (J->window > 0 && (J->causal ? 1.0 : 2.0) * J->window < keys)
        keys = (J->causal ? 1.0 : 2.0) * J->window;
    double scores = (double)J->slices * J->T * keys;
    return scores * (products * (J->d + J->dv) + 25.0);
}

static void attention_forward(ag_node *node) {
    attn_job J = R(agi_attn_job_of)(node);
    J.out = node->out->data;
    R(agi_attn_tables)(node, &J);  // and, when recording, what backward needs
    R(agi_attn_scratch_alloc)(node->tape, &J, false, J.slices * (size_t)((J.T + J.bq - 1) / J.bq));
    agi_parallel_for((size_t)J.parts, work_of(&J, 2), forward_parts, &J);
}

static void attention_backward(ag_node *node) {
    const attention_params *p = node->params;
    attn_job J = R(agi_attn_job_of)(node);
    J.o = node->out->data;
    J.dout = node->out->grad;
    const attn_saved *sv = node->saved;
    J.row_max = sv->row_max;
    J.row_log_sum = sv->row_log_sum;
    J.kept = sv->kept;
    J.rel = sv->rel;
    J.rope = sv->rope;
    J.rope_q = sv->rope_q;
    J.gq = grad_at(node->in[p->qi], p->q.offset);
    J.gk = grad_at(node->in[p->ki], p->k.offset);
    J.gv = grad_at(node->in[p->vi], p->v.offset);
    J.gadd = p->scores.add >= 0 ? node->in[p->scores.add]->grad : NULL;
    real *gtable = p->scores.table >= 0 ? node->in[p->scores.table]->grad : NULL;
    if (!J.gq && !J.gk && !J.gv && !J.gadd && !gtable) return;
    R(agi_attn_scratch_alloc)(node->tape, &J, true, J.slices / (size_t)J.group);
    // An additive mask shared by slices gathers gradient from several: part 0 adds into
    // it directly, every other part into a zeroed copy, summed in part order afterwards.
    // The position bias gradient goes the same way, every part into its own vector.
    const size_t plane = J.gadd ? node->in[p->scores.add]->numel : 0;
    if (J.gadd && p->scores.add_by_slices && J.parts > 1) {
        J.gadd_part = ag_tape_alloc(node->tape, (size_t)J.parts * sizeof *J.gadd_part);
        J.gadd_part[0] = J.gadd;
        for (int k = 1; k < J.parts; k++) {
            J.gadd_part[k] = ag_tape_alloc(node->tape, plane * sizeof(real));
            memset(J.gadd_part[k], 0, plane * sizeof(real));
        }
    }
    const size_t rels = (size_t)J.h * (J.T + J.S - 1);
    if (gtable) {
        J.grel_part = ag_tape_alloc(node->tape, (size_t)J.parts * sizeof *J.grel_part);
        for (int k = 0; k < J.parts; k++) {
            J.grel_part[k] = ag_tape_alloc(node->tape, rels * sizeof(real));
            memset(J.grel_part[k], 0, rels * sizeof(real));
        }
    }
    agi_parallel_for((size_t)J.parts, work_of(&J, J.kept ? 4 : 5), backward_parts, &J);
    if (J.gadd_part)
        for (int k = 1; k < J.parts; k++)
            for (size_t e = 0; e < plane; e++) J.gadd[e] += J.gadd_part[k][e];
    if (gtable) {
        for (int k = 1; k < J.parts; k++)
            for (size_t e = 0; e < rels; e++) J.grel_part[0][e] += J.grel_part[k][e];
        R(agi_pos_rel_grad)(&p->scores, J.grel_part[0], J.T, J.S, gtable);
    }
}

// One forward and backward for every layout; the packed one has its own name, so that a
// printed tape or profile shows which ran.
const ag_op R(agi_attention_op) = {"attention", attention_forward, attention_backward,
    "dV = Pd^T dO (Pd = dropout(P)); dS = P * (dP - rowsum(dO * O)), dP = dropout(dO V^T); dQ = scale dS K; dK = scale dS^T Q; dadd = dS"};
const ag_op R(agi_attention_packed_op) = {"attention_packed", attention_forward, attention_backward,
    "dV = Pd^T dO (Pd = dropout(P)); dS = P * (dP - rowsum(dO * O)), dP = dropout(dO V^T); dQ = scale dS K; dK = scale dS^T Q; dadd = dS"};

#if AG_ONCE
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
// messages ("q", "qkv"), `operands` describes q and k ("q [2,4,8] and k [2,5,8]"); both
// are formatted only for a message.
static ag_tensor *attention_apply(ag_tape *tp, const char *op, const ag_op *impl,
                                  ag_tensor *in[AG_MAX_INPUTS], int n_in, attention_params *p,
                                  const ag_attention_opts *o, const char *first,
                                  const agi_about *operands, int out_ndim,
                                  const int out_shape[]) {
    const ag_softmax_opts *so = &o->softmax;
    if (!(o->dropout >= 0 && o->dropout <= 1)) {  // also rejects NaN
        ag_error("%s: dropout p must be in [0, 1], got %g; %s %s", op, o->dropout, first,
                 agi_shape(in[0]));
        return NULL;
    }
    const agi_about subject = {first, in[0], NULL, NULL};
    if (!agi_check_softmax_masks(op, so, in[0]->dtype, 4, (int[]){p->B, p->h, p->T, p->S},
                                 p->h, &subject, operands, NULL, in, &n_in, &p->scores))
        return NULL;
    p->recompute = o->recompute_scores;
    p->p = o->training ? o->dropout : 0.0;
    p->seed = o->seed;
    p->site = o->site;
    if (o->rope && !agi_attn_rope_params(op, &o->rope_opts, &subject, p)) return NULL;
    p->products = ag_tape_autocast(tp);
    ag_tensor *y = ag_op_apply(tp, impl, n_in, in, out_ndim, out_shape, p, sizeof *p);
    if (y && o->head_mask) y = ag_head_mask(tp, y, o->head_mask, out_ndim == 4 ? 0 : p->h);
    return y;
}

static bool check_qkv_types(const ag_tensor *q, const ag_tensor *k, const ag_tensor *v) {
    return agi_check_float("attention", "q", q) && agi_check_float("attention", "k", k) &&
           agi_check_float("attention", "v", v) && agi_check_same_dtype("attention", q, k) &&
           agi_check_same_dtype("attention", q, v);
}

// The kv heads opts ask for with h query heads: kv_heads, 0 meaning h, dividing h.
static bool kv_heads_of(const char *op, int kv_heads, int h, const agi_about *operands,
                        int *kvh) {
    *kvh = kv_heads ? kv_heads : h;
    if (kv_heads < 0 || h % *kvh != 0) {
        ag_error("%s: opts kv_heads = %d must divide the %d query heads (0 means %d); %s", op,
                 kv_heads, h, h, agi_about_text(operands));
        return false;
    }
    return true;
}

// q [B, h, T, d], k [B, h_kv, S, d], v [B, h_kv, S, dv]; heads, if given, is h, and h_kv
// is opts kv_heads (0: h).
static bool heads_apart_geometry(const ag_tensor *q, const ag_tensor *k, const ag_tensor *v,
                                 const ag_attention_opts *o, const agi_about *operands,
                                 attention_params *p) {
    if (o->heads != 0 && o->heads != q->shape[1]) {
        ag_error("attention: opts heads = %d, but q %s has %d heads (give 0 or h for "
                 "[B, h, T, d] inputs)",
                 o->heads, agi_shape(q), q->shape[1]);
        return false;
    }
    int kvh;
    if (!kv_heads_of("attention", o->kv_heads, q->shape[1], operands, &kvh)) return false;
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != kvh ||
        v->shape[1] != kvh || k->shape[3] != q->shape[3] || v->shape[2] != k->shape[2]) {
        if (kvh == q->shape[1])
            ag_error("attention: q %s, k %s and v %s must be [B, h, T, d], [B, h, S, d] and "
                     "[B, h, S, dv] with the same B, h, d and S",
                     agi_shape(q), agi_shape(k), agi_shape(v));
        else
            ag_error("attention: q %s, k %s and v %s must be [B, h, T, d], [B, h_kv, S, d] "
                     "and [B, h_kv, S, dv] with the same B, d and S, h_kv = %d (opts kv_heads)",
                     agi_shape(q), agi_shape(k), agi_shape(v), kvh);
        return false;
    }
    p->B = q->shape[0];
    p->h = q->shape[1];
    p->kvh = kvh;
    p->T = q->shape[2];
    p->S = k->shape[2];
    p->d = q->shape[3];
    p->dv = v->shape[3];
    p->q = heads_apart(p->h, p->T, p->d);
    p->k = heads_apart(kvh, p->S, p->d);
    p->v = heads_apart(kvh, p->S, p->dv);
    p->o = heads_apart(p->h, p->T, p->dv);
    return true;
}

// q [B, T, h*d], k [B, S, h_kv*d], v [B, S, h_kv*dv] with h = heads, h_kv = kv_heads.
static bool heads_inside_geometry(const ag_tensor *q, const ag_tensor *k, const ag_tensor *v,
                                  const ag_attention_opts *o, const agi_about *operands,
                                  attention_params *p) {
    const int heads = o->heads;
    if (heads < 1) {
        ag_error("attention: q %s, k %s and v %s are 3-D, [B, T, h*d], [B, S, h*d] and "
                 "[B, S, h*dv]: opts heads must give h >= 1, got %d",
                 agi_shape(q), agi_shape(k), agi_shape(v), heads);
        return false;
    }
    int kvh;
    if (!kv_heads_of("attention", o->kv_heads, heads, operands, &kvh)) return false;
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] ||
        v->shape[1] != k->shape[1] || q->shape[2] % heads ||
        (long long)k->shape[2] * heads != (long long)q->shape[2] * kvh || v->shape[2] % kvh) {
        if (kvh == heads)
            ag_error("attention: q %s, k %s and v %s must be [B, T, h*d], [B, S, h*d] and "
                     "[B, S, h*dv] with the same B, S and h*d, for h = %d heads",
                     agi_shape(q), agi_shape(k), agi_shape(v), heads);
        else
            ag_error("attention: q %s, k %s and v %s must be [B, T, h*d], [B, S, h_kv*d] and "
                     "[B, S, h_kv*dv] with the same B, S and d, for h = %d heads, h_kv = %d",
                     agi_shape(q), agi_shape(k), agi_shape(v), heads, kvh);
        return false;
    }
    // The output's rows hold every query head's dv columns: with grouped kv heads v holds
    // h_kv dv of them, and h dv can pass INT_MAX where v's h_kv dv does not.
    const long long out_cols = (long long)heads * (v->shape[2] / kvh);
    if (out_cols > INT_MAX) {
        ag_error("attention: the output [B, T, h*dv] of q %s, k %s and v %s would have "
                 "%d x %d = %lld columns, more than an extent may be (%d); h_kv = %d",
                 agi_shape(q), agi_shape(k), agi_shape(v), heads, v->shape[2] / kvh, out_cols,
                 INT_MAX, kvh);
        return false;
    }
    p->B = q->shape[0];
    p->h = heads;
    p->kvh = kvh;
    p->T = q->shape[1];
    p->S = k->shape[1];
    p->d = q->shape[2] / heads;
    p->dv = v->shape[2] / kvh;
    p->q = heads_inside(0, p->T, q->shape[2], p->d);
    p->k = heads_inside(0, p->S, k->shape[2], p->d);
    p->v = heads_inside(0, p->S, v->shape[2], p->dv);
    p->o = heads_inside(0, p->T, heads * p->dv, p->dv);
    return true;
}

ag_tensor *ag_attention(ag_tape *tp, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                        const ag_attention_opts *opts) {
    static const ag_attention_opts plain;
    const ag_attention_opts *o = opts ? opts : &plain;
    if (!check_qkv_types(q, k, v)) return NULL;
    attention_params p;
    memset(&p, 0, sizeof p);
    const agi_about operands = {"q", q, "k", k};
    int shape[4];
    if (q->ndim == 4 && k->ndim == 4 && v->ndim == 4) {
        if (!heads_apart_geometry(q, k, v, o, &operands, &p)) return NULL;
        shape[0] = p.B, shape[1] = p.h, shape[2] = p.T, shape[3] = p.dv;
    } else if (q->ndim == 3 && k->ndim == 3 && v->ndim == 3) {
        if (!heads_inside_geometry(q, k, v, o, &operands, &p)) return NULL;
        shape[0] = p.B, shape[1] = p.T, shape[2] = p.h * p.dv;
    } else {
        ag_error("attention: q %s, k %s and v %s must be [B, h, T, d], [B, h, S, d] and "
                 "[B, h, S, dv], or [B, T, h*d], [B, S, h*d] and [B, S, h*dv]",
                 agi_shape(q), agi_shape(k), agi_shape(v));
        return NULL;
    }
    if (o->kv_len < 0 || o->kv_len > p.S) {
        ag_error("attention: kv_len %d must be in [0, %d] (0: all the rows of k %s)",
                 o->kv_len, p.S, agi_shape(k));
        return NULL;
    }
    if (o->kv_len) p.S = o->kv_len;  // k and v keep their layouts: rows beyond go unread
    p.qi = 0, p.ki = 1, p.vi = 2;
    ag_tensor *in[AG_MAX_INPUTS] = {q, k, v};
    return attention_apply(tp, "attention",
                           agi_pick(q, &agi_attention_op_f32, &agi_attention_op_f64), in, 3,
                           &p, o, "q", &operands, q->ndim, shape);
}

ag_tensor *ag_attention_packed(ag_tape *tp, ag_tensor *qkv, const ag_attention_opts *opts) {
    if (!agi_check_float("attention_packed", "qkv", qkv)) return NULL;
    const int h = opts ? opts->heads : 0;
    const agi_about operands = {"qkv", qkv, NULL, NULL};
    int kvh = 0;
    if (h >= 1 && !kv_heads_of("attention_packed", opts->kv_heads, h, &operands, &kvh))
        return NULL;
    const long long per_d = (long long)h + 2LL * kvh;  // columns per unit of d
    if (qkv->ndim != 3 || h < 1 || qkv->shape[2] % per_d != 0) {
        if (kvh == h || h < 1)
            ag_error("attention_packed: qkv %s must be [B, T, 3*h*d] with opts heads = h >= 1, "
                     "got heads = %d",
                     agi_shape(qkv), h);
        else
            ag_error("attention_packed: qkv %s must be [B, T, (h + 2 h_kv) d] with opts heads "
                     "= h = %d and kv_heads = h_kv = %d",
                     agi_shape(qkv), h, kvh);
        return NULL;
    }
    if (opts->kv_len != 0 && opts->kv_len != qkv->shape[1]) {
        ag_error("attention_packed: kv_len %d: the keys are the T = %d rows of qkv %s (give 0)",
                 opts->kv_len, qkv->shape[1], agi_shape(qkv));
        return NULL;
    }
    // q, k and v are the column blocks [0, E), [E, E + Ekv) and [E + Ekv, E + 2 Ekv) of
    // each row, E = h d, Ekv = h_kv d.
    const int W = qkv->shape[2], d = (int)(W / per_d), E = h * d, Ekv = kvh * d;
    attention_params p;
    memset(&p, 0, sizeof p);
    p.B = qkv->shape[0];
    p.h = h;
    p.kvh = kvh;
    p.T = p.S = qkv->shape[1];
    p.d = p.dv = d;
    p.q = heads_inside(0, p.T, W, p.d);
    p.k = heads_inside((size_t)E, p.T, W, p.d);
    p.v = heads_inside((size_t)E + (size_t)Ekv, p.T, W, p.d);
    p.o = heads_inside(0, p.T, E, p.d);
    p.qi = p.ki = p.vi = 0;
    ag_tensor *in[AG_MAX_INPUTS] = {qkv};
    int shape[3] = {p.B, p.T, E};
    return attention_apply(
        tp, "attention_packed",
        agi_pick(qkv, &agi_attention_packed_op_f32, &agi_attention_packed_op_f64), in, 1, &p,
        opts, "qkv", &operands, 3, shape);
}
#endif
