// Fully connected layer, PyTorch layout (nn.Linear).
//   x: [..., in], w: [out, in], b: [out] or NULL -> y: [..., out]
//   Treating x as a matrix X [M, in] (M = product of the leading dims):
//   Y = X W^T + 1 b^T;  so dX = dY W,  dW = dY^T X,  db = column sums of dY.
#include <limits.h>

#include "op.h"
#include "../kernels/bf16_weights.h"
#include "../kernels/gemv.h"
#include "../kernels/vecmath.h"

// A small layer's three gradients in one job on the threads (one handing-out and one
// wait where three products would take three; large layers below). Part p takes rows
// r0..r1 of dY and X, the rows the ops before it made on that thread: its rows of dX,
// and with many rows (K_SPLIT_ROWS) its rows' share of dW and db (part 0 adds into dW,
// part p > 0 writes a scratch copy that is added after the job in part order). With few
// rows each part takes its rows of dW and its columns of db over every row instead, which
// needs no scratch. There are ROW_PARTS parts either way, whatever the thread count, so
// that the sum and the extents of every product, hence their bits, do not depend on it
// (ag_op_check compares 1 and 2 threads bit for bit; BLAS sums a product's rows
// differently at the edges of its blocks). Column sums of dy
// [M, out] are the one long reduction: M can be many thousands of rows, so each column
// is summed in double and only then added into db.
typedef struct {
    const real *dy, *x, *w;
    real *dx, *dw, *db;
    real *dw_part;     // parts - 1 scratch copies of dW [out, in] (split by rows)
    double *db_part;   // parts sums of dY's columns [out] (split by rows)
    int M, in, out, parts;
    bool by_rows;
    ag_autocast mode;  // the products' precision (linear_params)
} linear_grads;

enum { K_SPLIT_ROWS = 256, ROW_PARTS = 4 };

// A large layer (GPT-2's: a gigaflop a product) instead runs each product split over the
// threads by the product kernels, which pack the shared operand once for all threads and
// sum in the order of one thread (no shares of dW to add afterwards), then db by columns.
#define SPLIT_PRODUCTS_FLOP 2.5e8

// Sums rows i0..i1 of dY's columns c0..c1 (in double, each column in row order) into
// acc[0 .. c1 - c0), COLUMNS side by side: each row's run of them is one contiguous read,
// and the sums vectorise (agi_linear_column_sums).
enum { COLUMNS = 256 };

void R(agi_linear_column_sums)(const real *dy, int ld, int i0, int i1, int w, double *acc);

// Four rows a pass: the running sums are loaded and stored once for four additions (the
// loads and stores of a[], not the reads of dY, bounded the loop); a column's additions
// keep their row order.
AGI_HOT void R(agi_linear_column_sums)(const real *dy, int ld, int i0, int i1, int w,
                                       double *acc) {
    double a[COLUMNS];
    for (int c = 0; c < w; c++) a[c] = 0;
    int i = i0;
    for (; i <= i1 - 4; i += 4) {  // i + 4 <= i1, which i + 4 might pass INT_MAX
        const real *restrict r0 = dy + (size_t)i * ld, *restrict r1 = r0 + ld;
        const real *restrict r2 = r1 + ld, *restrict r3 = r2 + ld;
        for (int c = 0; c < w; c++)
            a[c] = (((a[c] + (double)r0[c]) + (double)r1[c]) + (double)r2[c]) + (double)r3[c];
    }
    for (; i < i1; i++) {
        const real *restrict row = dy + (size_t)i * ld;
        for (int c = 0; c < w; c++) a[c] += row[c];
    }
    for (int c = 0; c < w; c++) acc[c] = a[c];
}

static void column_sums(const linear_grads *j, int i0, int i1, int c0, int c1, double *acc) {
    for (ptrdiff_t c = c0; c < c1; c += COLUMNS)  // an int would pass INT_MAX after the last
        R(agi_linear_column_sums)(j->dy + c, j->out, i0, i1, c1 - c < COLUMNS ? c1 - c : COLUMNS,
                                  acc + (c - c0));
}

