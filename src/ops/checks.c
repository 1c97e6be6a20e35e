// Input checks shared by the op constructors.
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "op.h"

bool agi_check_float_failed(const char *op, const char *what, const ag_tensor *t) {
    if (!t)
        ag_error("%s: %s is NULL", op, what);
    else
        ag_error("%s: %s %s must be f32 or f64, not %s", op, what, agi_shape(t),
                 ag_dtype_name(t->dtype));
    return false;
}

bool agi_check_same_dtype_failed(const char *op, const ag_tensor *a, const ag_tensor *b) {
    ag_error("%s: dtypes differ: %s %s and %s %s", op, ag_dtype_name(a->dtype), agi_shape(a),
             ag_dtype_name(b->dtype), agi_shape(b));
    return false;
}

bool agi_check_same_shape(const char *op, const ag_tensor *a, const ag_tensor *b) {
    if (ag_tensor_same_shape(a, b)) return true;
    ag_error("%s: shapes differ: %s and %s", op, agi_shape(a), agi_shape(b));
    return false;
}

// Copy and check are one pass over the targets, without branches, so that it vectorises:
// a loss over many short rows (11 classes in the copy task) has as many targets as a tenth
// of its logits, and a separate serial check and copy took a third of its forward.
enum { TARGET_CHUNK = 16384 };

typedef struct {
    const int32_t *src;
    int32_t *dst;
    size_t rows;
    int32_t ignore_index;
    uint32_t C;
    uint32_t *kept, *bad;  // per chunk
} targets_job;

static void copy_targets(size_t begin, size_t end, void *ctx) {
    const targets_job *j = ctx;
    for (size_t ch = begin; ch < end; ch++) {
        const size_t r0 = ch * TARGET_CHUNK;
        const size_t r1 = r0 + TARGET_CHUNK < j->rows ? r0 + TARGET_CHUNK : j->rows;
        uint32_t kept = 0, bad = 0;
        for (size_t r = r0; r < r1; r++) {
            const int32_t t = j->src[r];
            const uint32_t counted = t != j->ignore_index;
            j->dst[r] = t;
            kept += counted;
            bad |= counted & ((uint32_t)t >= j->C);
        }
        j->kept[ch] = kept;
        j->bad[ch] = bad;
    }
}

int32_t *agi_targets_copy(const char *op, const char *what, const ag_tensor *x, ag_tape *tp,
                          const int32_t *targets, size_t n_targets, int32_t ignore_index,
                          size_t *kept) {
    char dims[64];
    snprintf(dims, sizeof dims, "%s [..., C]", what);
    if (!agi_given(tp, op, "tape") || !agi_check_float(op, what, x) ||
        !agi_check_ndim(op, dims, x, 1, AG_MAX_DIMS))
        return NULL;
    const size_t rows = agi_rows(x);
    const int C = agi_last(x);
    if (!targets) {
        ag_error("%s: targets is NULL (%s %s, %zu targets expected)", op, what, agi_shape(x),
                 rows);
        return NULL;
    }
    if (n_targets != rows) {
        ag_error("%s: %zu targets for %s %s, which has %zu rows", op, n_targets, what,
                 agi_shape(x), rows);
        return NULL;
    }
    const size_t chunks = (rows + TARGET_CHUNK - 1) / TARGET_CHUNK;
    int32_t *copy = ag_tape_alloc(tp, rows * sizeof *copy);
    uint32_t *counts = ag_tape_alloc(tp, 2 * chunks * sizeof *counts);
    targets_job j = {targets, copy, rows, ignore_index, (uint32_t)C, counts, counts + chunks};
    // About one flop-equivalent per byte moved, as a memory pass.
    agi_parallel_for(chunks, 8.0 * (double)rows, copy_targets, &j);
    *kept = 0;
    bool bad = false;
    for (size_t ch = 0; ch < chunks; ch++) *kept += j.kept[ch], bad |= j.bad[ch] != 0;
    if (!bad) return copy;
    for (size_t r = 0;; r++)  // the first bad one, for the message
        if (targets[r] != ignore_index && (targets[r] < 0 || targets[r] >= C)) {
            ag_error("%s: target %d at position %zu is out of range for %d classes "
                     "(%s %s, ignore_index %d)",
                     op, (int)targets[r], r, C, what, agi_shape(x), (int)ignore_index);
            return NULL;
        }
}

