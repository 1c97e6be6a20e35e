// Geometry shared by the shape, broadcasting and along-a-dim ops: PyTorch's
// negative dims, numpy broadcasting, and the [outer, n, inner] view of a dim.
#ifndef ATTOGRAD_OPS_SHAPE_H
#define ATTOGRAD_OPS_SHAPE_H

#include "op.h"

// dim in [-ndim, ndim) as PyTorch counts (-1 is the last); returns it in
// [0, ndim), or reports "<op>: dim <dim> is out of range for <what> <shape>"
// and returns -1. `ndim` may exceed t->ndim by `extra` (stack inserts a dim).
int agi_dim(const char *op, const char *what, const ag_tensor *t, int dim, int extra);

// x viewed as [outer, n, inner] around `dim`.
typedef struct {
    size_t outer, n, inner;
} agi_around;
agi_around agi_around_dim(const ag_tensor *x, int dim);
// Work along a dim, cut into units split over the threads: fn(ctx, o, i0, i1) runs once
// for each index o of `outer` and each chunk [i0, i1) of at most 4096 indices of `inner`.
// `work` is the whole loop's estimated cost, as agi_parallel_for takes it.
void agi_around_for(const agi_around *a, double work,
                    void (*fn)(void *ctx, size_t o, size_t i0, size_t i1), void *ctx);
// The shape of a reduction of x along dim: dim kept as 1, or removed; returns ndim.
int agi_reduced_shape(const ag_tensor *x, int dim, bool keepdim, int shape[]);

// The numpy broadcast of n (<= 3) operands: the output shape, or a one-line
// error naming the op and every shape.
#define AGI_BCAST_MAX 3
bool agi_broadcast_shape(const char *op, int n, ag_tensor *const t[], int *ndim,
                         int shape[]);

// Elementwise work over a broadcast, with adjacent dims merged where every
// operand allows it, so that the common cases (same shape; a bias [E] over
// [B,T,E]) become one or two long loops. Operand k's element at output index
// (d0, d1, d2, d3) is at sum_d d_i * stride[k][i]; along the last dim every
// stride is 0 or 1. The work is cut into units: a row of the first three dims
// and a chunk of at most AGI_BCAST_CHUNK elements of the last.
#define AGI_BCAST_CHUNK 4096
typedef struct {
    int n;
    size_t shape[AG_MAX_DIMS];
    size_t stride[AGI_BCAST_MAX][AG_MAX_DIMS];
    size_t rows, chunks, units;  // units = rows * chunks
    bool full[AGI_BCAST_MAX];    // operand k has the output's numel (no reduction in backward)
} agi_bcast;
void agi_bcast_init(agi_bcast *g, int n, ag_tensor *const t[], int ndim,
                    const int shape[]);

// Unit u: its first output element, its length, and each operand's first element.
static inline size_t agi_bcast_unit(const agi_bcast *g, size_t u, size_t off[], size_t *len) {
    size_t row = u / g->chunks, c = u % g->chunks, L = g->shape[3];
    size_t begin = c * AGI_BCAST_CHUNK;
    *len = L - begin < AGI_BCAST_CHUNK ? L - begin : AGI_BCAST_CHUNK;
    size_t i2 = row % g->shape[2], i1 = (row / g->shape[2]) % g->shape[1];
    size_t i0 = row / g->shape[2] / g->shape[1];
    for (int k = 0; k < g->n; k++)
        off[k] = i0 * g->stride[k][0] + i1 * g->stride[k][1] + i2 * g->stride[k][2] +
                 begin * g->stride[k][3];
    return row * L + begin;
}

// Whether the index tensor `idx` is i32 or i64 and every entry lies in [0, size); reports
// "<op>: index <v> at position <p> is out of range for dim <d> of x <shape>".
bool agi_check_index(const char *op, const ag_tensor *idx, const ag_tensor *x, int dim);
// Entry i of an i32 or i64 index tensor.
static inline size_t agi_index_at(const ag_tensor *idx, size_t i) {
    return idx->dtype == AG_I32 ? (size_t)((const int32_t *)idx->data)[i]
                                : (size_t)((const int64_t *)idx->data)[i];
}

#endif
