// The family normalised by a logsumexp along one dim: logsumexp, softmax and log_softmax.
//   x viewed as [outer, n, inner] around dim; each (outer, inner) index is a row of n.
//   m = max_j x_j, S = sum_j e^(x_j - m) (stable: no exponent exceeds 0), lse = m + log S
//   logsumexp:    y = lse (dim removed or kept as 1)   dx_j = dy e^(x_j - lse)
//   softmax_dim:  y_j = e^(x_j - m) / S                dx_j = y_j (dy_j - sum_k y_k dy_k)
//   log_softmax:  y_j = (x_j - m) - log S              dx_j = dy_j - e^(y_j) sum_k dy_k
// The max is taken out first and lse is never formed for softmax and log_softmax: in
// float32, e^(x_j - lse) with lse rounded to float loses accuracy in proportion to the
// logits' common offset (2e-4 at 1e4), where e^(x_j - m) / S does not.
// A row that is entirely -inf (fully masked) has lse = -inf; softmax gives zeros, log_softmax
// gives -inf, and all three pass zero gradient (PyTorch gives NaN there: one padded row would
// poison a step). A -inf entry in a row that is not fully masked gets a zero softmax weight
// and an exact zero gradient through softmax. A NaN anywhere in a row makes the row NaN, and
// so does a +inf for softmax and log_softmax (e^(inf - inf), as PyTorch and ag_softmax);
// logsumexp is +inf there.
#include "shape.h"

typedef enum { LSE, SOFTMAX, LOG_SOFTMAX } lse_kind;

typedef struct {
    lse_kind kind;
    int dim;
} lse_params;

typedef struct {
    agi_around a;
    lse_kind kind;
    const real *x, *y, *dy;
    real *out;  // y in forward, dx in backward
} lse_job;

// The max m (NaN if the row holds one) of a row of n with stride s, and the sum of
// e^(x_j - m) (NaN when m is +inf; not computed, 0, when m is -inf). The sum runs in
// double: a float sum over a long row drifts by up to n roundings (softmax over 1e7
// logits came out 1% off).
static real row_max_sum(const real *x, size_t n, size_t s, double *sum) {
    real m = x[0];
    for (size_t j = 1; j < n; j++)
        if (x[j * s] > m || x[j * s] != x[j * s]) m = x[j * s];
    *sum = 0;
    if (m == -INFINITY) return m;
    for (size_t j = 0; j < n; j++) *sum += r_exp(x[j * s] - m);
    return m;
}

// The logsumexp of a row: +-inf when the max is.
static real row_lse(const real *x, size_t n, size_t s) {
    double sum;
    real m = row_max_sum(x, n, s, &sum);
    return m == -INFINITY || m == INFINITY ? m : (real)((double)m + log(sum));
}

// The rows of outer index o and inner indices [i0, i1).
static void forward_unit(void *ctx, size_t o, size_t i0, size_t i1) {
    const lse_job *c = ctx;
    const size_t n = c->a.n, s = c->a.inner;
    for (size_t i = i0; i < i1; i++) {
        const real *x = c->x + o * n * s + i;
        if (c->kind == LSE) {
            c->out[o * s + i] = row_lse(x, n, s);
            continue;
        }
        double sum;
        real m = row_max_sum(x, n, s, &sum);
        const real log_sum = c->kind == LOG_SOFTMAX ? (real)log(sum) : 0;  // softmax divides
        const real inv = (real)(1.0 / sum);
        real *y = c->out + o * n * s + i;
        bool empty = m == -INFINITY;
        for (size_t j = 0; j < n; j++) {
            if (c->kind == SOFTMAX)
                y[j * s] = empty ? 0 : r_exp(x[j * s] - m) * inv;
            else
                y[j * s] = empty ? -INFINITY : (x[j * s] - m) - log_sum;
        }
    }
}

