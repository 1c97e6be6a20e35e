// An optimizer describes its own state for checkpoints (attograd/state.h):
// its kind name, its scalars as key/value strings, its buffers by PyTorch's
// state keys, and how to read the scalars back. The checkpoint code in io
// then maps names to tensors and strings and knows no optimizer; a new
// optimizer needs its entry here and none there.
//
// Only the step count, the learning rate and SGD's momentum_initialised are
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

static int state_n_values(const void *self) {
    const char *const *keys;
    return N_COMMON + kind_keys(ag_optim_config_get(self).kind, &keys);
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

static const char *state_value(const void *self, int i, char *buf, size_t size) {
    const ag_optim *o = self;
    ag_optim_config c = ag_optim_config_get(o);
    const char *const *keys;
    int n = kind_keys(c.kind, &keys);
    if (i < 0 || i >= N_COMMON + n) return NULL;
    const char *key = i < N_COMMON ? common_keys[i] : keys[i - N_COMMON];
    if (strcmp(key, "step") == 0)
        snprintf(buf, size, "%" PRId64, ag_optim_step_count(o));
    else if (strcmp(key, "nesterov") == 0)
        write_bool(buf, size, c.nesterov);
    else if (strcmp(key, "momentum_initialised") == 0)
        write_bool(buf, size, ag_optim_momentum_initialised(o));
    else
        write_number(buf, size,
                     strcmp(key, "lr") == 0             ? c.lr
                     : strcmp(key, "weight_decay") == 0 ? c.weight_decay
                     : strcmp(key, "momentum") == 0     ? c.momentum
                     : strcmp(key, "dampening") == 0    ? c.dampening
                     : strcmp(key, "beta1") == 0        ? c.beta1
                     : strcmp(key, "beta2") == 0        ? c.beta2
                                                        : c.eps);
    return key;
}

static int state_n_buffers(const void *self) { return ag_optim_state_count(self); }
static const char *state_buffer_name(const void *self, int i) { return ag_optim_state_name(self, i); }
static void *state_buffer_data(const void *self, int i) { return ag_optim_state_data(self, i); }

// ---- Reading the scalars back, strictly ---------------------------------------------------

static const char *need(const ag_state_source *src, const char *key, ag_err *err) {
    const char *v = src->get(src->ctx, key);
    if (!v) agi_err_set(err, "metadata '%s%s' is missing", src->prefix, key);
    return v;
}

static int bad_value(const ag_state_source *src, const char *key, const char *value,
                     const char *expected, ag_err *err) {
    // Values come from a file: shown escaped and shortened, on one line.
    char shown[64];
    size_t k = 0;
    const char *s = value;
    for (; *s && k + 8 < sizeof shown; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch == 0x7f) k += (size_t)snprintf(shown + k, sizeof shown - k, "\\x%02x", ch);
        else shown[k++] = (char)ch;
    }
    shown[k] = '\0';
    agi_err_set(err, "metadata '%s%s' is '%s%s'; expected %s", src->prefix, key, shown,
                *s ? "..." : "", expected);
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
    if (!apply) return 0;
    ag_optim_set_step_count(o, step);
    ag_optim_set_lr(o, lr);
    if (ag_optim_has_momentum_buffer(o)) ag_optim_set_momentum_initialised(o, initialised);
    return 0;
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
