// Broadcasting a tensor to a larger shape (PyTorch's expand, as a copy).
//   x: [*s] -> y: `shape`, where s, right-aligned against shape, has each dim equal to
//   shape's or 1 (new leading dims allowed); -1 in `shape` keeps x's size there.
//   y = x repeated along the broadcast dims;  dx = dy summed over them (one thread, in
//   row-major order, so the sum is the same on every run).
#include "shape.h"

typedef struct {
    agi_bcast g;
    const real *src;
    real *dst;
} expand_job;

static void forward_units(size_t begin, size_t end, void *ctx) {
    const expand_job *j = ctx;
    size_t off[1], len, s = j->g.stride[0][3];
    for (size_t u = begin; u < end; u++) {
        size_t o = agi_bcast_unit(&j->g, u, off, &len);
        for (size_t i = 0; i < len; i++) j->dst[o + i] = j->src[off[0] + i * s];
    }
}

static void expand_forward(ag_node *n) {
    expand_job j = {.src = n->in[0]->data, .dst = n->out->data};
    agi_bcast_init(&j.g, 1, &n->in[0], n->out->ndim, n->out->shape);
    agi_parallel_for(j.g.units, (double)n->out->numel, forward_units, &j);
}

static void expand_backward(ag_node *n) {
    agi_bcast g;
    agi_bcast_init(&g, 1, &n->in[0], n->out->ndim, n->out->shape);
    const real *dy = n->out->grad;
    real *dx = n->in[0]->grad;
    const size_t numel = n->in[0]->numel;
    double *sum = agi_grad_sums(n->tape, numel);
    size_t off[1], len, s = g.stride[0][3];
    for (size_t u = 0; u < g.units; u++) {
        size_t o = agi_bcast_unit(&g, u, off, &len);
        for (size_t i = 0; i < len; i++) sum[off[0] + i * s] += dy[o + i];
    }
    R(agi_grad_sums_add)(dx, sum, numel);
}

const ag_op R(agi_expand_op) = {"expand", expand_forward, expand_backward,
    "dx = dy summed over the broadcast dims"};

#if AG_ONCE
ag_tensor *ag_expand(ag_tape *tp, ag_tensor *x, int ndim, const int shape[]) {
    if (!agi_check_float("expand", "x", x)) return NULL;
    if (ndim > 0 && !shape) {
        ag_error("expand: the shape is NULL (ndim %d, x %s)", ndim, agi_shape(x));
        return NULL;
    }
    if (ndim < x->ndim || ndim > AG_MAX_DIMS) {
        ag_error("expand: cannot expand x %s to %d dims: the target needs %d to %d", agi_shape(x),
                 ndim, x->ndim, AG_MAX_DIMS);
        return NULL;
    }
    int out[AG_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        int j = i - (ndim - x->ndim), s = j < 0 ? 1 : x->shape[j];
        if (shape[i] == -1 && j < 0) {
            ag_error("expand: -1 at dim %d of %s is a new leading dim, where x %s has no size "
                     "to keep",
                     i, agi_shape_of(ndim, shape), agi_shape(x));
            return NULL;
        }
        out[i] = shape[i] == -1 ? s : shape[i];
        if (out[i] < 1 || (s != out[i] && s != 1)) {
            ag_error("expand: x %s does not broadcast to %s", agi_shape(x),
                     agi_shape_of(ndim, shape));
            return NULL;
        }
    }
    return ag_op_apply(tp, agi_pick(x, &agi_expand_op_f32, &agi_expand_op_f64), 1, &x, ndim, out,
                    NULL, 0);
}
#endif
