// Joining tensors along a dim: concat (an existing dim) and stack (a new one).
//   concat: x_k: [..., n_k, ...] -> y: [..., sum_k n_k, ...]
//   stack:  x_k: [*s] (all equal) -> y: [*s with K inserted at dim]
// Both are the same copy: viewed around the dim, every x_k is [outer, w_k] (w_k = n_k * inner,
// or inner for stack) and each row of y is the rows of x_0, x_1, ... side by side.
//   dx_k = its columns of dy, row by row.
// A node takes at most AG_MAX_INPUTS tensors; more are joined in several nodes. Rows are
// split across threads above a size threshold.
#include <limits.h>
#include <string.h>

#include "shape.h"

typedef struct {
    size_t outer;
    size_t width[AG_MAX_INPUTS];
} concat_params;

typedef struct {
    const ag_node *n;
    bool forward;
} concat_job;

// Rows [begin, end) of y: forward copies each x_k's row in; backward adds each part of
// dy's row into x_k's gradient.
static void concat_rows(size_t begin, size_t end, void *ctx) {
    const concat_job *j = ctx;
    const ag_node *n = j->n;
    const concat_params *p = n->params;
    size_t row = 0;
    for (int k = 0; k < n->n_in; k++) row += p->width[k];
    for (size_t o = begin; o < end; o++) {
        size_t at = o * row;
        for (int k = 0; k < n->n_in; k++) {
            size_t w = p->width[k], xo = o * w;
            if (j->forward) {
                memcpy((real *)n->out->data + at, (const real *)n->in[k]->data + xo,
                       w * sizeof(real));
            } else if (n->in[k]->grad) {
                real *dx = (real *)n->in[k]->grad + xo;
                const real *dy = (const real *)n->out->grad + at;
                for (size_t i = 0; i < w; i++) dx[i] += dy[i];
            }
            at += w;
        }
    }
}

static void run(ag_node *n, bool forward) {
    concat_job j = {n, forward};
    const concat_params *p = n->params;
    agi_parallel_for(p->outer, 2.0 * (double)n->out->numel, concat_rows, &j);
}

static void concat_forward(ag_node *n) { run(n, true); }
static void concat_backward(ag_node *n) { run(n, false); }

const ag_op R(agi_concat_op) = {"concat", concat_forward, concat_backward,
    "dx_k = dy's slice of x_k along dim"};
const ag_op R(agi_stack_op) = {"stack", concat_forward, concat_backward,
    "dx_k = dy's entry k along the new dim"};

#if AG_ONCE
static bool check_inputs(const char *op, ag_tensor *const xs[], int n) {
    if (!xs) {
        ag_error("%s: the tensor array xs is NULL (n %d)", op, n);
        return false;
    }
    if (n < 1) {
        ag_error("%s: needs at least one tensor, got n %d", op, n);
        return false;
    }
    for (int k = 0; k < n; k++) {
        char what[32];
        snprintf(what, sizeof what, "xs[%d]", k);
        if (!agi_check_float(op, what, xs[k]) || !agi_check_same_dtype(op, xs[0], xs[k]))
            return false;
    }
    return true;
}

// xs already checked; dim normalised; stack inserts a dim of size n at dim.
static ag_tensor *join(ag_tape *tp, ag_tensor *const xs[], int n, int dim, bool stack) {
    const ag_tensor *x0 = xs[0];
    int shape[AG_MAX_DIMS + 1], nd = 0;
    for (int i = 0; i < x0->ndim; i++) {
        if (i == dim && stack) shape[nd++] = n;
        shape[nd++] = x0->shape[i];
    }
    if (stack && dim == x0->ndim) shape[nd++] = n;
    if (!stack) {
        shape[dim] = 0;
        for (int k = 0; k < n; k++) shape[dim] += xs[k]->shape[dim];
    }
    if (n > AG_MAX_INPUTS) {  // join the first ones, then the rest onto that
        ag_tensor *head = join(tp, xs, AG_MAX_INPUTS, dim, stack);
        if (!head) return NULL;
        ag_tensor *rest[AG_MAX_INPUTS];
        int done = AG_MAX_INPUTS;
        while (head && done < n) {
            int m = n - done < AG_MAX_INPUTS - 1 ? n - done : AG_MAX_INPUTS - 1;
            rest[0] = head;
            if (stack) {  // later groups are stacked, then concatenated onto the head
                ag_tensor *part = join(tp, xs + done, m, dim, true);
                if (!part) return NULL;
                rest[1] = part;
                head = join(tp, rest, 2, dim, false);
            } else {
                for (int k = 0; k < m; k++) rest[1 + k] = xs[done + k];
                head = join(tp, rest, 1 + m, dim, false);
            }
            done += m;
        }
        return head;
    }
    concat_params p = {1, {0}};
    for (int i = 0; i < dim; i++) p.outer *= (size_t)x0->shape[i];
    for (int k = 0; k < n; k++) p.width[k] = xs[k]->numel / p.outer;
    return ag_op_apply(tp, agi_pick(x0, stack ? &agi_stack_op_f32 : &agi_concat_op_f32,
                                 stack ? &agi_stack_op_f64 : &agi_concat_op_f64),
                    n, xs, nd, shape, &p, sizeof p);
}

ag_tensor *ag_concat(ag_tape *tp, ag_tensor *const xs[], int n, int dim) {
    if (!check_inputs("concat", xs, n)) return NULL;
    int d = agi_dim("concat", "xs[0]", xs[0], dim, 0);
    if (d < 0) return NULL;
    long long along = xs[0]->shape[d];
    for (int k = 1; k < n; k++) {
        bool ok = xs[k]->ndim == xs[0]->ndim;
        for (int i = 0; ok && i < xs[0]->ndim; i++)
            ok = i == d || xs[k]->shape[i] == xs[0]->shape[i];
        if (!ok) {
            ag_error("concat: shapes differ outside dim %d: %s vs %s", dim, agi_shape(xs[0]),
                     agi_shape(xs[k]));
            return NULL;
        }
        along += xs[k]->shape[d];
        if (along > INT_MAX) {
            ag_error("concat: the sizes along dim %d of xs[0..%d] (%s ... %s) add up to %lld, "
                     "more than an extent may be (%d)",
                     dim, k, agi_shape(xs[0]), agi_shape(xs[k]), along, INT_MAX);
            return NULL;
        }
    }
    return join(tp, xs, n, d, false);
}

ag_tensor *ag_stack(ag_tape *tp, ag_tensor *const xs[], int n, int dim) {
    if (!check_inputs("stack", xs, n)) return NULL;
    if (xs[0]->ndim >= AG_MAX_DIMS) {
        ag_error("stack: xs[0] %s already has %d dims, the most a tensor has", agi_shape(xs[0]),
                 AG_MAX_DIMS);
        return NULL;
    }
    int d = agi_dim("stack", "xs[0]", xs[0], dim, 1);
    if (d < 0) return NULL;
    for (int k = 1; k < n; k++) {
        if (!ag_tensor_same_shape(xs[0], xs[k])) {
            ag_error("stack: shapes differ: %s vs %s", agi_shape(xs[0]), agi_shape(xs[k]));
            return NULL;
        }
    }
    return join(tp, xs, n, d, true);
}
#endif
