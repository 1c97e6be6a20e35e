// Splitting the embedding into attention heads, and merging them back.
//   split_heads: x: [B, T, E] -> y: [B, h, T, d],  y[b, j, t, i] = x[b, t, j*d + i]
//   merge_heads: x: [B, h, T, d] -> y: [B, T, h*d], its inverse
// Both only move elements, so each one's gradient is the other's permutation
// applied to dy (added into dx).
//
// Both are one kernel: viewing [B, T, E] as [B, T, h, d], each swaps dims 1
// and 2 of a [B, P, Q, d] array, moving whole rows of d contiguous elements.
#include <limits.h>
#include <string.h>

#include "op.h"

typedef struct {
    int B, P, Q, d;
    const real *src;
    real *dst;
    bool accumulate;  // dst += permuted src (backward) instead of dst = ...
} swap_job;

// dst[b, q, p, :] (+)= src[b, p, q, :] for the rows bp = b*P + p in [begin, end).
static void swap_slice(size_t begin, size_t end, void *ctx) {
    const swap_job *j = ctx;
    size_t d = (size_t)j->d;
    for (size_t bp = begin; bp < end; bp++) {
        size_t b = bp / (size_t)j->P, p = bp % (size_t)j->P;
        for (size_t q = 0; q < (size_t)j->Q; q++) {
            const real *s = j->src + (bp * j->Q + q) * d;
            real *t = j->dst + ((b * j->Q + q) * j->P + p) * d;
            if (j->accumulate)
                for (size_t i = 0; i < d; i++) t[i] += s[i];
            else
                memcpy(t, s, d * sizeof *t);
        }
    }
}

static void swap12(int B, int P, int Q, int d, const real *src, real *dst, bool accumulate) {
    swap_job j = {B, P, Q, d, src, dst, accumulate};
    double work = (double)B * P * Q * d;  // a memory-bound copy: one unit per element
    agi_parallel_for((size_t)B * (size_t)P, work, swap_slice, &j);
}

// split: [B, T, (h, d)] -> [B, h, T, d] is the swap with P = T, Q = h.
static void split_heads_forward(ag_node *n) {
    const int *s = n->out->shape;  // [B, h, T, d]
    swap12(s[0], s[2], s[1], s[3], n->in[0]->data, n->out->data, false);
}

static void split_heads_backward(ag_node *n) {
    const int *s = n->out->shape;
    swap12(s[0], s[1], s[2], s[3], n->out->grad, n->in[0]->grad, true);
}

// merge: [B, h, T, d] -> [B, T, (h, d)] is the swap with P = h, Q = T.
static void merge_heads_forward(ag_node *n) {
    const int *s = n->in[0]->shape;  // [B, h, T, d]
    swap12(s[0], s[1], s[2], s[3], n->in[0]->data, n->out->data, false);
}

static void merge_heads_backward(ag_node *n) {
    const int *s = n->in[0]->shape;
    swap12(s[0], s[2], s[1], s[3], n->out->grad, n->in[0]->grad, true);
}

const ag_op R(agi_split_heads_op) = {"split_heads", split_heads_forward, split_heads_backward,
    "dx = merge_heads(dy)"};
const ag_op R(agi_merge_heads_op) = {"merge_heads", merge_heads_forward, merge_heads_backward,
    "dx = split_heads(dy)"};

#if AG_ONCE
ag_tensor *ag_split_heads(ag_tape *tp, ag_tensor *x, int heads) {
    if (!agi_check_float("split_heads", "x", x) ||
        !agi_check_ndim("split_heads", "x [B, T, E]", x, 3, 3))
        return NULL;
    int E = x->shape[2];
    if (heads < 1) {
        ag_error("split_heads: heads must be >= 1, got %d for x %s", heads, agi_shape(x));
        return NULL;
    }
    if (E % heads != 0) {
        ag_error("split_heads: E = %d is not divisible by %d heads: x %s", E, heads,
                 agi_shape(x));
        return NULL;
    }
    int shape[] = {x->shape[0], heads, x->shape[1], E / heads};
    return ag_op_apply(tp, agi_pick(x, &agi_split_heads_op_f32, &agi_split_heads_op_f64), 1, &x,
                    4, shape, NULL, 0);
}

ag_tensor *ag_merge_heads(ag_tape *tp, ag_tensor *x) {
    if (!agi_check_float("merge_heads", "x", x) ||
        !agi_check_ndim("merge_heads", "x [B, h, T, d]", x, 4, 4))
        return NULL;
    long long width = (long long)x->shape[1] * x->shape[3];
    if (width > INT_MAX) {
        ag_error("merge_heads: x %s merges to a last dim of %lld, more than an extent may "
                 "be (%d)",
                 agi_shape(x), width, INT_MAX);
        return NULL;
    }
    int shape[] = {x->shape[0], x->shape[2], (int)width};
    return ag_op_apply(tp, agi_pick(x, &agi_merge_heads_op_f32, &agi_merge_heads_op_f64), 1, &x,
                    3, shape, NULL, 0);
}
#endif
