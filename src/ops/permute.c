// Reordering dims: permute, and transpose (the permutation that swaps two dims).
//   x: [s_0, ..., s_{n-1}], perm a permutation of 0..n-1 -> y: [s_perm[0], ..., s_perm[n-1]]
//   y[i_0, ..., i_{n-1}] = x[j] with j_perm[d] = i_d;   dx = dy permuted back
// A copy (tensors stay contiguous), split across threads by rows of y above a size
// threshold. Each element of x has exactly one place in y, so the backward scatters
// without any sum.
#include "shape.h"

typedef struct {
    int perm[AG_MAX_DIMS];  // padded to 4 dims: leading dims of size 1 map to themselves
} permute_params;

typedef struct {
    size_t shape[AG_MAX_DIMS], st[AG_MAX_DIMS];  // y's padded shape; x's stride along each
    const real *src;
    real *dst;
    bool forward;
} walk_job;

// Rows [begin, end) of y's first three (padded) dims: forward copies x into y, backward
// adds dy into dx. Every element of x has one place in y, so rows never collide.
static void walk_rows(size_t begin, size_t end, void *ctx) {
    const walk_job *j = ctx;
    for (size_t row = begin; row < end; row++) {
        size_t c = row % j->shape[2], b = row / j->shape[2] % j->shape[1];
        size_t a = row / j->shape[2] / j->shape[1];
        size_t base = a * j->st[0] + b * j->st[1] + c * j->st[2], k = row * j->shape[3];
        if (j->forward)
            for (size_t d = 0; d < j->shape[3]; d++) j->dst[k + d] = j->src[base + d * j->st[3]];
        else
            for (size_t d = 0; d < j->shape[3]; d++) j->dst[base + d * j->st[3]] += j->src[k + d];
    }
}

static void walk(const ag_node *n, bool forward) {
    const permute_params *p = n->params;
    const ag_tensor *x = n->in[0];
    int pad = AG_MAX_DIMS - x->ndim;
    size_t xs[AG_MAX_DIMS], s = 1;
    walk_job j;
    for (int d = AG_MAX_DIMS - 1; d >= 0; d--) {
        xs[d] = s;
        s *= d < pad ? 1 : (size_t)x->shape[d - pad];
    }
    for (int d = 0; d < AG_MAX_DIMS; d++) {
        j.st[d] = xs[p->perm[d]];
        j.shape[d] = p->perm[d] < pad ? 1 : (size_t)x->shape[p->perm[d] - pad];
    }
    j.src = forward ? x->data : n->out->grad;
    j.dst = forward ? n->out->data : x->grad;
    j.forward = forward;
    agi_parallel_for(j.shape[0] * j.shape[1] * j.shape[2], 2.0 * (double)x->numel,
                     walk_rows, &j);
}

static void permute_forward(ag_node *n) { walk(n, true); }
static void permute_backward(ag_node *n) { walk(n, false); }

const ag_op R(agi_permute_op) = {"permute", permute_forward, permute_backward,
    "dx = dy permuted back"};
const ag_op R(agi_transpose_op) = {"transpose", permute_forward, permute_backward,
    "dx = dy with the two dims swapped back"};

#if AG_ONCE
static ag_tensor *apply_perm(ag_tape *tp, ag_tensor *x, const int perm[], bool transpose) {
    int pad = AG_MAX_DIMS - x->ndim, shape[AG_MAX_DIMS];
    permute_params p;
    for (int d = 0; d < pad; d++) p.perm[d] = d;
    for (int d = 0; d < x->ndim; d++) {
        p.perm[pad + d] = perm[d] + pad;
        shape[d] = x->shape[perm[d]];
    }
    const ag_op *f32 = transpose ? &agi_transpose_op_f32 : &agi_permute_op_f32;
    const ag_op *f64 = transpose ? &agi_transpose_op_f64 : &agi_permute_op_f64;
    return ag_op_apply(tp, agi_pick(x, f32, f64), 1, &x, x->ndim, shape, &p, sizeof p);
}

ag_tensor *ag_permute(ag_tape *tp, ag_tensor *x, const int perm[]) {
    if (!agi_check_float("permute", "x", x)) return NULL;
    if (!perm && x->ndim > 0) {
        ag_error("permute: perm is NULL (x %s)", agi_shape(x));
        return NULL;
    }
    int norm[AG_MAX_DIMS];
    bool seen[AG_MAX_DIMS] = {false};
    for (int d = 0; d < x->ndim; d++) {
        norm[d] = perm[d] < 0 ? perm[d] + x->ndim : perm[d];
        if (norm[d] < 0 || norm[d] >= x->ndim || seen[norm[d]]) {
            char buf[64];
            int len = 0;
            for (int i = 0; i < x->ndim; i++)
                len += snprintf(buf + len, sizeof buf - (size_t)len, i ? ",%d" : "(%d", perm[i]);
            snprintf(buf + len, sizeof buf - (size_t)len, ")");
            ag_error("permute: %s is not a permutation of the %d dims of x %s", buf, x->ndim,
                     agi_shape(x));
            return NULL;
        }
        seen[norm[d]] = true;
    }
    return apply_perm(tp, x, norm, false);
}

ag_tensor *ag_transpose(ag_tape *tp, ag_tensor *x, int d0, int d1) {
    if (!agi_check_float("transpose", "x", x)) return NULL;
    int a = agi_dim("transpose", "x", x, d0, 0);
    if (a < 0) return NULL;
    int b = agi_dim("transpose", "x", x, d1, 0);
    if (b < 0) return NULL;
    int perm[AG_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) perm[d] = d;
    perm[a] = b;
    perm[b] = a;
    return apply_perm(tp, x, perm, true);
}
#endif
