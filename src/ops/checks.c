// Input checks shared by the op constructors.
#include <math.h>

#include "op.h"

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

static bool mask_is_bool(const char *op, const char *what, const ag_tensor *m) {
    if (m->dtype == AG_BOOL) return true;
    ag_error("%s: %s %s must be bool (true = masked), not %s", op, what, agi_shape(m),
             ag_dtype_name(m->dtype));
    return false;
}

// [T, S] (shared by every slice), [N, T, S], or the scores' own shape.
static bool mask_fits(const char *op, const char *what, const ag_tensor *m,
                      const ag_tensor *scores, bool *shared) {
    int T = scores->shape[scores->ndim - 2], S = scores->shape[scores->ndim - 1];
    size_t N = scores->numel / ((size_t)T * (size_t)S);
    bool ts = m->ndim == 2 && m->shape[0] == T && m->shape[1] == S;
    bool nts = m->ndim == 3 && (size_t)m->shape[0] == N && m->shape[1] == T && m->shape[2] == S;
    if (ts || nts || ag_tensor_same_shape(m, scores)) {
        *shared = ts;
        return true;
    }
    ag_error("%s: %s %s does not match scores %s (expected [%d,%d], [%zu,%d,%d] or %s)", op, what,
             agi_shape(m), agi_shape(scores), T, S, N, T, S, agi_shape(scores));
    return false;
}

bool agi_check_softmax_masks(const char *op, const ag_softmax_opts *o, ag_dtype dt, int ndim,
                             const int scores_shape[], const char *subject, const char *operands,
                             ag_tensor *in[], int *n_in, agi_mask_inputs *m) {
    ag_tensor scores;  // a header only, for shapes and messages
    agi_tensor_header(&scores, dt, ndim, scores_shape);
    const int S = scores_shape[ndim - 1];
    *m = (agi_mask_inputs){-1, -1, -1, false, false};
    if (!isfinite(o->scale)) {
        ag_error("%s: scale must be finite, got %g; %s", op, o->scale, subject);
        return false;
    }
    if (o->mask) {
        if (!mask_is_bool(op, "mask", o->mask) ||
            !mask_fits(op, "mask", o->mask, &scores, &m->mask_shared))
            return false;
        m->mask = *n_in;
        in[(*n_in)++] = o->mask;
    }
    if (o->additive_mask) {
        const ag_tensor *a = o->additive_mask;
        if (a->dtype != dt) {
            ag_error("%s: additive_mask %s is %s but scores %s are %s", op, agi_shape(a),
                     ag_dtype_name(a->dtype), agi_shape(&scores), ag_dtype_name(dt));
            return false;
        }
        if (!mask_fits(op, "additive_mask", a, &scores, &m->add_shared)) return false;
        m->add = *n_in;
        in[(*n_in)++] = o->additive_mask;
    }
    if (o->key_padding_mask) {
        const ag_tensor *k = o->key_padding_mask;
        if (!mask_is_bool(op, "key_padding_mask", k)) return false;
        if (ndim < 3) {
            ag_error("%s: key_padding_mask %s needs scores with a batch dimension "
                     "([B, ..., T, S]), got %s",
                     op, agi_shape(k), agi_shape(&scores));
            return false;
        }
        if (k->ndim != 2 || k->shape[0] != scores_shape[0] || k->shape[1] != S) {
            ag_error("%s: key_padding_mask %s does not match %s (expected [%d,%d])", op,
                     agi_shape(k), operands, scores_shape[0], S);
            return false;
        }
        m->kpm = *n_in;
        in[(*n_in)++] = o->key_padding_mask;
    }
    return true;
}