bool agi_check_ndim_failed(const char *op, const char *what, const ag_tensor *t, int lo,
                           int hi) {
    if (lo == hi)
        ag_error("%s: %s must have %d dimensions, got %s", op, what, lo, agi_shape(t));
    else
        ag_error("%s: %s must have %d to %d dimensions, got %s", op, what, lo, hi,
                 agi_shape(t));
    return false;
}

bool agi_check_trailing(const char *op, const ag_tensor *a, const ag_tensor *b) {
    bool ok = b->ndim <= a->ndim;
    for (int i = 0; ok && i < b->ndim; i++)
        ok = b->shape[b->ndim - 1 - i] == a->shape[a->ndim - 1 - i];
    if (!ok)
        ag_error("%s: shape %s does not broadcast over %s (it must equal a trailing part of it)",
                 op, agi_shape(b), agi_shape(a));
    return ok;
}

// A module pads a bool mask itself (add_bias_kv) before any op reads it, and took a mask
// without data for no mask at all: every mask is refused here first, as an op's input is.
static bool mask_has_data(const char *op, const char *what, const ag_tensor *m) {
    if (m->data) return true;
    ag_error("%s: %s %s has no data (a gradient view no backward has reached)", op, what,
             agi_shape(m));
    return false;
}

static bool mask_is_bool(const char *op, const char *what, const ag_tensor *m, bool keeps) {
    if (!mask_has_data(op, what, m)) return false;
    if (m->dtype == AG_BOOL) return true;
    ag_error("%s: %s %s must be bool (true = %s), not %s", op, what, agi_shape(m),
             keeps ? "may attend" : "masked", ag_dtype_name(m->dtype));
    return false;
}

// Scores [..., T, S] as [na, nb, T, S].
static void scores_view(int ndim, const int sh[], int view[4]) {
    view[0] = ndim == 4 ? sh[0] : 1;
    view[1] = ndim == 4 ? sh[1] : ndim == 3 ? sh[0] : 1;
    view[2] = sh[ndim - 2];
    view[3] = sh[ndim - 1];
}

// Where mask m lies over the scores [..., T, S] (seen as [na, nb, T, S]), the one rule of
// mask shapes for every op and module. Its last dim is S. A mask of 1, 2 or 4 dims (at
// most the scores' own) lines up with the scores from the right, each dim equal or 1
// (numpy broadcasting: [S], [T, S], [1, S], [B, 1, T, S], [1, h, T, S], ...). A mask of 3
// dims is one [T, S] plane per slice, as nn.MultiheadAttention takes it: [N, T, S] for the
// N slices of the scores (B*h of [B, h, T, S], slice b*h + head; 1 of [T, S]), its first
// dim N or 1 and its second T or 1. So the first dim of a 3-D mask is never read as h
// alone, or B: a per-head mask is [1, h, T, S], a per-batch one [B, 1, T, S].
static bool mask_fits(const char *op, const char *what, const ag_tensor *m,
                      const ag_tensor *scores, agi_mask_layout *l) {
    int v[4];
    scores_view(scores->ndim, scores->shape, v);
    const int T = v[2], S = v[3];
    const size_t N = (size_t)v[0] * (size_t)v[1];
    const bool planes = m->ndim == 3;
    bool fits = m->ndim >= 1 && (m->ndim <= scores->ndim || planes) &&
                m->shape[m->ndim - 1] == S;
    size_t st[4] = {0, 0, 0, 0};
    if (fits && planes) {
        const int mt = m->shape[1];
        fits = ((size_t)m->shape[0] == N || m->shape[0] == 1) && (mt == T || mt == 1);
        if (fits && m->shape[0] > 1)  // slice n at n mt S = (n / nb) nb mt S + (n % nb) mt S
            st[0] = (size_t)v[1] * mt * S, st[1] = (size_t)mt * S;
        if (fits && mt > 1) st[2] = (size_t)S;
    } else if (fits) {  // mask dim k lines up with view dim 4 - m->ndim + k
        for (int k = 0; fits && k < m->ndim; k++) {
            int sd = scores->shape[scores->ndim - m->ndim + k];
            fits = m->shape[k] == sd || m->shape[k] == 1;
        }
        size_t stride = 1;
        for (int k = m->ndim - 1; fits && k >= 0; k--) {
            if (m->shape[k] > 1) st[4 - m->ndim + k] = stride;
            stride *= (size_t)m->shape[k];
        }
    }
    if (!fits && planes && scores->ndim == 4) {
        ag_error("%s: %s %s does not match scores %s (a 3-D mask is one [T, S] plane per "
                 "slice b*h + head: [%zu,%d,%d], or 1 for all; per head give [1,%d,%d,%d], "
                 "per batch [%d,1,%d,%d])",
                 op, what, agi_shape(m), agi_shape(scores), N, T, S, v[1], T, S, v[0], T, S);
        return false;
    }
    if (!fits) {
        ag_error("%s: %s %s does not match scores %s (expected [%d,%d], [%zu,%d,%d] or a shape "
                 "that broadcasts to %s)",
                 op, what, agi_shape(m), agi_shape(scores), T, S, N, T, S, agi_shape(scores));
        return false;
    }
    l->sa = st[0], l->sb = st[1], l->st = st[2], l->nb = v[1];
    return true;
}

