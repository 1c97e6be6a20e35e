#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static bool failed(ag_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static bool failed(ag_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return false;
}

static bool set_choice(flag *f, const char *s, ag_err *err) {
    char names[256] = "";
    for (int i = 0; f->choices[i]; i++) {
        if (!strcmp(s, f->choices[i])) return *(int *)f->value = i, true;
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? "|" : "",
                 f->choices[i]);
    }
    return failed(err, "%s needs one of %s, got '%s'", f->name, names, s);
}

bool flags_set(flag *f, const char *s, ag_err *err) {
    switch (f->kind) {
    case FLAG_STRING:
        if (!*s) return failed(err, "%s needs a non-empty value", f->name);
        return *(const char **)f->value = s, true;
    case FLAG_SWITCH:
        if (strcmp(s, "true") && strcmp(s, "false"))
            return failed(err, "%s needs true or false, got '%s'", f->name, s);
        return *(bool *)f->value = !strcmp(s, "true"), true;
    case FLAG_CHOICE: return set_choice(f, s, err);
    default: break;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    bool integer = f->kind == FLAG_INT || f->kind == FLAG_U64;
    if (errno || end == s || *end || !(v >= f->lo && v <= f->hi) || (integer && v != floor(v)))
        return failed(err, "%s needs %s in [%.15g, %.15g], got '%s'", f->name,
                      integer ? "an integer" : "a number", f->lo, f->hi, s);
    if (f->kind == FLAG_INT) *(int *)f->value = (int)v;
    else if (f->kind == FLAG_U64) *(uint64_t *)f->value = (uint64_t)v;
    else *(double *)f->value = v;
    return true;
}

// A flag's value as text: `exact`, what flags_set reads back to the same value
// ("0.10000000000000001"); otherwise for reading ("0.1").
static void format(const flag *f, char *buf, size_t size, bool exact) {
    switch (f->kind) {
    case FLAG_INT: snprintf(buf, size, "%d", *(const int *)f->value); break;
    case FLAG_U64:
        snprintf(buf, size, "%llu", (unsigned long long)*(const uint64_t *)f->value);
        break;
    case FLAG_REAL: snprintf(buf, size, exact ? "%.17g" : "%g", *(const double *)f->value); break;
    case FLAG_STRING: snprintf(buf, size, "%s", *(const char *const *)f->value); break;
    case FLAG_SWITCH: snprintf(buf, size, "%s", *(const bool *)f->value ? "true" : "false"); break;
    case FLAG_CHOICE: snprintf(buf, size, "%s", f->choices[*(const int *)f->value]); break;
    }
}

void flags_usage(const char *usage_line, const flag *flags, int n, FILE *f) {
    fprintf(f, "%s\n", usage_line);
    for (int i = 0; i < n; i++) {
        const flag *g = &flags[i];
        char def[300] = "", v[256];
        format(g, v, sizeof v, false);
        if (g->kind == FLAG_CHOICE) {
            size_t at = (size_t)snprintf(def, sizeof def, " (");
            for (int c = 0; g->choices[c]; c++)
                at += (size_t)snprintf(def + at, sizeof def - at, "%s%s", c ? "|" : "",
                                       g->choices[c]);
            snprintf(def + at, sizeof def - at, "; default %s)", v);
        } else if (g->kind != FLAG_STRING && g->kind != FLAG_SWITCH) {
            snprintf(def, sizeof def, " (default %s)", v);
        }
        fprintf(f, "  %-16s %s%s\n", g->name, g->help, def);
    }
}

int flags_parse(const char *usage_line, flag *flags, int n, int argc, char **argv, ag_err *err) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            flags_usage(usage_line, flags, n, stdout);
            return 1;
        }
        flag *f = NULL;
        for (int k = 0; k < n && !f; k++) f = strcmp(flags[k].name, argv[i]) ? NULL : &flags[k];
        if (!f) return failed(err, "unknown option '%s' (see --help)", argv[i]), 2;
        f->given = true;
        if (f->kind == FLAG_SWITCH) {
            *(bool *)f->value = true;
            continue;
        }
        if (i + 1 >= argc) return failed(err, "%s needs a value (see --help)", argv[i]), 2;
        if (!flags_set(f, argv[++i], err)) return 2;
    }
    return 0;
}

bool flags_from_file(flag *flags, int n, const char *path, ag_err *err) {
    // Text values outlive the file: they are kept here, one run's worth.
    static char kept[8][1024];
    static int n_kept;
    ag_safetensors *st = ag_safetensors_load(path, err);
    bool ok = st != NULL;
    for (int i = 0; ok && i < n; i++) {
        if (!flags[i].saved || flags[i].given) continue;
        const char *v = ag_safetensors_meta(st, flags[i].name + 2);
        if (!v) {
            ok = failed(err, "%s: no '%s' in the metadata", path, flags[i].name + 2);
        } else if (flags[i].kind == FLAG_STRING && (n_kept == 8 || strlen(v) >= 1024)) {
            ok = failed(err, "%s: '%s' is too long", path, flags[i].name + 2);
        } else {
            if (flags[i].kind == FLAG_STRING) v = strcpy(kept[n_kept++], v);
            ag_err why;
            if (!(ok = flags_set(&flags[i], v, &why))) failed(err, "%s: %s", path, why.msg);
        }
    }
    ag_safetensors_free(st);
    return ok;
}

const char *const *flags_to_meta(flags_meta *m, const flag *flags, int n,
                                 const char *const extra[]) {
    int k = 0;
    for (int i = 0; i < n && i < FLAGS_MAX; i++) {
        if (!flags[i].saved) continue;
        format(&flags[i], m->text[i], sizeof m->text[i], true);
        m->pairs[k++] = flags[i].name + 2;
        m->pairs[k++] = m->text[i];
    }
    for (int i = 0; extra && extra[i] && k < 2 * FLAGS_MAX; i++) m->pairs[k++] = extra[i];
    m->pairs[k] = NULL;
    return m->pairs;
}
