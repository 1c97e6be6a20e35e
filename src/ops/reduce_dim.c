// Reductions along one dim, with PyTorch's keepdim: sum, mean, max, var.
//   x viewed as [outer, n, inner] around dim -> y: [outer, inner] (dim removed, or kept as 1)
//   sum:   y = sum_j x_j                      dx_j = dy
//   mean:  y = sum_j x_j / n                  dx_j = dy / n
//   max:   y = x_m, m the first j with the largest x_j (a NaN counts as largest)
//                                             dx_m = dy, every other dx_j = 0 (as PyTorch)
//   var:   y = sum_j (x_j - mu)^2 / (n - c),  mu the mean, c = 1 unbiased, 0 biased
//                                             dx_j = dy * 2 (x_j - mu) / (n - c)
// Sums run in double, in a fixed order (32 interleaved partial sums along a contiguous
// row, so the loop vectorises), whatever the thread count.
#include "shape.h"
#include "../core/multiversion.h"

typedef enum { SUM, MEAN, MAX, VAR } reduce_kind;

typedef struct {
    reduce_kind kind;
    int dim;
    double correction;  // var: 1 unbiased, 0 biased
} reduce_params;

typedef struct {
    agi_around a;
    const reduce_params *p;
    const real *x, *dy;
    real *y, *dx;
    int32_t *arg;  // max: the arg max of each output, when recording
} reduce_job;

// Sums run in double even for f32: a float accumulator over a long dim drifts by up to n
// roundings (the mean of 1e7 values near 100 came out 1.4% off), and the variance's mean
// must keep the low bits of a large offset, or (x - mu)^2 measures the mean's error.
// LANES partial sums: four vectors of doubles, whose adds overlap (one vector's chain
// of adds ran at two thirds of the memory's rate), folded in halves.
enum { LANES = 32 };

AGI_INLINE double fold(double acc[LANES]) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

AGI_INLINE double row_sum(const real *x, size_t n) {
    double acc[LANES] = {0};
    size_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[j + l];
    double s = fold(acc);
    for (; j < n; j++) s += x[j];
    return s;
}

// Strided outputs are taken BLOCK inner indices at a time, each block's sums in double:
// a block's rows are read whole (4 KB of floats), as the sums stream down the dim (64 at
// a time read 256 bytes of every 4 KB row, and ran at a quarter of the memory's rate).
#define BLOCK 1024

// s[c] = sum_j x[j * inner + i + c] for c < cnt (cnt = 1 when inner = 1). Four rows are
// added together before their sum joins s: s, in double, is twice the bytes of a row, and
// its loads and stores, one each a row, had halved the pass's speed.
AGI_INLINE void block_sums(const real *x, size_t n, size_t inner, size_t i, size_t cnt,
                           double *s) {
    if (inner == 1) {
        s[0] = row_sum(x, n);
        return;
    }
    for (size_t c = 0; c < cnt; c++) s[c] = 0;
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const real *x0 = x + j * inner + i, *x1 = x0 + inner, *x2 = x1 + inner, *x3 = x2 + inner;
        for (size_t c = 0; c < cnt; c++)
            s[c] += ((double)x0[c] + (double)x1[c]) + ((double)x2[c] + (double)x3[c]);
    }
    for (; j < n; j++)
        for (size_t c = 0; c < cnt; c++) s[c] += x[j * inner + i + c];
}

// s[c] = sum_j (x[j * inner + i + c] - mu[c])^2, in double.
AGI_INLINE void block_squares(const real *x, size_t n, size_t inner, size_t i, size_t cnt,
                          const double *mu, double *s) {
    if (inner == 1) {
        double acc[LANES] = {0};
        size_t j = 0;
        for (; j + LANES <= n; j += LANES)
            for (int l = 0; l < LANES; l++) {
                double d = x[j + l] - mu[0];
                acc[l] += d * d;
            }
        s[0] = fold(acc);
        for (; j < n; j++) s[0] += (x[j] - mu[0]) * (x[j] - mu[0]);
        return;
    }
    for (size_t c = 0; c < cnt; c++) s[c] = 0;
    for (size_t j = 0; j < n; j++)
        for (size_t c = 0; c < cnt; c++) {
            double d = x[j * inner + i + c] - mu[c];
            s[c] += d * d;
        }
}

