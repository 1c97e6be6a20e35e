// Layer normalisation over the last dim (PyTorch nn.LayerNorm: biased variance).
//   x: [..., E], w: [E] or NULL, b: [E] or NULL -> y: [..., E]
//   per row: mean, var = mean((x - mean)^2), rstd = 1 / sqrt(var + eps),
//            xhat = (x - mean) * rstd,  y = xhat * w + b
// Gradient: with g = dy * w, and xhat depending on every x of its row through mean and
// rstd (d xhat_i / d x_j = rstd (delta_ij - 1/E - xhat_i xhat_j / E)):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//   dw += sum over rows of dy * xhat,  db += sum over rows of dy.
#include "op.h"
#include "../kernels/vecmath.h"

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

// Rows are cut into blocks of BLOCK_ROWS, fixed whatever the thread count. Backward
// computes dx row by row and, in the same pass over x and dy, each block's partial sums of
// dw and db (in tape memory); the blocks' partials are then added in block order. So x and
// dy are read once, and every result is bit-identical for any thread count.
#define BLOCK_ROWS 64

typedef struct {
    int E;
    size_t rows;
    double eps;
    const real *x, *w, *b, *dy;
    real *y, *dx, *dw, *db;
    row_stats *stats;
    double *part;  // backward: per block, E partial sums of dw then E of db
} layernorm_job;

// Row sums run in double, in LANES interleaved partial sums combined in a fixed order: one
// accumulator would be a chain of dependent additions, and the lanes vectorise. The order
// does not depend on the CPU or the thread count.
#define LANES 16

AGI_INLINE double sum_lanes(const double s[LANES]) {
    double t[LANES / 2];
    for (int k = 0; k < LANES / 2; k++) t[k] = s[k] + s[k + LANES / 2];
    for (int k = 0; k < LANES / 4; k++) t[k] = t[k] + t[k + LANES / 4];
    for (int k = 0; k < LANES / 8; k++) t[k] = t[k] + t[k + LANES / 8];
    return t[0] + t[1];
}

AGI_INLINE double row_mean(const real *restrict x, int E) {
    double s[LANES] = {0};
    int e = 0;
    for (; e <= E - LANES; e += LANES)  // e + LANES can pass INT_MAX
        for (int k = 0; k < LANES; k++) s[k] += x[e + k];
    for (int k = 0; e < E; e++, k++) s[k] += x[e];
    return sum_lanes(s) / E;
}

// xhat = (x - mean) * rstd in the real type, without losing the low bits of the double
// mean: mean = hi + lo with hi = (real)mean, and x - hi is (nearly) exact when x is
// close to the mean, which is the large-mean case where a rounded mean would hurt.
typedef struct {
    real hi, lo, rstd;
} centre;

AGI_INLINE centre centre_of(double mean, double rstd) {
    real hi = (real)mean;
    return (centre){hi, (real)(mean - hi), (real)rstd};
}

AGI_INLINE real centred(real x, centre c) { return (x - c.hi) - c.lo; }

// The variance from (x - mean)^2, never from mean(x^2) - mean^2, which cancels
// catastrophically when the mean is large and the variance tiny.
AGI_INLINE double row_var(const real *restrict x, int E, centre c) {
    double s[LANES] = {0};
    int e = 0;
    for (; e <= E - LANES; e += LANES)  // e + LANES can pass INT_MAX
        for (int k = 0; k < LANES; k++) {
            double d = centred(x[e + k], c);
            s[k] += d * d;
        }
    for (int k = 0; e < E; e++, k++) {
        double d = centred(x[e], c);
        s[k] += d * d;
    }
    return sum_lanes(s) / E;
}

void R(agi_layernorm_forward_rows)(size_t begin, size_t end, void *ctx);
void R(agi_layernorm_backward_blocks)(size_t begin, size_t end, void *ctx);

AGI_HOT void R(agi_layernorm_forward_rows)(size_t begin, size_t end, void *ctx) {
    const layernorm_job *j = ctx;
    const int E = j->E;
    const real *restrict w = j->w, *restrict b = j->b;
    for (size_t r = begin; r < end; r++) {
        const real *restrict x = j->x + r * E;
        real *restrict y = j->y + r * E;
        const double mean = row_mean(x, E);
        const double var = row_var(x, E, centre_of(mean, 1));
        const double rstd = 1.0 / sqrt(var + j->eps);
        const centre c = centre_of(mean, rstd);
        if (w && b)
            for (int e = 0; e < E; e++) y[e] = centred(x[e], c) * c.rstd * w[e] + b[e];
        else if (w)
            for (int e = 0; e < E; e++) y[e] = centred(x[e], c) * c.rstd * w[e];
        else if (b)
            for (int e = 0; e < E; e++) y[e] = centred(x[e], c) * c.rstd + b[e];
        else
            for (int e = 0; e < E; e++) y[e] = centred(x[e], c) * c.rstd;
        if (j->stats) j->stats[r] = (row_stats){mean, rstd};
    }
}

