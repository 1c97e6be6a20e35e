// Picking entries along a dim by an integer index: index_select and gather.
//   index_select: x: [..., n, ...], index: i32/i64 [m] -> y: [..., m, ...]
//                 y[o, j, i] = x[o, index[j], i]         (x viewed as [outer, n, inner])
//   gather:       x: [s_0..s_{k-1}], index: i32/i64 with the same number of dims and
//                 index.shape[d] <= x.shape[d] for d != dim -> y: index's shape
//                 y[p] = x[p with its dim-th coordinate replaced by index[p]]
//   dx[where y's element came from] += dy, in y's row-major order (index_select splits
//   the leading dims across threads, each owning its rows of dx; gather runs on one
//   thread), so an index repeated (a table row used twice) sums its gradients the same
//   way every run.
// Every index is checked when the op is built: an entry outside [0, n) is an error naming
// it and its position.
#include <string.h>

#include "shape.h"

typedef struct {
    int dim;
} index_params;

typedef struct {
    const ag_node *n;
    bool forward;
} select_job;

// Leading indices [begin, end): each owns its rows of x and y, so threads never collide;
// within one, repeated indices add up in order.
static void select_rows(size_t begin, size_t end, void *ctx) {
    const select_job *job = ctx;
    const ag_node *n = job->n;
    const index_params *p = n->params;
    const ag_tensor *x = n->in[0], *idx = n->in[1];
    agi_around a = agi_around_dim(x, p->dim);
    size_t m = idx->numel;
    for (size_t o = begin; o < end; o++)
        for (size_t j = 0; j < m; j++) {
            size_t src = (o * a.n + agi_index_at(idx, j)) * a.inner, dst = (o * m + j) * a.inner;
            if (job->forward) {
                memcpy((real *)n->out->data + dst, (const real *)x->data + src,
                       a.inner * sizeof(real));
            } else {
                real *dx = (real *)x->grad + src;
                const real *dy = (const real *)n->out->grad + dst;
                for (size_t i = 0; i < a.inner; i++) dx[i] += dy[i];
            }
        }
}

static void index_select_walk(ag_node *n, bool forward) {
    const index_params *p = n->params;
    select_job job = {n, forward};
    agi_parallel_for(agi_around_dim(n->in[0], p->dim).outer, 2.0 * (double)n->out->numel,
                     select_rows, &job);
}

static void gather_walk(ag_node *n, bool forward) {
    const index_params *p = n->params;
    const ag_tensor *x = n->in[0], *idx = n->in[1];
    int pad = AG_MAX_DIMS - x->ndim, dim = p->dim + pad;
    size_t xs[AG_MAX_DIMS], shape[AG_MAX_DIMS], s = 1;
    for (int d = AG_MAX_DIMS - 1; d >= 0; d--) {
        xs[d] = s;
        s *= d < pad ? 1 : (size_t)x->shape[d - pad];
        shape[d] = d < pad ? 1 : (size_t)idx->shape[d - pad];
    }
    size_t k = 0, i[AG_MAX_DIMS];
    for (i[0] = 0; i[0] < shape[0]; i[0]++)
        for (i[1] = 0; i[1] < shape[1]; i[1]++)
            for (i[2] = 0; i[2] < shape[2]; i[2]++)
                for (i[3] = 0; i[3] < shape[3]; i[3]++, k++) {
                    size_t off = 0;
                    for (int d = 0; d < AG_MAX_DIMS; d++)
                        off += (d == dim ? agi_index_at(idx, k) : i[d]) * xs[d];
                    if (forward)
                        ((real *)n->out->data)[k] = ((const real *)x->data)[off];
                    else
                        ((real *)x->grad)[off] += ((const real *)n->out->grad)[k];
                }
}

static void index_select_forward(ag_node *n) { index_select_walk(n, true); }
static void index_select_backward(ag_node *n) { index_select_walk(n, false); }
static void gather_forward(ag_node *n) { gather_walk(n, true); }
static void gather_backward(ag_node *n) { gather_walk(n, false); }

const ag_op R(agi_index_select_op) = {"index_select", index_select_forward,
    index_select_backward, "dx[index[j]] += dy[j] along dim"};
const ag_op R(agi_gather_op) = {"gather", gather_forward, gather_backward,
    "dx[p with index[p] at dim] += dy[p]"};

#if AG_ONCE
static int checked_dim(const char *op, ag_tensor *x, int dim) {
    if (!agi_check_float(op, "x", x)) return -1;
    return agi_dim(op, "x", x, dim, 0);
}

// The index as the node keeps it: when the op records, a copy in tape memory (as
// embedding's ids and the losses' targets), since backward reads it again and an entry
// changed after the check would move the gradient or write outside dx.
static ag_tensor *kept_index(ag_tape *tp, const ag_tensor *x, ag_tensor *index) {
    if (!tp || !x->requires_grad || !ag_tape_grad_enabled(tp)) return index;
    ag_tensor *c = ag_tape_tensor(tp, index->dtype, index->ndim, index->shape);
    if (!c) return NULL;
    memcpy(c->data, index->data, index->numel * ag_dtype_size(index->dtype));
    c->name = index->name;
    return c;
}

ag_tensor *ag_index_select(ag_tape *tp, ag_tensor *x, int dim, ag_tensor *index) {
    int d = checked_dim("index_select", x, dim);
    if (d < 0) return NULL;
    if (index && index->ndim != 1) {
        ag_error("index_select: index %s must have 1 dim; x %s", agi_shape(index), agi_shape(x));
        return NULL;
    }
    if (!agi_check_index("index_select", index, x, d)) return NULL;
    int shape[AG_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = i == d ? index->shape[0] : x->shape[i];
    index_params p = {d};
    ag_tensor *in[] = {x, kept_index(tp, x, index)};
    if (!in[1]) return NULL;
    return ag_op_apply(tp, agi_pick(x, &agi_index_select_op_f32, &agi_index_select_op_f64), 2, in,
                    x->ndim, shape, &p, sizeof p);
}

ag_tensor *ag_gather(ag_tape *tp, ag_tensor *x, int dim, ag_tensor *index) {
    int d = checked_dim("gather", x, dim);
    if (d < 0) return NULL;
    bool ok = index && index->ndim == x->ndim;
    for (int i = 0; ok && i < x->ndim; i++) ok = i == d || index->shape[i] <= x->shape[i];
    if (index && !ok) {
        ag_error("gather: index %s does not fit x %s (same dims, each at most x's except dim %d)",
                 agi_shape(index), agi_shape(x), dim);
        return NULL;
    }
    if (!agi_check_index("gather", index, x, d)) return NULL;
    index_params p = {d};
    ag_tensor *in[] = {x, kept_index(tp, x, index)};
    if (!in[1]) return NULL;
    return ag_op_apply(tp, agi_pick(x, &agi_gather_op_f32, &agi_gather_op_f64), 2, in, x->ndim,
                    index->shape, &p, sizeof p);
}
#endif
