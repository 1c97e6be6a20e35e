// A slice of one dim (PyTorch's narrow).
//   x: [..., n, ...] (n at dim) -> y: [..., length, ...]
//   y[o, j, i] = x[o, start + j, i] for j < length (x viewed as [outer, n, inner])
//   dx[o, start + j, i] += dy[o, j, i]; the rest of dx receives nothing
// A copy (tensors stay contiguous), split across threads over the leading dims.
#include <string.h>

#include "shape.h"

typedef struct {
    int dim, start;
} slice_params;

typedef struct {
    size_t n, inner, start, len;  // len: elements of y per outer index
    const real *src;
    real *dst;
    bool forward;
} slice_job;

static void slice_rows(size_t begin, size_t end, void *ctx) {
    const slice_job *j = ctx;
    for (size_t o = begin; o < end; o++) {
        size_t xo = (o * j->n + j->start) * j->inner, yo = o * j->len;
        if (j->forward)
            memcpy(j->dst + yo, j->src + xo, j->len * sizeof(real));
        else
            for (size_t k = 0; k < j->len; k++) j->dst[xo + k] += j->src[yo + k];
    }
}

static void run(ag_node *n, bool forward) {
    const slice_params *p = n->params;
    agi_around a = agi_around_dim(n->in[0], p->dim);
    slice_job j = {a.n, a.inner, (size_t)p->start, (size_t)n->out->shape[p->dim] * a.inner,
                   forward ? n->in[0]->data : n->out->grad,
                   forward ? n->out->data : n->in[0]->grad, forward};
    agi_parallel_for(a.outer, 2.0 * (double)n->out->numel, slice_rows, &j);
}

static void slice_forward(ag_node *n) { run(n, true); }
static void slice_backward(ag_node *n) { run(n, false); }

const ag_op R(agi_slice_op) = {"slice", slice_forward, slice_backward,
    "dx[start:start+length] += dy along dim"};

#if AG_ONCE
ag_tensor *ag_slice(ag_tape *tp, ag_tensor *x, int dim, int start, int length) {
    if (!agi_check_float("slice", "x", x)) return NULL;
    int d = agi_dim("slice", "x", x, dim, 0);
    if (d < 0) return NULL;
    int n = x->shape[d], s = start < 0 ? start + n : start;
    if (length < 1) {
        ag_error("slice: length %d along dim %d of x %s; it must be >= 1", length, dim,
                 agi_shape(x));
        return NULL;
    }
    if (s < 0 || s > n - length) {
        ag_error("slice: [%d, %d + %d) is outside dim %d of x %s (size %d)", start, start, length,
                 dim, agi_shape(x), n);
        return NULL;
    }
    slice_params p = {d, s};
    int shape[AG_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = i == d ? length : x->shape[i];
    return ag_op_apply(tp, agi_pick(x, &agi_slice_op_f32, &agi_slice_op_f64), 1, &x, x->ndim,
                    shape, &p, sizeof p);
}
#endif
