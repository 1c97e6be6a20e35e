// A slice of one dim (PyTorch's narrow).
//   x: [..., n, ...] (n at dim) -> y: [..., length, ...]
//   y[o, j, i] = x[o, start + j, i] for j < length (x viewed as [outer, n, inner])
//   dx[o, start + j, i] += dy[o, j, i]; the rest of dx receives nothing
// A copy (tensors stay contiguous).
#include <string.h>

#include "shape.h"

typedef struct {
    int dim, start;
} slice_params;

static void slice_forward(ag_node *n) {
    const slice_params *p = n->params;
    agi_around a = agi_around_dim(n->in[0], p->dim);
    size_t len = (size_t)n->out->shape[p->dim] * a.inner;
    const real *x = n->in[0]->data;
    real *y = n->out->data;
    for (size_t o = 0; o < a.outer; o++)
        memcpy(y + o * len, x + (o * a.n + (size_t)p->start) * a.inner, len * sizeof(real));
}

static void slice_backward(ag_node *n) {
    const slice_params *p = n->params;
    agi_around a = agi_around_dim(n->in[0], p->dim);
    size_t len = (size_t)n->out->shape[p->dim] * a.inner;
    const real *dy = n->out->grad;
    real *dx = n->in[0]->grad;
    for (size_t o = 0; o < a.outer; o++) {
        real *d = dx + (o * a.n + (size_t)p->start) * a.inner;
        for (size_t k = 0; k < len; k++) d[k] += dy[o * len + k];
    }
}

const ag_op R(agi_slice_op) = {"slice", slice_forward, slice_backward,
    "dx[start:start+length] += dy along dim"};

#if AG_ONCE
extern const ag_op agi_slice_op_f32, agi_slice_op_f64;

ag_tensor *ag_slice(ag_tape *tp, ag_tensor *x, int dim, int start, int length) {
    if (!agi_check_float("slice", "x", x)) return NULL;
    if (x->ndim == 0) {
        ag_error("slice: x %s is a scalar: it has no dim %d", agi_shape(x), dim);
        return NULL;
    }
    int d = agi_dim("slice", "x", x, dim, 0);
    if (d < 0) return NULL;
    int n = x->shape[d], s = start < 0 ? start + n : start;
    if (s < 0 || length < 1 || s > n - length) {
        ag_error("slice: [%d, %d + %d) is outside dim %d of x %s (size %d)", start, start, length,
                 dim, agi_shape(x), n);
        return NULL;
    }
    slice_params p = {d, s};
    int shape[AG_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = i == d ? length : x->shape[i];
    return ag_apply(tp, agi_pick(x, &agi_slice_op_f32, &agi_slice_op_f64), 1, &x, x->ndim,
                    shape, &p, sizeof p);
}
#endif
