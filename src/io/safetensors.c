// The tensor set: named tensors sorted by name, and string metadata sorted by
// key. Building, looking up and freeing; the file formats live next door.
#include "safetensors.h"

#include <string.h>

#include "../core/json.h"

// The format's dtypes, in the order of the reference implementation's Dtype enum, which
// declares them by increasing alignment and which its writer sorts by (descending). The
// ones attograd stores name their ag_dtype; the others are known, so that a file holding
// one is told apart from a corrupt one.
static const struct {
    const char *name;
    int dt;  // an ag_dtype, or -1 for a dtype attograd does not store
} st_dtypes[] = {
    {"BOOL", AG_BOOL}, {"F4", -1},       {"F6_E2M3", -1}, {"F6_E3M2", -1},    {"U8", AG_U8},
    {"I8", -1},        {"F8_E5M2", -1},  {"F8_E4M3", -1}, {"F8_E8M0", -1},    {"I16", -1},
    {"U16", -1},       {"F16", -1},      {"BF16", -1},    {"I32", AG_I32},    {"U32", -1},
    {"F32", AG_F32},   {"C64", -1},      {"F64", AG_F64}, {"I64", AG_I64},    {"U64", -1},
    {"C128", -1},
};
enum { ST_DTYPES = sizeof st_dtypes / sizeof st_dtypes[0] };

static int st_dtype_index(ag_dtype dt) {
    for (int i = 0; i < ST_DTYPES; i++)
        if (st_dtypes[i].dt == (int)dt) return i;
    return -1;
}

const char *ag_safetensors_dtype_name(ag_dtype dt) {
    const int i = st_dtype_index(dt);
    return i < 0 ? "?" : st_dtypes[i].name;
}

int agi_st_dtype_rank(ag_dtype dt) { return st_dtype_index(dt); }

int agi_st_dtype_from_name(const char *s, ag_dtype *dt) {
    for (int i = 0; i < ST_DTYPES; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            if (st_dtypes[i].dt < 0) return 0;
            *dt = (ag_dtype)st_dtypes[i].dt;
            return 1;
        }
    return -1;
}

const char *agi_st_stored_dtypes(char *buf, size_t size) {
    int k = 0;
    for (int i = 0; i < ST_DTYPES; i++) k += st_dtypes[i].dt >= 0;
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0, j = 0; i < ST_DTYPES && n < size; i++) {
        if (st_dtypes[i].dt < 0) continue;
        j++;
        n += (size_t)snprintf(buf + n, size - n, "%s%s", j == 1 ? "" : j == k ? " and " : ", ",
                              st_dtypes[i].name);
    }
    return buf;
}

const char *agi_st_show(const char *s, char *buf, size_t size) {
    const size_t keep = size > 16 ? size - 8 : 1;  // room for "\xNN" and "..."
    const bool utf8 = agi_utf8_valid(s, strlen(s));  // else escape every byte >= 0x80
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (n >= keep) {
            while (n > 0 && ((unsigned char)buf[n - 1] & 0xC0) == 0x80) n--;  // whole chars
            if (n > 0 && (unsigned char)buf[n - 1] >= 0xC0) n--;
            memcpy(buf + n, "...", 4);
            return buf;
        }
        if (*p < 0x20 || *p == 0x7F || (*p >= 0x80 && !utf8))
            n += (size_t)snprintf(buf + n, size - n, "\\x%02X", *p);
        else
            buf[n++] = (char)*p;
    }
    buf[n] = 0;
    return buf;
}

void agi_le_inplace(void *data, size_t count, size_t size) {
    const uint16_t probe = 1;
    unsigned char little;
    memcpy(&little, &probe, 1);
    if (little) return;
    unsigned char *d = data;
    for (size_t i = 0; i < count; i++, d += size)
        for (size_t a = 0, b = size - 1; a < b; a++, b--) {
            unsigned char t = d[a];
            d[a] = d[b];
            d[b] = t;
        }
}

size_t agi_st_first_bad_bool(const ag_tensor *t) {
    const uint8_t *b = t->data;
    size_t k = 0;
    if (t->dtype == AG_BOOL)
        while (k < t->numel && b[k] <= 1) k++;
    return t->dtype == AG_BOOL ? k : t->numel;
}

// ---- The set ------------------------------------------------------------------------

ag_safetensors *ag_safetensors_new(void) { return agi_calloc(sizeof(ag_safetensors)); }

void ag_safetensors_free(ag_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->count; i++) {
        agi_st_entry *e = st->entries[i];
        if (!e->borrowed) agi_free(e->tensor.data);
        // A set's tensor that was made to require grad gets its gradient on the heap at
        // its first backward; it lives and goes with the set, as its values do.
        agi_free(e->tensor.grad);
        agi_free(e->name);
        agi_free(e);
    }
    for (int i = 0; i < st->meta_count; i++) {
        agi_free(st->meta[i].key);
        agi_free(st->meta[i].value);
    }
    agi_free(st->entries);
    agi_free(st->meta);
    agi_free(st);
}

// A NULL set reads as an empty one, as ag_safetensors_free(NULL) frees nothing:
// what a failed load leaves in a caller's variable.
int ag_safetensors_count(const ag_safetensors *st) { return st ? st->count : 0; }

const char *ag_safetensors_name(const ag_safetensors *st, int i) {
    return st && i >= 0 && i < st->count ? st->entries[i]->name : NULL;
}

const ag_tensor *ag_safetensors_at(const ag_safetensors *st, int i) {
    return st && i >= 0 && i < st->count ? &st->entries[i]->tensor : NULL;
}

