// What every op file needs: the public API, the real type, the BLAS and
// threading kernels, and small helpers for shape checks.
#ifndef ATTOGRAD_OP_H
#define ATTOGRAD_OP_H

#include "../core/internal.h"
#include "../core/parallel.h"
#include "../kernels/gemm.h"
#include "../core/real.h"
#include "attograd/ops.h"

// The f32 or f64 variant of an op, by the dtype of a float input.
static inline const ag_op *agi_pick(const ag_tensor *x, const ag_op *f32, const ag_op *f64) {
    return x->dtype == AG_F64 ? f64 : f32;
}

// Input checks shared by the constructors; each reports "<op>: ..." and
// returns false.
bool agi_check_float(const char *op, const char *what, const ag_tensor *t);
bool agi_check_same_dtype(const char *op, const ag_tensor *a, const ag_tensor *b);
bool agi_check_same_shape(const char *op, const ag_tensor *a, const ag_tensor *b);
bool agi_check_ndim(const char *op, const char *what, const ag_tensor *t, int lo, int hi);
// b's shape equals a's shape or a trailing part of it (b broadcasts over a's
// leading dims).
bool agi_check_trailing(const char *op, const ag_tensor *a, const ag_tensor *b);

// Where an op's optional softmax masks sit among its inputs, and whether each
// float/bool [T, S] mask is shared by all slices (rather than one per slice).
typedef struct {
    int mask, add, kpm;  // input index of each mask, -1 when absent
    bool mask_shared, add_shared;
} agi_mask_inputs;

// The checks ag_softmax and ag_attention share: scale finite; `mask` bool and
// `additive_mask` of dtype dt, each [T, S], [N, T, S] or the scores' own shape
// (N = product of the leading dims of scores [..., T, S]); `key_padding_mask`
// bool [scores[0], S]. Appends the masks present to in[*n_in ...] and records
// where they went in *m. `subject` names the op's first input in messages
// ("scores [2,4,5,7]", "q [2,2,3,5]"), `operands` what key padding must fit.
bool agi_check_softmax_masks(const char *op, const ag_softmax_opts *o, ag_dtype dt, int ndim,
                             const int scores[], const char *subject, const char *operands,
                             ag_tensor *in[], int *n_in, agi_mask_inputs *m);

// Product of all dims but the last: the number of rows of a [..., D] tensor.
static inline size_t agi_rows(const ag_tensor *t) {
    return t->ndim ? t->numel / (size_t)t->shape[t->ndim - 1] : 1;
}
static inline int agi_last(const ag_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

#endif
