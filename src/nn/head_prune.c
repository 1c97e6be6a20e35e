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

// Keeps, of t [rows, cols] seen as `parts` blocks of h*d rows (or, with `columns`, h*d
// columns), the d-row (or d-column) slices of the heads in keep[0 .. nk-1].
static int last_dim(const ag_tensor *t) { return t->shape[t->ndim - 1]; }

static bool keep_heads(ag_params *ps, ag_tensor *t, int parts, int h, int d, const int *keep,
                       int nk, bool columns) {
    if (!t) return true;
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
    int shape[3] = {new_rows, new_cols}, nd = t->ndim;
    if (nd == 3) shape[0] = shape[1] = 1, shape[2] = new_cols;  // bias_k, bias_v [1, 1, I]
    bool ok = ag_params_resize(ps, t, nd, shape, v);
    agi_free(v);
    return ok;
}

bool ag_mha_prune_heads(ag_mha *m, ag_params *ps, const int *heads, int n) {
    int h = m->cfg.num_heads, d = m->head_dim;
    if (n < 0 || n >= h) {
        ag_error("mha_prune_heads: cannot prune %d of %d heads (at least one must stay)", n, h);
        return false;
    }
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
    ag_tensor *all[] = {m->in_proj_weight, m->q_proj_weight, m->k_proj_weight, m->v_proj_weight,
                        m->in_proj_bias,   m->out_proj.weight, m->bias_k,      m->bias_v,
                        m->pos_table};
    if (m->cfg.pos == AG_POS_ALIBI) {  // the slopes follow from h: they would change
        ag_error("mha_prune_heads: ALiBi's slopes depend on the head count; cannot prune");
        agi_free(gone);
        return false;
    }
    for (int i = 0; i < 9; i++)
        if (all[i] && ag_params_find(ps, all[i]->name) != all[i]) {
            ag_error("mha_prune_heads: %s is not in this parameter store", all[i]->name);
            agi_free(gone);
            return false;
        }
    int *keep = agi_malloc((size_t)h * sizeof *keep), nk = 0;
    for (int j = 0; j < h; j++)
        if (!gone[j]) keep[nk++] = j;
    bool ok = n == 0 ||
              (keep_heads(ps, m->in_proj_weight, 3, h, d, keep, nk, false) &&
               keep_heads(ps, m->q_proj_weight, 1, h, d, keep, nk, false) &&
               keep_heads(ps, m->k_proj_weight, 1, h, d, keep, nk, false) &&
               keep_heads(ps, m->v_proj_weight, 1, h, d, keep, nk, false) &&
               keep_heads(ps, m->in_proj_bias, 3, h, d, keep, nk, false) &&
               keep_heads(ps, m->out_proj.weight, 1, h, d, keep, nk, true) &&
               keep_heads(ps, m->bias_k, 1, h, d, keep, nk, true) &&
               keep_heads(ps, m->bias_v, 1, h, d, keep, nk, true) &&
               keep_heads(ps, m->pos_table, 1, h, 1, keep, nk, false));  // one row a head
    if (ok) m->cfg.num_heads = nk;
    agi_free(keep);
    agi_free(gone);
    return ok;
}
