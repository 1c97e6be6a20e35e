// RMSNorm over the last dim, with an optional weight (as in LLaMA-style models).
//   x: [..., E], w: [E] or NULL -> y: [..., E]
//   r = 1 / sqrt(mean_e x_e^2 + eps),  xh = x r,  y = xh * w
// Gradient, per row, with g = dy * w:
//   dr/dx_e = -r^3 x_e / E, so dx = r g - x r^3 sum_e(g_e x_e) / E = r (g - xh * mean(g * xh))
//   dw = sum over rows of dy * xh
// Rows split across threads; dw sums the rows in order on one thread (the same every run).
// Every sum runs in double, also for f32.
#include "op.h"

typedef struct {
    double eps;
} rmsnorm_params;

typedef struct {
    const real *x, *w, *dy;
    real *y, *dx;
    real *r;  // 1/rms per row (tape memory when recording)
    size_t E;
    real eps;
} rms_job;

// In double, in 8 interleaved lanes: a float sum over a long row drifts by up to E
// roundings (at E = 65536 every output was off by 4e-6 relative).
static double sum_squares(const real *x, size_t E) {
    double acc[8] = {0};
    size_t e = 0;
    for (; e + 8 <= E; e += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)x[e + l] * x[e + l];
    double ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; e < E; e++) ss += (double)x[e] * x[e];
    return ss;
}

static void forward_rows(size_t begin, size_t end, void *ctx) {
    const rms_job *j = ctx;
    const size_t E = j->E;
    for (size_t row = begin; row < end; row++) {
        const real *x = j->x + row * E;
        real *y = j->y + row * E;
        const real r = (real)(1 / sqrt(sum_squares(x, E) / (double)E + (double)j->eps));
        if (j->r) j->r[row] = r;
        for (size_t e = 0; e < E; e++) y[e] = x[e] * r * (j->w ? j->w[e] : 1);
    }
}

// In double: g - xh * mean(g * xh) cancels when a row is dominated by one entry (E = 1
// leaves g * eps / (x^2 + eps)), and float32's r alone would lose every digit of it.
static void backward_rows(size_t begin, size_t end, void *ctx) {
    const rms_job *j = ctx;
    const size_t E = j->E;
    for (size_t row = begin; row < end; row++) {
        const real *x = j->x + row * E, *dy = j->dy + row * E;
        real *dx = j->dx + row * E;
        double ss = 0, dot = 0;
        for (size_t e = 0; e < E; e++) ss += (double)x[e] * x[e];
        double r = 1 / sqrt(ss / (double)E + (double)j->eps);
        for (size_t e = 0; e < E; e++) dot += (double)dy[e] * (j->w ? j->w[e] : 1) * x[e] * r;
        dot /= (double)E;
        for (size_t e = 0; e < E; e++)
            dx[e] += (real)(r * ((double)dy[e] * (j->w ? j->w[e] : 1) - x[e] * r * dot));
    }
}

static void rmsnorm_forward(ag_node *n) {
    const ag_tensor *x = n->in[0];
    const size_t rows = agi_rows(x);
    rms_job j = {x->data, n->n_in > 1 ? n->in[1]->data : NULL, NULL, n->out->data, NULL,
                 n->recording ? ag_tape_alloc(n->tape, rows * sizeof(real)) : NULL,
                 (size_t)agi_last(x), (real)((const rmsnorm_params *)n->params)->eps};
    n->saved = j.r;
    agi_parallel_for(rows, 3.0 * (double)x->numel, forward_rows, &j);
}

static void rmsnorm_backward(ag_node *n) {
    const ag_tensor *x = n->in[0], *w = n->n_in > 1 ? n->in[1] : NULL;
    const size_t rows = agi_rows(x);
    size_t E = (size_t)agi_last(x);
    const real *r = n->saved, *xs = x->data, *dy = n->out->grad;
    if (x->grad) {
        rms_job j = {xs, w ? w->data : NULL, dy, NULL, x->grad, n->saved, E,
                     (real)((const rmsnorm_params *)n->params)->eps};
        agi_parallel_for(rows, 6.0 * (double)x->numel, backward_rows, &j);
    }
    if (w && w->grad) {  // summed in double over the rows, as the forward's squares
        double *sum = agi_grad_sums(n->tape, E);
        for (size_t row = 0; row < rows; row++)
            for (size_t e = 0; e < E; e++)
                sum[e] += (double)dy[row * E + e] * xs[row * E + e] * r[row];
        R(agi_grad_sums_add)(w->grad, sum, E);
    }
}

const ag_op R(agi_rmsnorm_op) = {"rmsnorm", rmsnorm_forward, rmsnorm_backward,
    "dx = r (dy w - xh mean(dy w xh)); dw = sum(dy xh)"};

#if AG_ONCE
ag_tensor *ag_rmsnorm(ag_tape *tp, ag_tensor *x, ag_tensor *w, double eps) {
    if (!agi_check_float("rmsnorm", "x", x) ||
        !agi_check_ndim("rmsnorm", "x [..., E]", x, 1, AG_MAX_DIMS))
        return NULL;
    if (w && (!agi_check_float("rmsnorm", "w", w) || !agi_check_same_dtype("rmsnorm", x, w)))
        return NULL;
    if (w && (w->ndim != 1 || w->shape[0] != agi_last(x))) {
        ag_error("rmsnorm: w %s does not match x %s (expected [%d])", agi_shape(w), agi_shape(x),
                 agi_last(x));
        return NULL;
    }
    if (!isfinite(eps) || eps < 0) {
        ag_error("rmsnorm: eps must be finite and >= 0, got %g; x %s", eps, agi_shape(x));
        return NULL;
    }
    rmsnorm_params p = {eps};
    ag_tensor *in[] = {x, w};
    return ag_op_apply(tp, agi_pick(x, &agi_rmsnorm_op_f32, &agi_rmsnorm_op_f64), w ? 2 : 1, in,
                    x->ndim, x->shape, &p, sizeof p);
}
#endif
