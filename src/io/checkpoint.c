// Checkpoints: a parameter store, the state kept beside it (an optimizer's,
// seen only through attograd/state.h) and your metadata in one safetensors
// file (layout in io.h), so that training resumes to the very same numbers.
// Saving writes straight from the store's and the state's buffers; loading
// checks the whole file before it writes the first value, so a failed load
// changes nothing. A model-only checkpoint (ag_params_save) is one without a
// state. This file builds on params_io.c, never the other way round.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

// Everything of the state lives under this name: tensors under
// "optimizer.", metadata under "optimizer" (the kind) and "optimizer.".
#define NS "optimizer"
#define NS_DOT "optimizer."

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static bool reserved_key(const char *key) {
    return strcmp(key, NS) == 0 || starts_with(key, NS_DOT);
}

// "optimizer.<key>", the file's name of a setting of any length, agi_malloc'd.
static char *setting_name(const char *key) {
    size_t n = strlen(NS_DOT) + strlen(key) + 1;
    char *s = agi_malloc(n);
    snprintf(s, n, NS_DOT "%s", key);
    return s;
}

// "optimizer.<buffer>." or "optimizer.<buffer>.<param>", agi_malloc'd.
static char *state_name(const char *buffer, const char *param) {
    size_t n = strlen(NS_DOT) + strlen(buffer) + 1 + strlen(param) + 1;
    char *s = agi_malloc(n);
    snprintf(s, n, NS_DOT "%s.%s", buffer, param);
    return s;
}

// Parameter t's slice of a flat state buffer: the same element offset as its
// value in the store's buffer, its shape and dtype.
static ag_tensor state_view(const ag_params *ps, const ag_tensor *t, void *buffer) {
    ag_tensor v;
    agi_tensor_header(&v, t->dtype, t->ndim, t->shape);
    v.data = (char *)buffer + ((const char *)t->data - (const char *)ag_params_data(ps));
    return v;
}

// The state belongs to the store and the store has not grown or shrunk since.
static int check_state_store(const char *fn, const ag_params *ps, const ag_state *sv,
                             ag_err *err) {
    size_t len;
    if (sv->store(sv->self, &len) != ps) {
        agi_err_set(err, "%s: the optimizer updates another parameter store", fn);
        return -1;
    }
    size_t now = ag_params_buffer_len(ps);
    if (len == 0 && now != 0) {  // the state's word that it no longer fits (state.h)
        agi_err_set(err,
                    "%s: a parameter was resized after the optimizer was made (as pruning "
                    "does), inside the store's %zu elements: the optimizer's state no longer "
                    "fits it; make a new optimizer for the store as it is now",
                    fn, now);
        return -1;
    }
    if (len != now) {
        agi_err_set(err,
                    "%s: the parameter store %s from %zu to %zu elements after the optimizer "
                    "was made (a parameter was %s); make a new optimizer for the store as it "
                    "is now",
                    fn, now > len ? "grew" : "shrank", len, now,
                    now > len ? "added or enlarged" : "resized, as pruning does");
        return -1;
    }
    for (int i = 0; i < ag_params_count(ps); i++) {
        char shown[96];
        if (starts_with(ag_params_at(ps, i)->name, NS_DOT)) {
            agi_err_set(err,
                        "%s: parameter '%s' is named like optimizer state; names starting with "
                        "'" NS_DOT "' are reserved in checkpoints with an optimizer",
                        fn, agi_st_show(ag_params_at(ps, i)->name, shown, sizeof shown));
            return -1;
        }
    }
    return 0;
}

// ---- Saving ---------------------------------------------------------------------------

static int add_user_meta(ag_safetensors *st, const char *fn, const char *const meta[],
                         ag_err *err) {
    char shown[96];
    for (int i = 0; meta && meta[i]; i += 2) {
        if (!meta[i + 1]) {
            agi_err_set(err, "%s: metadata key '%s' has no value", fn,
                        agi_st_show(meta[i], shown, sizeof shown));
            return -1;
        }
        if (reserved_key(meta[i])) {
            agi_err_set(err,
                        "%s: metadata key '%s' is reserved: '" NS "' and keys starting with '" NS_DOT
                        "' describe the optimizer",
                        fn, agi_st_show(meta[i], shown, sizeof shown));
            return -1;
        }
        if (ag_safetensors_set_meta(st, meta[i], meta[i + 1], err)) return -1;
    }
    return 0;
}

// The state's kind and settings, as "optimizer" and "optimizer.<key>": strings
// whose meaning only the state knows.
static int add_state_meta(ag_safetensors *st, const ag_state *sv, ag_err *err) {
    if (ag_safetensors_set_meta(st, NS, sv->kind(sv->self), err)) return -1;
    char small[64], *value = small;
    size_t size = sizeof small;
    int rc = 0;
    for (int i = 0; i < sv->n_values(sv->self) && rc == 0; i++) {
        const char *key;
        size_t len = sv->value(sv->self, i, &key, value, size);
        if (len >= size) {  // a long value (a list of names): ask again with room for it
            if (value != small) agi_free(value);
            size = len + 1;
            value = agi_malloc(size);
            sv->value(sv->self, i, &key, value, size);
        }
        char *full = setting_name(key);
        rc = ag_safetensors_set_meta(st, full, value, err);
        agi_free(full);
    }
    if (value != small) agi_free(value);
    return rc;
}

