// Training checkpoints: a parameter store, its optimizer's state and your
// metadata in one safetensors file (layout in io.h), so that training resumes
// to the very same numbers. Saving writes straight from the store's and the
// optimizer's buffers; loading checks the whole file before it writes the
// first value, so a failed load changes nothing.
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "safetensors.h"

// Everything of the optimizer lives under this name: tensors under
// "optimizer.", metadata under "optimizer" and "optimizer.".
#define NS "optimizer"
#define NS_DOT "optimizer."

static const char *kind_name(ag_optim_kind k) {
    switch (k) {
    case AG_SGD: return "sgd";
    case AG_ADAM: return "adam";
    case AG_ADAMW: return "adamw";
    }
    return "?";
}

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static bool reserved_key(const char *key) {
    return strcmp(key, NS) == 0 || starts_with(key, NS_DOT);
}

// "optimizer.<state>." or "optimizer.<state>.<param>", agi_malloc'd.
static char *state_name(const char *state, const char *param) {
    size_t n = strlen(NS_DOT) + strlen(state) + 1 + strlen(param) + 1;
    char *s = agi_malloc(n);
    snprintf(s, n, NS_DOT "%s.%s", state, param);
    return s;
}

// Parameter t's slice of a flat state buffer: the same element offset as its
// value in the store's buffer, its shape and dtype.
static ag_tensor state_view(const ag_params *ps, const ag_tensor *t, void *state) {
    ag_tensor v;
    agi_tensor_header(&v, t->dtype, t->ndim, t->shape);
    v.data = (char *)state + ((const char *)t->data - (const char *)ag_params_data(ps));
    return v;
}

