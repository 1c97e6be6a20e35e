// Embedding lookup: row ids[r] of the weight table becomes output row r.
//   weight: [V, E], ids: `shape` ints in [0, V) -> y: [*shape, E]
//   y[r, e] = weight[ids[r], e]
//   dweight[v, e] = sum over r with ids[r] == v of dy[r, e]
// Backward scatters each output row's gradient into its weight row; an id that
// appears twice receives both rows. It runs serially, in row order, so repeated
// ids always add up in the same order (bit-identical results).
#include <string.h>

#include "op.h"

typedef struct {
    const int32_t *ids;  // a copy in tape memory: the caller's array may be gone by backward
} embedding_params;

static void embedding_forward(ag_node *n) {
    const int32_t *ids = ((const embedding_params *)n->params)->ids;
    const real *w = n->in[0]->data;
    real *y = n->out->data;
    size_t E = (size_t)n->in[0]->shape[1], rows = n->out->numel / E;
    for (size_t r = 0; r < rows; r++) memcpy(y + r * E, w + (size_t)ids[r] * E, E * sizeof(real));
}

static void embedding_backward(ag_node *n) {
    const int32_t *ids = ((const embedding_params *)n->params)->ids;
    const real *dy = n->out->grad;
    real *dw = n->in[0]->grad;
    size_t E = (size_t)n->in[0]->shape[1], rows = n->out->numel / E;
    for (size_t r = 0; r < rows; r++) {
        real *dst = dw + (size_t)ids[r] * E;
        for (size_t e = 0; e < E; e++) dst[e] += dy[r * E + e];
    }
}

const ag_op R(agi_embedding_op) = {"embedding", embedding_forward, embedding_backward,
    "dweight[ids[r]] += dy[r]"};

#if AG_ONCE
ag_tensor *ag_embedding(ag_tape *tp, ag_tensor *weight, const int32_t *ids, int ndim,
                        const int shape[]) {
    if (!agi_given(tp, "embedding", "tape")) return NULL;
    if (!agi_check_float("embedding", "weight", weight) ||
        !agi_check_ndim("embedding", "weight [V, E]", weight, 2, 2))
        return NULL;
    if (ndim > 0 && !shape) {
        ag_error("embedding: ids shape is NULL for %d dimensions (weight %s)", ndim,
                 agi_shape(weight));
        return NULL;
    }
    if (!agi_valid_shape("embedding", AG_I32, ndim, shape)) return NULL;
    const char *ids_shape = agi_shape_of(ndim, shape);
    if (ndim + 1 > AG_MAX_DIMS) {
        ag_error("embedding: ids %s give an output of %d dimensions, at most %d are supported "
                 "(weight %s)",
                 ids_shape, ndim + 1, AG_MAX_DIMS, agi_shape(weight));
        return NULL;
    }
    int V = weight->shape[0], E = weight->shape[1];
    int out_shape[AG_MAX_DIMS];
    for (int i = 0; i < ndim; i++) out_shape[i] = shape[i];
    out_shape[ndim] = E;
    if (!agi_valid_shape("embedding", weight->dtype, ndim + 1, out_shape)) return NULL;
    if (!ids) {
        ag_error("embedding: ids is NULL (ids %s, weight %s)", ids_shape, agi_shape(weight));
        return NULL;
    }
    size_t count = agi_numel(ndim, shape);
    for (size_t i = 0; i < count; i++) {
        if (ids[i] < 0 || ids[i] >= V) {
            ag_error("embedding: index %d at position %zu is out of range for %d rows "
                     "(weight %s, ids %s)",
                     (int)ids[i], i, V, agi_shape(weight), ids_shape);
            return NULL;
        }
    }
    int32_t *copy = ag_tape_alloc(tp, count * sizeof *copy);
    memcpy(copy, ids, count * sizeof *copy);
    embedding_params p = {copy};
    return ag_op_apply(tp, agi_pick(weight, &agi_embedding_op_f32, &agi_embedding_op_f64), 1,
                    &weight, ndim + 1, out_shape, &p, sizeof p);
}
#endif
