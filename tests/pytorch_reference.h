// Reading the reference files that tests/pytorch/make_*_reference.py write
// into tests/reference/: one safetensors file of cases, each case's tensors
// named "c<i>.<what>", the number of cases in the metadata under "cases", and
// settings as "key=value key=value" strings.
#ifndef ATTOGRAD_PYTORCH_REFERENCE_H
#define ATTOGRAD_PYTORCH_REFERENCE_H

#include <stdlib.h>

#include "attograd/io.h"
#include "testing.h"

// tests/reference/<file>; NULL, with the reason printed, if it does not load.
static inline ag_safetensors *load_reference(const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/reference/%s", AG_SOURCE_DIR, file);
    ag_err err;
    ag_safetensors *st = ag_safetensors_load(path, &err);
    if (!st) fprintf(stderr, "%s\n", err.msg);
    return st;
}

// The number of cases the file says it holds (0 without a file).
static inline int reference_cases(const ag_safetensors *st) {
    const char *n = st ? ag_safetensors_meta(st, "cases") : NULL;
    return n ? atoi(n) : 0;
}

// The value of `key` in "key=value key=value", copied into buf; NULL if absent.
static inline const char *reference_value(const char *settings, const char *key, char *buf,
                                          size_t size) {
    size_t k = strlen(key);
    for (const char *s = settings; s && (s = strstr(s, key)) != NULL; s += k) {
        if ((s == settings || s[-1] == ' ') && s[k] == '=') {
            size_t n = strcspn(s + k + 1, " ");
            snprintf(buf, size, "%.*s", (int)n, s + k + 1);
            return buf;
        }
    }
    return NULL;
}

#endif
