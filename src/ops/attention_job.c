// The plumbing of fused attention: jobs, scratch, slice views (see attention_job.h).
#include "attention_job.h"

#include <string.h>

static size_t round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

// The row stride of a block of n columns: 64-byte rows in float, and not a multiple of
// 64 reals, whose rows would all fall in a few sets of the L1 cache (a product reading a
// column of a 256-wide block, or its rows one after another, then misses on every line).
static int block_ld(int n) {
    const int ld = (n + 15) / 16 * 16;
    return ld % 64 == 0 ? ld + 16 : ld;
}

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
    real **blocks[] = {&sc->kt, &sc->vt, &sc->qr, &sc->kr, &sc->gqr, &sc->gkr};
    sc->ldt = block_ld(J->bk);
    const size_t sizes[] = {J->tiles ? (size_t)J->d * sc->ldt : 0,
                            J->tiles && backward ? (size_t)J->dv * sc->ldt : 0,
                            J->rope ? (size_t)J->bq * J->d : 0,
                            J->rope ? (size_t)J->bk * J->d : 0,
                            J->rope && backward ? (size_t)J->bq * J->d : 0,
                            J->rope && backward ? (size_t)J->bk * J->d : 0};
    for (int i = 0; i < 6; i++) {
        if (base && sizes[i]) *blocks[i] = (real *)(base + at);
        at += round64(sizes[i] * sizeof(real));
    }
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

scratch R(agi_attn_scratch_of)(const attn_job *J, int part, bool backward) {
    scratch sc;
    scratch_layout(J, backward, J->scratch + (size_t)part * J->part_bytes, &sc);
    return sc;
}

// Element offset of slice n = b*h + head in an operand (its base pointer's offset aside);
// of k and v (group > 1) the slice of kv head head / group.
static size_t slice_at(const operand *x, size_t n, int h, int group) {
    return n / (size_t)h * x->batch + n % (size_t)h / (size_t)group * x->head;
}

slice_view R(agi_attn_view)(const attn_job *J, size_t n) {
    const int h = J->h, g = J->group;
    const size_t qa = slice_at(&J->Lq, n, h, 1), ka = slice_at(&J->Lk, n, h, g),
                 va = slice_at(&J->Lv, n, h, g), oa = slice_at(&J->Lo, n, h, 1);
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
void R(agi_copy_rows)(real *dst, int ld_dst, const real *src, int ld_src, int rows, int w) {
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * ld_dst, src + (size_t)r * ld_src, (size_t)w * sizeof *dst);
}
void R(agi_add_rows)(real *dst, int ld_dst, const real *src, int ld_src, int rows, int w) {
    for (int r = 0; r < rows; r++) {
        real *d = dst + (size_t)r * ld_dst;
        const real *s = src + (size_t)r * ld_src;
        for (int c = 0; c < w; c++) d[c] += s[c];
    }
}

// The masks of block rows [i0, ...) x keys [j0, ...) of slice n, for agi_score_mask.
agi_score_masks R(agi_attn_masks_at)(const attn_job *J, size_t n, int i0, int j0) {
    const agi_scores *mi = J->mi;
    agi_score_masks m;
    memset(&m, 0, sizeof m);
    if (J->rel)
        m.rel = J->rel + n % (size_t)J->h * (size_t)(J->T + J->S - 1) +
                (size_t)(J->T - 1 + j0 - i0);
    if (J->add) {
        m.add = J->add + agi_mask_at(&mi->add_at, n, i0) + j0;
        m.add_ld = mi->add_at.st;
    }
    if (J->mask) {
        m.mask = J->mask + agi_mask_at(&mi->mask_at, n, i0) + j0;
        m.mask_ld = mi->mask_at.st;
    }
    if (J->kpm) m.kpm = J->kpm + agi_mask_at(&mi->kpm_at, n, i0) + j0;
    m.keeps = mi->keeps;
    m.causal = J->causal;
    m.causal_first = J->q_offset + i0 + 1 - j0;
    if (J->window > 0) {  // clamped: beyond [-bq, bk] every row masks all or nothing
        const long long first = (long long)J->q_offset + i0 + 1 - j0,
                        lo = first - J->window, hi = first - 1 + J->window;
        m.window = true;
        m.window_lo = lo < -J->bq ? -J->bq : lo > J->bk ? J->bk : (int)lo;
        m.window_hi = hi < -J->bq ? -J->bq : hi > J->bk ? J->bk : (int)hi;
    }
    return m;
}