// Both lists are sorted by strcmp: entries by name, metadata by key.
static const char *entry_name(const ag_safetensors *st, int i) { return st->entries[i]->name; }
static const char *meta_key(const ag_safetensors *st, int i) { return st->meta[i].key; }

// Binary search for `key` among the n keys key_at(st, 0 .. n-1): its index, or
// where it would be inserted; *found says which.
static int find_sorted(const ag_safetensors *st, int n,
                       const char *(*key_at)(const ag_safetensors *, int), const char *key,
                       bool *found) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(key_at(st, mid), key);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static int find_entry(const ag_safetensors *st, const char *name, bool *found) {
    return find_sorted(st, st->count, entry_name, name, found);
}

static int find_meta(const ag_safetensors *st, const char *key, bool *found) {
    return find_sorted(st, st->meta_count, meta_key, key, found);
}

const ag_tensor *ag_safetensors_find(const ag_safetensors *st, const char *name) {
    bool found;
    if (!st || !name) return NULL;
    int i = find_entry(st, name, &found);
    return found ? &st->entries[i]->tensor : NULL;
}

int ag_safetensors_meta_count(const ag_safetensors *st) { return st ? st->meta_count : 0; }

const char *ag_safetensors_meta_key(const ag_safetensors *st, int i) {
    return st && i >= 0 && i < st->meta_count ? st->meta[i].key : NULL;
}

const char *ag_safetensors_meta_value(const ag_safetensors *st, int i) {
    return st && i >= 0 && i < st->meta_count ? st->meta[i].value : NULL;
}

const char *ag_safetensors_meta(const ag_safetensors *st, const char *key) {
    bool found;
    if (!st || !key) return NULL;
    int i = find_meta(st, key, &found);
    return found ? st->meta[i].value : NULL;
}

// ---- Building -----------------------------------------------------------------------

int agi_st_add(ag_safetensors *st, const char *name, const ag_tensor *t, bool borrow,
               ag_err *err) {
    char shown[96];
    if (!st || !name || !t) {
        agi_err_set(err, "safetensors_add: the set, the name and the tensor must not be NULL");
        return -1;
    }
    if (!agi_utf8_valid(name, strlen(name))) {
        agi_err_set(err, "safetensors_add: tensor name '%s' is not valid UTF-8",
                    agi_st_show(name, shown, sizeof shown));
        return -1;
    }
    if (strcmp(name, "__metadata__") == 0) {
        agi_err_set(err, "safetensors_add: '__metadata__' is reserved for the metadata");
        return -1;
    }
    if (ag_dtype_size(t->dtype) == 0 || !t->data) {
        agi_err_set(err, "safetensors_add: tensor '%s' has an unknown dtype or no data",
                    agi_st_show(name, shown, sizeof shown));
        return -1;
    }
    size_t bad = agi_st_first_bad_bool(t);
    if (bad < t->numel) {
        agi_err_set(err, "safetensors_add: tensor '%s': BOOL element %zu is %u; BOOL bytes are 0 or 1",
                    agi_st_show(name, shown, sizeof shown), bad,
                    (unsigned)((const uint8_t *)t->data)[bad]);
        return -1;
    }
    bool found;
    int pos = find_entry(st, name, &found);
    if (found) {
        agi_err_set(err, "safetensors_add: the set already holds a tensor named '%s'",
                    agi_st_show(name, shown, sizeof shown));
        return -1;
    }
    agi_st_entry *e = agi_calloc(sizeof *e);
    e->name = agi_strdup(name);
    agi_tensor_header(&e->tensor, t->dtype, t->ndim, t->shape);
    e->tensor.name = e->name;
    e->borrowed = borrow;
    if (borrow) {
        e->tensor.data = t->data;
    } else {
        size_t bytes = t->numel * ag_dtype_size(t->dtype);
        e->tensor.data = agi_malloc(bytes);
        memcpy(e->tensor.data, t->data, bytes);
    }
    st->entries =
        agi_reserve(st->entries, &st->cap, st->count, st->count + 1, 16, sizeof *st->entries);
    memmove(st->entries + pos + 1, st->entries + pos,
            (size_t)(st->count - pos) * sizeof *st->entries);
    st->entries[pos] = e;
    st->count++;
    return 0;
}

int ag_safetensors_add(ag_safetensors *st, const char *name, const ag_tensor *t, ag_err *err) {
    return agi_st_add(st, name, t, false, err);
}

int ag_safetensors_set_meta(ag_safetensors *st, const char *key, const char *value,
                            ag_err *err) {
    char shown[96];
    if (!st || !key || !value) {
        agi_err_set(err, "safetensors_set_meta: the set, the key and the value must not be NULL");
        return -1;
    }
    if (!agi_utf8_valid(key, strlen(key)) || !agi_utf8_valid(value, strlen(value))) {
        agi_err_set(err, "safetensors_set_meta: metadata '%s' is not valid UTF-8",
                    agi_st_show(key, shown, sizeof shown));
        return -1;
    }
    bool found;
    int pos = find_meta(st, key, &found);
    if (found) {
        char *v = agi_strdup(value);
        agi_free(st->meta[pos].value);
        st->meta[pos].value = v;
        return 0;
    }
    st->meta = agi_reserve(st->meta, &st->meta_cap, st->meta_count, st->meta_count + 1, 16,
                           sizeof *st->meta);
    memmove(st->meta + pos + 1, st->meta + pos,
            (size_t)(st->meta_count - pos) * sizeof *st->meta);
    st->meta[pos].key = agi_strdup(key);
    st->meta[pos].value = agi_strdup(value);
    st->meta_count++;
    return 0;
}
