// Heap tensors: creation, element access, conversion.
#include <math.h>
#include <string.h>

#include "internal.h"
#include "parallel.h"

void agi_tensor_header(ag_tensor *t, ag_dtype dt, int ndim, const int shape[]) {
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < AG_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    t->numel = agi_numel(ndim, shape);
}

const char *agi_shape(const ag_tensor *t) {
    return t ? agi_shape_of(t->ndim, t->shape) : "(null)";
}

const char *agi_dtype_shape(const ag_tensor *t) {
    static _Thread_local char bufs[4][80];
    static _Thread_local int next;
    if (!t) return "NULL";
    char *b = bufs[next];
    next = (next + 1) % 4;
    snprintf(b, sizeof bufs[0], "%s %s", ag_dtype_name(t->dtype), agi_shape(t));
    return b;
}

const char *agi_about_text(const agi_about *a) {
    static _Thread_local char bufs[2][160];
    static _Thread_local int next;
    char *b = bufs[next];
    next = (next + 1) % 2;
    if (a->t2)
        snprintf(b, sizeof bufs[0], "%s %s and %s %s", a->name, agi_shape(a->t), a->name2,
                 agi_shape(a->t2));
    else
        snprintf(b, sizeof bufs[0], "%s %s", a->name, agi_shape(a->t));
    return b;
}

