// Masked scaled softmax over the last dim (the attention weights).
//   x: [..., T, S] -> y: [..., T, S]   (2 to 4 dims; N = product of the leading dims)
//   row r = (slice n, query i):  s_j = scale * x_j + add_j for allowed keys j,
//   y = softmax(s) over the allowed keys, y_j = 0 for masked keys.
// Gradient: the softmax Jacobian is diag(y) - y y^T, so with g_j = y_j (dy_j - sum_k y_k dy_k)
//   dx_j = scale * g_j,  d add_j = g_j.  O(S) per row, from y alone (y is the node's output,
//   nothing else is saved). A masked key has y_j = 0, hence exactly zero gradient.
//
// !!! MASK POLARITY: a boolean mask entry that is TRUE means "NOT allowed to attend", as in
// !!! torch.nn.MultiheadAttention (attn_mask) and its key_padding_mask (true = padding).
// !!! torch.nn.functional.scaled_dot_product_attention uses the OPPOSITE polarity (true =
// !!! allowed): invert such a mask before passing it here.
//
// A row whose keys are all masked (by any mix of mask, key padding, causality or an
// additive -inf) gives all zeros and passes zero gradient. A row whose (unmasked) scores
// contain a NaN, or a +inf (+inf - +inf is NaN), gives NaN, as in PyTorch. PyTorch gives NaN there (its max
// over the row is -inf and -inf - -inf = NaN); a padded query row is common in batches, and
// one NaN would poison the whole step.
#include "op.h"

typedef struct {
    double scale;          // never 0 (the constructor maps 0 to 1)
    bool causal;
    agi_mask_inputs masks;
} softmax_params;

// One call's view of the rows: row r = n * T + i holds the scores of query i in slice n.
typedef struct {
    int T, S;
    size_t N;                 // slices
    size_t slices_per_batch;  // N / B: consecutive slices that share a key padding row
    real scale;
    bool causal, mask_shared, add_shared;
    const real *x, *add;
    const uint8_t *mask, *kpm;
    real *y;
    const real *dy;
    real *dx, *dadd;
} rows;

// The row of a [T, S] (shared) or [N, T, S] mask that applies to row r.
static size_t mask_row(bool shared, size_t r, int T) { return shared ? r % (size_t)T : r; }

