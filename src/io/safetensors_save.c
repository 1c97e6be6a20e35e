// Writing safetensors as the reference implementation does, so the same
// tensors give the same bytes: tensors ordered by dtype alignment (largest
// first) and then by name, compact JSON, header padded with spaces to a
// multiple of 8; all through an atomic file replacement.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic_file.h"
#include "../core/json.h"
#include "safetensors.h"

#define MAX_HEADER 100000000u  // what readers accept (see safetensors_load.c)

static int file_order(const void *a, const void *b) {
    const agi_st_entry *x = *(agi_st_entry *const *)a, *y = *(agi_st_entry *const *)b;
    int rx = agi_st_dtype_rank(x->tensor.dtype), ry = agi_st_dtype_rank(y->tensor.dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

// ---- The header text ------------------------------------------------------------------

typedef struct text {
    char *p;
    size_t len, cap;
} text;

static void reserve(text *t, size_t more) {
    if (t->len + more <= t->cap) return;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + more) cap *= 2;
    char *p = agi_malloc(cap);
    if (t->len) memcpy(p, t->p, t->len);
    agi_free(t->p);
    t->p = p;
    t->cap = cap;
}

static void put(text *t, const char *s) {
    size_t n = strlen(s);
    reserve(t, n);
    memcpy(t->p + t->len, s, n);
    t->len += n;
}

static void put_quoted(text *t, const char *s) {
    size_t n = agi_json_quote(s, NULL);
    reserve(t, n);
    agi_json_quote(s, t->p + t->len);
    t->len += n;
}

static void put_u64(text *t, unsigned long long v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%llu", v);
    put(t, buf);
}

// {"__metadata__":{...},"name":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...}
static void build_header(text *t, const ag_safetensors *st, agi_st_entry *const order[]) {
    put(t, "{");
    if (st->meta_count) {
        put(t, "\"__metadata__\":{");
        for (int i = 0; i < st->meta_count; i++) {
            if (i) put(t, ",");
            put_quoted(t, st->meta[i].key);
            put(t, ":");
            put_quoted(t, st->meta[i].value);
        }
        put(t, st->count ? "}," : "}");
    }
    uint64_t offset = 0;
    for (int i = 0; i < st->count; i++) {
        const ag_tensor *x = &order[i]->tensor;
        uint64_t bytes = (uint64_t)x->numel * ag_dtype_size(x->dtype);
        if (i) put(t, ",");
        put_quoted(t, order[i]->name);
        put(t, ":{\"dtype\":\"");
        put(t, ag_safetensors_dtype_name(x->dtype));
        put(t, "\",\"shape\":[");
        for (int d = 0; d < x->ndim; d++) {
            if (d) put(t, ",");
            put_u64(t, (unsigned long long)x->shape[d]);
        }
        put(t, "],\"data_offsets\":[");
        put_u64(t, offset);
        put(t, ",");
        put_u64(t, offset + bytes);
        put(t, "]}");
        offset += bytes;
    }
    put(t, "}");
    while (t->len % 8) put(t, " ");
}

// ---- The file ---------------------------------------------------------------------------

// Data in file byte order, staged through a small buffer so that a
// big-endian host can swap without touching the tensor.
static void write_data(agi_atomic_file *af, const ag_tensor *t, unsigned char *stage,
                       size_t stage_size) {
    size_t size = ag_dtype_size(t->dtype), per = stage_size / size;
    const unsigned char *src = t->data;
    for (size_t done = 0; done < t->numel;) {
        size_t n = t->numel - done < per ? t->numel - done : per;
        memcpy(stage, src + done * size, n * size);
        agi_le_inplace(stage, n, size);
        agi_atomic_write(af, stage, n * size);
        done += n;
    }
}

int ag_safetensors_save(const ag_safetensors *st, const char *path, ag_err *err) {
    if (!st || !path) {
        agi_err_set(err, "safetensors_save: the set and the path must not be NULL");
        return -1;
    }
    if (agi_atomic_path_check(path, err)) return -1;  // before the header is built
    agi_st_entry **order = agi_malloc((size_t)(st->count ? st->count : 1) * sizeof *order);
    if (st->count) memcpy(order, st->entries, (size_t)st->count * sizeof *order);
    if (st->count > 1) qsort(order, (size_t)st->count, sizeof *order, file_order);
    text header = {0};
    build_header(&header, st, order);
    if (header.len > MAX_HEADER) {
        agi_err_set(err, "%s: the header would be %zu bytes, more than the %u readers accept",
                    path, header.len, MAX_HEADER);
        agi_free(header.p);
        agi_free(order);
        return -1;
    }
    agi_atomic_file af;
    int rc = agi_atomic_open(&af, path, err);
    if (rc == 0) {
        unsigned char len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header.len >> (8 * i));
        agi_atomic_write(&af, len8, 8);
        agi_atomic_write(&af, header.p, header.len);
        const size_t stage_size = 1 << 20;
        unsigned char *stage = agi_malloc(stage_size);
        for (int i = 0; i < st->count; i++) write_data(&af, &order[i]->tensor, stage, stage_size);
        agi_free(stage);
        rc = agi_atomic_commit(&af, err);
    }
    agi_free(header.p);
    agi_free(order);
    return rc;
}