// Views of every state buffer's slices, as "optimizer.<buffer>.<param>".
static int add_state_buffers(ag_safetensors *st, const ag_params *ps, const ag_state *sv,
                             ag_err *err) {
    int rc = 0;
    for (int s = 0; s < sv->n_buffers(sv->self) && rc == 0; s++) {
        void *data = sv->buffer_data(sv->self, s);
        for (int i = 0; i < ag_params_count(ps) && rc == 0; i++) {
            const ag_tensor *p = ag_params_at(ps, i);
            ag_tensor view = state_view(ps, p, data);
            char *name = state_name(sv->buffer_name(sv->self, s), p->name);
            rc = agi_st_add(st, name, &view, true, err);
            agi_free(name);
        }
    }
    return rc;
}

static int checkpoint_save(const char *fn, const ag_params *ps, const ag_state *sv,
                           const char *path, const char *const meta[], ag_err *err) {
    if (!ps || !path) {
        agi_err_set(err, "%s: the store and the path must not be NULL", fn);
        return -1;
    }
    if (sv && check_state_store(fn, ps, sv, err)) return -1;
    // The set borrows the buffers: a checkpoint costs no copy.
    ag_safetensors *st = ag_safetensors_new();
    int rc = agi_st_add_params(st, ps, "", true, err);
    if (rc == 0) rc = add_user_meta(st, fn, meta, err);
    if (rc == 0 && sv) rc = add_state_meta(st, sv, err);
    if (rc == 0 && sv) rc = add_state_buffers(st, ps, sv, err);
    if (rc == 0) rc = ag_safetensors_save(st, path, err);
    ag_safetensors_free(st);
    return rc;
}

int ag_checkpoint_save(const ag_params *ps, const ag_state *state, const char *path,
                       const char *const meta[], ag_err *err) {
    return checkpoint_save("checkpoint_save", ps, state, path, meta, err);
}

int ag_params_save(const ag_params *ps, const char *path, const char *const meta[],
                   ag_err *err) {
    return checkpoint_save("params_save", ps, NULL, path, meta, err);
}

// ---- Loading: the plan, checked in full before anything is written -----------------------

typedef struct plan {
    const ag_tensor **params;  // the file's tensor for each parameter
    const ag_tensor **buffer;  // buffer[s * n + i]: state buffer s's tensor for parameter i
    int n_buffers;
    bool *may_lack;            // set by the state's restore (attograd/state.h)
    bool *absent;              // absent[s]: the file leaves buffer s out; it loads as zeros
    ag_state_source values;
} plan;

static const char *get_value(const void *ctx, const char *key) {
    char *full = setting_name(key);
    const char *value = ag_safetensors_meta(ctx, full);
    agi_free(full);
    return value;
}

// Names the kinds when the file's state is not of the given kind, or the
// file has none.
static int check_kind(const ag_safetensors *st, const ag_state *sv, ag_err *err) {
    const char *kind = ag_safetensors_meta(st, NS);
    bool has_state = false;
    for (int i = 0; i < ag_safetensors_count(st) && !has_state; i++)
        has_state = starts_with(ag_safetensors_name(st, i), NS_DOT);
    const char *want = sv->kind(sv->self);
    if (!kind && !has_state) {
        agi_err_set(err,
                    "the file has no optimizer state (a model-only checkpoint) but %s state was "
                    "asked for; load it with a NULL optimizer to restore only the parameters",
                    want);
        return -1;
    }
    if (!kind) {
        agi_err_set(err, "the file has '" NS_DOT "' tensors but no metadata '" NS
                         "' naming the optimizer");
        return -1;
    }
    if (strcmp(kind, want) != 0) {
        char shown[64];
        agi_err_set(err, "the file holds %s optimizer state but the optimizer is %s",
                    agi_st_show(kind, shown, sizeof shown), want);
        return -1;
    }
    return 0;
}

// "optimizer.exp_avg.* and optimizer.exp_avg_sq.*", for messages.
static void list_buffers(const ag_state *sv, char *out, size_t size) {
    int n = sv->n_buffers(sv->self);
    size_t k = 0;
    out[0] = '\0';
    for (int s = 0; s < n && k < size; s++) {
        int w = snprintf(out + k, size - k, "%s" NS_DOT "%s.*",
                         s == 0 ? "" : s == n - 1 ? " and " : ", ", sv->buffer_name(sv->self, s));
        if (w < 0) break;
        k += (size_t)w;
    }
}

