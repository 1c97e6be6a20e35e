// An optimizer describes its own state for checkpoints (attograd/state.h):
// its kind name, its settings as key/value strings, its buffers by PyTorch's
// state keys, and how to read the settings back. The checkpoint code in io
// then maps names to tensors and strings and knows no optimizer; a new
// optimizer, or a new per-parameter setting, needs its entry here and none there.
//
// Only the step count, the learning rate, SGD's momentum_initialised and the
// decay groups (the store's ag_params_set_decay tags, as "no_decay") are
// restored. The other hyperparameters are saved for the reader (PyTorch keeps
// them in its state_dict too) but stay as the code that makes the optimizer
// sets them; SGD's momentum is compared, because it decides whether a
// momentum buffer exists at all.
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/internal.h"
#include "../core/json.h"
#include "attograd/optim.h"
#include "update.h"

static const char *kind_name(ag_optim_kind k) {
    switch (k) {
    case AG_SGD: return "sgd";
    case AG_ADAM: return "adam";
    case AG_ADAMW: return "adamw";
    case AG_LION: return "lion";
    }
    return "?";
}

static const char *state_kind(const void *self) {
    return kind_name(ag_optim_config_get(self).kind);
}

static const ag_params *state_store(const void *self, size_t *buffer_len) {
    return agi_optim_params(self, buffer_len);
}

// The saved scalars of each kind, in this order: the common ones first.
static const char *const common_keys[] = {"step", "lr", "weight_decay"};
static const char *const sgd_keys[] = {"momentum", "dampening", "nesterov",
                                       "momentum_initialised"};
static const char *const adam_keys[] = {"beta1", "beta2", "eps"};
static const char *const lion_keys[] = {"beta1", "beta2"};
#define COUNT(a) ((int)(sizeof(a) / sizeof(a)[0]))
#define N_COMMON COUNT(common_keys)

static int kind_keys(ag_optim_kind k, const char *const **keys) {
    switch (k) {
    case AG_SGD: *keys = sgd_keys; return COUNT(sgd_keys);
    case AG_ADAM:
    case AG_ADAMW: *keys = adam_keys; return COUNT(adam_keys);
    case AG_LION: *keys = lion_keys; return COUNT(lion_keys);
    }
    *keys = NULL;
    return 0;
}

// ---- The decay groups -----------------------------------------------------------------
// "no_decay": a JSON array of the parameters outside the decaying group
// (ag_params_set_decay; PyTorch's second param_group, weight_decay 0), saved only
// when there are any, so that files of models without groups stay as they were,
// and a file without it restores every parameter to decaying.

static bool some_do_not_decay(const ag_params *ps) {
    for (int i = 0; i < ag_params_count(ps); i++)
        if (!ag_params_decays(ps, ag_params_at(ps, i))) return true;
    return false;
}

// The array's length; written into buf only when it fits (length < size).
static size_t write_no_decay(const ag_params *ps, char *buf, size_t size) {
    size_t len = 2;
    int listed = 0;
    for (int i = 0; i < ag_params_count(ps); i++)
        if (!ag_params_decays(ps, ag_params_at(ps, i)))
            len += agi_json_quote(ag_params_at(ps, i)->name, NULL) + (listed++ ? 1 : 0);
    if (len >= size) return len;
    char *w = buf;
    *w++ = '[';
    for (int i = 0; i < ag_params_count(ps); i++) {
        if (ag_params_decays(ps, ag_params_at(ps, i))) continue;
        if (w > buf + 1) *w++ = ',';
        w += agi_json_quote(ag_params_at(ps, i)->name, w);
    }
    *w++ = ']', *w = '\0';
    return len;
}

// ---- Writing the settings ---------------------------------------------------------------

static const ag_params *store_of(const ag_optim *o) {
    size_t len;
    return agi_optim_params(o, &len);
}

static int state_n_values(const void *self) {
    const char *const *keys;
    int n = N_COMMON + kind_keys(ag_optim_config_get(self).kind, &keys);
    return n + some_do_not_decay(store_of(self));
}