static void backward_unit(void *ctx, size_t o, size_t i0, size_t i1) {
    const lse_job *c = ctx;
    const size_t n = c->a.n, s = c->a.inner;
    for (size_t i = i0; i < i1; i++) {
        const real *x = c->x + o * n * s + i;
        real *dx = c->out + o * n * s + i;
        if (c->kind == LSE) {
            real lse = c->y[o * s + i], g = c->dy[o * s + i];
            if (lse == -INFINITY) continue;
            for (size_t j = 0; j < n; j++) dx[j * s] += g * r_exp(x[j * s] - lse);
            continue;
        }
        const real *y = c->y + o * n * s + i, *dy = c->dy + o * n * s + i;
        if (c->kind == SOFTMAX) {
            double dot = 0;  // in double, as the forward's sum
            for (size_t j = 0; j < n; j++) dot += (double)y[j * s] * dy[j * s];
            const real d = (real)dot;
            for (size_t j = 0; j < n; j++) dx[j * s] += y[j * s] * (dy[j * s] - d);
        } else {
            if (y[0] == -INFINITY && row_lse(x, n, s) == -INFINITY) continue;
            double sum = 0;  // in double, as the forward's sum
            for (size_t j = 0; j < n; j++) sum += dy[j * s];
            const real g = (real)sum;
            for (size_t j = 0; j < n; j++) dx[j * s] += dy[j * s] - r_exp(y[j * s]) * g;
        }
    }
}

static lse_job make_job(const ag_node *n, bool forward) {
    const lse_params *p = n->params;
    lse_job c = {agi_around_dim(n->in[0], p->dim), p->kind, n->in[0]->data, n->out->data,
                 n->out->grad, forward ? n->out->data : n->in[0]->grad};
    return c;
}

static void lse_forward(ag_node *n) {
    lse_job c = make_job(n, true);
    agi_around_for(&c.a, 20.0 * (double)n->in[0]->numel, forward_unit, &c);
}

static void lse_backward(ag_node *n) {
    lse_job c = make_job(n, false);
    agi_around_for(&c.a, 20.0 * (double)n->in[0]->numel, backward_unit, &c);
}

const ag_op R(agi_logsumexp_op) = {"logsumexp", lse_forward, lse_backward,
    "dx_j = dy * exp(x_j - y)"};
const ag_op R(agi_softmax_dim_op) = {"softmax_dim", lse_forward, lse_backward,
    "dx = y * (dy - sum(dy * y))"};
const ag_op R(agi_log_softmax_op) = {"log_softmax", lse_forward, lse_backward,
    "dx = dy - exp(y) * sum(dy)"};

#if AG_ONCE
static ag_tensor *along(ag_tape *tp, const char *name, const ag_op *f32, const ag_op *f64,
                       ag_tensor *x, int dim, lse_kind kind, bool keepdim) {
    if (!agi_check_float(name, "x", x)) return NULL;
    lse_params p = {kind, agi_dim(name, "x", x, dim, 0)};
    if (p.dim < 0) return NULL;
    int shape[AG_MAX_DIMS], nd = x->ndim;
    if (kind == LSE)
        nd = agi_reduced_shape(x, p.dim, keepdim, shape);
    else
        for (int i = 0; i < nd; i++) shape[i] = x->shape[i];
    return ag_op_apply(tp, agi_pick(x, f32, f64), 1, &x, nd, shape, &p, sizeof p);
}

ag_tensor *ag_logsumexp(ag_tape *tp, ag_tensor *x, int dim, bool keepdim) {
    return along(tp, "logsumexp", &agi_logsumexp_op_f32, &agi_logsumexp_op_f64, x, dim, LSE,
                 keepdim);
}
ag_tensor *ag_softmax_dim(ag_tape *tp, ag_tensor *x, int dim) {
    return along(tp, "softmax_dim", &agi_softmax_dim_op_f32, &agi_softmax_dim_op_f64, x, dim,
                 SOFTMAX, false);
}
ag_tensor *ag_log_softmax(ag_tape *tp, ag_tensor *x, int dim) {
    return along(tp, "log_softmax", &agi_log_softmax_op_f32, &agi_log_softmax_op_f64, x, dim,
                 LOG_SOFTMAX, false);
}
#endif
