// Reading safetensors: every byte of the file is untrusted. The header is
// checked against the format as it is parsed, the tensors' byte ranges are
// checked against each other and the file, and only then is any data read.
// A bad file yields one line naming the file and the first problem found.
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/json.h"
#include "safetensors.h"

// The reference implementation's limit; real headers are at most a few MB.
#define MAX_HEADER 100000000u

// Where the bytes come from: a file read front to back, or memory.
typedef struct source {
    FILE *f;
    const unsigned char *mem;
    uint64_t size, pos;
} source;

static bool source_read(source *s, void *dst, size_t n) {
    if (s->f) {
        if (fread(dst, 1, n, s->f) != n) return false;
    } else {
        if (n > s->size - s->pos) return false;
        memcpy(dst, s->mem + s->pos, n);
    }
    s->pos += n;
    return true;
}

// A tensor entry from the header, and where its bytes are.
typedef struct pending {
    agi_st_entry *e;
    uint64_t begin, end;
} pending;

typedef struct loader {
    const char *file;  // names the file in messages
    ag_err *err;
    bool reported;     // a problem is in err; stop
    agi_json j;
    uint64_t data_size;
    pending *items;
    int count, cap;
    agi_st_meta *meta;
    int meta_count, meta_cap;
    bool have_meta;
} loader;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static bool problem(loader *ld, const char *fmt, ...) {
    if (ld->reported) return false;
    char what[sizeof ld->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    agi_err_set(ld->err, "%s: %s", ld->file, what);
    ld->reported = true;
    return false;
}

static bool json_problem(loader *ld) {
    return problem(ld, "invalid JSON in the header: %s of the header", ld->j.error);
}

// Reports what was found where a value of another kind was expected; a
// missing or malformed value is a JSON error, reported as such. `shown` is
// the tensor's name made printable, or NULL outside a tensor entry.
static bool wrong_kind(loader *ld, const char *shown, const char *what) {
    agi_json_kind k = agi_json_peek(&ld->j);
    if (k == AGI_JSON_NONE) {
        agi_json_skip(&ld->j);
        return json_problem(ld);
    }
    if (shown) return problem(ld, "tensor '%s': %s, found %s", shown, what, agi_json_kind_name(k));
    return problem(ld, "%s, found %s", what, agi_json_kind_name(k));
}

// ---- One tensor entry ------------------------------------------------------------

static bool read_dtype(loader *ld, const char *shown, ag_dtype *dt) {
    char *s, text[48];
    if (agi_json_peek(&ld->j) != AGI_JSON_STRING)
        return wrong_kind(ld, shown, "dtype must be a string such as \"F32\"");
    if (!agi_json_string(&ld->j, &s)) return json_problem(ld);
    const int known = agi_st_dtype_from_name(s, dt);
    const bool ok = known == 1;
    char stored[64];
    if (known == 0)
        problem(ld, "tensor '%s': unsupported dtype %s (attograd reads %s)", shown, s,
                agi_st_stored_dtypes(stored, sizeof stored));
    else if (!ok)
        problem(ld, "tensor '%s': unknown dtype '%s'", shown, agi_st_show(s, text, sizeof text));
    agi_free(s);
    return ok;
}

// One integer of an array; `what` names it in messages.
static bool read_integer(loader *ld, const char *shown, const char *what, int64_t *v) {
    agi_json_number num;
    if (agi_json_peek(&ld->j) != AGI_JSON_NUMBER) {
        char expect[64];
        snprintf(expect, sizeof expect, "%s entries must be integers", what);
        return wrong_kind(ld, shown, expect);
    }
    if (!agi_json_number_read(&ld->j, &num)) return json_problem(ld);
    int len = num.len > 40 ? 40 : (int)num.len;
    const char *more = num.len > 40 ? "..." : "";
    if (!num.integer)
        return problem(ld, "tensor '%s': %s entry %.*s%s is not an integer", shown, what, len,
                       num.text, more);
    if (!num.fits)
        return problem(ld, "tensor '%s': %s entry %.*s%s is out of range", shown, what, len,
                       num.text, more);
    *v = num.value;
    return true;
}

static bool read_shape(loader *ld, const char *shown, int *ndim, int shape[]) {
    agi_json *j = &ld->j;
    if (agi_json_peek(j) != AGI_JSON_ARRAY)
        return wrong_kind(ld, shown, "shape must be an array of integers");
    agi_json_array_begin(j);
    int n = 0;
    while (agi_json_array_next(j)) {
        int64_t d;
        if (n == AG_MAX_DIMS) {  // count the rest for the message
            while (agi_json_skip(j) && agi_json_array_next(j)) n++;
            if (j->failed) return json_problem(ld);
            return problem(ld, "tensor '%s': shape has %d dimensions; attograd supports at most %d",
                           shown, n + 1, AG_MAX_DIMS);
        }
        if (!read_integer(ld, shown, "shape", &d)) return false;
        if (d == 0)
            return problem(ld,
                           "tensor '%s': dimension %d is 0; attograd tensors have extents >= 1 "
                           "(no empty tensors)",
                           shown, n);
        if (d < 0) return problem(ld, "tensor '%s': dimension %d is negative (%lld)", shown, n,
                                  (long long)d);
        if (d > INT32_MAX)
            return problem(ld, "tensor '%s': dimension %d is %lld, more than attograd's limit %d",
                           shown, n, (long long)d, (int)INT32_MAX);
        shape[n++] = (int)d;
    }
    if (j->failed) return json_problem(ld);
    *ndim = n;
    return true;
}

static bool read_offsets(loader *ld, const char *shown, uint64_t off[2]) {
    agi_json *j = &ld->j;
    if (agi_json_peek(j) != AGI_JSON_ARRAY)
        return wrong_kind(ld, shown, "data_offsets must be an array [begin, end]");
    agi_json_array_begin(j);
    int n = 0;
    while (agi_json_array_next(j)) {
        int64_t v;
        if (n == 2) {
            while (agi_json_skip(j) && agi_json_array_next(j)) n++;
            if (j->failed) return json_problem(ld);
            return problem(ld, "tensor '%s': data_offsets has %d entries, expected 2 [begin, end]",
                           shown, n + 1);
        }
        if (!read_integer(ld, shown, "data_offsets", &v)) return false;
        if (v < 0)
            return problem(ld, "tensor '%s': data_offsets entry %lld is negative", shown,
                           (long long)v);
        off[n++] = (uint64_t)v;
    }
    if (j->failed) return json_problem(ld);
    if (n != 2)
        return problem(ld, "tensor '%s': data_offsets has %d entr%s, expected 2 [begin, end]",
                       shown, n, n == 1 ? "y" : "ies");
    return true;
}

static bool check_entry(loader *ld, const char *shown, ag_dtype dt, int ndim,
                        const int shape[], const uint64_t off[2]) {
    ag_tensor view;
    agi_tensor_header(&view, dt, ndim, shape);
    const char *dtn = ag_safetensors_dtype_name(dt), *shp = agi_shape(&view);
    unsigned long long b = off[0], e = off[1];
    size_t need;
    if (b > e)
        return problem(ld, "tensor '%s': data_offsets [%llu,%llu] end before they begin", shown,
                       b, e);
    if (!agi_shape_bytes(dt, ndim, shape, &need))
        return problem(ld,
                       "tensor '%s': data_offsets [%llu,%llu] hold %llu bytes but %s %s needs "
                       "more than 2^%d",
                       shown, b, e, e - b, dtn, shp, agi_max_bytes_log2());
    if (e - b != need)
        return problem(ld, "tensor '%s': data_offsets [%llu,%llu] hold %llu bytes but %s %s needs %llu",
                       shown, b, e, e - b, dtn, shp, (unsigned long long)need);
    if (e > ld->data_size)
        return problem(ld,
                       "tensor '%s': data_offsets [%llu,%llu] reach past the end of the data "
                       "(%llu bytes; truncated file?)",
                       shown, b, e, (unsigned long long)ld->data_size);
    return true;
}

// An entry's object; takes ownership of `name`.
static bool read_entry(loader *ld, char *name) {
    agi_json *j = &ld->j;
    char shown[80];
    agi_st_show(name, shown, sizeof shown);
    if (agi_json_peek(j) != AGI_JSON_OBJECT) {
        agi_free(name);
        return wrong_kind(ld, shown, "expected an object with dtype, shape and data_offsets");
    }
    agi_json_object_begin(j);
    bool has_dtype = false, has_shape = false, has_offsets = false, ok = true;
    ag_dtype dt = AG_F32;
    int ndim = 0, shape[AG_MAX_DIMS];
    uint64_t off[2] = {0, 0};
    char *field;
    while (ok && agi_json_object_next(j, &field)) {
        bool *seen = strcmp(field, "dtype") == 0          ? &has_dtype
                     : strcmp(field, "shape") == 0        ? &has_shape
                     : strcmp(field, "data_offsets") == 0 ? &has_offsets
                                                          : NULL;
        char text[48];
        if (!seen)
            ok = problem(ld, "tensor '%s': unknown field '%s' (an entry has dtype, shape and "
                             "data_offsets)",
                         shown, agi_st_show(field, text, sizeof text));
        else if (*seen)
            ok = problem(ld, "tensor '%s': field \"%s\" appears twice", shown, field);
        else if (seen == &has_dtype)
            ok = read_dtype(ld, shown, &dt);
        else if (seen == &has_shape)
            ok = read_shape(ld, shown, &ndim, shape);
        else
            ok = read_offsets(ld, shown, off);
        if (seen) *seen = true;
        agi_free(field);
    }
    if (ok && j->failed) ok = json_problem(ld);
    if (ok && !(has_dtype && has_shape && has_offsets))
        ok = problem(ld, "tensor '%s': missing \"%s\"", shown,
                     !has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets");
    if (ok) ok = check_entry(ld, shown, dt, ndim, shape, off);
    if (!ok) {
        agi_free(name);
        return false;
    }
    agi_st_entry *e = agi_calloc(sizeof *e);
    e->name = name;
    agi_tensor_header(&e->tensor, dt, ndim, shape);
    e->tensor.name = name;
    ld->items = agi_reserve(ld->items, &ld->cap, ld->count, ld->count + 1, 16, sizeof *ld->items);
    ld->items[ld->count++] = (pending){e, off[0], off[1]};
    return true;
}

// ---- Metadata and the whole header ------------------------------------------------

static int meta_cmp(const void *a, const void *b) {
    return strcmp(((const agi_st_meta *)a)->key, ((const agi_st_meta *)b)->key);
}

static bool read_metadata(loader *ld) {
    agi_json *j = &ld->j;
    if (ld->have_meta) return problem(ld, "\"__metadata__\" appears twice in the header");
    ld->have_meta = true;
    if (agi_json_peek(j) != AGI_JSON_OBJECT)
        return wrong_kind(ld, NULL, "__metadata__ must be an object of strings");
    agi_json_object_begin(j);
    char *key, shown[80];
    while (agi_json_object_next(j, &key)) {
        char *value;
        if (agi_json_peek(j) != AGI_JSON_STRING) {
            char what[128];
            snprintf(what, sizeof what, "__metadata__ '%s' must be a string",
                     agi_st_show(key, shown, sizeof shown));
            agi_free(key);
            return wrong_kind(ld, NULL, what);
        }
        if (!agi_json_string(j, &value)) {
            agi_free(key);
            return json_problem(ld);
        }
        ld->meta = agi_reserve(ld->meta, &ld->meta_cap, ld->meta_count, ld->meta_count + 1, 16,
                               sizeof *ld->meta);
        ld->meta[ld->meta_count++] = (agi_st_meta){key, value};
    }
    if (j->failed) return json_problem(ld);
    if (ld->meta_count > 1) qsort(ld->meta, (size_t)ld->meta_count, sizeof *ld->meta, meta_cmp);
    for (int i = 1; i < ld->meta_count; i++)
        if (strcmp(ld->meta[i - 1].key, ld->meta[i].key) == 0)
            return problem(ld, "__metadata__ key '%s' appears twice",
                           agi_st_show(ld->meta[i].key, shown, sizeof shown));
    return true;
}

static bool read_header(loader *ld, const char *text, size_t len) {
    agi_json *j = &ld->j;
    // The format's rule, beyond JSON's (which skips leading whitespace): the header's
    // first byte is '{', and only its end may be padded. The reference refuses others.
    if (len > 0 && (text[0] == ' ' || text[0] == '\t' || text[0] == '\n' || text[0] == '\r'))
        return problem(ld, "the header starts with whitespace; its first byte must be '{'");
    agi_json_init(j, text, len);
    if (agi_json_peek(j) != AGI_JSON_OBJECT)
        return wrong_kind(ld, NULL, "the header must be a JSON object");
    agi_json_object_begin(j);
    char *key;
    while (agi_json_object_next(j, &key)) {
        if (strcmp(key, "__metadata__") == 0) {
            agi_free(key);
            if (!read_metadata(ld)) return false;
        } else if (!read_entry(ld, key)) {
            return false;
        }
    }
    if (j->failed || !agi_json_finish(j)) return json_problem(ld);
    return true;
}

// ---- Byte ranges and data ----------------------------------------------------------

static int by_name(const void *a, const void *b) {
    return strcmp(((const pending *)a)->e->name, ((const pending *)b)->e->name);
}

static int by_offset(const void *a, const void *b) {
    uint64_t x = ((const pending *)a)->begin, y = ((const pending *)b)->begin;
    return x < y ? -1 : x > y;
}

// Distinct names, and byte ranges that tile the data exactly.
static bool check_layout(loader *ld) {
    char s1[80], s2[80];
    if (ld->count > 1) qsort(ld->items, (size_t)ld->count, sizeof *ld->items, by_name);
    for (int i = 1; i < ld->count; i++)
        if (strcmp(ld->items[i - 1].e->name, ld->items[i].e->name) == 0)
            return problem(ld, "tensor '%s' appears twice in the header",
                           agi_st_show(ld->items[i].e->name, s1, sizeof s1));
    if (ld->count > 1) qsort(ld->items, (size_t)ld->count, sizeof *ld->items, by_offset);
    uint64_t covered = 0;
    for (int i = 0; i < ld->count; i++) {
        const pending *p = &ld->items[i];
        if (p->begin < covered)
            return problem(ld, "tensors '%s' [%llu,%llu] and '%s' [%llu,%llu] overlap",
                           agi_st_show(ld->items[i - 1].e->name, s1, sizeof s1),
                           (unsigned long long)ld->items[i - 1].begin,
                           (unsigned long long)ld->items[i - 1].end,
                           agi_st_show(p->e->name, s2, sizeof s2),
                           (unsigned long long)p->begin, (unsigned long long)p->end);
        if (p->begin > covered)
            return problem(ld, "data bytes [%llu,%llu) belong to no tensor (a hole before '%s')",
                           (unsigned long long)covered, (unsigned long long)p->begin,
                           agi_st_show(p->e->name, s1, sizeof s1));
        covered = p->end;
    }
    if (covered < ld->data_size)
        return problem(ld, "data bytes [%llu,%llu) at the end of the file belong to no tensor",
                       (unsigned long long)covered, (unsigned long long)ld->data_size);
    return true;
}

// Reads the data of each tensor in file order (the ranges tile the data).
static bool read_data(loader *ld, source *src) {
    char shown[80];
    for (int i = 0; i < ld->count; i++) {
        agi_st_entry *e = ld->items[i].e;
        ag_tensor *t = &e->tensor;
        size_t size = ag_dtype_size(t->dtype), bytes = t->numel * size;
        t->data = agi_malloc(bytes);
        if (!source_read(src, t->data, bytes))
            return problem(ld, "the file ended inside tensor '%s' (was it changed while loading?)",
                           agi_st_show(e->name, shown, sizeof shown));
        agi_le_inplace(t->data, t->numel, size);
        size_t bad = agi_st_first_bad_bool(t);
        if (bad < t->numel)
            return problem(ld, "tensor '%s': BOOL element %zu is %u; BOOL bytes are 0 or 1",
                           agi_st_show(e->name, shown, sizeof shown), bad,
                           (unsigned)((const uint8_t *)t->data)[bad]);
    }
    return true;
}

static void loader_free(loader *ld) {
    for (int i = 0; i < ld->count; i++) {
        agi_free(ld->items[i].e->tensor.data);
        agi_free(ld->items[i].e->name);
        agi_free(ld->items[i].e);
    }
    for (int i = 0; i < ld->meta_count; i++) {
        agi_free(ld->meta[i].key);
        agi_free(ld->meta[i].value);
    }
    agi_free(ld->items);
    agi_free(ld->meta);
}

static ag_safetensors *load(source *src, const char *file, ag_err *err) {
    loader ld;
    memset(&ld, 0, sizeof ld);
    ld.file = file;
    ld.err = err;
    unsigned char len8[8];
    if (src->size < 8) {
        problem(&ld, "%llu bytes is too short: a safetensors file starts with an 8-byte header length",
                (unsigned long long)src->size);
        return NULL;
    }
    if (!source_read(src, len8, 8)) {
        problem(&ld, "could not read the header length");
        return NULL;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n > MAX_HEADER) {
        problem(&ld, "header length %llu exceeds the limit of %u bytes (not a safetensors file?)",
                (unsigned long long)n, MAX_HEADER);
        return NULL;
    }
    if (n > src->size - 8) {
        problem(&ld, "header length %llu exceeds the %llu bytes after it (truncated file?)",
                (unsigned long long)n, (unsigned long long)(src->size - 8));
        return NULL;
    }
    ld.data_size = src->size - 8 - n;
    char *header = agi_malloc(n ? (size_t)n : 1);
    bool ok = source_read(src, header, (size_t)n);
    if (!ok) problem(&ld, "the file ended inside the header (was it changed while loading?)");
    ok = ok && read_header(&ld, header, (size_t)n) && check_layout(&ld) && read_data(&ld, src);
    agi_free(header);
    if (!ok) {
        loader_free(&ld);
        return NULL;
    }
    // The set adopts the entries, sorted by name, and the sorted metadata.
    ag_safetensors *st = ag_safetensors_new();
    if (ld.count > 1) qsort(ld.items, (size_t)ld.count, sizeof *ld.items, by_name);
    st->entries = agi_malloc((size_t)(ld.count ? ld.count : 1) * sizeof *st->entries);
    for (int i = 0; i < ld.count; i++) st->entries[i] = ld.items[i].e;
    st->count = st->cap = ld.count;
    st->meta = ld.meta;
    st->meta_count = ld.meta_count;
    st->meta_cap = ld.meta_cap;
    agi_free(ld.items);
    return st;
}

ag_safetensors *ag_safetensors_load(const char *path, ag_err *err) {
    if (!path) {
        agi_err_set(err, "safetensors_load: the path is NULL");
        return NULL;
    }
    if (!*path) {  // else the line began ": cannot open", naming no file
        agi_err_set(err, "safetensors_load: the path is empty; name a file to read");
        return NULL;
    }
    char shown_buf[AGI_PATH_SHOWN_SIZE];
    const char *shown = agi_path_shown(path, shown_buf);
    // Non-blocking, so that a FIFO given by mistake cannot hang the open.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        agi_err_set(err, "%s: cannot open: %s", shown, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        agi_err_set(err, "%s: cannot stat: %s", shown, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        agi_err_set(err, "%s: %s", shown,
                    S_ISDIR(sb.st_mode) ? "is a directory, not a file" : "is not a regular file");
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        agi_err_set(err, "%s: cannot read: %s", shown, strerror(errno));
        close(fd);
        return NULL;
    }
    source src = {.f = f, .size = (uint64_t)sb.st_size};
    ag_safetensors *st = load(&src, shown, err);
    fclose(f);
    return st;
}

ag_safetensors *ag_safetensors_load_buffer(const void *data, size_t size, const char *name,
                                           ag_err *err) {
    source src = {.mem = data, .size = size};
    if (!name) name = "<buffer>";
    if (!data && size) {
        agi_err_set(err, "%s: the buffer is NULL", name);
        return NULL;
    }
    return load(&src, name, err);
}
