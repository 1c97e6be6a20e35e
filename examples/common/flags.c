#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool parse_value(const char *prog, flag *f, const char *s) {
    char *end;
    errno = 0;
    if (f->kind == FLAG_STRING) {
        if (!*s) {
            fprintf(stderr, "%s: %s needs a non-empty value\n", prog, f->name);
            return false;
        }
        *(const char **)f->value = s;
        return true;
    }
    double v = strtod(s, &end);
    bool integer = f->kind == FLAG_INT || f->kind == FLAG_U64;
    if (errno || end == s || *end || !(v >= f->lo && v <= f->hi) || (integer && v != floor(v))) {
        fprintf(stderr, "%s: %s needs %s in [%.15g, %.15g], got '%s'\n", prog, f->name,
                integer ? "an integer" : "a number", f->lo, f->hi, s);
        return false;
    }
    if (f->kind == FLAG_INT) *(int *)f->value = (int)v;
    else if (f->kind == FLAG_U64) *(uint64_t *)f->value = (uint64_t)v;
    else *(double *)f->value = v;
    return true;
}

void flags_format(const flag *f, char *buf, size_t size) {
    switch (f->kind) {
    case FLAG_INT: snprintf(buf, size, "%d", *(const int *)f->value); break;
    case FLAG_U64:
        snprintf(buf, size, "%llu", (unsigned long long)*(const uint64_t *)f->value);
        break;
    case FLAG_REAL: snprintf(buf, size, "%.17g", *(const double *)f->value); break;
    case FLAG_STRING: snprintf(buf, size, "%s", *(const char *const *)f->value); break;
    case FLAG_SWITCH: snprintf(buf, size, "%s", *(const bool *)f->value ? "true" : "false"); break;
    }
}

bool flags_set(const char *prog, flag *f, const char *text) {
    if (f->kind != FLAG_SWITCH) return parse_value(prog, f, text);
    if (strcmp(text, "true") && strcmp(text, "false")) {
        fprintf(stderr, "%s: %s needs true or false, got '%s'\n", prog, f->name, text);
        return false;
    }
    *(bool *)f->value = !strcmp(text, "true");
    return true;
}

flag *flags_find(flag *flags, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(flags[i].name, name)) return &flags[i];
    return NULL;
}

void flags_usage(const char *usage_line, const flag *flags, int n, FILE *f) {
    fprintf(f, "%s\n", usage_line);
    for (int i = 0; i < n; i++) {
        const flag *g = &flags[i];
        char def[64] = "";
        if (g->kind == FLAG_INT) snprintf(def, sizeof def, " (default %d)", *(int *)g->value);
        if (g->kind == FLAG_U64)
            snprintf(def, sizeof def, " (default %llu)", (unsigned long long)*(uint64_t *)g->value);
        if (g->kind == FLAG_REAL) snprintf(def, sizeof def, " (default %g)", *(double *)g->value);
        fprintf(f, "  %-16s %s%s\n", g->name, g->help, def);
    }
}

int flags_parse(const char *prog, const char *usage_line, flag *flags, int n, int argc,
                char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            flags_usage(usage_line, flags, n, stdout);
            return 1;
        }
        flag *f = flags_find(flags, n, argv[i]);
        if (!f) {
            fprintf(stderr, "%s: unknown option '%s' (see --help)\n", prog, argv[i]);
            return 2;
        }
        f->given = true;
        if (f->kind == FLAG_SWITCH) {
            *(bool *)f->value = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value (see --help)\n", prog, argv[i]);
            return 2;
        }
        if (!parse_value(prog, f, argv[++i])) return 2;
    }
    return 0;
}
