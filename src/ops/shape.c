// Geometry shared by the shape, broadcasting and along-a-dim ops (type-free).
#include "shape.h"

#include <stdio.h>

int agi_dim(const char *op, const char *what, const ag_tensor *t, int dim, int extra) {
    int nd = t->ndim + extra;
    if (dim >= -nd && dim < nd) return dim < 0 ? dim + nd : dim;
    if (nd == 0)
        ag_error("%s: %s %s is a scalar: it has no dim %d", op, what, agi_shape(t), dim);
    else
        ag_error("%s: dim %d is out of range for %s %s (expected %d to %d)", op, dim, what,
                 agi_shape(t), -nd, nd - 1);
    return -1;
}

agi_around agi_around_dim(const ag_tensor *x, int dim) {
    agi_around a = {1, (size_t)x->shape[dim], 1};
    for (int i = 0; i < dim; i++) a.outer *= (size_t)x->shape[i];
    for (int i = dim + 1; i < x->ndim; i++) a.inner *= (size_t)x->shape[i];
    return a;
}

enum { AROUND_CHUNK = 4096 };

typedef struct {
    const agi_around *a;
    void (*fn)(void *ctx, size_t o, size_t i0, size_t i1);
    void *ctx;
} around_job;

static void around_units(size_t begin, size_t end, void *ctx) {
    const around_job *j = ctx;
    const size_t chunks = (j->a->inner + AROUND_CHUNK - 1) / AROUND_CHUNK;
    for (size_t u = begin; u < end; u++) {
        const size_t o = u / chunks, i0 = u % chunks * AROUND_CHUNK;
        j->fn(j->ctx, o, i0, i0 + AROUND_CHUNK < j->a->inner ? i0 + AROUND_CHUNK : j->a->inner);
    }
}

void agi_around_for(const agi_around *a, double work,
                    void (*fn)(void *ctx, size_t o, size_t i0, size_t i1), void *ctx) {
    around_job j = {a, fn, ctx};
    const size_t chunks = (a->inner + AROUND_CHUNK - 1) / AROUND_CHUNK;
    agi_parallel_for(a->outer * chunks, work, around_units, &j);
}

int agi_reduced_shape(const ag_tensor *x, int dim, bool keepdim, int shape[]) {
    int nd = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i != dim)
            shape[nd++] = x->shape[i];
        else if (keepdim)
            shape[nd++] = 1;
    }
    return nd;
}

bool agi_broadcast_shape(const char *op, int n, ag_tensor *const t[], int *ndim,
                         int shape[]) {
    int nd = 0;
    for (int k = 0; k < n; k++)
        if (t[k]->ndim > nd) nd = t[k]->ndim;
    bool ok = true;
    for (int i = 0; i < nd; i++) {
        int size = 1;
        for (int k = 0; k < n; k++) {
            int j = i - (nd - t[k]->ndim);
            int s = j < 0 ? 1 : t[k]->shape[j];
            if (s == 1) continue;
            if (size != 1 && s != size) ok = false;
            size = s;
        }
        shape[i] = size;
    }
    if (ok) {
        *ndim = nd;
        return true;
    }
    char msg[256];
    int len = 0;
    for (int k = 0; k < n; k++)
        len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%s", k ? " and " : "",
                        agi_shape(t[k]));
    ag_error("%s: shapes %s do not broadcast", op, msg);
    return false;
}

void agi_bcast_init(agi_bcast *g, int n, ag_tensor *const t[], int ndim,
                    const int shape[]) {
    size_t sh[AG_MAX_DIMS], st[AGI_BCAST_MAX][AG_MAX_DIMS];
    int m = 0;  // merged dims so far
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 1) continue;  // contributes nothing to any offset
        size_t s[AGI_BCAST_MAX];
        for (int k = 0; k < n; k++) {
            int j = i - (ndim - t[k]->ndim);
            size_t stride = 1;
            for (int q = j < 0 ? 0 : j + 1; q < t[k]->ndim; q++)
                stride *= (size_t)t[k]->shape[q];
            s[k] = j < 0 || t[k]->shape[j] == 1 ? 0 : stride;
        }
        bool merge = m > 0;
        for (int k = 0; merge && k < n; k++) merge = st[k][m - 1] == s[k] * (size_t)shape[i];
        if (merge) {
            sh[m - 1] *= (size_t)shape[i];
            for (int k = 0; k < n; k++) st[k][m - 1] = s[k];
        } else {
            sh[m] = (size_t)shape[i];
            for (int k = 0; k < n; k++) st[k][m] = s[k];
            m++;
        }
    }
    g->n = n;
    for (int d = 0; d < AG_MAX_DIMS; d++) {
        int src = d - (AG_MAX_DIMS - m);  // right-aligned
        g->shape[d] = src < 0 ? 1 : sh[src];
        for (int k = 0; k < n; k++) g->stride[k][d] = src < 0 ? 0 : st[k][src];
    }
    size_t total = 1;
    for (int d = 0; d < AG_MAX_DIMS; d++) total *= g->shape[d];
    for (int k = 0; k < n; k++) g->full[k] = t[k]->numel == total;
    g->rows = g->shape[0] * g->shape[1] * g->shape[2];
    g->chunks = (g->shape[3] + AGI_BCAST_CHUNK - 1) / AGI_BCAST_CHUNK;
    g->units = g->rows * g->chunks;
}

bool agi_check_index(const char *op, const ag_tensor *idx, const ag_tensor *x, int dim) {
    if (!idx) {
        ag_error("%s: index is NULL", op);
        return false;
    }
    if (idx->dtype != AG_I32 && idx->dtype != AG_I64) {
        ag_error("%s: index %s must be i32 or i64, not %s", op, agi_shape(idx),
                 ag_dtype_name(idx->dtype));
        return false;
    }
    if (!idx->data) {
        ag_error("%s: index %s has no data (a gradient view no backward has reached)", op,
                 agi_shape(idx));
        return false;
    }
    long long size = x->shape[dim];
    for (size_t i = 0; i < idx->numel; i++) {
        long long v = idx->dtype == AG_I32 ? ((const int32_t *)idx->data)[i]
                                           : (long long)((const int64_t *)idx->data)[i];
        if (v < 0 || v >= size) {
            ag_error("%s: index %lld at position %zu is out of range for dim %d of x %s", op, v,
                     i, dim, agi_shape(x));
            return false;
        }
    }
    return true;
}
