// Checkpoints of a parameter store: saved straight from the store's buffer,
// loaded strictly (as load_state_dict(strict=True)), all checks before the
// first value is written.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "safetensors.h"

static char *join(const char *prefix, const char *name) {
    size_t a = strlen(prefix), b = strlen(name);
    char *s = agi_malloc(a + b + 1);
    memcpy(s, prefix, a);
    memcpy(s + a, name, b + 1);
    return s;
}

// Adds every parameter as prefix + name, or nothing if any name is unusable.
static int add_params(ag_safetensors *st, const ag_params *ps, const char *prefix, bool borrow,
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
        } else if (ag_safetensors_get(st, name) || strcmp(name, "__metadata__") == 0) {
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
    return add_params(st, ps, prefix, false, err);
}

int ag_params_save(const ag_params *ps, const char *path, const char *const meta[],
                   ag_err *err) {
    if (!ps || !path) {
        agi_err_set(err, "params_save: the store and the path must not be NULL");
        return -1;
    }
    // The set borrows the store's values: a checkpoint costs no copy.
    ag_safetensors *st = ag_safetensors_new();
    int rc = add_params(st, ps, "", true, err);
    for (int i = 0; rc == 0 && meta && meta[i]; i += 2) {
        if (!meta[i + 1]) {
            agi_err_set(err, "params_save: metadata key '%s' has no value", meta[i]);
            rc = -1;
        } else {
            rc = ag_safetensors_set_meta(st, meta[i], meta[i + 1], err);
        }
    }
    if (rc == 0) rc = ag_safetensors_save(st, path, err);
    ag_safetensors_free(st);
    return rc;
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

int ag_params_load_from(ag_params *ps, const ag_safetensors *st, const char *prefix,
                        ag_err *err) {
    if (!ps || !st) {
        agi_err_set(err, "params_load: the store and the set must not be NULL");
        return -1;
    }
    if (!prefix) prefix = "";
    size_t plen = strlen(prefix);
    int n = ag_params_count(ps), missing = 0, mismatched = 0, unexpected = 0;

    // Every check first: the store is written only if all of them pass.
    const ag_tensor **src = agi_malloc((size_t)(n ? n : 1) * sizeof *src);
    for (int i = 0; i < n; i++) {
        char *name = join(prefix, ag_params_at(ps, i)->name);
        src[i] = ag_safetensors_get(st, name);
        agi_free(name);
        missing += !src[i];
        mismatched += src[i] && !usable(src[i], ag_params_at(ps, i));
    }
    for (int i = 0; i < st->count; i++) {
        const char *name = st->entries[i]->name;
        unexpected += strncmp(name, prefix, plen) == 0 && !ag_params_find(ps, name + plen);
    }
    if (!missing && !mismatched && !unexpected) {
        for (int i = 0; i < n; i++) ag_tensor_copy(ag_params_at(ps, i), src[i]);
        agi_free(src);
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
            if (strncmp(name, prefix, plen) != 0 || ag_params_find(ps, name + plen)) continue;
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
                agi_st_dtype_name(src[i]->dtype));
        else
            say(&r, "%ssize mismatch for '%s': %s in the file, %s in the model", sep, shown,
                agi_shape(src[i]), agi_shape(p));
        sep = "; ";
    }
    agi_err_set(err, "%s", r.msg);
    agi_free(src);
    return -1;
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
    if (rc && err) {
        agi_err_set(err, "%s: %s", path, inner.msg);
        if (strlen(path) + 2 + strlen(inner.msg) >= sizeof err->msg)  // cut: say so
            memcpy(err->msg + sizeof err->msg - 4, "...", 4);
    }
    ag_safetensors_free(st);
    return rc;
}
