// Layer normalisation over the last dim (PyTorch nn.LayerNorm: biased variance).
//   x: [..., E], w: [E] or NULL, b: [E] or NULL -> y: [..., E]
//   per row: mean, var = mean((x - mean)^2), rstd = 1 / sqrt(var + eps),
//            xhat = (x - mean) * rstd,  y = xhat * w + b
// Gradient: with g = dy * w, and xhat depending on every x of its row through mean and
// rstd (d xhat_i / d x_j = rstd (delta_ij - 1/E - xhat_i xhat_j / E)):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//   dw += sum over rows of dy * xhat,  db += sum over rows of dy.
#include "op.h"

typedef struct {
    double eps;
    int w, b;  // input index of the weight and of the bias, -1 when absent
} layernorm_params;

// Per row, saved for backward: mean and rstd, kept in double even for f32. With a large
// mean and a tiny variance (x = 100 + 1e-3 * noise), a float mean would be off by up
// to ulp(100) / 2 = 4e-6, which shifts every xhat by 4e-6 * rstd: 0.004 at std 1e-3.
typedef struct {
    double mean, rstd;
} row_stats;

typedef struct {
    int E;
    size_t rows;
    double eps;
    const real *x, *w, *b, *dy;
    real *y, *dx, *dw, *db;
    row_stats *stats;
} layernorm_job;

// Row sums run in double with four interleaved partial sums: one accumulator would be
// a single chain of dependent additions (several cycles each); four chains overlap.
// The order is fixed, so results stay deterministic.
static double sum4(const double s[4]) { return (s[0] + s[1]) + (s[2] + s[3]); }

static double row_mean(const real *x, int E) {
    double s[4] = {0};
    int e = 0;
    for (; e + 4 <= E; e += 4)
        for (int k = 0; k < 4; k++) s[k] += x[e + k];
    for (; e < E; e++) s[0] += x[e];
    return sum4(s) / E;
}

static double row_var(const real *x, int E, double mean) {
    double s[4] = {0};
    int e = 0;
    for (; e + 4 <= E; e += 4)
        for (int k = 0; k < 4; k++) s[k] += (x[e + k] - mean) * (x[e + k] - mean);
    for (; e < E; e++) s[0] += (x[e] - mean) * (x[e] - mean);
    return sum4(s) / E;
}

static void forward_rows(int begin, int end, void *ctx) {
    const layernorm_job *j = ctx;
    const int E = j->E;
    for (size_t r = (size_t)begin; r < (size_t)end; r++) {
        const real *x = j->x + r * E;
        real *y = j->y + r * E;
        // Two passes: the variance from (x - mean)^2, never from mean(x^2) - mean^2,
        // which cancels catastrophically when the mean is large and the variance tiny.
        const double mean = row_mean(x, E), var = row_var(x, E, mean);
        const double rstd = 1.0 / sqrt(var + j->eps);
        for (int e = 0; e < E; e++) {
            real v = (real)((x[e] - mean) * rstd);
            if (j->w) v *= j->w[e];
            if (j->b) v += j->b[e];
            y[e] = v;
        }
        if (j->stats) j->stats[r] = (row_stats){mean, rstd};
    }
}

// xhat = (x - mean) * rstd in the real type, without losing the low bits of the double
// mean: mean = hi + lo with hi = (real)mean, and x - hi is (nearly) exact when x is
// close to the mean, which is the large-mean case where a rounded mean would hurt.
typedef struct {
    real hi, lo, rstd;
} centre;

static centre centre_of(const row_stats *s) {
    real hi = (real)s->mean;
    return (centre){hi, (real)(s->mean - hi), (real)s->rstd};
}

static real xhat_of(real x, centre c) { return ((x - c.hi) - c.lo) * c.rstd; }

// g = dy * w (or dy) at column e, and its contribution to the two row sums of dx.
static void add_g(const layernorm_job *j, const real *x, const real *dy, int e, centre c,
                  double *sg, double *sgx) {
    real g = j->w ? dy[e] * j->w[e] : dy[e];
    *sg += g;
    *sgx += g * xhat_of(x[e], c);
}

static void backward_dx_rows(int begin, int end, void *ctx) {
    const layernorm_job *j = ctx;
    const int E = j->E;
    for (size_t r = (size_t)begin; r < (size_t)end; r++) {
        const real *x = j->x + r * E, *dy = j->dy + r * E;
        real *dx = j->dx + r * E;
        const centre c = centre_of(&j->stats[r]);
        double sg[4] = {0}, sgx[4] = {0};  // four partial sums, as in row_mean
        int e = 0;
        for (; e + 4 <= E; e += 4)
            for (int k = 0; k < 4; k++) add_g(j, x, dy, e + k, c, &sg[k], &sgx[k]);
        for (; e < E; e++) add_g(j, x, dy, e, c, &sg[0], &sgx[0]);
        const real mg = (real)(sum4(sg) / E), mgx = (real)(sum4(sgx) / E);
        for (e = 0; e < E; e++) {
            real g = j->w ? dy[e] * j->w[e] : dy[e];
            dx[e] += c.rstd * (g - mg - xhat_of(x[e], c) * mgx);
        }
    }
}