// db[c0:c1] += the sums of dY's columns c0..c1 over every row.
static void add_column_sums(const linear_grads *j, int c0, int c1) {
    double acc[COLUMNS];
    for (ptrdiff_t c = c0; c < c1; c += COLUMNS) {
        const int c_end = c1 - c < COLUMNS ? c1 : c + COLUMNS;
        column_sums(j, 0, j->M, c, c_end, acc);
        for (int k = c; k < c_end; k++) j->db[k] += (real)acc[k - c];
    }
}

static void linear_grads_of(size_t begin, size_t end, void *ctx) {
    const linear_grads *j = ctx;
    for (int p = (int)begin; p < (int)end; p++) {  // of j->parts
        const int r0 = (int)((long long)j->M * p / j->parts);
        const int r1 = (int)((long long)j->M * (p + 1) / j->parts);
        // dX [M, in] += dY [M, out] W [out, in]
        if (j->dx && r1 > r0)
            R(agi_gemm_autocast)(j->mode, false, false, r1 - r0, j->in, j->out, 1,
                                 j->dy + (size_t)r0 * j->out, j->out, j->w, j->in, 1, NULL,
                                 j->dx + (size_t)r0 * j->in, j->in);
        if (j->by_rows) {
            // dW [out, in] (+)= dY[r0:r1]^T X[r0:r1]
            if (j->dw)
                R(agi_gemm_autocast)(j->mode, true, false, j->out, j->in, r1 - r0, 1,
                                     j->dy + (size_t)r0 * j->out, j->out,
                                     j->x + (size_t)r0 * j->in, j->in, p ? 0 : 1, NULL,
                                     p ? j->dw_part + (size_t)(p - 1) * j->out * j->in : j->dw,
                                     j->in);
            if (j->db) column_sums(j, r0, r1, 0, j->out, j->db_part + (size_t)p * j->out);
            continue;
        }
        const int o0 = (int)((long long)j->out * p / j->parts);
        const int o1 = (int)((long long)j->out * (p + 1) / j->parts);
        // dW [out, in] += dY^T [out, M] X [M, in], rows o0..o1
        if (j->dw && o1 > o0)
            R(agi_gemm_autocast)(j->mode, true, false, o1 - o0, j->in, j->M, 1, j->dy + o0,
                                 j->out, j->x, j->in, 1, NULL, j->dw + (size_t)o0 * j->in, j->in);
        if (j->db) add_column_sums(j, o0, o1);
    }
}

// db (over columns [begin, end) in units of COLUMNS) of a large layer, whose products
// split themselves.
static void bias_columns(size_t begin, size_t end, void *ctx) {
    const linear_grads *j = ctx;
    const size_t c1 = end * COLUMNS < (size_t)j->out ? end * COLUMNS : (size_t)j->out;
    add_column_sums(j, (int)(begin * COLUMNS), (int)c1);  // columns of j->out
}

// Adds the parts' shares of dW and db, in part order.
static void add_parts(const linear_grads *j) {
    const size_t n = (size_t)j->out * j->in;
    if (j->dw)
        for (int p = 1; p < j->parts; p++) {
            const real *s = j->dw_part + (size_t)(p - 1) * n;
            for (size_t e = 0; e < n; e++) j->dw[e] += s[e];
        }
    if (j->db)
        for (int c = 0; c < j->out; c++) {
            double sum = 0;
            for (int p = 0; p < j->parts; p++) sum += j->db_part[(size_t)p * j->out + c];
            j->db[c] += (real)sum;
        }
}

// The tape's autocast when the op was recorded: the precision of its products; and for a
// few rows under autocast, the table of bf16 copies of weights the tape carries, if any.
typedef struct {
    ag_autocast products;
    struct agi_bf16_weights *copies;
} linear_params;

static void linear_forward(ag_node *n) {
    const linear_params *p = n->params;
    const ag_tensor *x = n->in[0], *w = n->in[1];
    int in = w->shape[1], out = w->shape[0], M = (int)agi_rows(x);
    const real *b = n->n_in > 2 ? n->in[2]->data : NULL;
#ifndef AG_REAL_F64
    if (p->copies) {  // the products' rounding, from the table's copy of W: half the bytes
        agi_bf16_weights_gemv(p->copies, M, out, in, x->data, in, w->data, b, n->out->data, out);
        return;
    }
#endif
    // The bias is added as each block of Y is stored, in the product's own pass over Y.
    R(agi_gemm_autocast)(p->products, false, true, M, out, in, 1, x->data, in, w->data, in, 0, b,
                         n->out->data, out);
}

