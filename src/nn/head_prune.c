// Removing attention heads for real (as HuggingFace's prune_heads): the rows of every
// input projection that make a pruned head's q, k and v, and the columns of
// out_proj.weight that read its output, leave the parameter store. What stays is the
// same module on h - n heads of the same width d (its cfg.head_dim), so compute and
// memory shrink, and a pruned head cannot come back in training: it has no weights left.
//
// Exactly equivalent to a head mask of 0 on those heads: with the mask, the head's
// context is zeroed before out_proj, which is what dropping its out_proj columns does, and
// the remaining heads' attention never depended on the pruned ones' rows.
//
// Grouped-query attention: the k and v rows belong to kv heads, each read by a group of
// h / h_kv query heads. Removing part of a group would leave groups of unequal size, which
// the attention (query head i reads kv head i / (h / h_kv)) cannot describe, so only whole
// groups go, with their kv head: then the same rule holds on h - n and h_kv - n / g heads.
#include <string.h>

#include "nn.h"

// The heads of one kind, query or kv: h of them, keep[0 .. nk-1] staying.
typedef struct {
    int h, nk;
    const int *keep;
} heads_kept;

static int last_dim(const ag_tensor *t) { return t->shape[t->ndim - 1]; }

// What the module holds, each with how its heads are laid out: `parts` blocks of heads of
// `width` rows (three for the packed projection and its bias: q's heads, then k's and v's,
// which are the kv heads; one of the query heads, or with `kv` of the kv heads), or
// (columns) a last dim of heads of `width`.
enum { N_TENSORS = 9 };
typedef struct {
    ag_tensor *t;
    int parts, width;
    bool columns, kv;
} head_tensor;

// The heads of block p of ht.
static const heads_kept *block_heads(const head_tensor *ht, int p, const heads_kept *q,
                                     const heads_kept *kv) {
    return ht->parts == 3 ? (p == 0 ? q : kv) : ht->kv ? kv : q;
}

// The kept heads' slices of t, as a new buffer (the caller frees it) and the new shape:
// of t [rows, cols] seen as ht->parts blocks of heads, the width-row slices of the kept
// heads; with `columns`, of its last dim the width-column slices.
static void *kept_heads(const head_tensor *ht, const heads_kept *q, const heads_kept *kv,
                        int shape[3]) {
    const ag_tensor *t = ht->t;
    const int d = ht->width;
    size_t es = ag_dtype_size(t->dtype);
    int cols = ht->columns ? last_dim(t) : (t->ndim >= 2 ? t->shape[1] : 1);
    int rows = (int)(t->numel / (size_t)cols);
    const heads_kept *only = block_heads(ht, 0, q, kv);
    int new_rows = 0, new_cols = ht->columns ? only->nk * d : cols;
    for (int p = 0; p < ht->parts; p++) new_rows += block_heads(ht, p, q, kv)->nk * d;
    if (ht->columns) new_rows = rows;
    char *v = agi_malloc((size_t)new_rows * new_cols * es);
    const char *src = t->data;
    if (ht->columns) {
        for (int r = 0; r < rows; r++)
            for (int k = 0; k < only->nk; k++)
                memcpy(v + ((size_t)r * new_cols + (size_t)k * d) * es,
                       src + ((size_t)r * cols + (size_t)only->keep[k] * d) * es,
                       (size_t)d * es);
    } else {
        size_t from = 0, to = 0;  // the first row of block p, before and after
        for (int p = 0; p < ht->parts; p++) {
            const heads_kept *b = block_heads(ht, p, q, kv);
            for (int k = 0; k < b->nk; k++)
                memcpy(v + (to + (size_t)k * d) * cols * es,
                       src + (from + (size_t)b->keep[k] * d) * cols * es,
                       (size_t)d * cols * es);
            from += (size_t)b->h * d;
            to += (size_t)b->nk * d;
        }
    }
    shape[0] = new_rows, shape[1] = new_cols;
    if (t->ndim == 3) shape[0] = shape[1] = 1, shape[2] = new_cols;  // bias_k, bias_v [1, 1, I]
    return v;
}

// t must be in the store and hold its heads (q's h, kv's h_kv) of `width` where pruning
// cuts it; false (after an error naming it) otherwise.
static bool fits(const ag_params *ps, const head_tensor *ht, int h, int kvh) {
    const ag_tensor *t = ht->t;
    if (ag_params_find(ps, t->name) != t) {
        ag_error("mha_prune_heads: %s is not in this parameter store", t->name);
        return false;
    }
    const int first = ht->kv ? kvh : h;
    long long want = ht->parts == 3 ? ((long long)h + 2LL * kvh) * ht->width
                                    : (long long)first * ht->width;
    bool ok = t->ndim >= 1 && t->ndim <= 3 &&
              (ht->columns ? last_dim(t) == want && (t->ndim != 3 || t->numel == (size_t)want)
                           : t->shape[0] == want && t->ndim <= 2);
    if (!ok)
        ag_error("mha_prune_heads: %s %s does not hold %d heads of width %d (%s %lld)", t->name,
                 agi_shape(t), ht->parts == 3 ? h + 2 * kvh : first, ht->width,
                 ht->columns ? "last dim" : "rows", want);
    return ok;
}