static void forward_row(const rows *c, size_t r) {
    const int S = c->S, i = (int)(r % (size_t)c->T);
    const real *x = c->x + r * S;
    const real *add = c->add ? c->add + mask_row(c->add_shared, r, c->T) * S : NULL;
    const uint8_t *m = c->mask ? c->mask + mask_row(c->mask_shared, r, c->T) * S : NULL;
    const uint8_t *kp = c->kpm ? c->kpm + (r / (size_t)c->T / c->slices_per_batch) * S : NULL;
    const int visible = c->causal && i + 1 < S ? i + 1 : S;  // keys j > i are in the future
    real *y = c->y + r * S;

    // y holds the scores first, -inf where masked: exp(-inf - max) is then exactly 0.
    real mx = -INFINITY;
    for (int j = 0; j < S; j++) {
        real s = c->scale * x[j] + (add ? add[j] : 0);
        if (j >= visible || (m && m[j]) || (kp && kp[j])) s = -INFINITY;
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

static void backward_row(const rows *c, size_t r) {
    const int S = c->S;
    const real *y = c->y + r * S, *dy = c->dy + r * S;
    double dot = 0;
    for (int j = 0; j < S; j++) dot += (double)y[j] * dy[j];
    const real d = (real)dot;
    if (c->dx) {
        real *dx = c->dx + r * S;
        for (int j = 0; j < S; j++) dx[j] += c->scale * (y[j] * (dy[j] - d));
    }
    if (c->dadd) {
        real *da = c->dadd + mask_row(c->add_shared, r, c->T) * S;
        for (int j = 0; j < S; j++) da[j] += y[j] * (dy[j] - d);
    }
}

static rows rows_of(const ag_node *n) {
    const softmax_params *p = n->params;
    const ag_tensor *x = n->in[0];
    rows c = {0};
    c.T = x->shape[x->ndim - 2];
    c.S = x->shape[x->ndim - 1];
    c.N = x->numel / ((size_t)c.T * (size_t)c.S);
    c.scale = (real)p->scale;
    c.causal = p->causal;
    c.mask_shared = p->masks.mask_shared;
    c.add_shared = p->masks.add_shared;
    c.x = x->data;
    c.y = n->out->data;
    if (p->masks.mask >= 0) c.mask = n->in[p->masks.mask]->data;
    if (p->masks.add >= 0) c.add = n->in[p->masks.add]->data;
    if (p->masks.kpm >= 0) {
        c.kpm = n->in[p->masks.kpm]->data;
        c.slices_per_batch = c.N / (size_t)n->in[p->masks.kpm]->shape[0];
    }
    return c;
}

// Rows are independent, so any slicing gives the same bits.
static void forward_rows(int begin, int end, void *ctx) {
    for (int r = begin; r < end; r++) forward_row(ctx, (size_t)r);
}

static void softmax_forward(ag_node *n) {
    rows c = rows_of(n);
    agi_parallel_for((int)(c.N * (size_t)c.T), 30.0 * (double)n->out->numel, forward_rows, &c);
}

// A shared [T, S] additive mask gathers gradient from all N slices: then the unit of
// work is a query index i (rows i, T + i, 2T + i, ...), so that no two threads add into
// the same row of d add, and the sum over slices runs in the same order for any thread
// count. Otherwise the unit is a row.
static void backward_units(int begin, int end, void *ctx) {
    const rows *c = ctx;
    bool by_query = c->dadd && c->add_shared;
    for (int u = begin; u < end; u++) {
        if (!by_query) {
            backward_row(c, (size_t)u);
            continue;
        }
        for (size_t s = 0; s < c->N; s++) backward_row(c, s * (size_t)c->T + (size_t)u);
    }
}

static void softmax_backward(ag_node *n) {
    const softmax_params *p = n->params;
    rows c = rows_of(n);
    c.dy = n->out->grad;
    c.dx = n->in[0]->grad;
    c.dadd = p->masks.add >= 0 ? n->in[p->masks.add]->grad : NULL;
    if (!c.dx && !c.dadd) return;
    int units = c.dadd && c.add_shared ? c.T : (int)(c.N * (size_t)c.T);
    agi_parallel_for(units, 8.0 * (double)n->out->numel, backward_units, &c);
}

const ag_op R(agi_softmax_op) = {"softmax", softmax_forward, softmax_backward,
    "dx = scale * y * (dy - sum(dy * y))"};

#if AG_ONCE
extern const ag_op agi_softmax_op_f32, agi_softmax_op_f64;

ag_tensor *ag_softmax(ag_tape *tp, ag_tensor *x, const ag_softmax_opts *opts) {
    static const ag_softmax_opts plain = {0};
    const ag_softmax_opts *o = opts ? opts : &plain;
    if (!agi_check_float("softmax", "scores", x) ||
        !agi_check_ndim("softmax", "scores", x, 2, 4))
        return NULL;
    softmax_params p = {o->scale == 0 ? 1.0 : o->scale, o->causal, {0}};
    ag_tensor *in[4] = {x};
    int n_in = 1;
    char subject[80];
    snprintf(subject, sizeof subject, "scores %s", agi_shape(x));
    if (!agi_check_softmax_masks("softmax", o, x->dtype, x->ndim, x->shape, subject, subject, in,
                                 &n_in, &p.masks))
        return NULL;
    return ag_apply(tp, agi_pick(x, &agi_softmax_op_f32, &agi_softmax_op_f64), n_in, in,
                    x->ndim, x->shape, &p, sizeof p);
}
#endif
