// Fully connected layer, PyTorch layout (nn.Linear).
//   x: [..., in], w: [out, in], b: [out] or NULL -> y: [..., out]
//   Treating x as a matrix X [M, in] (M = product of the leading dims):
//   Y = X W^T + 1 b^T;  so dX = dY W,  dW = dY^T X,  db = column sums of dY.
#include <limits.h>

#include "op.h"

// Column sums of dy [M, out] are the one long reduction here: M can be many
// thousands of rows, so they are accumulated in double (a scratch row in tape
// memory) and only then added into db.
static void add_column_sums(ag_tape *tp, const real *dy, size_t M, int out, real *db) {
    double *acc = ag_tape_alloc(tp, (size_t)out * sizeof *acc);
    for (int j = 0; j < out; j++) acc[j] = 0;
    for (size_t i = 0; i < M; i++) {
        const real *row = dy + i * (size_t)out;
        for (int j = 0; j < out; j++) acc[j] += row[j];
    }
    for (int j = 0; j < out; j++) db[j] += (real)acc[j];
}

static void linear_forward(ag_node *n) {
    const ag_tensor *x = n->in[0], *w = n->in[1];
    int in = w->shape[1], out = w->shape[0], M = (int)agi_rows(x);
    const real *b = n->n_in > 2 ? n->in[2]->data : NULL;
    real *y = n->out->data;
    // With a bias, Y starts as the bias rows and the product is added onto
    // them (beta = 1), which saves a second pass over Y.
    if (b)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < out; j++) y[(size_t)i * out + j] = b[j];
    R(agi_gemm)(false, true, M, out, in, 1, x->data, in, w->data, in, b ? 1 : 0, y, out);
}

static void linear_backward(ag_node *n) {
    const ag_tensor *x = n->in[0], *w = n->in[1];
    int in = w->shape[1], out = w->shape[0], M = (int)agi_rows(x);
    const real *dy = n->out->grad;
    real *dx = x->grad, *dw = w->grad;
    // dX [M, in] += dY [M, out] W [out, in]
    if (dx) R(agi_gemm)(false, false, M, in, out, 1, dy, out, w->data, in, 1, dx, in);
    // dW [out, in] += dY^T [out, M] X [M, in]
    if (dw) R(agi_gemm)(true, false, out, in, M, 1, dy, out, x->data, in, 1, dw, in);
    if (n->n_in > 2 && n->in[2]->grad)
        add_column_sums(n->tape, dy, (size_t)M, out, n->in[2]->grad);
}

const ag_op R(agi_linear_op) = {"linear", linear_forward, linear_backward,
    "dx = dy W; dW = dy^T x; db = sum over rows of dy"};

#if AG_ONCE
extern const ag_op agi_linear_op_f32, agi_linear_op_f64;

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
    return ag_apply(tp, agi_pick(x, &agi_linear_op_f32, &agi_linear_op_f64), b ? 3 : 2, inputs,
                    x->ndim, shape, NULL, 0);
}
#endif