// With groups of g > 1 query heads per kv head, a group is pruned whole or not at all;
// false (after naming the split group) otherwise.
static bool whole_groups(const bool *gone, int h, int kvh) {
    const int g = h / kvh;
    for (int i = 0; i < h; i++)
        if (gone[i] != gone[i / g * g]) {
            const int j = i / g;
            ag_error("mha_prune_heads: the list splits the group of heads %d to %d (which read "
                     "kv head %d): with num_kv_heads %d < num_heads %d only whole groups can "
                     "be pruned",
                     j * g, j * g + g - 1, j, kvh, h);
            return false;
        }
    return true;
}

bool ag_mha_prune_heads(ag_mha *m, ag_params *ps, const int *heads, int n) {
    if (!m || !ps) {
        ag_error("mha_prune_heads: the %s is NULL", !m ? "module" : "parameter store");
        return false;
    }
    int h = m->cfg.num_heads, kvh = m->cfg.num_kv_heads, d = m->head_dim;
    if (n < 0 || (n > 0 && !heads)) {
        ag_error(n < 0 ? "mha_prune_heads: n = %d heads to prune; it must be >= 0"
                       : "mha_prune_heads: n = %d heads to prune, but the list is NULL",
                 n);
        return false;
    }
    // Each index first: a list of h or more entries repeats one, and "listed twice" is
    // what is wrong with it.
    bool *gone = agi_calloc((size_t)h * sizeof *gone);
    for (int i = 0; i < n; i++) {
        if (heads[i] < 0 || heads[i] >= h || gone[heads[i]]) {
            ag_error(heads[i] < 0 || heads[i] >= h
                         ? "mha_prune_heads: head %d is out of range [0, %d)"
                         : "mha_prune_heads: head %d is listed twice (of %d heads)",
                     heads[i], h);
            agi_free(gone);
            return false;
        }
        gone[heads[i]] = true;
    }
    if (n == h) {
        ag_error("mha_prune_heads: cannot prune %d of %d heads (at least one must stay)", n, h);
        agi_free(gone);
        return false;
    }
    if (!whole_groups(gone, h, kvh)) {
        agi_free(gone);
        return false;
    }
    const agi_pos pos = agi_mha_pos(m, false);
    // Terms that follow from h itself change when h does; pruning no head leaves h, and
    // them, as they were, so it is the no-op it is for every other scheme.
    const char *refusal = n > 0 ? agi_pos_prune_refusal(&pos) : NULL;
    if (refusal) {
        ag_error("mha_prune_heads: %s; cannot prune", refusal);
        agi_free(gone);
        return false;
    }
    const head_tensor all[N_TENSORS] = {
        {m->in_proj_weight, 3, d, false, false}, {m->q_proj_weight, 1, d, false, false},
        {m->k_proj_weight, 1, d, false, true},   {m->v_proj_weight, 1, d, false, true},
        {m->in_proj_bias, 3, d, false, false},   {m->out_proj.weight, 1, d, true, false},
        {m->bias_k, 1, d, true, true},           {m->bias_v, 1, d, true, true},
        {m->pos_table, 1, 1, false, false}};  // the position table: one row a query head
    // Everything is checked, and every new value made, before the first tensor changes: a
    // refusal leaves the module and the store as they were.
    for (int i = 0; i < N_TENSORS; i++)
        if (all[i].t && !fits(ps, &all[i], h, kvh)) {
            agi_free(gone);
            return false;
        }
    int *keep = agi_malloc((size_t)h * sizeof *keep), nk = 0;
    int *keep_kv = agi_malloc((size_t)kvh * sizeof *keep_kv), nk_kv = 0;
    for (int j = 0; j < h; j++)
        if (!gone[j]) keep[nk++] = j;
    for (int j = 0; j < kvh; j++)  // a kv head stays with its group (its first head)
        if (!gone[j * (h / kvh)]) keep_kv[nk_kv++] = j;
    const heads_kept q = {h, nk, keep}, kv = {kvh, nk_kv, keep_kv};
    void *values[N_TENSORS] = {0};
    int shapes[N_TENSORS][3];
    for (int i = 0; n > 0 && i < N_TENSORS; i++)
        if (all[i].t) values[i] = kept_heads(&all[i], &q, &kv, shapes[i]);
    // fits() leaves ag_params_resize nothing to refuse (its tensor is in the store, its
    // new extents are >= 1), so from here on every tensor changes or none does.
    bool ok = true;
    for (int i = 0; i < N_TENSORS; i++) {
        if (values[i])
            ok = ag_params_resize(ps, all[i].t, all[i].t->ndim, shapes[i], values[i]) && ok;
        agi_free(values[i]);
    }
    if (n > 0) {
        m->cfg.num_heads = nk;
        m->cfg.num_kv_heads = nk_kv;
        m->version = agi_mha_version_next();  // a cache made before refuses the module
    }
    agi_free(keep);
    agi_free(keep_kv);
    agi_free(gone);
    return ok;
}