static void linear_backward(ag_node *n) {
    const ag_tensor *x = n->in[0], *w = n->in[1];
    const int in = w->shape[1], out = w->shape[0], M = (int)agi_rows(x);
    linear_grads j = {n->out->grad, x->data, w->data, x->grad, w->grad,
                      n->n_in > 2 ? n->in[2]->grad : NULL, NULL, NULL, M, in, out, 1, false,
                      ((const linear_params *)n->params)->products};
    if (2.0 * M * in * out >= SPLIT_PRODUCTS_FLOP) {
        if (j.dx)  // dX [M, in] += dY [M, out] W [out, in]
            R(agi_gemm_autocast)(j.mode, false, false, M, in, out, 1, j.dy, out, j.w, in, 1,
                                 NULL, j.dx, in);
        if (j.dw)  // dW [out, in] += dY^T [out, M] X [M, in]
            R(agi_gemm_autocast)(j.mode, true, false, out, in, M, 1, j.dy, out, j.x, in, 1,
                                 NULL, j.dw, in);
        if (j.db)
            agi_parallel_for((size_t)agi_tiles(out, COLUMNS), (double)M * out, bias_columns, &j);
        return;
    }
    const double work = 2.0 * M * in * out * ((j.dx != NULL) + (j.dw != NULL)) + (double)M * out;
    const bool split = work >= AGI_PARALLEL_MIN_WORK;
    j.by_rows = split && M >= K_SPLIT_ROWS;
    j.parts = split ? ROW_PARTS : 1;
    if (j.by_rows) {
        if (j.dw)
            j.dw_part = ag_tape_alloc(n->tape, (size_t)(j.parts - 1) * out * in * sizeof(real));
        if (j.db) j.db_part = ag_tape_alloc(n->tape, (size_t)j.parts * out * sizeof(double));
    }
    agi_parallel_for((size_t)j.parts, work, linear_grads_of, &j);
    if (j.by_rows) add_parts(&j);
}

const ag_op R(agi_linear_op) = {"linear", linear_forward, linear_backward,
    "dx = dy W; dW = dy^T x; db = sum over rows of dy"};

#if AG_ONCE
ag_tensor *ag_linear(ag_tape *tp, ag_tensor *x, ag_tensor *w, ag_tensor *b) {
    if (!agi_check_float("linear", "x", x) || !agi_check_float("linear", "w", w) ||
        !agi_check_same_dtype("linear", x, w) || !agi_check_ndim("linear", "x", x, 1, 4) ||
        !agi_check_ndim("linear", "w", w, 2, 2))
        return NULL;
    if (b && (!agi_check_float("linear", "b", b) || !agi_check_same_dtype("linear", x, b)))
        return NULL;
    int in = w->shape[1], out = w->shape[0];
    if (agi_last(x) != in) {
        ag_error("linear: x %s has %d features but w %s expects %d", agi_shape(x), agi_last(x),
                 agi_shape(w), in);
        return NULL;
    }
    if (b && !(b->ndim == 1 && b->shape[0] == out)) {
        ag_error("linear: bias %s must be [%d] for w %s", agi_shape(b), out, agi_shape(w));
        return NULL;
    }
    if (agi_rows(x) > INT_MAX) {
        ag_error("linear: x %s has more than %d rows", agi_shape(x), INT_MAX);
        return NULL;
    }
    int shape[AG_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = out;
    ag_tensor *inputs[] = {x, w, b};
    // A parameter's copy only: a table knows a weight by its address, which a tape tensor
    // gives to another after a reset.
    linear_params p = {ag_tape_autocast(tp), NULL};
    struct agi_bf16_weights *copies = agi_tape_bf16_weights(tp);
    if (copies && p.products == AG_AUTOCAST_BF16 && w->dtype == AG_F32 &&
        (w->agi_bookkeeping & AGI_PARAM) && agi_rows(x) <= AGI_GEMV_ROWS)
        p.copies = copies;
    return ag_op_apply(tp, agi_pick(x, &agi_linear_op_f32, &agi_linear_op_f64), b ? 3 : 2, inputs,
                    x->ndim, shape, &p, sizeof p);
}
#endif
