// An optimizer describes its own state for checkpoints (attograd/state.h):
// its kind name, its settings as key/value strings, its buffers by PyTorch's
// state keys, and how to read the settings back. The checkpoint code in io
// then maps names to tensors and strings and knows no optimizer; this file reads
// the optimizer's descriptor (optimizer.h) and names none either. A new optimizer
// needs its settings in its descriptor and nothing here or in io; a new
// per-parameter setting, its entry here.
//
// Only the step count, the learning rate, SGD's momentum_initialised and the
// decay groups (the store's ag_params_set_decay tags, as "no_decay") are
// restored. The other hyperparameters are saved for the reader (PyTorch keeps
// them in its state_dict too) but stay as the code that makes the optimizer
// sets them; those that decide which buffers exist (SGD's and RMSprop's momentum,
// RMSprop's centered) are compared.
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
#include "optimizer.h"

static const agi_optimizer *descriptor(const void *self) {
    return agi_optimizer_of(ag_optim_current_config(self).kind);
}

static const char *state_kind(const void *self) { return descriptor(self)->name; }

// A parameter resized inside its alignment padding leaves the store's length as it was,
// but not where the parameters are: the state then says 0 (state.h).
static const ag_params *state_store(const void *self, size_t *buffer_len) {
    const ag_params *ps = agi_optim_params(self, buffer_len);
    if (*buffer_len == ag_params_buffer_len(ps) && !agi_optim_fits(self)) *buffer_len = 0;
    return ps;
}

// The saved scalars, in this order: "step", the settings every optimizer has,
// the descriptor's settings, then "momentum_initialised" for an optimizer whose
// momentum buffer starts on the first step.
static const agi_setting common_settings[] = {
    {"lr", AGI_SETTING_FIELD(lr), NULL},
    {"weight_decay", AGI_SETTING_FIELD(weight_decay), NULL},
    {NULL, 0, false, NULL},
};
static const char initialised_key[] = "momentum_initialised";

static int count_settings(const agi_setting *list) {
    int n = 0;
    while (list[n].key) n++;
    return n;
}

static double number_of(const ag_optim_config *c, const agi_setting *s) {
    return *(const double *)((const char *)c + s->offset);
}

static bool bool_of(const ag_optim_config *c, const agi_setting *s) {
    return *(const bool *)((const char *)c + s->offset);
}

static const ag_params *store_of(const ag_optim *o) {
    size_t len;
    return agi_optim_params(o, &len);
}

// ---- Lists of parameters ----------------------------------------------------------------
// "no_decay": a JSON array of the parameters outside the decaying group
// (ag_params_set_decay; PyTorch's second param_group, weight_decay 0), saved only
// when there are any, so that files of models without groups stay as they were,
// and a file without it restores every parameter to decaying.
// "momentum_not_started": once SGD's momentum is initialised, the parameters no step
// has updated yet (frozen on every step so far), whose buffers start on their first
// update as PyTorch's do; saved only when there are any, and a file without it
// restores every parameter as started.

static bool does_not_decay(const ag_optim *o, int i) {
    const ag_params *ps = store_of(o);
    return !ag_params_decays(ps, ag_params_at(ps, i));
}

static bool not_started(const ag_optim *o, int i) {
    return ag_optim_momentum_initialised(o) && !agi_optim_started(o, i);
}

static const struct {
    const char *key;
    bool (*listed)(const ag_optim *o, int i);
} lists[] = {{"no_decay", does_not_decay}, {"momentum_not_started", not_started}};
enum { N_LISTS = sizeof lists / sizeof lists[0] };

static bool some_listed(const ag_optim *o, int l) {
    for (int i = 0; i < ag_params_count(store_of(o)); i++)
        if (lists[l].listed(o, i)) return true;
    return false;
}

// The array's length; written into buf only when it fits (length < size).
static size_t write_list(const ag_optim *o, int l, char *buf, size_t size) {
    const ag_params *ps = store_of(o);
    size_t len = 2;
    int listed = 0;
    for (int i = 0; i < ag_params_count(ps); i++)
        if (lists[l].listed(o, i))
            len += agi_json_quote(ag_params_at(ps, i)->name, NULL) + (listed++ ? 1 : 0);
    if (len >= size) return len;
    char *w = buf;
    *w++ = '[';
    for (int i = 0; i < ag_params_count(ps); i++) {
        if (!lists[l].listed(o, i)) continue;
        if (w > buf + 1) *w++ = ',';
        w += agi_json_quote(ag_params_at(ps, i)->name, w);
    }
    *w++ = ']', *w = '\0';
    return len;
}