bool agi_check_softmax_masks(const char *op, const ag_softmax_opts *o, ag_dtype dt, int ndim,
                             const int scores_shape[], int heads, const agi_about *subject,
                             const agi_about *operands, const agi_mask_names *names,
                             ag_tensor *in[], int *n_in, agi_scores *m) {
    static const agi_mask_names own = {"mask", "additive_mask", "key_padding_mask"};
    if (!names) names = &own;
    ag_tensor scores;  // a header only, for shapes and messages
    agi_tensor_header(&scores, dt, ndim, scores_shape);
    const int S = scores_shape[ndim - 1];
    memset(m, 0, sizeof *m);
    m->mask = m->add = m->kpm = m->table = -1;
    m->keeps = o->mask_polarity == AG_MASK_KEEPS;
    if (!isfinite(o->scale)) {
        ag_error("%s: scale must be finite, got %g; %s", op, o->scale,
                 agi_about_text(subject));
        return false;
    }
    if (o->q_offset < 0) {
        ag_error("%s: q_offset must be >= 0, got %d; %s", op, o->q_offset,
                 agi_about_text(subject));
        return false;
    }
    // Query positions q_offset + i and relative positions j - q_offset - i are ints.
    const int T = scores_shape[ndim - 2];
    if (o->q_offset > INT_MAX - T) {
        ag_error("%s: q_offset + T must fit in an int, got q_offset %d and T = %d; %s", op,
                 o->q_offset, T, agi_about_text(subject));
        return false;
    }
    if (o->window < 0) {
        ag_error("%s: window must be >= 0 (0: no sliding window), got %d; %s", op, o->window,
                 agi_about_text(subject));
        return false;
    }
    m->scale = o->scale == 0 ? 1.0 : o->scale;
    m->causal = o->causal;
    m->q_offset = o->q_offset;
    m->window = o->window;
    if (o->mask_polarity != AG_MASK_BLOCKS && o->mask_polarity != AG_MASK_KEEPS) {
        ag_error("%s: mask_polarity must be AG_MASK_BLOCKS or AG_MASK_KEEPS, got %d; %s", op,
                 (int)o->mask_polarity, agi_about_text(subject));
        return false;
    }
    if (o->mask) {
        if (!mask_is_bool(op, names->mask, o->mask, m->keeps) ||
            !mask_fits(op, names->mask, o->mask, &scores, &m->mask_at))
            return false;
        m->mask = *n_in;
        in[(*n_in)++] = o->mask;
    }
    if (o->additive_mask) {
        const ag_tensor *a = o->additive_mask;
        if (!mask_has_data(op, names->additive_mask, a)) return false;
        if (a->dtype != dt) {
            ag_error("%s: %s %s is %s but scores %s are %s", op, names->additive_mask, agi_shape(a),
                     ag_dtype_name(a->dtype), agi_shape(&scores), ag_dtype_name(dt));
            return false;
        }
        if (!mask_fits(op, names->additive_mask, a, &scores, &m->add_at)) return false;
        int v[4];
        scores_view(ndim, scores_shape, v);
        const agi_mask_layout *l = &m->add_at;
        m->add_by_slices = (l->sa == 0 && v[0] > 1) || (l->sb == 0 && v[1] > 1);
        m->add_one_to_one = !m->add_by_slices && !(l->st == 0 && v[2] > 1);
        m->add = *n_in;
        in[(*n_in)++] = o->additive_mask;
    }
    if (o->key_padding_mask) {
        const ag_tensor *k = o->key_padding_mask;
        if (!mask_is_bool(op, names->key_padding_mask, k, m->keeps)) return false;
        if (ndim < 3) {
            ag_error("%s: %s %s needs scores with a batch dimension ([B, ..., T, S]), got %s",
                     op, names->key_padding_mask, agi_shape(k), agi_shape(&scores));
            return false;
        }
        if (k->ndim != 2 || k->shape[0] != scores_shape[0] || k->shape[1] != S) {
            ag_error("%s: %s %s does not match %s (expected [%d,%d])", op,
                     names->key_padding_mask, agi_shape(k), agi_about_text(operands),
                     scores_shape[0], S);
            return false;
        }
        // [B, S] over [na, nb, T, S]: batch b is na's index for 4-D scores, nb's for 3-D.
        m->kpm_at.nb = ndim == 4 ? scores_shape[1] : scores_shape[0];
        if (ndim == 4)
            m->kpm_at.sa = (size_t)S;
        else
            m->kpm_at.sb = (size_t)S;
        m->kpm = *n_in;
        in[(*n_in)++] = o->key_padding_mask;
    }
    if (!agi_pos_check_op(op, &o->pos, dt, heads, subject, &m->heads)) return false;
    // A position term has T + S - 1 entries a head (relative positions -(T - 1) .. S - 1),
    // counted in ints.
    if (o->pos.kind != AG_POS_NONE && T - 1 > INT_MAX - S) {
        ag_error("%s: a position term over %d queries and %d keys needs T + S - 1 entries, "
                 "more than INT_MAX; %s",
                 op, T, S, agi_about_text(subject));
        return false;
    }
    // Slice n of the N leading ones reads head n % h: with h > N, heads N ... h - 1 are never
    // read, so the term is made for the first N alone (a scheme's values still use its h,
    // m->pos.heads). An op-level h is otherwise unbounded: 2^31 heads asked 120 GB of a
    // softmax over 32 scores.
    size_t N = 1;
    for (int d = 0; d < ndim - 2; d++) N *= (size_t)scores_shape[d];
    if ((size_t)m->heads > N) m->heads = N > 0 ? (int)N : 1;
    // The term is one allocation of heads x (T + S - 1) reals. ag_softmax's scores are
    // larger, but the fused attention never makes its scores, so nothing bounded this one:
    // past AG_MAX_BYTES the tape refused it and the op wrote through NULL.
    size_t term;
    if (o->pos.kind != AG_POS_NONE &&
        (!agi_size_mul((size_t)m->heads, (size_t)T + (size_t)S - 1, &term) ||
         !agi_size_mul(term, agi_dtype_size(dt), &term))) {
        ag_error("%s: a position term of %d heads over %d queries and %d keys needs %d x %lld "
                 "%s values, more than the 2^%d bytes one allocation may take; %s",
                 op, m->heads, T, S, m->heads, (long long)T + S - 1, ag_dtype_name(dt),
                 agi_max_bytes_log2(), agi_about_text(subject));
        return false;
    }
    m->pos = o->pos;
    m->pos.table = NULL;
    if (o->pos.table) {  // the check refused a table where the scheme has none
        m->table = *n_in;
        in[(*n_in)++] = o->pos.table;
    }
    return true;
}