// One row of backward: dx (when wanted) and, when part is not NULL, the row's terms of the
// block's dw and db sums (part[0, E) and part[E, 2E)).
AGI_INLINE void backward_row(const layernorm_job *j, size_t r, double *restrict part) {
    const int E = j->E;
    const real *restrict x = j->x + r * E, *restrict dy = j->dy + r * E, *restrict w = j->w;
    const centre c = centre_of(j->stats[r].mean, j->stats[r].rstd);
    // g = dy * w; dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
    double sg[LANES] = {0}, sgx[LANES] = {0};
    double *restrict pw = part, *restrict pb = part ? part + E : NULL;
    int e = 0;
    for (; e <= E - LANES; e += LANES)  // e + LANES can pass INT_MAX
        for (int k = 0; k < LANES; k++) {
            const real xh = centred(x[e + k], c) * c.rstd;
            const real g = w ? dy[e + k] * w[e + k] : dy[e + k];
            sg[k] += g;
            sgx[k] += g * xh;
            if (part) pw[e + k] += dy[e + k] * xh, pb[e + k] += dy[e + k];
        }
    for (int k = 0; e < E; e++, k++) {
        const real xh = centred(x[e], c) * c.rstd, g = w ? dy[e] * w[e] : dy[e];
        sg[k] += g;
        sgx[k] += g * xh;
        if (part) pw[e] += dy[e] * xh, pb[e] += dy[e];
    }
    if (!j->dx) return;
    const real mg = (real)(sum_lanes(sg) / E), mgx = (real)(sum_lanes(sgx) / E);
    real *restrict dx = j->dx + r * E;
    if (w)
        for (e = 0; e < E; e++)
            dx[e] += c.rstd * (dy[e] * w[e] - mg - (centred(x[e], c) * c.rstd) * mgx);
    else
        for (e = 0; e < E; e++)
            dx[e] += c.rstd * (dy[e] - mg - (centred(x[e], c) * c.rstd) * mgx);
}

AGI_HOT void R(agi_layernorm_backward_blocks)(size_t begin, size_t end, void *ctx) {
    const layernorm_job *j = ctx;
    const size_t E = (size_t)j->E;
    for (size_t blk = begin; blk < end; blk++) {
        double *part = j->part ? j->part + 2 * E * blk : NULL;
        if (part)
            for (size_t e = 0; e < 2 * E; e++) part[e] = 0;
        const size_t r1 = (blk + 1) * BLOCK_ROWS < j->rows ? (blk + 1) * BLOCK_ROWS : j->rows;
        for (size_t r = blk * BLOCK_ROWS; r < r1; r++) backward_row(j, r, part);
    }
}

// dw and db: each column adds the blocks' partial sums in block order, into block 0's.
static void backward_dwdb_columns(size_t begin, size_t end, void *ctx) {
    const layernorm_job *j = ctx;
    const size_t E = (size_t)j->E, blocks = (j->rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
    double *restrict sum = j->part;
    for (size_t blk = 1; blk < blocks; blk++) {
        const double *restrict part = j->part + 2 * E * blk;
        for (size_t e = begin; e < end; e++) {
            sum[e] += part[e];
            sum[E + e] += part[E + e];
        }
    }
    for (size_t e = begin; e < end; e++) {
        if (j->dw) j->dw[e] += (real)sum[e];
        if (j->db) j->db[e] += (real)sum[E + e];
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
    agi_parallel_for(j.rows, 8.0 * (double)n->out->numel, R(agi_layernorm_forward_rows), &j);
}

static void layernorm_backward(ag_node *n) {
    const layernorm_params *p = n->params;
    layernorm_job j = job_of(n);
    j.stats = n->saved;
    j.dy = n->out->grad;
    j.dx = n->in[0]->grad;
    j.dw = p->w >= 0 ? n->in[p->w]->grad : NULL;
    j.db = p->b >= 0 ? n->in[p->b]->grad : NULL;
    const size_t blocks = (j.rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
    if (j.dw || j.db) j.part = ag_tape_alloc(n->tape, blocks * 2 * (size_t)j.E * sizeof *j.part);
    if (!j.dx && !j.part) return;
    agi_parallel_for(blocks, 10.0 * (double)n->out->numel, R(agi_layernorm_backward_blocks), &j);
    if (j.part)
        agi_parallel_for((size_t)j.E, 2.0 * (double)(blocks * (size_t)j.E), backward_dwdb_columns,
                         &j);
}

const ag_op R(agi_layernorm_op) = {"layernorm", layernorm_forward, layernorm_backward,
    "dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w; dw = sum dy * xhat; db = sum dy"};

#if AG_ONCE
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
    return ag_op_apply(tp, agi_pick(x, &agi_layernorm_op_f32, &agi_layernorm_op_f64), n_in, in,
                    x->ndim, x->shape, &p, sizeof p);
}
#endif