// The fewest significant digits that strtod reads back as exactly `v`: 0.9
// rather than 0.90000000000000002. 17 digits always suffice.
static void write_number(char *buf, size_t size, double v) {
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, size, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
}

static void write_bool(char *buf, size_t size, bool v) { snprintf(buf, size, "%s", v ? "true" : "false"); }

static size_t state_value(const void *self, int i, const char **key, char *buf, size_t size) {
    const ag_optim *o = self;
    ag_optim_config c = ag_optim_config_get(o);
    const char *const *keys;
    int n = kind_keys(c.kind, &keys);
    *key = NULL;
    if (i < 0 || i >= state_n_values(o)) return 0;
    if (i == N_COMMON + n) {
        *key = "no_decay";
        return write_no_decay(store_of(o), buf, size);
    }
    *key = i < N_COMMON ? common_keys[i] : keys[i - N_COMMON];
    char v[40];  // a number or a bool: "%.17g" needs at most 24 characters
    if (strcmp(*key, "step") == 0)
        snprintf(v, sizeof v, "%" PRId64, ag_optim_step_count(o));
    else if (strcmp(*key, "nesterov") == 0)
        write_bool(v, sizeof v, c.nesterov);
    else if (strcmp(*key, "momentum_initialised") == 0)
        write_bool(v, sizeof v, ag_optim_momentum_initialised(o));
    else
        write_number(v, sizeof v,
                     strcmp(*key, "lr") == 0             ? c.lr
                     : strcmp(*key, "weight_decay") == 0 ? c.weight_decay
                     : strcmp(*key, "momentum") == 0     ? c.momentum
                     : strcmp(*key, "dampening") == 0    ? c.dampening
                     : strcmp(*key, "beta1") == 0        ? c.beta1
                     : strcmp(*key, "beta2") == 0        ? c.beta2
                                                         : c.eps);
    size_t len = strlen(v);
    if (len < size) memcpy(buf, v, len + 1);
    return len;
}

static int state_n_buffers(const void *self) { return ag_optim_state_count(self); }
static const char *state_buffer_name(const void *self, int i) { return ag_optim_state_name(self, i); }
static void *state_buffer_data(const void *self, int i) { return ag_optim_state_data(self, i); }

// ---- Reading the settings back, strictly ---------------------------------------------------

static const char *need(const ag_state_source *src, const char *key, ag_err *err) {
    const char *v = src->get(src->ctx, key);
    if (!v) agi_err_set(err, "metadata '%s%s' is missing", src->prefix, key);
    return v;
}

// Text from a file, for a message: control characters escaped, cut to fit `size`
// ("..." marks the cut), on one line.
static const char *show(const char *text, char *shown, size_t size) {
    size_t k = 0;
    const char *s = text;
    for (; *s && k + 11 < size; s++) {  // room for one \xNN, the "..." and the NUL
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch == 0x7f) k += (size_t)snprintf(shown + k, size - k, "\\x%02x", ch);
        else shown[k++] = (char)ch;
    }
    snprintf(shown + k, size - k, "%s", *s ? "..." : "");
    return shown;
}

static int bad_value(const ag_state_source *src, const char *key, const char *value,
                     const char *expected, ag_err *err) {
    char shown[67];
    agi_err_set(err, "metadata '%s%s' is '%s'; expected %s", src->prefix, key,
                show(value, shown, sizeof shown), expected);
    return -1;
}

// Digits only, no sign, no space, at most AG_OPTIM_MAX_STEPS (optim.h says why).
static int read_step(const ag_state_source *src, int64_t *step, ag_err *err) {
    const char *key = "step", *s = need(src, key, err);
    if (!s) return -1;
    static const char expected[] = "a whole number of steps >= 0 and <= 2^53";
    if (!isdigit((unsigned char)s[0])) return bad_value(src, key, s, expected, err);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end || errno == ERANGE || v > AG_OPTIM_MAX_STEPS)
        return bad_value(src, key, s, expected, err);
    *step = (int64_t)v;
    return 0;
}