// The outputs of outer index o and inner indices [i0, i1) (one output, i0 = 0, when inner = 1).
// The two passes' loops, multiversioned (their sums in double: in the baseline's SSE2 a
// float becomes a double two at a time, and the passes fell to a third of the memory's
// rate); R() names, called through agi_around_for from this file only.
void R(agi_reduce_dim_forward_unit)(void *ctx, size_t o, size_t i0, size_t i1);
void R(agi_reduce_dim_backward_unit)(void *ctx, size_t o, size_t i0, size_t i1);

AGI_HOT void R(agi_reduce_dim_forward_unit)(void *ctx, size_t o, size_t i0, size_t i1) {
    const reduce_job *c = ctx;
    const size_t n = c->a.n, inner = c->a.inner;
    const real *x = c->x + o * n * inner;
    real *y = c->y + o * inner;
    if (inner == 1) i0 = 0, i1 = 1;
    if (c->p->kind == MAX) {
        for (size_t i = i0; i < i1; i++) {
            real m = x[i];
            int32_t arg = 0;
            for (size_t j = 1; j < n && m == m; j++) {
                real v = x[j * inner + i];
                if (v > m || v != v) m = v, arg = (int32_t)j;
            }
            y[i] = m;
            if (c->arg) c->arg[o * inner + i] = arg;
        }
        return;
    }
    for (size_t b = i0; b < i1; b += BLOCK) {
        const size_t cnt = i1 - b < BLOCK ? i1 - b : BLOCK;
        double s[BLOCK], mu[BLOCK];
        block_sums(x, n, inner, b, cnt, s);
        if (c->p->kind == SUM) {
            for (size_t k = 0; k < cnt; k++) y[b + k] = (real)s[k];
        } else if (c->p->kind == MEAN) {
            for (size_t k = 0; k < cnt; k++) y[b + k] = (real)(s[k] / (double)n);
        } else {
            for (size_t k = 0; k < cnt; k++) mu[k] = s[k] / (double)n;
            block_squares(x, n, inner, b, cnt, mu, s);
            for (size_t k = 0; k < cnt; k++)
                y[b + k] = (real)(s[k] / ((double)n - c->p->correction));
        }
    }
}

AGI_HOT void R(agi_reduce_dim_backward_unit)(void *ctx, size_t o, size_t i0, size_t i1) {
    const reduce_job *c = ctx;
    const size_t n = c->a.n, inner = c->a.inner;
    const real inv = (real)(1.0 / (double)n);
    const real *x = c->x + o * n * inner, *dy = c->dy + o * inner;
    real *dx = c->dx + o * n * inner;
    switch (c->p->kind) {
    case SUM:
    case MEAN: {
        real f = c->p->kind == MEAN ? inv : 1;
        for (size_t j = 0; j < n; j++)
            for (size_t i = i0; i < i1; i++) dx[j * inner + i] += dy[i] * f;
        break;
    }
    case MAX:
        for (size_t i = i0; i < i1; i++) dx[(size_t)c->arg[o * inner + i] * inner + i] += dy[i];
        break;
    case VAR: {
        // dx = dy 2 (x - mu) / (n - c), with mu and the product in double: x - mu in
        // float would round mu to the offset's ulp, which a tiny spread cannot afford.
        const double two_over = 2.0 / ((double)n - c->p->correction);
        if (inner == 1) i0 = 0, i1 = 1;
        for (size_t b = i0; b < i1; b += BLOCK) {
            const size_t cnt = i1 - b < BLOCK ? i1 - b : BLOCK;
            double mu[BLOCK], g[BLOCK];
            block_sums(x, n, inner, b, cnt, mu);
            for (size_t k = 0; k < cnt; k++) mu[k] /= (double)n, g[k] = dy[b + k] * two_over;
            for (size_t j = 0; j < n; j++)
                for (size_t k = 0; k < cnt; k++)
                    dx[j * inner + b + k] += (real)(g[k] * (x[j * inner + b + k] - mu[k]));
        }
        break;
    }
    }
}

