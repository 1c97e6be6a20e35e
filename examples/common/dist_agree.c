#include "dist_agree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "fnv1a.h"

// What a bad flag and a failed agreement exit with: the run was started wrongly.
#define DISAGREE_STATUS 2
#define OTHER_FLAGS "started with other flags than rank 0 (every rank needs the same)"

void dist_flags_parse(const char *usage_line, flag *flags, int n, int argc, char **argv) {
    ag_err err;
    const flags_result parsed = flags_parse(usage_line, flags, n, argc, argv, &err);
    dist_check(parsed == FLAGS_BAD, DISAGREE_STATUS, "%s", err.msg);
    dist_check_same(parsed, DISAGREE_STATUS, "%s", OTHER_FLAGS);
    if (parsed == FLAGS_HELP) {
        dist_finish();
        exit(0);
    }
}

void dist_agree_flags(const flag *flags, int n) {
    uint64_t h = FNV1A_START;
    for (int i = 0; i < n; i++) {
        if (flags[i].per_rank && flags[i].kind != FLAG_STRING) continue;  // each rank's own
        char value[1024];
        if (flags[i].per_rank)  // a path: only whether it is given
            snprintf(value, sizeof value, "%s",
                     *(const char *const *)flags[i].value ? "given" : "");
        else
            flags_format(&flags[i], value, sizeof value);
        h = fnv1a(h, flags[i].name, strlen(flags[i].name) + 1);  // with its NUL: a separator
        h = fnv1a(h, value, strlen(value) + 1);
    }
    dist_check_same(h, DISAGREE_STATUS, "%s", OTHER_FLAGS);
}

void dist_agree_data(const void *bytes, size_t n, const char *flag_name) {
    dist_check_same(fnv1a(FNV1A_START, bytes, n), DISAGREE_STATUS,
                    "its data differs from rank 0's (%s)", flag_name);
}

// The hash of the optimizer's state as a checkpoint would save it: every setting
// (the step count among them) and every buffer.
static uint64_t state_hash(uint64_t h, const ag_state *s) {
    for (int i = 0; i < s->n_values(s->self); i++) {
        const char *key;
        char value[4096];
        size_t len = s->value(s->self, i, &key, value, sizeof value);
        h = fnv1a(h, key, strlen(key) + 1);
        if (len < sizeof value) h = fnv1a(h, value, len + 1);
        else h = fnv1a(h, &len, sizeof len);  // (a long list of names: its length will do)
    }
    size_t len;
    const ag_params *ps = s->store(s->self, &len);
    for (int i = 0; i < s->n_buffers(s->self); i++)
        h = fnv1a(h, s->buffer_data(s->self, i), len * ag_dtype_size(ag_params_dtype(ps)));
    return h;
}

void dist_agree_state(const ag_params *ps, ag_optim *opt, const char *resume) {
    const size_t bytes = ag_params_buffer_len(ps) * ag_dtype_size(ag_params_dtype(ps));
    uint64_t h = fnv1a(FNV1A_START, ag_params_data(ps), bytes);
    if (opt) h = state_hash(h, ag_optim_state(opt));
    if (resume)
        dist_check_same(h, DISAGREE_STATUS, "%s holds another model than rank 0's copy", resume);
    else
        dist_check_same(h, DISAGREE_STATUS, "its initial model differs from rank 0's");
}
