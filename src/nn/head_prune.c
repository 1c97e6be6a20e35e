// Removing attention heads for real (as HuggingFace's prune_heads): the rows of every
// input projection that make a pruned head's q, k and v, and the columns of
// out_proj.weight that read its output, leave the parameter store. What stays is the
// same module on h - n heads of the same width d (its cfg.head_dim), so compute and
// memory shrink, and a pruned head cannot come back in training: it has no weights left.
//
// Exactly equivalent to a head mask of 0 on those heads: with the mask, the head's
// context is zeroed before out_proj, which is what dropping its out_proj columns does, and
// the remaining heads' attention never depended on the pruned ones' rows.
#include <string.h>

#include "nn.h"

// The kept heads' slices of t, as a new buffer (the caller frees it) and the new shape:
// of t [rows, cols] seen as `parts` blocks of h*d rows, the d-row slices of the heads in
// keep[0 .. nk-1]; with `columns`, of its last dim (h*d wide) the d-column slices.
static int last_dim(const ag_tensor *t) { return t->shape[t->ndim - 1]; }

static void *kept_heads(const ag_tensor *t, int parts, int h, int d, const int *keep, int nk,
                        bool columns, int shape[3]) {
    size_t es = ag_dtype_size(t->dtype);
    int cols = columns ? last_dim(t) : (t->ndim >= 2 ? t->shape[1] : 1);
    int rows = (int)(t->numel / (size_t)cols);
    int new_rows = columns ? rows : parts * nk * d, new_cols = columns ? nk * d : cols;
    char *v = agi_malloc((size_t)new_rows * new_cols * es);
    const char *src = t->data;
    if (columns) {
        for (int r = 0; r < rows; r++)
            for (int k = 0; k < nk; k++)
                memcpy(v + ((size_t)r * new_cols + (size_t)k * d) * es,
                       src + ((size_t)r * cols + (size_t)keep[k] * d) * es, (size_t)d * es);
    } else {
        for (int p = 0; p < parts; p++)
            for (int k = 0; k < nk; k++)
                memcpy(v + ((size_t)(p * nk + k) * d) * cols * es,
                       src + ((size_t)(p * h + keep[k]) * d) * cols * es,
                       (size_t)d * cols * es);
    }
    shape[0] = new_rows, shape[1] = new_cols;
    if (t->ndim == 3) shape[0] = shape[1] = 1, shape[2] = new_cols;  // bias_k, bias_v [1, 1, I]
    return v;
}

// What the module holds, each with how its heads are laid out: `parts` blocks of h*width
// rows, or (columns) a last dim of h*width.
enum { N_TENSORS = 9 };
typedef struct {
    ag_tensor *t;
    int parts, width;
    bool columns;
} head_tensor;

// t must be in the store and hold h heads of `width` where pruning cuts it; false (after
// an error naming it) otherwise.
static bool fits(const ag_params *ps, const head_tensor *ht, int h) {
    const ag_tensor *t = ht->t;
    if (ag_params_find(ps, t->name) != t) {
        ag_error("mha_prune_heads: %s is not in this parameter store", t->name);
        return false;
    }
    long long want = (long long)ht->parts * h * ht->width;
    bool ok = t->ndim >= 1 && t->ndim <= 3 &&
              (ht->columns ? last_dim(t) == want && (t->ndim != 3 || t->numel == (size_t)want)
                           : t->shape[0] == want && t->ndim <= 2);
    if (!ok)
        ag_error("mha_prune_heads: %s %s does not hold %d heads of width %d (%s %lld)", t->name,
                 agi_shape(t), h, ht->width, ht->columns ? "last dim" : "rows", want);
    return ok;
}

bool ag_mha_prune_heads(ag_mha *m, ag_params *ps, const int *heads, int n) {
    if (!m || !ps) {
        ag_error("mha_prune_heads: the %s is NULL", !m ? "module" : "parameter store");
        return false;
    }
    int h = m->cfg.num_heads, d = m->head_dim;
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
    const agi_pos pos = agi_mha_pos(m, false);
    const char *refusal = agi_pos_prune_refusal(&pos);  // terms that follow from h itself
    if (refusal) {
        ag_error("mha_prune_heads: %s; cannot prune", refusal);
        agi_free(gone);
        return false;
    }
    const head_tensor all[N_TENSORS] = {
        {m->in_proj_weight, 3, d, false},  {m->q_proj_weight, 1, d, false},
        {m->k_proj_weight, 1, d, false},   {m->v_proj_weight, 1, d, false},
        {m->in_proj_bias, 3, d, false},    {m->out_proj.weight, 1, d, true},
        {m->bias_k, 1, d, true},           {m->bias_v, 1, d, true},
        {m->pos_table, 1, 1, false}};  // the position table: one row a head
    // Everything is checked, and every new value made, before the first tensor changes: a
    // refusal leaves the module and the store as they were.
    for (int i = 0; i < N_TENSORS; i++)
        if (all[i].t && !fits(ps, &all[i], h)) {
            agi_free(gone);
            return false;
        }
    int *keep = agi_malloc((size_t)h * sizeof *keep), nk = 0;
    for (int j = 0; j < h; j++)
        if (!gone[j]) keep[nk++] = j;
    void *values[N_TENSORS] = {0};
    int shapes[N_TENSORS][3];
    for (int i = 0; n > 0 && i < N_TENSORS; i++)
        if (all[i].t)
            values[i] = kept_heads(all[i].t, all[i].parts, h, all[i].width, keep, nk,
                                   all[i].columns, shapes[i]);
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
        m->version = agi_mha_version_next();  // a cache made before refuses the module
    }
    agi_free(keep);
    agi_free(gone);
    return ok;
}