// ---- Writing the settings ---------------------------------------------------------------

// The scalars before the lists.
static int n_scalars(const agi_optimizer *d) {
    return 1 + count_settings(common_settings) + count_settings(d->settings) +
           (d->momentum_starts_on_first_step ? 1 : 0);
}

static int state_n_values(const void *self) {
    int n = n_scalars(descriptor(self));
    for (int l = 0; l < N_LISTS; l++) n += some_listed(self, l);
    return n;
}

// The fewest significant digits that strtod reads back as exactly `v`: 0.9
// rather than 0.90000000000000002. 17 digits always suffice. With '.' whatever the
// locale (agi_format_g), so that a file means the same in every program.
static void write_number(char *buf, size_t size, double v) {
    for (int digits = 15; digits <= 17; digits++) {
        agi_format_g(buf, size, digits, v);
        if (agi_strtod_c(buf, NULL) == v) break;
    }
}

static void write_bool(char *buf, size_t size, bool v) { snprintf(buf, size, "%s", v ? "true" : "false"); }

static size_t state_value(const void *self, int i, const char **key, char *buf, size_t size) {
    const ag_optim *o = self;
    const agi_optimizer *d = descriptor(o);
    ag_optim_config c = ag_optim_current_config(o);
    int n_common = count_settings(common_settings), n_own = count_settings(d->settings);
    *key = NULL;
    if (i < 0 || i >= state_n_values(o)) return 0;
    if (i >= n_scalars(d)) {  // the lists there are, in their order
        int l = 0, k = i - n_scalars(d);
        for (; l < N_LISTS; l++)
            if (some_listed(o, l) && k-- == 0) break;
        *key = lists[l].key;
        return write_list(o, l, buf, size);
    }
    char v[40];  // a number or a bool: "%.17g" needs at most 24 characters
    if (i == 0) {
        *key = "step";
        snprintf(v, sizeof v, "%" PRId64, ag_optim_step_count(o));
    } else if (i <= n_common + n_own) {
        const agi_setting *s = i <= n_common ? &common_settings[i - 1]
                                             : &d->settings[i - 1 - n_common];
        *key = s->key;
        if (s->is_bool) write_bool(v, sizeof v, bool_of(&c, s));
        else write_number(v, sizeof v, number_of(&c, s));
    } else {
        *key = initialised_key;
        write_bool(v, sizeof v, ag_optim_momentum_initialised(o));
    }
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
    // Cut inside a character (a file's text is UTF-8): leave all of it out, so that the
    // message stays UTF-8. Each of its bytes was copied as one.
    while (*s && k > 0 && ((unsigned char)*s & 0xC0) == 0x80) s--, k--;
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

// A number >= 0, as write_number writes it (strtod reads it back exactly), '.' as the
// decimal point whatever the locale.
static int read_nonnegative(const ag_state_source *src, const char *key, bool finite, double *v,
                            ag_err *err) {
    const char *s = need(src, key, err);
    if (!s) return -1;
    const char *expected = finite ? "a finite number >= 0" : "a number >= 0";
    if (!s[0] || isspace((unsigned char)s[0])) return bad_value(src, key, s, expected, err);
    char *end;
    *v = agi_strtod_c(s, &end);
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

// The parameters the list `key` names, as listed[i] for parameter i; none when it is absent.
static int read_list(const ag_state_source *src, const char *key, const ag_params *ps,
                     bool *listed, ag_err *err) {
    const char *text = src->get(src->ctx, key);
    if (!text) return 0;
    agi_json j;
    agi_json_init(&j, text, strlen(text));
    bool ok = agi_json_array_begin(&j);
    while (ok && agi_json_array_next(&j)) {
        char *name = NULL;
        ok = agi_json_string(&j, &name);
        ag_tensor *p = ok ? ag_params_find(ps, name) : NULL;
        for (int i = 0; p && i < ag_params_count(ps); i++)
            if (ag_params_at(ps, i) == p) listed[i] = true;
        if (ok && !p) {
            char shown[80];
            agi_err_set(err, "metadata %s%s names '%s', which is not a parameter",
                        src->prefix, key, show(name, shown, sizeof shown));
            agi_free(name);
            return -1;
        }
        agi_free(name);
    }
    if (ok && !j.failed && agi_json_finish(&j)) return 0;
    return bad_value(src, key, text, "a JSON array of parameter names", err);
}

// Two configurations keep the same state buffers.
static bool same_buffers(const agi_optimizer *d, const ag_optim_config *a,
                         const ag_optim_config *b) {
    const char *na[AGI_OPTIM_MAX_BUFFERS], *nb[AGI_OPTIM_MAX_BUFFERS];
    int n = d->buffers(a, na);
    if (n != d->buffers(b, nb)) return false;
    for (int i = 0; i < n; i++)
        if (strcmp(na[i], nb[i]) != 0) return false;
    return true;
}

// The settings that decide which buffers exist (SGD's momentum: a momentum
// buffer or none) must agree between the file and the optimizer: a file cannot
// feed buffers the optimizer lacks, nor lack buffers it has.
static int check_deciding_settings(const ag_state_source *src, const ag_optim *o,
                                   ag_err *err) {
    const agi_optimizer *d = descriptor(o);
    ag_optim_config mine = ag_optim_current_config(o);
    for (const agi_setting *s = d->settings; s->key; s++) {
        if (!s->decides) continue;
        ag_optim_config theirs = mine;
        char *field = (char *)&theirs + s->offset;
        char file_value[32], my_value[32];
        if (s->is_bool) {
            if (read_bool(src, s->key, (bool *)field, err)) return -1;
            write_bool(file_value, sizeof file_value, bool_of(&theirs, s));
            write_bool(my_value, sizeof my_value, bool_of(&mine, s));
        } else {
            if (read_nonnegative(src, s->key, false, (double *)field, err)) return -1;
            snprintf(file_value, sizeof file_value, "%g", number_of(&theirs, s));
            snprintf(my_value, sizeof my_value, "%g", number_of(&mine, s));
        }
        if (!same_buffers(d, &theirs, &mine)) {
            agi_err_set(err,
                        "the file's %s has %s %s but the optimizer's has %s %s: one has %s "
                        "and the other has none",
                        d->name, s->key, file_value, s->key, my_value, s->decides);
            return -1;
        }
    }
    return 0;
}

static int state_restore(void *self, const ag_state_source *src, bool apply, ag_err *err) {
    ag_optim *o = self;
    const agi_optimizer *d = descriptor(o);
    int64_t step = 0;
    double lr = 0;
    bool initialised = false;
    if (read_step(src, &step, err)) return -1;
    if (read_nonnegative(src, "lr", true, &lr, err)) return -1;
    if (check_deciding_settings(src, o, err)) return -1;
    bool has_flag = ag_optim_has_momentum_buffer(o);
    if (has_flag && read_bool(src, initialised_key, &initialised, err)) return -1;
    // The buffers PyTorch has not made yet, which its state_dict leaves out: SGD's
    // momentum buffer until its first step; any buffer that starts at zero, before
    // the first step.
    for (int i = 0; src->may_lack && i < ag_optim_state_count(o); i++)
        src->may_lack[i] = d->momentum_starts_on_first_step ? !initialised : step == 0;
    size_t len;
    ag_params *ps = agi_optim_params(o, &len);
    int n = ag_params_count(ps);
    size_t flags = (size_t)(n ? n : 1);
    bool *no_decay = agi_calloc(flags * sizeof *no_decay);
    bool *unstarted = agi_calloc(flags * sizeof *unstarted);
    int rc = read_list(src, "no_decay", ps, no_decay, err);
    if (rc == 0 && has_flag && initialised)
        rc = read_list(src, "momentum_not_started", ps, unstarted, err);
    if (rc == 0 && apply) {
        ag_optim_set_step_count(o, step);
        ag_optim_set_lr(o, lr);
        if (has_flag) ag_optim_set_momentum_initialised(o, initialised);
        for (int i = 0; i < n; i++) {
            ag_params_set_decay(ps, ag_params_at(ps, i), !no_decay[i]);
            if (unstarted[i]) agi_optim_set_started(o, i, false);
        }
    }
    agi_free(no_decay);
    agi_free(unstarted);
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