// A number >= 0, as write_number writes it (strtod reads it back exactly).
static int read_nonnegative(const ag_state_source *src, const char *key, bool finite, double *v,
                            ag_err *err) {
    const char *s = need(src, key, err);
    if (!s) return -1;
    const char *expected = finite ? "a finite number >= 0" : "a number >= 0";
    if (!s[0] || isspace((unsigned char)s[0])) return bad_value(src, key, s, expected, err);
    char *end;
    *v = strtod(s, &end);
    if (*end || !(*v >= 0) || (finite && !isfinite(*v))) return bad_value(src, key, s, expected, err);
    return 0;
}

static int read_bool(const ag_state_source *src, const char *key, bool *v, ag_err *err) {
    const char *s = need(src, key, err);
    if (!s) return -1;
    if (strcmp(s, "true") != 0 && strcmp(s, "false") != 0)
        return bad_value(src, key, s, "true or false", err);
    *v = s[0] == 't';
    return 0;
}

// The parameters "no_decay" lists, as no_decay[i] for parameter i; none when it is absent.
static int read_no_decay(const ag_state_source *src, const ag_params *ps, bool *no_decay,
                         ag_err *err) {
    const char *text = src->get(src->ctx, "no_decay");
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
            agi_err_set(err, "metadata %sno_decay names '%s', which is not a parameter",
                        src->prefix, show(name, shown, sizeof shown));
            agi_free(name);
            return -1;
        }
        agi_free(name);
    }
    if (ok && !j.failed && agi_json_finish(&j)) return 0;
    return bad_value(src, "no_decay", text, "a JSON array of parameter names", err);
}

static int state_restore(void *self, const ag_state_source *src, bool apply, ag_err *err) {
    ag_optim *o = self;
    int64_t step = 0;
    double lr = 0;
    bool initialised = false;
    if (read_step(src, &step, err)) return -1;
    if (read_nonnegative(src, "lr", true, &lr, err)) return -1;
    if (ag_optim_config_get(o).kind == AG_SGD) {
        // SGD's momentum buffer exists (momentum != 0) in both or in neither.
        double momentum;
        if (read_nonnegative(src, "momentum", false, &momentum, err)) return -1;
        bool file_has = momentum != 0, opt_has = ag_optim_has_momentum_buffer(o);
        if (file_has != opt_has) {
            agi_err_set(err,
                        "the file's sgd has momentum %g but the optimizer's has momentum %g: "
                        "one has a momentum buffer and the other has none",
                        momentum, ag_optim_config_get(o).momentum);
            return -1;
        }
        if (opt_has && read_bool(src, "momentum_initialised", &initialised, err)) return -1;
    }
    size_t len;
    ag_params *ps = agi_optim_params(o, &len);
    int n = ag_params_count(ps);
    bool *no_decay = agi_calloc((size_t)(n ? n : 1) * sizeof *no_decay);
    int rc = read_no_decay(src, ps, no_decay, err);
    if (rc == 0 && apply) {
        ag_optim_set_step_count(o, step);
        ag_optim_set_lr(o, lr);
        if (ag_optim_has_momentum_buffer(o)) ag_optim_set_momentum_initialised(o, initialised);
        for (int i = 0; i < n; i++) ag_params_set_decay(ps, ag_params_at(ps, i), !no_decay[i]);
    }
    agi_free(no_decay);
    return rc;
}

void agi_optim_state_init(ag_state *s, ag_optim *o) {
    *s = (ag_state){
        .self = o,
        .kind = state_kind,
        .store = state_store,
        .n_values = state_n_values,
        .value = state_value,
        .n_buffers = state_n_buffers,
        .buffer_name = state_buffer_name,
        .buffer_data = state_buffer_data,
        .restore = state_restore,
    };
}