void R(agi_attn_tables)(ag_node *node, attn_job *J) {
    const agi_scores *mi = J->mi;
    const attention_params *p = node->params;
    if (mi->pos.kind != AG_POS_NONE) {
        real *rel = ag_tape_alloc(node->tape, (size_t)J->h * (J->T + J->S - 1) * sizeof *rel);
        R(agi_pos_rel_fill)(mi, mi->table >= 0 ? node->in[mi->table]->data : NULL, J->T, J->S,
                            rel);
        J->rel = rel;
    }
    if (p->rope) {
        J->rope = R(agi_rope_table)(node->tape, p->rope_base, p->rope_offset, J->rope_T, J->d);
        J->rope_q = !J->rope_q_apart ? J->rope
                                     : R(agi_rope_table)(node->tape, p->rope_base,
                                                         (long long)p->rope_offset + J->q_offset,
                                                         J->T, J->d);
    }
    if (node->recording) {
        attn_saved *sv = ag_tape_alloc(node->tape, sizeof *sv);
        sv->row_max = J->row_max = ag_tape_alloc(node->tape, J->slices * J->T * sizeof(real));
        sv->row_log_sum = J->row_log_sum =
            ag_tape_alloc(node->tape, J->slices * J->T * sizeof(real));
        sv->rel = J->rel;
        sv->rope = J->rope;
        sv->rope_q = J->rope_q;
        // A block per (slice, query block, key block), whole: their count and size are
        // bounded by T, S and the block sizes, and the product against the limit is
        // computed in double, so that no size_t product overflows.
        const double bytes = (double)J->slices * J->kept_nqb * J->kept_nkb * J->bq * J->ld *
                             sizeof(real);
        J->kept = NULL;
        if (!p->recompute && !J->row && J->S > 0 && J->S <= ATTN_KEEP_KEYS &&
            bytes <= ATTN_KEEP_BYTES)
            J->kept = ag_tape_alloc(node->tape, (size_t)bytes);
        sv->kept = J->kept;
        node->saved = sv;
    }
}