// Every state tensor, and no tensor under "optimizer." that is not one.
static int check_buffers(const ag_safetensors *st, const ag_params *ps, const ag_state *sv,
                         plan *pl, ag_err *err) {
    int n = ag_params_count(ps);
    for (int s = 0; s < pl->n_buffers; s++) {
        char *prefix = state_name(sv->buffer_name(sv->self, s), "");
        bool any = false;
        for (int i = 0; i < ag_safetensors_count(st) && !any; i++)
            any = starts_with(ag_safetensors_name(st, i), prefix);
        pl->absent[s] = pl->may_lack[s] && !any;
        ag_err inner;
        int rc = pl->absent[s] ? 0
                               : agi_params_match(ps, st, prefix, NULL,
                                                  pl->buffer + (size_t)s * (size_t)n, &inner);
        agi_free(prefix);
        if (rc) {
            agi_err_set(err, "optimizer state: %s", inner.msg);
            return -1;
        }
    }
    int stray = 0, stray_at = -1;
    for (int i = 0; i < ag_safetensors_count(st); i++) {
        const char *name = ag_safetensors_name(st, i);
        if (!starts_with(name, NS_DOT)) continue;
        bool known = false;
        for (int s = 0; s < pl->n_buffers && !known; s++) {
            char *prefix = state_name(sv->buffer_name(sv->self, s), "");
            known = starts_with(name, prefix);
            agi_free(prefix);
        }
        if (!known && stray++ == 0) stray_at = i;
    }
    if (stray) {
        char shown[96], kept[200];
        list_buffers(sv, kept, sizeof kept);
        agi_err_set(err, "%d unexpected optimizer tensor%s, the first '%s' (%s keeps %s%s)", stray,
                    stray == 1 ? "" : "s",
                    agi_st_show(ag_safetensors_name(st, stray_at), shown, sizeof shown),
                    sv->kind(sv->self), pl->n_buffers ? "only " : "no state tensors", kept);
        return -1;
    }
    return 0;
}

static int make_plan(const ag_safetensors *st, const ag_params *ps, ag_state *sv, plan *pl,
                     ag_err *err) {
    // Without a state, its part of the file is none of our business.
    if (agi_params_match(ps, st, "", NS_DOT, pl->params, err)) return -1;
    if (!sv) return 0;
    if (check_kind(st, sv, err)) return -1;
    if (sv->restore(sv->self, &pl->values, false, err)) return -1;
    return check_buffers(st, ps, sv, pl, err);
}

static void carry_out(const plan *pl, ag_params *ps, ag_state *sv) {
    int n = ag_params_count(ps);
    for (int i = 0; i < n; i++) ag_tensor_copy(ag_params_at(ps, i), pl->params[i]);
    if (!sv) return;
    for (int s = 0; s < pl->n_buffers; s++) {
        void *data = sv->buffer_data(sv->self, s);
        if (pl->absent[s]) {
            size_t len;
            sv->store(sv->self, &len);
            memset(data, 0, len * ag_dtype_size(ag_params_dtype(ps)));
            continue;
        }
        for (int i = 0; i < n; i++) {
            ag_tensor view = state_view(ps, ag_params_at(ps, i), data);
            ag_tensor_copy(&view, pl->buffer[(size_t)s * (size_t)n + (size_t)i]);
        }
    }
    // Checked in make_plan: cannot fail now. Still given somewhere to write: state.h
    // promises restore an err, and a state of the user's may write it on any call.
    ag_err unused;
    sv->restore(sv->self, &pl->values, true, &unused);
}

int ag_checkpoint_load(ag_params *ps, ag_state *state, const char *path, ag_safetensors **file,
                       ag_err *err) {
    if (file) *file = NULL;
    if (!ps || !path) {
        agi_err_set(err, "checkpoint_load: the store and the path must not be NULL");
        return -1;
    }
    if (state && check_state_store("checkpoint_load", ps, state, err)) return -1;
    ag_safetensors *st = ag_safetensors_load(path, err);
    if (!st) return -1;
    size_t n = (size_t)ag_params_count(ps);
    plan pl = {.n_buffers = state ? state->n_buffers(state->self) : 0,
               .values = {.get = get_value, .ctx = st, .prefix = NS_DOT}};
    pl.params = agi_malloc((n ? n : 1) * sizeof *pl.params);
    pl.buffer = agi_malloc((n * (size_t)pl.n_buffers + 1) * sizeof *pl.buffer);
    pl.may_lack = agi_calloc(((size_t)pl.n_buffers + 1) * sizeof *pl.may_lack);
    pl.absent = agi_calloc(((size_t)pl.n_buffers + 1) * sizeof *pl.absent);
    pl.values.may_lack = pl.may_lack;
    ag_err inner;
    int rc = make_plan(st, ps, state, &pl, &inner);
    if (rc == 0)
        carry_out(&pl, ps, state);
    else
        agi_err_in_file(err, path, inner.msg);
    agi_free(pl.params);
    agi_free(pl.buffer);
    agi_free(pl.may_lack);
    agi_free(pl.absent);
    if (rc == 0 && file)
        *file = st;
    else
        ag_safetensors_free(st);
    return rc;
}