static reduce_job make_job(const ag_node *n) {
    const reduce_params *p = n->params;
    reduce_job c = {agi_around_dim(n->in[0], p->dim), p, n->in[0]->data, n->out->grad,
                    n->out->data, n->in[0]->grad, n->saved};
    return c;
}

static void reduce_dim_forward(ag_node *n) {
    const reduce_params *p = n->params;
    if (p->kind == MAX && n->recording)
        n->saved = ag_tape_alloc(n->tape, n->out->numel * sizeof(int32_t));
    reduce_job c = make_job(n);
    agi_around_for(&c.a, 2.0 * (double)n->in[0]->numel, R(agi_reduce_dim_forward_unit), &c);
}

static void reduce_dim_backward(ag_node *n) {
    reduce_job c = make_job(n);
    agi_around_for(&c.a, 2.0 * (double)n->in[0]->numel, R(agi_reduce_dim_backward_unit), &c);
}

const ag_op R(agi_sum_dim_op) = {"sum_dim", reduce_dim_forward, reduce_dim_backward,
    "dx_j = dy"};
const ag_op R(agi_mean_dim_op) = {"mean_dim", reduce_dim_forward, reduce_dim_backward,
    "dx_j = dy / n"};
const ag_op R(agi_max_dim_op) = {"max_dim", reduce_dim_forward, reduce_dim_backward,
    "dx_j = dy at the first arg max j, else 0"};
const ag_op R(agi_var_dim_op) = {"var_dim", reduce_dim_forward, reduce_dim_backward,
    "dx_j = dy * 2 (x_j - mean) / (n - correction)"};

#if AG_ONCE
static ag_tensor *reduce_dim(ag_tape *tp, const char *name, const ag_op *f32, const ag_op *f64,
                             ag_tensor *x, int dim, bool keepdim, reduce_params p) {
    if (!agi_check_float(name, "x", x)) return NULL;
    if (x->ndim == 0) {
        ag_error("%s: x %s is a scalar: it has no dim %d to reduce", name, agi_shape(x), dim);
        return NULL;
    }
    p.dim = agi_dim(name, "x", x, dim, 0);
    if (p.dim < 0) return NULL;
    if (p.kind == VAR && x->shape[p.dim] <= p.correction) {
        ag_error("%s: the unbiased variance needs at least 2 elements along dim %d of x %s", name,
                 dim, agi_shape(x));
        return NULL;
    }
    int shape[AG_MAX_DIMS];
    int nd = agi_reduced_shape(x, p.dim, keepdim, shape);
    return ag_op_apply(tp, agi_pick(x, f32, f64), 1, &x, nd, shape, &p, sizeof p);
}

ag_tensor *ag_sum_dim(ag_tape *tp, ag_tensor *x, int dim, bool keepdim) {
    return reduce_dim(tp, "sum_dim", &agi_sum_dim_op_f32, &agi_sum_dim_op_f64, x, dim, keepdim,
                      (reduce_params){SUM, 0, 0});
}
ag_tensor *ag_mean_dim(ag_tape *tp, ag_tensor *x, int dim, bool keepdim) {
    return reduce_dim(tp, "mean_dim", &agi_mean_dim_op_f32, &agi_mean_dim_op_f64, x, dim,
                      keepdim, (reduce_params){MEAN, 0, 0});
}
ag_tensor *ag_max_dim(ag_tape *tp, ag_tensor *x, int dim, bool keepdim) {
    return reduce_dim(tp, "max_dim", &agi_max_dim_op_f32, &agi_max_dim_op_f64, x, dim, keepdim,
                      (reduce_params){MAX, 0, 0});
}
ag_tensor *ag_var_dim(ag_tape *tp, ag_tensor *x, int dim, bool unbiased, bool keepdim) {
    return reduce_dim(tp, "var_dim", &agi_var_dim_op_f32, &agi_var_dim_op_f64, x, dim, keepdim,
                      (reduce_params){VAR, 0, unbiased ? 1.0 : 0.0});
}
#endif
