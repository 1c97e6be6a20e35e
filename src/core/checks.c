// Input checks shared by the op constructors.
#include "../ops/op.h"

bool agi_check_float(const char *op, const char *what, const ag_tensor *t) {
    if (!t) {
        ag_error("%s: %s is NULL", op, what);
        return false;
    }
    if (!agi_is_float(t->dtype)) {
        ag_error("%s: %s %s must be f32 or f64, not %s", op, what, agi_shape(t),
                 ag_dtype_name(t->dtype));
        return false;
    }
    return true;
}

bool agi_check_same_dtype(const char *op, const ag_tensor *a, const ag_tensor *b) {
    if (a->dtype == b->dtype) return true;
    ag_error("%s: dtypes differ: %s %s and %s %s", op, ag_dtype_name(a->dtype), agi_shape(a),
             ag_dtype_name(b->dtype), agi_shape(b));
    return false;
}

bool agi_check_same_shape(const char *op, const ag_tensor *a, const ag_tensor *b) {
    if (ag_tensor_same_shape(a, b)) return true;
    ag_error("%s: shapes differ: %s and %s", op, agi_shape(a), agi_shape(b));
    return false;
}

bool agi_check_ndim(const char *op, const char *what, const ag_tensor *t, int lo, int hi) {
    if (t->ndim >= lo && t->ndim <= hi) return true;
    if (lo == hi)
        ag_error("%s: %s must have %d dimensions, got %s", op, what, lo, agi_shape(t));
    else
        ag_error("%s: %s must have %d to %d dimensions, got %s", op, what, lo, hi,
                 agi_shape(t));
    return false;
}

bool agi_check_trailing(const char *op, const ag_tensor *a, const ag_tensor *b) {
    bool ok = b->ndim <= a->ndim;
    for (int i = 0; ok && i < b->ndim; i++)
        ok = b->shape[b->ndim - 1 - i] == a->shape[a->ndim - 1 - i];
    if (!ok)
        ag_error("%s: shape %s does not broadcast over %s (it must equal a trailing part of it)",
                 op, agi_shape(b), agi_shape(a));
    return ok;
}