// dw and db sum over rows. Threads split the COLUMNS, and every column adds its rows in
// order 0, 1, 2, ...: the result is bit-identical for any thread count. Accumulators
// live on the stack, a block of columns at a time.
#define COLUMN_BLOCK 64

static void backward_dwdb_columns(int begin, int end, void *ctx) {
    const layernorm_job *j = ctx;
    for (int e0 = begin; e0 < end; e0 += COLUMN_BLOCK) {
        const int n = end - e0 < COLUMN_BLOCK ? end - e0 : COLUMN_BLOCK;
        double sw[COLUMN_BLOCK] = {0}, sb[COLUMN_BLOCK] = {0};
        for (size_t r = 0; r < j->rows; r++) {
            const real *x = j->x + r * j->E + e0, *dy = j->dy + r * j->E + e0;
            const centre c = centre_of(&j->stats[r]);
            for (int k = 0; k < n; k++) {
                sw[k] += dy[k] * xhat_of(x[k], c);
                sb[k] += dy[k];
            }
        }
        for (int k = 0; k < n; k++) {
            if (j->dw) j->dw[e0 + k] += (real)sw[k];
            if (j->db) j->db[e0 + k] += (real)sb[k];
        }
    }
}

static layernorm_job job_of(const ag_node *n) {
    const layernorm_params *p = n->params;
    const ag_tensor *x = n->in[0];
    layernorm_job j = {0};
    j.E = agi_last(x);
    j.rows = agi_rows(x);
    j.eps = p->eps;
    j.x = x->data;
    j.w = p->w >= 0 ? n->in[p->w]->data : NULL;
    j.b = p->b >= 0 ? n->in[p->b]->data : NULL;
    return j;
}

static void layernorm_forward(ag_node *n) {
    layernorm_job j = job_of(n);
    j.y = n->out->data;
    if (n->recording) n->saved = j.stats = ag_tape_alloc(n->tape, j.rows * sizeof *j.stats);
    agi_parallel_for((int)j.rows, 8.0 * (double)n->out->numel, forward_rows, &j);
}

static void layernorm_backward(ag_node *n) {
    const layernorm_params *p = n->params;
    layernorm_job j = job_of(n);
    j.stats = n->saved;
    j.dy = n->out->grad;
    j.dx = n->in[0]->grad;
    j.dw = p->w >= 0 ? n->in[p->w]->grad : NULL;
    j.db = p->b >= 0 ? n->in[p->b]->grad : NULL;
    double work = 10.0 * (double)n->out->numel;
    if (j.dx) agi_parallel_for((int)j.rows, work, backward_dx_rows, &j);
    if (j.dw || j.db) agi_parallel_for(j.E, work, backward_dwdb_columns, &j);
}

const ag_op R(agi_layernorm_op) = {"layernorm", layernorm_forward, layernorm_backward,
    "dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w; dw = sum dy * xhat; db = sum dy"};

#if AG_ONCE
extern const ag_op agi_layernorm_op_f32, agi_layernorm_op_f64;

// w and b are [E], in x's dtype.
static bool check_affine(const char *what, const ag_tensor *t, const ag_tensor *x) {
    if (!agi_check_float("layernorm", what, t) || !agi_check_same_dtype("layernorm", x, t))
        return false;
    if (t->ndim == 1 && t->shape[0] == agi_last(x)) return true;
    ag_error("layernorm: %s %s does not match x %s (expected [%d])", what, agi_shape(t),
             agi_shape(x), agi_last(x));
    return false;
}

ag_tensor *ag_layernorm(ag_tape *tp, ag_tensor *x, ag_tensor *w, ag_tensor *b, double eps) {
    if (!agi_check_float("layernorm", "x", x) || !agi_check_ndim("layernorm", "x", x, 1, 4))
        return NULL;
    if (!(eps >= 0 && isfinite(eps))) {
        ag_error("layernorm: eps must be finite and >= 0, got %g; x %s", eps, agi_shape(x));
        return NULL;
    }
    layernorm_params p = {eps, -1, -1};
    ag_tensor *in[3] = {x};
    int n_in = 1;
    if (w) {
        if (!check_affine("w", w, x)) return NULL;
        p.w = n_in;
        in[n_in++] = w;
    }
    if (b) {
        if (!check_affine("b", b, x)) return NULL;
        p.b = n_in;
        in[n_in++] = b;
    }
    return ag_apply(tp, agi_pick(x, &agi_layernorm_op_f32, &agi_layernorm_op_f64), n_in, in,
                    x->ndim, x->shape, &p, sizeof p);
}
#endif
