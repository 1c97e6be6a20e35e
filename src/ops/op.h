// What every op file needs: the public API, the real type, the BLAS and
// threading kernels, and small helpers for shape checks.
#ifndef ATTOGRAD_OP_H
#define ATTOGRAD_OP_H

#include "../core/internal.h"
#include "../core/parallel.h"
#include "../kernels/gemm.h"
#include "real.h"

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

// Product of all dims but the last: the number of rows of a [..., D] tensor.
static inline size_t agi_rows(const ag_tensor *t) {
    return t->ndim ? t->numel / (size_t)t->shape[t->ndim - 1] : 1;
}
static inline int agi_last(const ag_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

#endif
