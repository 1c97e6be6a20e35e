// The parameter store: one contiguous value buffer and one contiguous gradient
// buffer for all parameters of a model.
#include <math.h>
#include <string.h>

#include "internal.h"
#include "multiversion.h"
#include "parallel.h"

struct ag_params {
    ag_dtype dtype;
    ag_tensor **tensors;  // individually allocated, so their addresses never move
    int count, cap;
    void *data, *grad;    // `cap_len` elements each; `len` in use
    size_t len, cap_len;
};

ag_params *ag_params_new(ag_dtype dt) {
    if (!agi_is_float(dt)) {
        ag_error("params_new: parameters must be f32 or f64, got %s", ag_dtype_name(dt));
        return NULL;
    }
    ag_params *ps = agi_calloc(sizeof *ps);
    ps->dtype = dt;
    return ps;
}

void ag_params_free(ag_params *ps) {
    if (!ps) return;
    for (int i = 0; i < ps->count; i++) {
        agi_free((void *)ps->tensors[i]->name);
        agi_free(ps->tensors[i]);
    }
    agi_free(ps->tensors);
    agi_free(ps->data);
    agi_free(ps->grad);
    agi_free(ps);
}

// Element offset of a tensor inside the buffers.
static size_t offset_of(const ag_params *ps, const ag_tensor *t) {
    return (size_t)((const char *)t->data - (const char *)ps->data) / ag_dtype_size(ps->dtype);
}

static void grow(ag_params *ps, size_t need) {
    size_t cap = ps->cap_len ? 2 * ps->cap_len : 1024;
    while (cap < need) cap *= 2;
    size_t es = ag_dtype_size(ps->dtype);
    if (cap > AG_MAX_BYTES / es) cap = need;  // need itself fits (ag_params_add checked)
    char *data = agi_calloc(cap * es), *grad = agi_calloc(cap * es);
    if (ps->len) {
        memcpy(data, ps->data, ps->len * es);
        memcpy(grad, ps->grad, ps->len * es);
    }
    for (int i = 0; i < ps->count; i++) {
        ag_tensor *t = ps->tensors[i];
        size_t off = offset_of(ps, t);
        t->data = data + off * es;
        t->grad = grad + off * es;
    }
    agi_free(ps->data);
    agi_free(ps->grad);
    ps->data = data;
    ps->grad = grad;
    ps->cap_len = cap;
}

// The buffers' length with a parameter of `numel` elements at `*off` (the end `len`
// rounded up to 64 bytes), false when their bytes would exceed AG_MAX_BYTES.
static bool place(const ag_params *ps, size_t len, size_t numel, size_t *off, size_t *end) {
    size_t es = ag_dtype_size(ps->dtype), align = 64 / es, padded, bytes;
    if (!agi_size_add(len, align - 1, &padded)) return false;
    *off = padded / align * align;
    return agi_size_add(*off, numel, end) && agi_size_mul(*end, es, &bytes);
}

static void too_large(const char *fn, const ag_params *ps, const char *name, int ndim,
                      const int shape[]) {
    ag_error("%s: '%s' %s %s would make the store's buffers larger than the 2^%d bytes "
             "each may hold",
             fn, name, ag_dtype_name(ps->dtype), agi_shape_of(ndim, shape),
             agi_max_bytes_log2());
}

ag_tensor *ag_params_add(ag_params *ps, const char *name, int ndim, const int shape[]) {
    if (!agi_given(ps, "params_add", "store")) return NULL;
    if (!name || !*name) {
        ag_error("params_add: a parameter needs a name");
        return NULL;
    }
    if (ag_params_find(ps, name)) {
        ag_error("params_add: a parameter named '%s' already exists", name);
        return NULL;
    }
    if (!agi_valid_shape("params_add", ps->dtype, ndim, shape)) return NULL;
    size_t es = ag_dtype_size(ps->dtype), numel = agi_numel(ndim, shape), off, end;
    if (!place(ps, ps->len, numel, &off, &end)) {
        too_large("params_add", ps, name, ndim, shape);
        return NULL;
    }
    if (end > ps->cap_len) grow(ps, end);
    ps->tensors = agi_reserve(ps->tensors, &ps->cap, ps->count, ps->count + 1, 16,
                              sizeof *ps->tensors);
    ag_tensor *t = agi_malloc(sizeof *t);
    agi_tensor_header(t, ps->dtype, ndim, shape);
    t->data = (char *)ps->data + off * es;
    t->grad = (char *)ps->grad + off * es;
    t->requires_grad = true;
    t->name = agi_strdup(name);
    t->agi_bookkeeping = AGI_PARAM;
    ps->tensors[ps->count++] = t;
    ps->len = end;
    return t;
}

