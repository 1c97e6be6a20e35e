// Masked scaled softmax over the last dim (the attention weights).
//   x: [..., T, S] -> y: [..., T, S]   (2 to 4 dims; N = product of the leading dims)
//   row r = (slice n, query i):  s_j = scale * x_j + b(n % h, j - i) + add_j for allowed
//   keys j (b: the position bias, see pos_bias.c), y = softmax(s) over the allowed keys,
//   y_j = 0 for masked keys.
// Gradient: the softmax Jacobian is diag(y) - y y^T, so with g_j = y_j (dy_j - sum_k y_k dy_k)
//   dx_j = scale * g_j,  d add_j = g_j,  d b(head, j - i) = g_j: O(S) per row, from y alone
//   (y is the node's output, nothing else is saved). A masked key has y_j = 0, hence
//   exactly zero gradient; in a NaN row (y NaN) its dx_j is NaN, as PyTorch's, but an
//   additive mask's entry at a key that another mask takes away gets none (see
//   add_grad_row). A mask broadcast over some dims, and the bias table, sum g
//   over every score they serve.
//
// !!! MASK POLARITY: by default (AG_MASK_BLOCKS) a boolean mask entry that is TRUE means
// !!! "NOT allowed to attend", as in torch.nn.MultiheadAttention (attn_mask) and its
// !!! key_padding_mask (true = padding). torch.nn.functional.scaled_dot_product_attention
// !!! and HuggingFace use the OPPOSITE polarity (true = allowed): pass AG_MASK_KEEPS.
//
// A row whose keys are all masked (by any mix of mask, key padding, causality or an
// additive -inf) gives all zeros and passes zero gradient. PyTorch gives NaN there (its
// max over the row is -inf and -inf - -inf = NaN); a padded query row is common in
// batches, and one NaN would poison the whole step. A row whose (unmasked) scores
// contain a NaN, or a +inf (+inf - +inf is NaN), gives NaN, as in PyTorch.

#include "op.h"

// One call's view of the rows: row r = n * T + i holds the scores of query i in slice n.
typedef struct {
    int T, S;
    size_t N;  // slices
    real scale;
    const agi_scores *m;
    const real *x, *add;
    const uint8_t *mask, *kpm;
    const real *rel;  // position bias by relative position, [heads, T + S - 1], or NULL
    real *y;
    const real *dy;
    real *dx, *dadd;
    real *grel;  // its gradient
} rows;

// The term vector's entry for key 0 of row r (query i: relative position -(q_offset + i)).
static const real *rel_row(const rows *c, size_t r) {
    const size_t n = r / (size_t)c->T, i = r % (size_t)c->T;
    return c->rel + n % (size_t)c->m->heads * (size_t)(c->T + c->S - 1) + (size_t)(c->T - 1) - i;
}

// The keys of row r that a boolean mask, key padding, causality or a window takes away
// (an additive -inf is not among them: its entry is what masks the key).
typedef struct {
    int first, visible;  // keys [first, visible): later ones are the future (causal) or
                         // too far ahead (window), earlier ones too far behind (window)
    const uint8_t *mask, *kpm;
    uint8_t blocked;  // the value of a mask entry that masks
} row_masks;

static row_masks masks_of_row(const rows *c, size_t r) {
    const size_t n = r / (size_t)c->T;
    const int i = (int)(r % (size_t)c->T);
    const agi_scores *mi = c->m;
    row_masks k = {.mask = c->mask ? c->mask + agi_mask_at(&mi->mask_at, n, i) : NULL,
                   .kpm = c->kpm ? c->kpm + agi_mask_at(&mi->kpm_at, n, i) : NULL,
                   .blocked = !mi->keeps};
    agi_scores_keys(mi, c->S, i, i + 1, &k.first, &k.visible);
    return k;
}

static bool key_masked(const row_masks *k, int j) {
    return j < k->first || j >= k->visible || (k->mask && !k->mask[j] == !k->blocked) ||
           (k->kpm && !k->kpm[j] == !k->blocked);
}

