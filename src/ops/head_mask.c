// Scaling each attention head's output by its own factor (a head mask).
//   x: [B, h, T, d] (heads as dim 1) or [B, T, h*d] (heads inside the last dim),
//   mask: [h] -> y: x's shape
//   y[.., j, ..] = x[.., j, ..] * mask[j]
//   dx = dy * mask[j];  dmask[j] = sum over head j's elements of dy * x
// The gradient to the mask is what head importance (Michel, Levy & Neubig 2019)
// reads; a mask entry of 0 removes the head's contribution, as pruning it would.
// Both layouts are rows of `run` contiguous elements that share one mask entry,
// row r belonging to head r % h: in [B, h, T, d] a row is T*d, in [B, T, h*d] it is d.
#include "op.h"

typedef struct {
    const real *x, *m, *dy;
    real *y, *dx;
    size_t run;
    int heads;
} head_mask_job;

static size_t run_of(const ag_tensor *x, int heads) {
    return x->ndim == 4 ? (size_t)x->shape[2] * x->shape[3] : (size_t)x->shape[2] / heads;
}

static void forward_rows(size_t begin, size_t end, void *ctx) {
    const head_mask_job *j = ctx;
    for (size_t r = begin; r < end; r++) {
        real s = j->m[r % (size_t)j->heads];
        size_t o = r * j->run;
        for (size_t i = 0; i < j->run; i++) j->y[o + i] = j->x[o + i] * s;
    }
}

static void backward_dx_rows(size_t begin, size_t end, void *ctx) {
    const head_mask_job *j = ctx;
    for (size_t r = begin; r < end; r++) {
        real s = j->m[r % (size_t)j->heads];
        size_t o = r * j->run;
        for (size_t i = 0; i < j->run; i++) j->dx[o + i] += j->dy[o + i] * s;
    }
}

static head_mask_job job_of(const ag_node *n) {
    int heads = n->in[1]->shape[0];
    head_mask_job j = {n->in[0]->data, n->in[1]->data, n->out->grad, n->out->data,
                       n->in[0]->grad, run_of(n->in[0], heads), heads};
    return j;
}

static void head_mask_forward(ag_node *n) {
    head_mask_job j = job_of(n);
    size_t rows = n->out->numel / j.run;
    agi_parallel_for(rows, (double)n->out->numel, forward_rows, &j);
}

static void head_mask_backward(ag_node *n) {
    head_mask_job j = job_of(n);
    size_t rows = n->out->numel / j.run;
    if (j.dx) agi_parallel_for(rows, 2.0 * (double)n->out->numel, backward_dx_rows, &j);
    real *dm = n->in[1]->grad;
    if (!dm) return;
    // One pass in a fixed order, on the calling thread: the sum is the same for
    // every thread count. In double: a float sum over a head's B T d elements drifts by
    // up to that many roundings.
    double *sum = agi_grad_sums(n->tape, (size_t)j.heads);
    for (size_t r = 0; r < rows; r++) {
        size_t o = r * j.run;
        double s = 0;
        for (size_t i = 0; i < j.run; i++) s += (double)j.dy[o + i] * j.x[o + i];
        sum[r % (size_t)j.heads] += s;
    }
    R(agi_grad_sums_add)(dm, sum, (size_t)j.heads);
}

const ag_op R(agi_head_mask_op) = {"head_mask", head_mask_forward, head_mask_backward,
    "dx = dy * mask[head]; dmask[head] = sum over the head of dy * x"};

#if AG_ONCE
ag_tensor *ag_head_mask(ag_tape *tp, ag_tensor *x, ag_tensor *mask, int heads) {
    if (!agi_check_float("head_mask", "x", x) || !agi_check_float("head_mask", "mask", mask) ||
        !agi_check_same_dtype("head_mask", x, mask) ||
        !agi_check_ndim("head_mask", "x [B, h, T, d] or [B, T, h*d]", x, 3, 4))
        return NULL;
    int h = x->ndim == 4 ? x->shape[1] : heads;
    if (h < 1 || (x->ndim == 4 && heads != 0 && heads != h)) {
        ag_error("head_mask: heads %d does not fit x %s", heads, agi_shape(x));
        return NULL;
    }
    if (x->ndim == 3 && x->shape[2] % h != 0) {
        ag_error("head_mask: the last dim of x %s is not divisible by %d heads", agi_shape(x),
                 h);
        return NULL;
    }
    if (mask->ndim != 1 || mask->shape[0] != h) {
        ag_error("head_mask: mask %s must be [%d], one entry per head of x %s", agi_shape(mask),
                 h, agi_shape(x));
        return NULL;
    }
    ag_tensor *in[] = {x, mask};
    return ag_op_apply(tp, agi_pick(x, &agi_head_mask_op_f32, &agi_head_mask_op_f64), 2, in,
                    x->ndim, x->shape, NULL, 0);
}
#endif