void R(agi_attn_product)(const attn_job *J, bool ta, bool tb, int M, int N, int K, real alpha,
                         const real *A, int lda, const real *B, int ldb, const real *Bt,
                         int ldbt, real beta, real *C, int ldc) {
    if (J->bf16)
        R(agi_gemm_autocast)(AG_AUTOCAST_BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, NULL,
                             C, ldc);
#ifndef AG_REAL_F64
    // The blocks' own kernel, on one thread: inside the job's parts always; a product the
    // pool would split (one part, several threads) goes to the tile kernels.
    else if (J->tiles && K <= AGI_BLOCK_PRODUCT_MAX_K &&
             agi_parallel_threads(2.0 * M * N * K) == 1)
        agi_block_product_f32(ta, M, N, K, alpha, A, lda, tb ? Bt : B, tb ? ldbt : ldb, beta, C,
                              ldc);
#endif
    else if (J->tiles)
        R(agi_tile_gemm)(ta, false, M, N, K, alpha, A, lda, tb ? Bt : B, tb ? ldbt : ldb, beta,
                         C, ldc, NULL);
    else
        R(agi_gemm)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Rows [r0, r0 + rows) of x (ld ldx) as the products take them: in place, or with RoPE
// rotated by rows t0, t0 + 1, ... of the table cs (of T rows) into dst (ld d).
static const real *R(rows_at)(const attn_job *J, const real *cs, int T, real *dst,
                              const real *x, int ldx, int r0, int t0, int rows, int *ld) {
    const real *X = x + (size_t)r0 * ldx;
    *ld = ldx;
    if (J->rope) {
        R(agi_rope_rows)(cs, T, t0, J->d, X, ldx, dst, J->d, rows, 1, false);
        X = dst;
        *ld = J->d;
    }
    return X;
}

const real *R(agi_attn_queries)(const attn_job *J, const scratch *sc, const real *q, int ldq,
                                int i0, int bq, int *ld) {
    return R(rows_at)(J, J->rope_q, J->rope_qT, sc->qr, q, ldq, i0, J->rope_q0 + i0, bq, ld);
}

const real *R(agi_attn_keys)(const attn_job *J, const scratch *sc, const real *k, int ldk,
                             const real *v, int ldv, int j0, int bk, bool kt, int *ld) {
    const real *Kj = R(rows_at)(J, J->rope, J->rope_T, sc->kr, k, ldk, j0, j0, bk, ld);
    if (J->tiles && !J->bf16 && !J->row) {  // the bf16 packing reads k in place
        if (kt) R(agi_transpose)(sc->kt, sc->ldt, Kj, *ld, bk, J->d);
        if (v) R(agi_transpose)(sc->vt, sc->ldt, v + (size_t)j0 * ldv, ldv, bk, J->dv);
    }
    return Kj;
}


// The keep flags of rows [i0, i0 + bq) of slice n, replayed as ag_dropout draws them on
// the weights [B, h, T, S].
void R(agi_attn_replay_keep)(const attn_job *J, size_t n, int i0, int bq, uint8_t *keep) {
    agi_dropout_keep_rows(&J->drop, n * (size_t)J->T + (size_t)i0, bq, keep, (size_t)J->S);
}

attn_job R(agi_attn_job_of)(const ag_node *node) {
    const attention_params *p = node->params;
    attn_job J;
    memset(&J, 0, sizeof J);
    J.h = p->h;
    J.T = p->T;
    J.S = p->S;
    J.d = p->d;
    J.dv = p->dv;
    J.group = p->h / p->kvh;
    J.slices = (size_t)p->B * (size_t)p->h;
    J.bq = J.T < BLOCK_Q ? J.T : BLOCK_Q;
    J.bk = J.S < BLOCK_K ? J.S : BLOCK_K;
    J.ld = block_ld(J.bk);
    J.kept_nqb = J.bq > 0 ? agi_tiles(J.T, J.bq) : 0;
    J.kept_nkb = J.bk > 0 ? agi_tiles(J.S, J.bk) : 0;
    J.scale = (real)p->scores.scale;
    J.causal = p->scores.causal;
    J.q_offset = p->scores.q_offset;
    J.window = p->scores.window;
    J.mi = &p->scores;
    if (p->scores.mask >= 0) J.mask = node->in[p->scores.mask]->data;
    if (p->scores.add >= 0) J.add = node->in[p->scores.add]->data;
    if (p->scores.kpm >= 0) J.kpm = node->in[p->scores.kpm]->data;
    J.p = p->p;
    J.keep_scale = p->p > 0 && p->p < 1 ? (real)(1.0 / (1.0 - p->p)) : 1;
    J.seed = p->seed;
    J.site = p->site;
    if (J.p > 0) agi_dropout_plan_make(&J.drop, J.seed, J.site, J.p, J.S);
    // The keys' positions, and the queries' among them when they fall within: else the
    // queries have their own table, so that its size follows T and S, never q_offset.
    J.rope_T = J.S > 0 ? J.S : 1;
    J.rope_q_apart = J.q_offset > J.rope_T - J.T;
    J.rope_qT = J.rope_q_apart ? J.T : J.rope_T;
    J.rope_q0 = J.rope_q_apart ? 0 : J.q_offset;
    J.Lq = p->q;
    J.Lk = p->k;
    J.Lv = p->v;
    J.Lo = p->o;
    const bool strided = J.Lq.ld != J.d || J.Lk.ld != J.d || J.Lv.ld != J.dv || J.Lo.ld != J.dv;
    J.tiles = agi_tile_gemm_available();
    J.bf16 = p->products == AG_AUTOCAST_BF16 && node->out->dtype == AG_F32;
    // One row: decoding, where a step's attention is a few hundred flop per head and the
    // tile products' transposes and packing cost more. Only without a backward, so that
    // backward's recomputed scores are those the forward normalised.
    J.row = J.T == 1 && !node->recording && J.p == 0 && !J.bf16;
    J.stage = !J.row && !J.tiles && strided && J.T <= BLOCK_Q && J.S <= BLOCK_K;
    J.q = data_at(node->in[p->qi], p->q.offset);
    J.k = data_at(node->in[p->ki], p->k.offset);
    J.v = data_at(node->in[p->vi], p->v.offset);
    return J;
}

// Scratch for each part: as many parts as the pool makes slices (AGI_SLICES_PER_THREAD a
// thread, so that one thread can take over the end of another's share when that one starts
// late or runs slow), or one per unit of work when there are fewer units.
void R(agi_attn_scratch_alloc)(ag_tape *tp, attn_job *J, bool backward, size_t units) {
    scratch unused;
    J->part_bytes = scratch_layout(J, backward, NULL, &unused);
    const int threads = ag_threads();
    const int cap = threads > 1 ? threads * AGI_SLICES_PER_THREAD : 1;
    J->parts = units < (size_t)cap ? (int)units : cap;
    J->scratch = ag_tape_alloc(tp, (size_t)J->parts * J->part_bytes);
}

#if AG_ONCE
bool agi_attn_rope_params(const char *op, const ag_rope_opts *o, const agi_about *subject,
                          attention_params *p) {
    const double base = o->base == 0 ? 10000.0 : o->base;
    if (p->d % 2 != 0 || !(base > 0 && isfinite(base)) || o->pos_offset < 0) {
        ag_error("%s: rope needs an even head width d, base > 0 and pos_offset >= 0, got d = "
                 "%d, base %g and pos_offset %d; %s",
                 op, p->d, o->base, o->pos_offset, agi_about_text(subject));
        return false;
    }
    p->rope = true;
    p->rope_base = base;
    p->rope_offset = o->pos_offset;
    return true;
}
#endif