static void forward_row(const rows *c, size_t r) {
    const int S = c->S, i = (int)(r % (size_t)c->T);
    const size_t n = r / (size_t)c->T;
    const agi_scores *mi = c->m;
    const real *x = c->x + r * S;
    const real *add = c->add ? c->add + agi_mask_at(&mi->add_at, n, i) : NULL;
    const real *rel = c->rel ? rel_row(c, r) : NULL;
    const row_masks k = masks_of_row(c, r);
    real *y = c->y + r * S;

    // y holds the scores first, -inf where masked: exp(-inf - max) is then exactly 0.
    real mx = -INFINITY;
    for (int j = 0; j < S; j++) {
        real s = c->scale * x[j] + (rel ? rel[j] : 0) + (add ? add[j] : 0);
        if (key_masked(&k, j)) s = -INFINITY;
        y[j] = s;
        if (s > mx) mx = s;
    }
    if (mx == -INFINITY) {
        // Nothing to attend to (an additive -inf counts as masked): zeros. But the max
        // skips NaN, so a row of NaN scores lands here too, and stays NaN.
        bool nan = false;
        for (int j = 0; j < S; j++) nan |= y[j] != y[j];
        for (int j = 0; j < S; j++) y[j] = nan ? (real)NAN : 0;
        return;
    }
    double sum = 0;  // in double: an f32 sum over long rows would drift
    for (int j = 0; j < S; j++) {
        real e = r_exp(y[j] - mx);
        y[j] = e;
        sum += e;
    }
    real inv = (real)(1.0 / sum);
    for (int j = 0; j < S; j++) y[j] *= inv;
}

// The additive mask's gradient from row r: g_j, but 0 at the keys masked otherwise. There
// y_j = 0 makes g_j 0 already, unless the row is NaN (a NaN score, or a NaN upstream
// gradient): then 0 * NaN would put a NaN on an entry that changes nothing, as PyTorch's
// masked_fill of key padding over attn_mask never does.
// Into the mask's gradient da, or into the double sums of a broadcast mask (da NULL).
static void add_grad_row(const rows *c, size_t r, real d, real *da, double *sums) {
    const real *y = c->y + r * c->S, *dy = c->dy + r * c->S;
    const row_masks k = masks_of_row(c, r);
    for (int j = 0; j < c->S; j++) {
        if (key_masked(&k, j)) continue;
        if (da) da[j] += y[j] * (dy[j] - d);
        else sums[j] += y[j] * (dy[j] - d);
    }
}

// g = y (dy - y . dy): the gradient of the biased, masked scores of row r.
static real row_dot(const rows *c, size_t r) {
    const real *y = c->y + r * c->S, *dy = c->dy + r * c->S;
    double dot = 0;
    for (int j = 0; j < c->S; j++) dot += (double)y[j] * dy[j];
    return (real)dot;
}

static void backward_row(const rows *c, size_t r, bool with_add) {
    const int S = c->S;
    const real *y = c->y + r * S, *dy = c->dy + r * S;
    const real d = row_dot(c, r);
    if (c->dx) {
        real *dx = c->dx + r * S;
        for (int j = 0; j < S; j++) dx[j] += c->scale * (y[j] * (dy[j] - d));
    }
    if (with_add) {
        const size_t n = r / (size_t)c->T;
        add_grad_row(c, r, d, c->dadd + agi_mask_at(&c->m->add_at, n, (int)(r % (size_t)c->T)),
                     NULL);
    }
}

static rows rows_of(const ag_node *n) {
    const agi_scores *p = n->params;
    const ag_tensor *x = n->in[0];
    rows c = {0};
    c.T = x->shape[x->ndim - 2];
    c.S = x->shape[x->ndim - 1];
    c.N = x->numel / ((size_t)c.T * (size_t)c.S);
    c.scale = (real)p->scale;
    c.m = p;
    c.x = x->data;
    c.y = n->out->data;
    if (p->mask >= 0) c.mask = n->in[p->mask]->data;
    if (p->add >= 0) c.add = n->in[p->add]->data;
    if (p->kpm >= 0) c.kpm = n->in[p->kpm]->data;
    return c;
}

// The position bias vector, in tape memory (NULL without a bias).
static real *rel_of(ag_node *n, const rows *c) {
    const agi_scores *m = c->m;
    if (m->pos.kind == AG_POS_NONE) return NULL;
    real *rel = ag_tape_alloc(n->tape, (size_t)m->heads * (c->T + c->S - 1) * sizeof *rel);
    R(agi_pos_rel_fill)(m, m->table >= 0 ? n->in[m->table]->data : NULL, c->T, c->S, rel);
    return rel;
}