// The optimizer belongs to the store and the store has not grown since.
static int check_optimizer_store(const char *fn, const ag_params *ps, const ag_optim *opt,
                                 ag_err *err) {
    size_t len;
    if (agi_optim_params(opt, &len) != ps) {
        agi_err_set(err, "%s: the optimizer updates another parameter store", fn);
        return -1;
    }
    if (len != ag_params_buffer_len(ps)) {
        agi_err_set(err,
                    "%s: the parameter store grew from %zu to %zu elements after the optimizer "
                    "was made",
                    fn, len, ag_params_buffer_len(ps));
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

// Keys and values here are ASCII, which set_meta always accepts.
// The fewest significant digits that strtod reads back as exactly `v`: 0.9
// rather than 0.90000000000000002. 17 digits always suffice.
static void meta_number(ag_safetensors *st, const char *key, double v) {
    char text[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, v);
        if (strtod(text, NULL) == v) break;
    }
    ag_safetensors_set_meta(st, key, text, NULL);
}

static void meta_bool(ag_safetensors *st, const char *key, bool v) {
    ag_safetensors_set_meta(st, key, v ? "true" : "false", NULL);
}

// "optimizer.no_decay": a JSON array of the parameters outside the decaying
// group, when there are any (files of models without them stay as they were).
static void add_no_decay_meta(ag_safetensors *st, const ag_params *ps) {
    size_t len = 3;
    int n = ag_params_count(ps);
    for (int i = 0; i < n; i++)
        if (!ag_params_decays(ps, ag_params_at(ps, i)))
            len += agi_json_quote(ag_params_at(ps, i)->name, NULL) + 1;
    if (len == 3) return;
    char *text = agi_malloc(len), *w = text;
    *w++ = '[';
    for (int i = 0; i < n; i++) {
        if (ag_params_decays(ps, ag_params_at(ps, i))) continue;
        if (w > text + 1) *w++ = ',';
        w += agi_json_quote(ag_params_at(ps, i)->name, w);
    }
    *w++ = ']', *w = 0;
    ag_safetensors_set_meta(st, NS_DOT "no_decay", text, NULL);
    agi_free(text);
}

static void add_optimizer_meta(ag_safetensors *st, const ag_optim *opt) {
    ag_optim_config c = ag_optim_get_config(opt);
    char step[24];
    snprintf(step, sizeof step, "%lld", (long long)ag_optim_step_count(opt));
    ag_safetensors_set_meta(st, NS, kind_name(c.kind), NULL);
    ag_safetensors_set_meta(st, NS_DOT "step", step, NULL);
    meta_number(st, NS_DOT "lr", c.lr);
    meta_number(st, NS_DOT "weight_decay", c.weight_decay);
    if (c.kind == AG_SGD) {
        meta_number(st, NS_DOT "momentum", c.momentum);
        meta_number(st, NS_DOT "dampening", c.dampening);
        meta_bool(st, NS_DOT "nesterov", c.nesterov);
        meta_bool(st, NS_DOT "momentum_initialised", ag_optim_momentum_initialised(opt));
    } else {
        meta_number(st, NS_DOT "beta1", c.beta1);
        meta_number(st, NS_DOT "beta2", c.beta2);
        meta_number(st, NS_DOT "eps", c.eps);
    }
}

// Views of every state buffer's slices, as "optimizer.<state>.<param>".
static int add_optimizer_state(ag_safetensors *st, const ag_params *ps, const ag_optim *opt,
                               ag_err *err) {
    int rc = 0;
    for (int s = 0; s < ag_optim_state_count(opt) && rc == 0; s++) {
        void *data = ag_optim_state_data(opt, s);
        for (int i = 0; i < ag_params_count(ps) && rc == 0; i++) {
            const ag_tensor *p = ag_params_at(ps, i);
            ag_tensor view = state_view(ps, p, data);
            char *name = state_name(ag_optim_state_name(opt, s), p->name);
            rc = agi_st_add(st, name, &view, true, err);
            agi_free(name);
        }
    }
    return rc;
}

int agi_checkpoint_save(const char *fn, const ag_params *ps, const ag_optim *opt,
                        const char *path, const char *const meta[], ag_err *err) {
    if (!ps || !path) {
        agi_err_set(err, "%s: the store and the path must not be NULL", fn);
        return -1;
    }
    if (opt && check_optimizer_store(fn, ps, opt, err)) return -1;
    // The set borrows the buffers: a checkpoint costs no copy.
    ag_safetensors *st = ag_safetensors_new();
    int rc = agi_st_add_params(st, ps, "", true, err);
    if (rc == 0) rc = add_user_meta(st, fn, meta, err);
    if (rc == 0 && opt) {
        add_optimizer_meta(st, opt);
        add_no_decay_meta(st, ps);
        rc = add_optimizer_state(st, ps, opt, err);
    }
    if (rc == 0) rc = ag_safetensors_save(st, path, err);
    ag_safetensors_free(st);
    return rc;
}

int ag_checkpoint_save(const ag_params *ps, const ag_optim *opt, const char *path,
                       const char *const meta[], ag_err *err) {
    return agi_checkpoint_save("checkpoint_save", ps, opt, path, meta, err);
}

// ---- Loading: reading the metadata strictly --------------------------------------------

// The value of `key`, or NULL with a message.
static const char *need_meta(const ag_safetensors *st, const char *key, ag_err *err) {
    const char *v = ag_safetensors_meta(st, key);
    if (!v) agi_err_set(err, "metadata '%s' is missing", key);
    return v;
}

static int bad_value(const char *key, const char *value, const char *expected, ag_err *err) {
    char shown[64];
    agi_err_set(err, "metadata '%s' is '%s'; expected %s", key,
                agi_st_show(value, shown, sizeof shown), expected);
    return -1;
}

static int meta_step(const ag_safetensors *st, int64_t *step, ag_err *err) {
    const char *key = NS_DOT "step", *s = need_meta(st, key, err);
    if (!s) return -1;
    const char *expected = "a whole number of steps >= 0";
    if (!isdigit((unsigned char)s[0])) return bad_value(key, s, expected, err);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE) return bad_value(key, s, expected, err);
    *step = (int64_t)v;
    return 0;
}

// A number >= 0, as meta_number writes it (strtod reads it back exactly).
static int meta_nonnegative(const ag_safetensors *st, const char *key, bool finite, double *v,
                            ag_err *err) {
    const char *s = need_meta(st, key, err);
    if (!s) return -1;
    const char *expected = finite ? "a finite number >= 0" : "a number >= 0";
    if (!s[0] || isspace((unsigned char)s[0])) return bad_value(key, s, expected, err);
    char *end;
    *v = strtod(s, &end);
    if (*end || !(*v >= 0) || (finite && !isfinite(*v))) return bad_value(key, s, expected, err);
    return 0;
}