char *ag_tensor_shape_str(const ag_tensor *t, char *buf, size_t size) {
    if (!buf || size == 0) return buf;
    if (!t) {
        snprintf(buf, size, "(null)");
        return buf;
    }
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < t->ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ",%d" : "%d", t->shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

bool ag_tensor_same_shape(const ag_tensor *a, const ag_tensor *b) {
    if (!a || !b || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

// Every heap constructor: `fn` names it in messages.
static ag_tensor *zeros(const char *fn, ag_dtype dt, int ndim, const int shape[]) {
    if (!agi_valid_shape(fn, dt, ndim, shape)) return NULL;
    ag_tensor *t = agi_malloc(sizeof *t);
    agi_tensor_header(t, dt, ndim, shape);
    t->data = agi_calloc(t->numel * agi_dtype_size(dt));
    t->agi_bookkeeping = AGI_HEAP;
    return t;
}

ag_tensor *ag_tensor_zeros(ag_dtype dt, int ndim, const int shape[]) {
    return zeros("tensor_zeros", dt, ndim, shape);
}

ag_tensor ag_tensor_grad_view(const ag_tensor *t) {
    ag_tensor v;
    // Of NULL, a float32 scalar without data: what a view of a gradient no backward has
    // reached is, so every function here reports it rather than reading it.
    if (agi_given(t, "tensor_grad_view", "tensor")) {
        agi_tensor_header(&v, t->dtype, t->ndim, t->shape);
        v.data = t->grad;
        v.name = t->name;
    } else {
        agi_tensor_header(&v, AG_F32, 0, NULL);  // zeroes v: no data, no name
    }
    v.agi_bookkeeping = AGI_VIEW;
    return v;
}

void ag_tensor_free(ag_tensor *t) {
    if (!t || !(t->agi_bookkeeping & AGI_HEAP)) return;
    agi_free(t->grad);
    agi_free(t->data);
    agi_free(t);
}

ag_tensor *ag_tensor_ones(ag_dtype dt, int ndim, const int shape[]) {
    ag_tensor *t = zeros("tensor_ones", dt, ndim, shape);
    if (t) ag_tensor_fill(t, 1.0);
    return t;
}

ag_tensor *ag_tensor_from(ag_dtype dt, int ndim, const int shape[], const void *data) {
    if (!data) {
        ag_error("tensor_from: data is NULL");
        return NULL;
    }
    ag_tensor *t = zeros("tensor_from", dt, ndim, shape);
    if (t) memcpy(t->data, data, t->numel * agi_dtype_size(dt));
    return t;
}

// A random tensor: checked in full before anything is allocated.
static ag_tensor *random_tensor(const char *fn, ag_dtype dt, int ndim, const int shape[],
                                const ag_pcg32 *rng) {
    if (!rng) {
        ag_error("%s: rng is NULL", fn);
        return NULL;
    }
    if (agi_dtype_size(dt) != 0 && !agi_is_float(dt)) {
        ag_error("%s: needs a float dtype, got %s", fn, ag_dtype_name(dt));
        return NULL;
    }
    return zeros(fn, dt, ndim, shape);
}

ag_tensor *ag_tensor_uniform(ag_dtype dt, int ndim, const int shape[], ag_pcg32 *rng,
                             double lo, double hi) {
    ag_tensor *t = random_tensor("tensor_uniform", dt, ndim, shape, rng);
    if (t && !agi_init_uniform("tensor_uniform", t, rng, lo, hi)) {
        ag_tensor_free(t);
        return NULL;
    }
    return t;
}

ag_tensor *ag_tensor_normal(ag_dtype dt, int ndim, const int shape[], ag_pcg32 *rng,
                            double mean, double std) {
    ag_tensor *t = random_tensor("tensor_normal", dt, ndim, shape, rng);
    if (t && !agi_init_normal("tensor_normal", t, rng, mean, std)) {
        ag_tensor_free(t);
        return NULL;
    }
    return t;
}

static bool has_data(const char *op, const ag_tensor *t);

ag_tensor *ag_tensor_convert(const ag_tensor *src, ag_dtype dt) {
    if (!src) {
        ag_error("tensor_convert: input is NULL");
        return NULL;
    }
    if (!has_data("tensor_convert", src)) return NULL;
    ag_tensor *t = zeros("tensor_convert", dt, src->ndim, src->shape);
    if (t) ag_tensor_copy(t, src);
    return t;
}

static double load(const ag_tensor *t, size_t i) {
    switch (t->dtype) {
    case AG_F32: return ((const float *)t->data)[i];
    case AG_F64: return ((const double *)t->data)[i];
    case AG_BOOL:
    case AG_U8: return ((const uint8_t *)t->data)[i];
    case AG_I32: return ((const int32_t *)t->data)[i];
    case AG_I64: return (double)((const int64_t *)t->data)[i];
    }
    return NAN;
}

// A double to an integer type truncates toward zero, like a C cast, but a
// bare cast of NaN or of an out-of-range value is undefined behaviour: those
// become 0 and the nearest representable value.
static double clamp_trunc(double v, double lo, double hi) {
    if (isnan(v)) return 0;
    return v < lo ? lo : v > hi ? hi : trunc(v);
}

static int64_t to_i64(double v) {
    if (isnan(v)) return 0;
    if (v >= 0x1p63) return INT64_MAX;  // 2^63 itself does not fit
    if (v <= -0x1p63) return INT64_MIN;
    return (int64_t)v;
}

static void store(ag_tensor *t, size_t i, double v) {
    switch (t->dtype) {
    case AG_F32: ((float *)t->data)[i] = (float)v; break;
    case AG_F64: ((double *)t->data)[i] = v; break;
    case AG_BOOL: ((uint8_t *)t->data)[i] = v != 0; break;
    case AG_U8: ((uint8_t *)t->data)[i] = (uint8_t)clamp_trunc(v, 0, UINT8_MAX); break;
    case AG_I32:
        ((int32_t *)t->data)[i] = (int32_t)clamp_trunc(v, INT32_MIN, INT32_MAX);
        break;
    case AG_I64: ((int64_t *)t->data)[i] = to_i64(v); break;
    }
}

static bool have_tensor(const char *op, const ag_tensor *t) {
    return agi_given(t, op, "tensor");
}

// A gradient's view has no data until a backward reaches its tensor.
static bool has_data(const char *op, const ag_tensor *t) {
    if (!have_tensor(op, t)) return false;
    if (t->data) return true;
    ag_error("%s: tensor %s has no data (a gradient no backward has reached)", op, agi_shape(t));
    return false;
}

// An index past the end would read or write another allocation: checked at
// every public access (one compare beside a call), never in fill and copy.
static bool in_range(const char *op, const ag_tensor *t, size_t i) {
    if (!have_tensor(op, t)) return false;
    if (i < t->numel) return true;
    ag_error("%s: index %zu is out of range for %s (%zu elements)", op, i, agi_shape(t),
             t->numel);
    return false;
}

double ag_tensor_item(const ag_tensor *t, size_t i) {
    return in_range("tensor_item", t, i) && has_data("tensor_item", t) ? load(t, i) : NAN;
}

void ag_tensor_set_item(ag_tensor *t, size_t i, double v) {
    if (!in_range("tensor_set_item", t, i) || !has_data("tensor_set_item", t)) return;
    store(t, i, v);
    agi_tensor_written(t);
}

double ag_tensor_grad_item(const ag_tensor *t, size_t i) {
    if (!in_range("tensor_grad_item", t, i)) return NAN;
    if (!t->grad) return 0.0;
    return t->dtype == AG_F32 ? ((const float *)t->grad)[i] : ((const double *)t->grad)[i];
}

void ag_tensor_fill(ag_tensor *t, double v) {
    if (!has_data("tensor_fill", t)) return;
    for (size_t i = 0; i < t->numel; i++) store(t, i, v);
    agi_tensor_written(t);
}

void ag_tensor_copy(ag_tensor *dst, const ag_tensor *src) {
    if (!has_data("tensor_copy", dst) || !has_data("tensor_copy", src)) return;
    if (dst->numel != src->numel) {
        ag_error("tensor_copy: element counts differ: %s <- %s", agi_shape(dst),
                 agi_shape(src));
        return;
    }
    agi_tensor_written(dst);
    if (dst->dtype == src->dtype) {  // a tensor onto itself (or a view onto its own data)
        memmove(dst->data, src->data, src->numel * agi_dtype_size(src->dtype));
        return;
    }
    // Through a double, an i64 beyond 2^53 would be rounded twice, and 2^60 + 2^36 + 1
    // would land on 2^60, not on the nearest float (2^60 + 2^37, as torch's .float()).
    if (src->dtype == AG_I64 && dst->dtype == AG_F32) {
        const int64_t *s = src->data;
        float *d = dst->data;
        for (size_t i = 0; i < src->numel; i++) d[i] = (float)s[i];
        return;
    }
    for (size_t i = 0; i < src->numel; i++) store(dst, i, load(src, i));
}

float *ag_tensor_f32(const ag_tensor *t) {
    if (!have_tensor("tensor_f32", t)) return NULL;
    if (t->dtype != AG_F32) {
        ag_error("tensor_f32: tensor %s is %s, not f32", agi_shape(t),
                 ag_dtype_name(t->dtype));
        return NULL;
    }
    return t->data;
}

double *ag_tensor_f64(const ag_tensor *t) {
    if (!have_tensor("tensor_f64", t)) return NULL;
    if (t->dtype != AG_F64) {
        ag_error("tensor_f64: tensor %s is %s, not f64", agi_shape(t),
                 ag_dtype_name(t->dtype));
        return NULL;
    }
    return t->data;
}

void ag_tensor_set_requires_grad(ag_tensor *t, bool requires_grad) {
    if (!have_tensor("set_requires_grad", t)) return;
    if (requires_grad && !agi_is_float(t->dtype)) {
        ag_error("set_requires_grad: a %s tensor %s cannot require grad",
                 ag_dtype_name(t->dtype), agi_shape(t));
        return;
    }
    // A backward would give it a gradient that nothing frees (ag_tensor_free ignores it).
    if (requires_grad && (t->agi_bookkeeping & AGI_VIEW)) {
        ag_error("set_requires_grad: %s is a gradient view (ag_tensor_grad_view), which owns "
                 "nothing and cannot hold a gradient of its own", agi_shape(t));
        return;
    }
    // Cleared on an op's output, the flag cut the graph there silently (the ops after it
    // recorded nothing that reaches its inputs): PyTorch refuses it.
    if (!requires_grad && t->node && t->requires_grad) {
        ag_error("set_requires_grad: %s is the output of op %s, not a leaf: only a leaf's "
                 "flag can change (ag_detach(tp, x) gives x without its history)",
                 agi_shape(t), t->node->op && t->node->op->name ? t->node->op->name : "?");
        return;
    }
    t->requires_grad = requires_grad;
}

void ag_tensor_set_name(ag_tensor *t, const char *name) {
    if (have_tensor("tensor_set_name", t)) t->name = name;
}

void ag_tensor_zero_grad(ag_tensor *t) {
    if (have_tensor("tensor_zero_grad", t) && t->grad)
        agi_zero(t->grad, t->numel * agi_dtype_size(t->dtype));
}
