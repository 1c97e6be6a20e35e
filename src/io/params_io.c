// Parameter stores in tensor sets: added under a prefix, loaded strictly (as
// load_state_dict(strict=True)), all checks before the first value is
// written. Saving a store to a file is a model-only checkpoint (checkpoint.c,
// which calls this file; this file never calls it).
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/json.h"
#include "safetensors.h"

static char *join(const char *prefix, const char *name) {
    size_t a = strlen(prefix), b = strlen(name);
    char *s = agi_malloc(a + b + 1);
    memcpy(s, prefix, a);
    memcpy(s + a, name, b + 1);
    return s;
}

int agi_st_add_params(ag_safetensors *st, const ag_params *ps, const char *prefix, bool borrow,
                      ag_err *err) {
    if (!st || !ps) {
        agi_err_set(err, "safetensors_add_params: the set and the store must not be NULL");
        return -1;
    }
    if (!prefix) prefix = "";
    int n = ag_params_count(ps), rc = 0;
    char shown[96];
    for (int i = 0; i < n && rc == 0; i++) {
        char *name = join(prefix, ag_params_at(ps, i)->name);
        if (!agi_utf8_valid(name, strlen(name))) {
            agi_err_set(err, "safetensors_add_params: parameter name '%s' is not valid UTF-8",
                        agi_st_show(name, shown, sizeof shown));
            rc = -1;
        } else if (strcmp(name, "__metadata__") == 0) {
            agi_err_set(err, "safetensors_add_params: '__metadata__' is reserved for the "
                             "metadata; no parameter can be saved under that name");
            rc = -1;
        } else if (ag_safetensors_find(st, name)) {
            agi_err_set(err, "safetensors_add_params: the set already holds a tensor named '%s'",
                        agi_st_show(name, shown, sizeof shown));
            rc = -1;
        }
        agi_free(name);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        const ag_tensor *t = ag_params_at(ps, i);
        char *name = join(prefix, t->name);
        rc = agi_st_add(st, name, t, borrow, err);
        agi_free(name);
    }
    return rc;
}

int ag_safetensors_add_params(ag_safetensors *st, const ag_params *ps, const char *prefix,
                              ag_err *err) {
    return agi_st_add_params(st, ps, prefix, false, err);
}

// ---- Loading ------------------------------------------------------------------------

// One line listing the problems, cut with "..." when it does not fit.
typedef struct report {
    char msg[sizeof(((ag_err *)0)->msg)];
    size_t len;
} report;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void say(report *r, const char *fmt, ...) {
    size_t room = sizeof r->msg - r->len;
    if (room <= 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->msg + r->len, room, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < room) {
        r->len += (size_t)n;
    } else {
        r->len = sizeof r->msg - 1;
        memcpy(r->msg + r->len - 3, "...", 3);
    }
}

static bool usable(const ag_tensor *file, const ag_tensor *param) {
    return agi_is_float(file->dtype) && ag_tensor_same_shape(file, param);
}