static int meta_truth(const ag_safetensors *st, const char *key, bool *v, ag_err *err) {
    const char *s = need_meta(st, key, err);
    if (!s) return -1;
    if (strcmp(s, "true") != 0 && strcmp(s, "false") != 0)
        return bad_value(key, s, "true or false", err);
    *v = s[0] == 't';
    return 0;
}

// ---- Loading: the plan, checked in full before anything is written -----------------------

typedef struct plan {
    const ag_tensor **params;   // the file's tensor for each parameter
    const ag_tensor **state[2]; // for each state buffer, the tensor for each parameter
    int n_state;
    int64_t step;
    double lr;
    bool momentum_initialised;
    bool *no_decay;             // for each parameter: outside the decaying group
} plan;

// Names the kinds when the file's optimizer is not the one given, or the
// file has none.
static int check_kind(const ag_safetensors *st, const ag_optim *opt, ag_err *err) {
    const char *kind = ag_safetensors_meta(st, NS);
    bool has_state = false;
    for (int i = 0; i < ag_safetensors_count(st) && !has_state; i++)
        has_state = starts_with(ag_safetensors_name(st, i), NS_DOT);
    const char *want = kind_name(ag_optim_get_config(opt).kind);
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
    if (strcmp(kind, "sgd") && strcmp(kind, "adam") && strcmp(kind, "adamw"))
        return bad_value(NS, kind, "sgd, adam or adamw", err);
    if (strcmp(kind, want) != 0) {
        agi_err_set(err, "the file holds %s optimizer state but the optimizer is %s", kind, want);
        return -1;
    }
    return 0;
}

// SGD's momentum buffer exists (momentum != 0) in both or in neither.
static int check_momentum(const ag_safetensors *st, const ag_optim *opt, plan *pl, ag_err *err) {
    double momentum;
    if (meta_nonnegative(st, NS_DOT "momentum", false, &momentum, err)) return -1;
    bool file_has = momentum != 0, opt_has = ag_optim_has_momentum_buffer(opt);
    if (file_has != opt_has) {
        agi_err_set(err,
                    "the file's sgd has momentum %g but the optimizer's has momentum %g: "
                    "one has a momentum buffer and the other has none",
                    momentum, ag_optim_get_config(opt).momentum);
        return -1;
    }
    pl->momentum_initialised = false;
    if (opt_has && meta_truth(st, NS_DOT "momentum_initialised", &pl->momentum_initialised, err))
        return -1;
    return 0;
}

// Every state tensor, and no tensor under "optimizer." that is not one.
static int check_state(const ag_safetensors *st, const ag_params *ps, const ag_optim *opt,
                       plan *pl, ag_err *err) {
    for (int s = 0; s < pl->n_state; s++) {
        char *prefix = state_name(ag_optim_state_name(opt, s), "");
        ag_err inner;
        int rc = agi_params_match(ps, st, prefix, NULL, pl->state[s], &inner);
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
        for (int s = 0; s < pl->n_state && !known; s++) {
            char *prefix = state_name(ag_optim_state_name(opt, s), "");
            known = starts_with(name, prefix);
            agi_free(prefix);
        }
        if (!known && stray++ == 0) stray_at = i;
    }
    if (stray) {
        char shown[96];
        agi_err_set(err, "%d unexpected optimizer tensor%s, the first '%s' (%s)", stray,
                    stray == 1 ? "" : "s",
                    agi_st_show(ag_safetensors_name(st, stray_at), shown, sizeof shown),
                    pl->n_state == 0   ? "sgd without momentum keeps no state tensors"
                    : pl->n_state == 1 ? "sgd keeps only " NS_DOT "momentum_buffer.*"
                                       : "adam keeps only " NS_DOT "exp_avg.* and " NS_DOT
                                         "exp_avg_sq.*");
        return -1;
    }
    return 0;
}