int agi_params_mark(const ag_params *ps) { return ps ? ps->count : 0; }

// The buffers' tail is zeroed because ag_params_add hands out its elements as they are:
// a parameter added later must find a zero gradient there, as in a fresh buffer.
void agi_params_truncate(ag_params *ps, int count) {
    if (!ps || count < 0 || count >= ps->count) return;
    const size_t es = ag_dtype_size(ps->dtype);
    for (int i = count; i < ps->count; i++) {
        agi_free((void *)ps->tensors[i]->name);
        agi_free(ps->tensors[i]);
    }
    ps->count = count;
    const ag_tensor *last = count ? ps->tensors[count - 1] : NULL;
    const size_t len = last ? offset_of(ps, last) + last->numel : 0;
    memset((char *)ps->data + len * es, 0, (ps->len - len) * es);
    memset((char *)ps->grad + len * es, 0, (ps->len - len) * es);
    ps->len = len;
}

// The questions of a NULL store report it and answer as an empty float32 store would.
static bool store_given(const ag_params *ps, const char *fn) {
    return agi_given(ps, fn, "store");
}

ag_dtype ag_params_dtype(const ag_params *ps) {
    return store_given(ps, "params_dtype") ? ps->dtype : AG_F32;
}
int ag_params_count(const ag_params *ps) {
    return store_given(ps, "params_count") ? ps->count : 0;
}

ag_tensor *ag_params_at(const ag_params *ps, int i) {
    if (!store_given(ps, "params_at")) return NULL;
    // An out-of-range index is a programming error (base.h), as PyTorch's IndexError:
    // a silent NULL surfaced later as a crash far from the bad index.
    if (i < 0 || i >= ps->count) {
        ag_error("params_at: index %d is out of range for a store of %d parameters", i,
                 ps->count);
        return NULL;
    }
    return ps->tensors[i];
}

ag_tensor *ag_params_find(const ag_params *ps, const char *name) {
    if (!store_given(ps, "params_find") || !agi_given(name, "params_find", "name"))
        return NULL;
    for (int i = 0; i < ps->count; i++)
        if (strcmp(ps->tensors[i]->name, name) == 0) return ps->tensors[i];
    return NULL;
}

size_t ag_params_numel(const ag_params *ps) {
    size_t n = 0;
    if (!store_given(ps, "params_numel")) return 0;
    for (int i = 0; i < ps->count; i++) n += ps->tensors[i]->numel;
    return n;
}

size_t ag_params_buffer_len(const ag_params *ps) {
    return store_given(ps, "params_buffer_len") ? ps->len : 0;
}
void *ag_params_data(const ag_params *ps) {
    return store_given(ps, "params_data") ? ps->data : NULL;
}
void *ag_params_grad(const ag_params *ps) {
    return store_given(ps, "params_grad") ? ps->grad : NULL;
}

static bool in_store(const char *fn, const ag_params *ps, const ag_tensor *p) {
    if (!store_given(ps, fn)) return false;
    for (int i = 0; p && i < ps->count; i++)
        if (ps->tensors[i] == p) return true;
    ag_error("%s: %s is not a parameter of this store", fn, p && p->name ? p->name : "the tensor");
    return false;
}

void ag_params_set_decay(ag_params *ps, ag_tensor *param, bool decay) {
    if (!in_store("params_set_decay", ps, param)) return;
    param->agi_bookkeeping = decay ? param->agi_bookkeeping & ~(uint32_t)AGI_NO_DECAY : param->agi_bookkeeping | AGI_NO_DECAY;
}

bool ag_params_decays(const ag_params *ps, const ag_tensor *param) {
    return in_store("params_decays", ps, param) && !(param->agi_bookkeeping & AGI_NO_DECAY);
}

int ag_params_decay_matrices_only(ag_params *ps) {
    int without = 0;
    if (!store_given(ps, "params_decay_matrices_only")) return 0;
    for (int i = 0; i < ps->count; i++) {
        ag_params_set_decay(ps, ps->tensors[i], ps->tensors[i]->ndim >= 2);
        without += ps->tensors[i]->ndim < 2;
    }
    return without;
}

