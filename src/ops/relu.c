// Rectified linear unit.
//   x: any -> y: same
//   y = max(x, 0);  dx = dy where x > 0 or x is NaN, else 0
// At exactly x = 0 the gradient is 0, as in PyTorch (the subgradient it picks); at a NaN it
// is dy, as in PyTorch (whose backward zeroes where y <= 0, which a NaN is not).
//
// Both loops are selects without branches, so they vectorise; large tensors are
// split over threads in fixed chunks.
#include "op.h"
#include "../kernels/vecmath.h"

#define CHUNK 16384

typedef struct {
    size_t n;
    const real *x, *dy;
    real *y, *dx;
} relu_job;

void R(agi_relu_forward_chunks)(size_t begin, size_t end, void *ctx);
void R(agi_relu_backward_chunks)(size_t begin, size_t end, void *ctx);

AGI_HOT void R(agi_relu_forward_chunks)(size_t begin, size_t end, void *ctx) {
    const relu_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK < j->n ? end * CHUNK : j->n;
    const real *restrict x = j->x;
    real *restrict y = j->y;
    // Written as "x <= 0 ? 0 : x" so that a NaN input stays NaN, as in PyTorch.
    for (size_t k = lo; k < hi; k++) y[k] = x[k] <= 0 ? 0 : x[k];
}

AGI_HOT void R(agi_relu_backward_chunks)(size_t begin, size_t end, void *ctx) {
    const relu_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK < j->n ? end * CHUNK : j->n;
    const real *restrict x = j->x, *restrict dy = j->dy;
    real *restrict dx = j->dx;
    // Adding 0 where x <= 0 leaves dx as it was (a NaN dy there is not passed on).
    for (size_t k = lo; k < hi; k++) dx[k] += x[k] <= 0 ? 0 : dy[k];
}

static void relu_forward(ag_node *n) {
    relu_job j = {n->out->numel, n->in[0]->data, NULL, n->out->data, NULL};
    agi_parallel_for((j.n + CHUNK - 1) / CHUNK, 2.0 * (double)j.n,
                     R(agi_relu_forward_chunks), &j);
}

static void relu_backward(ag_node *n) {
    relu_job j = {n->out->numel, n->in[0]->data, n->out->grad, NULL, n->in[0]->grad};
    agi_parallel_for((j.n + CHUNK - 1) / CHUNK, 3.0 * (double)j.n,
                     R(agi_relu_backward_chunks), &j);
}

const ag_op R(agi_relu_op) = {"relu", relu_forward, relu_backward,
    "dx = dy where x > 0 or x is NaN, else 0"};

#if AG_ONCE
ag_tensor *ag_relu(ag_tape *tp, ag_tensor *x) {
    if (!agi_check_float("relu", "x", x)) return NULL;
    return ag_op_apply(tp, agi_pick(x, &agi_relu_op_f32, &agi_relu_op_f64), 1, &x, x->ndim,
                    x->shape, NULL, 0);
}
#endif