// Rows are independent, so any slicing gives the same bits.
static void forward_rows(size_t begin, size_t end, void *ctx) {
    for (size_t r = begin; r < end; r++) forward_row(ctx, r);
}

static void softmax_forward(ag_node *n) {
    rows c = rows_of(n);
    c.rel = rel_of(n, &c);
    agi_parallel_for(c.N * (size_t)c.T, 30.0 * (double)n->out->numel, forward_rows, &c);
}

// Rows in parallel, each its own dx row and, when each additive-mask element belongs to
// one score, its own d add row.
static void backward_rows(size_t begin, size_t end, void *ctx) {
    const rows *c = ctx;
    for (size_t r = begin; r < end; r++)
        backward_row(c, r, c->dadd && c->m->add_one_to_one);
}

static void softmax_backward(ag_node *n) {
    const agi_scores *p = n->params;
    rows c = rows_of(n);
    c.dy = n->out->grad;
    c.dx = n->in[0]->grad;
    c.dadd = p->add >= 0 ? n->in[p->add]->grad : NULL;
    real *gtable = p->table >= 0 ? n->in[p->table]->grad : NULL;
    if (!c.dx && !c.dadd && !gtable) return;
    agi_parallel_for(c.N * (size_t)c.T, 8.0 * (double)n->out->numel, backward_rows, &c);
    // A broadcast additive mask and the position table gather from many rows: one pass
    // over the rows in order, so that the sums do not depend on the thread count. The sums
    // run in double, then land in the gradients once: a float sum over B h T rows drifts
    // by up to that many roundings.
    const bool add_by_rows = c.dadd && !p->add_one_to_one;
    if (!add_by_rows && !gtable) return;
    const int w = c.T + c.S - 1;
    const size_t add_n = add_by_rows ? n->in[p->add]->numel : 0;
    const size_t rel_n = gtable ? (size_t)p->heads * w : 0;
    double *add_sum = add_n ? agi_grad_sums(n->tape, add_n) : NULL;
    double *rel_sum = rel_n ? agi_grad_sums(n->tape, rel_n) : NULL;
    for (size_t r = 0; r < c.N * (size_t)c.T; r++) {
        const real *y = c.y + r * c.S, *dy = c.dy + r * c.S;
        const real d = row_dot(&c, r);
        const size_t i = r % (size_t)c.T;
        if (add_sum)
            add_grad_row(&c, r, d, NULL,
                         add_sum + agi_mask_at(&c.m->add_at, r / (size_t)c.T, (int)i));
        if (rel_sum) {
            const size_t head = r / (size_t)c.T % (size_t)p->heads;
            double *g = rel_sum + head * w + (size_t)(c.T - 1) - i;
            for (int j = 0; j < c.S; j++) g[j] += y[j] * (dy[j] - d);
        }
    }
    if (add_sum) R(agi_grad_sums_add)(c.dadd, add_sum, add_n);
    if (rel_sum) {
        real *grel = ag_tape_alloc(n->tape, rel_n * sizeof *grel);
        for (size_t k = 0; k < rel_n; k++) grel[k] = (real)rel_sum[k];
        R(agi_pos_rel_grad)(p, grel, c.T, c.S, gtable);
    }
}

const ag_op R(agi_softmax_op) = {"softmax", softmax_forward, softmax_backward,
    "dx = scale * y * (dy - sum(dy * y)); an additive mask or position bias gets the same "
    "without the scale, summed over the scores it serves"};

#if AG_ONCE
ag_tensor *ag_softmax(ag_tape *tp, ag_tensor *x, const ag_softmax_opts *opts) {
    static const ag_softmax_opts plain = {0};
    const ag_softmax_opts *o = opts ? opts : &plain;
    if (!agi_check_float("softmax", "scores", x) ||
        !agi_check_ndim("softmax", "scores", x, 2, 4))
        return NULL;
    agi_scores p;
    ag_tensor *in[AG_MAX_INPUTS] = {x};
    int n_in = 1;
    const agi_about subject = {"scores", x, NULL, NULL};
    if (!agi_check_softmax_masks("softmax", o, x->dtype, x->ndim, x->shape, 0, &subject, &subject,
                                 NULL, in, &n_in, &p))
        return NULL;
    return ag_op_apply(tp, agi_pick(x, &agi_softmax_op_f32, &agi_softmax_op_f64), n_in, in,
                    x->ndim, x->shape, &p, sizeof p);
}
#endif
