// A copy with a new shape of the same numel (row-major order is kept).
//   x: any -> y: `shape`, numel(shape) == numel(x)
//   y[k] = x[k] in flat order;  dx[k] = dy[k]
// A copy, not a view: an op's output owns its data, so no gradient can be
// corrupted through an alias. (Op outputs never alias; the one aliasing tape
// tensor is agi_rows_view's leaf, whose gradient is meant to land in its
// parent's.)
#include <string.h>

#include "op.h"

static void reshape_forward(ag_node *n) {
    memcpy(n->out->data, n->in[0]->data, n->out->numel * sizeof(real));
}

static void reshape_backward(ag_node *n) {
    const real *dy = n->out->grad;
    real *dx = n->in[0]->grad;
    for (size_t k = 0; k < n->out->numel; k++) dx[k] += dy[k];
}

const ag_op R(agi_reshape_op) = {"reshape", reshape_forward, reshape_backward,
    "dx = reshape(dy)"};

#if AG_ONCE
ag_tensor *ag_reshape(ag_tape *tp, ag_tensor *x, int ndim, const int shape[]) {
    if (!agi_check_float("reshape", "x", x)) return NULL;
    if (ndim > 0 && !shape) {
        ag_error("reshape: shape is NULL for %d dimensions (x %s)", ndim, agi_shape(x));
        return NULL;
    }
    if (!agi_valid_shape("reshape", x->dtype, ndim, shape)) return NULL;
    if (agi_numel(ndim, shape) != x->numel) {
        ag_error("reshape: cannot reshape %s (%zu elements) to %s (%zu elements)",
                 agi_shape(x), x->numel, agi_shape_of(ndim, shape), agi_numel(ndim, shape));
        return NULL;
    }
    return ag_op_apply(tp, agi_pick(x, &agi_reshape_op_f32, &agi_reshape_op_f64), 1, &x, ndim,
                    shape, NULL, 0);
}
#endif