static int by_string(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// The parameters' names, sorted, so that telling whether a tensor of the set
// names a parameter costs a binary search rather than a scan.
typedef struct name_index {
    const char **names;
    int n;
    const char *prefix, *except;  // the tensors looked at, and those skipped
    size_t plen, elen;
} name_index;

static name_index index_names(const ag_params *ps, const char *prefix, const char *except) {
    name_index ix = {.n = ag_params_count(ps), .prefix = prefix, .except = except};
    ix.names = agi_malloc((size_t)(ix.n ? ix.n : 1) * sizeof *ix.names);
    for (int i = 0; i < ix.n; i++) ix.names[i] = ag_params_at(ps, i)->name;
    if (ix.n > 1) qsort(ix.names, (size_t)ix.n, sizeof *ix.names, by_string);
    ix.plen = strlen(prefix);
    ix.elen = except ? strlen(except) : 0;
    return ix;
}

// A tensor under the prefix (and not under `except`) that names no parameter.
static bool is_unexpected(const name_index *ix, const char *name) {
    if (strncmp(name, ix->prefix, ix->plen) != 0) return false;
    if (ix->except && strncmp(name, ix->except, ix->elen) == 0) return false;
    const char *rest = name + ix->plen;
    return !bsearch(&rest, ix->names, (size_t)ix->n, sizeof *ix->names, by_string);
}

int agi_params_match(const ag_params *ps, const ag_safetensors *st, const char *prefix,
                     const char *except, const ag_tensor **src, ag_err *err) {
    if (!prefix) prefix = "";
    int n = ag_params_count(ps), missing = 0, mismatched = 0, unexpected = 0;
    for (int i = 0; i < n; i++) {
        char *name = join(prefix, ag_params_at(ps, i)->name);
        src[i] = ag_safetensors_find(st, name);
        agi_free(name);
        missing += !src[i];
        mismatched += src[i] && !usable(src[i], ag_params_at(ps, i));
    }
    name_index ix = index_names(ps, prefix, except);
    for (int i = 0; i < st->count; i++) unexpected += is_unexpected(&ix, st->entries[i]->name);
    if (!missing && !mismatched && !unexpected) {
        agi_free(ix.names);
        return 0;
    }

    report r = {.len = 0};
    char shown[96];
    const char *sep = "";
    if (missing) {
        say(&r, "missing %d of %d parameter%s:", missing, n, n == 1 ? "" : "s");
        for (int i = 0, k = 0; i < n; i++) {
            if (src[i]) continue;
            char *name = join(prefix, ag_params_at(ps, i)->name);
            say(&r, "%s '%s'", k++ ? "," : "", agi_st_show(name, shown, sizeof shown));
            agi_free(name);
        }
        sep = "; ";
    }
    if (unexpected) {
        say(&r, "%s%d unexpected tensor%s:", sep, unexpected, unexpected == 1 ? "" : "s");
        for (int i = 0, k = 0; i < st->count; i++) {
            const char *name = st->entries[i]->name;
            if (is_unexpected(&ix, name))
                say(&r, "%s '%s'", k++ ? "," : "", agi_st_show(name, shown, sizeof shown));
        }
        sep = "; ";
    }
    for (int i = 0; i < n; i++) {
        const ag_tensor *p = ag_params_at(ps, i);
        if (!src[i] || usable(src[i], p)) continue;
        agi_st_show(src[i]->name, shown, sizeof shown);
        if (!agi_is_float(src[i]->dtype))
            say(&r, "%s'%s' is %s in the file; parameters load from F32 or F64", sep, shown,
                ag_safetensors_dtype_name(src[i]->dtype));
        else
            say(&r, "%ssize mismatch for '%s': %s in the file, %s in the model", sep, shown,
                agi_shape(src[i]), agi_shape(p));
        sep = "; ";
    }
    agi_err_set(err, "%s", r.msg);
    agi_free(ix.names);
    return -1;
}

int ag_params_load_from(ag_params *ps, const ag_safetensors *st, const char *prefix,
                        ag_err *err) {
    if (!ps || !st) {
        agi_err_set(err, "params_load: the store and the set must not be NULL");
        return -1;
    }
    int n = ag_params_count(ps);
    const ag_tensor **src = agi_malloc((size_t)(n ? n : 1) * sizeof *src);
    int rc = agi_params_match(ps, st, prefix, NULL, src, err);
    for (int i = 0; rc == 0 && i < n; i++) ag_tensor_copy(ag_params_at(ps, i), src[i]);
    agi_free(src);
    return rc;
}

void agi_err_in_file(ag_err *err, const char *path, const char *msg) {
    if (!err) return;
    // Cut, it is at least sizeof - 4 bytes long (an escape takes at most 4): say so.
    char shown[AGI_PATH_SHOWN_SIZE];
    if (!agi_err_set(err, "%s: %s", agi_path_shown(path, shown), msg))
        memcpy(err->msg + sizeof err->msg - 4, "...", 4);
}

int ag_params_load(ag_params *ps, const char *path, ag_err *err) {
    if (!ps || !path) {
        agi_err_set(err, "params_load: the store and the path must not be NULL");
        return -1;
    }
    ag_safetensors *st = ag_safetensors_load(path, err);
    if (!st) return -1;
    ag_err inner;
    int rc = ag_params_load_from(ps, st, "", &inner);
    if (rc) agi_err_in_file(err, path, inner.msg);
    ag_safetensors_free(st);
    return rc;
}