void ag_params_zero_grad(ag_params *ps) {
    if (store_given(ps, "params_zero_grad") && ps->len)
        agi_zero(ps->grad, ps->len * ag_dtype_size(ps->dtype));
}

// The gradient's norm and its clipping pass over NORM_BLOCKS fixed blocks of the buffer,
// split over the threads; a block's squares are summed in double in 8 interleaved sums
// (which vectorise; one sum would wait four cycles an element on the last), and the
// blocks' sums are added in block order: the norm does not depend on the thread count.
// A GPT-2-size model's 85 million gradients took 80 ms on one chain. Both passes are
// multiversioned (AGI_HOT): the baseline's two doubles a vector left the norm bound by
// the arithmetic, not by the memory; every version keeps the lanes' sums and their order.
enum { NORM_BLOCKS = 64 };

typedef struct {
    const ag_params *ps;
    double sum[NORM_BLOCKS];
    double coef;  // clipping: the factor of every gradient
} norm_job;

static void block_of(const ag_params *ps, int b, size_t *lo, size_t *hi) {
    *lo = ps->len / NORM_BLOCKS * (size_t)b + (ps->len % NORM_BLOCKS) * (size_t)b / NORM_BLOCKS;
    *hi = ps->len / NORM_BLOCKS * (size_t)(b + 1) +
          (ps->len % NORM_BLOCKS) * (size_t)(b + 1) / NORM_BLOCKS;
}

// The body of agi_grad_squares_*: g's squares over [lo, hi), whatever g's type. Each run
// of 8 is squared into t before it is added: written as one statement, the compiler
// neither vectorised the 8 sums nor the squares.
#define SQUARES_BODY                                                                      \
    double acc[8] = {0};                                                                  \
    const size_t runs = (hi - lo) / 8;                                                    \
    for (size_t r = 0; r < runs; r++) {                                                   \
        double t[8];                                                                      \
        for (int l = 0; l < 8; l++) t[l] = (double)g[lo + 8 * r + l] * (double)g[lo + 8 * r + l]; \
        for (int l = 0; l < 8; l++) acc[l] += t[l];                                       \
    }                                                                                     \
    for (size_t i = lo + 8 * runs; i < hi; i++) acc[0] += (double)g[i] * (double)g[i];    \
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))

double agi_grad_squares_f32(const float *g, size_t lo, size_t hi);
double agi_grad_squares_f64(const double *g, size_t lo, size_t hi);
void agi_grad_scale_f32(float *g, size_t lo, size_t hi, float c);

AGI_HOT double agi_grad_squares_f32(const float *g, size_t lo, size_t hi) { SQUARES_BODY; }
AGI_HOT double agi_grad_squares_f64(const double *g, size_t lo, size_t hi) { SQUARES_BODY; }

AGI_HOT void agi_grad_scale_f32(float *g, size_t lo, size_t hi, float c) {
    for (size_t i = lo; i < hi; i++) g[i] *= c;
}

static void norm_blocks(size_t begin, size_t end, void *ctx) {
    norm_job *j = ctx;
    for (int b = (int)begin; b < (int)end; b++) {  // of NORM_BLOCKS
        size_t lo, hi;
        block_of(j->ps, b, &lo, &hi);
        j->sum[b] = j->ps->dtype == AG_F32
                        ? agi_grad_squares_f32((const float *)j->ps->grad, lo, hi)
                        : agi_grad_squares_f64((const double *)j->ps->grad, lo, hi);
    }
}

static void scale_blocks(size_t begin, size_t end, void *ctx) {
    const norm_job *j = ctx;
    size_t lo, hi, e;
    block_of(j->ps, (int)begin, &lo, &e);
    block_of(j->ps, (int)end - 1, &e, &hi);
    if (j->ps->dtype == AG_F32) {
        agi_grad_scale_f32(j->ps->grad, lo, hi, (float)j->coef);
    } else {
        double *g = j->ps->grad;
        for (size_t i = lo; i < hi; i++) g[i] *= j->coef;
    }
}

double ag_params_grad_norm(const ag_params *ps) {
    if (!store_given(ps, "params_grad_norm")) return NAN;
    norm_job j = {.ps = ps};
    agi_parallel_for(NORM_BLOCKS, (double)ps->len, norm_blocks, &j);
    double s = 0;
    for (int b = 0; b < NORM_BLOCKS; b++) s += j.sum[b];
    return sqrt(s);
}