// The decay groups: every parameter decays unless "optimizer.no_decay" lists it.
static int meta_no_decay(const ag_safetensors *st, const ag_params *ps, bool *no_decay,
                         ag_err *err) {
    const char *text = ag_safetensors_meta(st, NS_DOT "no_decay");
    if (!text) return 0;
    agi_json j;
    agi_json_init(&j, text, strlen(text));
    bool ok = agi_json_array_begin(&j);
    while (ok && agi_json_array_next(&j)) {
        char *name = NULL;
        ok = agi_json_string(&j, &name);
        ag_tensor *p = ok ? ag_params_find(ps, name) : NULL;
        for (int i = 0; p && i < ag_params_count(ps); i++)
            if (ag_params_at(ps, i) == p) no_decay[i] = true;
        if (ok && !p) {
            char shown[80];
            agi_err_set(err, "metadata " NS_DOT "no_decay names '%s', which is not a parameter",
                        agi_st_show(name, shown, sizeof shown));
            agi_free(name);
            return -1;
        }
        agi_free(name);
    }
    if (ok && !j.failed && agi_json_finish(&j)) return 0;
    return bad_value(NS_DOT "no_decay", text, "a JSON array of parameter names", err);
}

static int make_plan(const ag_safetensors *st, const ag_params *ps, const ag_optim *opt,
                     plan *pl, ag_err *err) {
    // Without an optimizer, its part of the file is none of our business.
    if (agi_params_match(ps, st, "", NS_DOT, pl->params, err)) return -1;
    if (!opt) return 0;
    if (check_kind(st, opt, err)) return -1;
    if (meta_step(st, &pl->step, err)) return -1;
    if (meta_nonnegative(st, NS_DOT "lr", true, &pl->lr, err)) return -1;
    if (ag_optim_get_config(opt).kind == AG_SGD && check_momentum(st, opt, pl, err)) return -1;
    if (meta_no_decay(st, ps, pl->no_decay, err)) return -1;
    return check_state(st, ps, opt, pl, err);
}

static void carry_out(const plan *pl, ag_params *ps, ag_optim *opt) {
    int n = ag_params_count(ps);
    for (int i = 0; i < n; i++) ag_tensor_copy(ag_params_at(ps, i), pl->params[i]);
    if (!opt) return;
    for (int s = 0; s < pl->n_state; s++) {
        void *data = ag_optim_state_data(opt, s);
        for (int i = 0; i < n; i++) {
            ag_tensor view = state_view(ps, ag_params_at(ps, i), data);
            ag_tensor_copy(&view, pl->state[s][i]);
        }
    }
    for (int i = 0; i < n; i++) ag_params_set_decay(ps, ag_params_at(ps, i), !pl->no_decay[i]);
    ag_optim_set_step_count(opt, pl->step);
    ag_optim_set_lr(opt, pl->lr);
    if (ag_optim_has_momentum_buffer(opt))
        ag_optim_set_momentum_initialised(opt, pl->momentum_initialised);
}

int ag_checkpoint_load(ag_params *ps, ag_optim *opt, const char *path, ag_safetensors **file,
                       ag_err *err) {
    if (file) *file = NULL;
    if (!ps || !path) {
        agi_err_set(err, "checkpoint_load: the store and the path must not be NULL");
        return -1;
    }
    if (opt && check_optimizer_store("checkpoint_load", ps, opt, err)) return -1;
    ag_safetensors *st = ag_safetensors_load(path, err);
    if (!st) return -1;
    int n = ag_params_count(ps);
    plan pl = {.n_state = opt ? ag_optim_state_count(opt) : 0};
    pl.params = agi_malloc((size_t)(n ? n : 1) * sizeof *pl.params);
    pl.no_decay = agi_calloc((size_t)(n ? n : 1) * sizeof *pl.no_decay);
    for (int s = 0; s < pl.n_state; s++)
        pl.state[s] = agi_malloc((size_t)(n ? n : 1) * sizeof *pl.state[s]);
    ag_err inner;
    int rc = make_plan(st, ps, opt, &pl, &inner);
    if (rc == 0)
        carry_out(&pl, ps, opt);
    else
        agi_err_in_file(err, path, inner.msg);
    agi_free(pl.params);
    agi_free(pl.no_decay);
    for (int s = 0; s < pl.n_state; s++) agi_free(pl.state[s]);
    if (rc == 0 && file)
        *file = st;
    else
        ag_safetensors_free(st);
    return rc;
}