double ag_params_clip_grad_norm(ag_params *ps, double max_norm) {
    // torch would scale by a negative or NaN coefficient: flipped or NaN
    // gradients from a typo in a setting. Refused; the gradients stay.
    if (!(max_norm >= 0)) {
        ag_error("params_clip_grad_norm: max_norm must be >= 0, got %g", max_norm);
        return NAN;
    }
    if (!store_given(ps, "params_clip_grad_norm")) return NAN;
    double total = ag_params_grad_norm(ps);
    norm_job j = {.ps = ps, .coef = max_norm / (total + 1e-6)};
    if (j.coef < 1.0) agi_parallel_for(NORM_BLOCKS, (double)ps->len, scale_blocks, &j);
    return total;
}

// x * 0 is 0 for a finite x and NaN for NaN or an infinity: summing those
// needs no branch per element; the tensor is looked for only once the sum
// says there is one.
static bool all_finite(const void *p, ag_dtype dt, size_t n) {
    if (dt == AG_F32) {
        const float *x = p;
        float s = 0;
        for (size_t i = 0; i < n; i++) s += x[i] * 0.0f;
        return s == 0;
    }
    const double *x = p;
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i] * 0.0;
    return s == 0;
}

ag_tensor *ag_params_first_nonfinite(const ag_params *ps, bool grad) {
    if (!store_given(ps, "params_first_nonfinite") || !ps->len ||
        all_finite(grad ? ps->grad : ps->data, ps->dtype, ps->len))
        return NULL;
    for (int i = 0; i < ps->count; i++) {
        ag_tensor *t = ps->tensors[i];
        if (!all_finite(grad ? t->grad : t->data, ps->dtype, t->numel)) return t;
    }
    return NULL;
}

// ---- Changing a parameter's shape (pruning) --------------------------------------------
// The buffers are rebuilt at their new length rather than patched in place: a parameter
// that shrinks leaves a hole, and the one-pass loops over the buffers (clipping, the
// optimizers) must never see stale values in it.
bool ag_params_resize(ag_params *ps, ag_tensor *t, int ndim, const int shape[],
                      const void *values) {
    int which = -1;
    for (int i = 0; ps && i < ps->count; i++)
        if (ps->tensors[i] == t) which = i;
    if (which < 0) {
        ag_error("params_resize: %s is not a parameter of %s",
                 t && t->name ? t->name : "the tensor", ps ? "this store" : "a NULL store");
        return false;
    }
    if (!agi_valid_shape("params_resize", ps->dtype, ndim, shape)) return false;
    if (!values) {
        ag_error("params_resize: the values for '%s' %s are NULL", t->name,
                 agi_shape_of(ndim, shape));
        return false;
    }
    size_t es = ag_dtype_size(ps->dtype), numel = agi_numel(ndim, shape);
    size_t *off = agi_malloc((size_t)ps->count * sizeof *off), len = 0;
    for (int i = 0; i < ps->count; i++) {
        if (!place(ps, len, i == which ? numel : ps->tensors[i]->numel, &off[i], &len)) {
            too_large("params_resize", ps, t->name, ndim, shape);
            agi_free(off);
            return false;
        }
    }
    char *data = agi_calloc(len * es), *grad = agi_calloc(len * es);
    for (int i = 0; i < ps->count; i++) {
        ag_tensor *p = ps->tensors[i];
        if (i == which) {
            memcpy(data + off[i] * es, values, numel * es);
            continue;
        }
        memcpy(data + off[i] * es, p->data, p->numel * es);
        memcpy(grad + off[i] * es, p->grad, p->numel * es);
    }
    for (int i = 0; i < ps->count; i++) {
        ps->tensors[i]->data = data + off[i] * es;
        ps->tensors[i]->grad = grad + off[i] * es;
    }
    const char *name = t->name;
    void *d = t->data, *g = t->grad;
    // Its weight decay group, whether it is frozen and its count of writes are the
    // parameter's, as its name is: pruning keeps them.
    const uint32_t kept = t->agi_bookkeeping & (AGI_NO_DECAY | ~0u << AGI_VERSION_SHIFT);
    const bool requires_grad = t->requires_grad;
    agi_tensor_header(t, ps->dtype, ndim, shape);
    t->data = d, t->grad = g, t->name = name;
    t->requires_grad = requires_grad;
    t->agi_bookkeeping = AGI_PARAM | kept;
    agi_tensor_written(t);
    agi_free(off);
    agi_free(ps->data);
    agi_free(ps->grad);
    ps->data = data;
    ps->grad = grad;
    ps->len = ps->cap_len = len;
    return true;
}
