#include "flags.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "escape.h"

// --help: the help text starts in this column, and lines end before HELP_WIDTH.
#define HELP_COLUMN 19
#define HELP_WIDTH 80

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

// What the user typed, for an error line: escaped, cut to 100 bytes ("...").
static const char *shown(const char *s, char *buf, size_t size) {
    escaped(s, 100, buf, size - 4);
    if (strlen(s) > 100) strcat(buf, "...");
    return buf;
}

// An argument without a flag ("OUT.dot"), rather than a flag ("--out").
static bool is_positional(const flag *f) { return f->name[0] != '-'; }

// "-12": an optional '-' and at least one digit, nothing else.
static bool is_decimal(const char *s) {
    if (*s == '-') s++;
    if (*s == '\0') return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

bool int_in_range(const char *s, long lo, long hi, int *out) {
    if (!is_decimal(s)) return false;
    errno = 0;
    long v = strtol(s, NULL, 10);
    if (errno || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static bool set_choice(flag *f, const char *s, ag_err *err) {
    char names[256] = "";
    for (int i = 0; f->choices[i]; i++) {
        if (!strcmp(s, f->choices[i])) {
            *(int *)f->value = i;
            return true;
        }
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", i ? "|" : "", f->choices[i]);
    }
    char typed[512];
    return failed(err, "%s needs one of %s, got '%s'", f->name, names,
                  shown(s, typed, sizeof typed));
}

// A FLAG_U64's value: decimal digits (no sign), read as an integer and compared as one.
// Read as a double first, 9007199254740993 rounded to 2^53, passed a bound of 2^53, and
// ran as 9007199254740992.
static bool u64_in_range(const char *s, double lo, double hi, uint64_t *out) {
    if (*s == '-' || !is_decimal(s)) return false;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno || v < (unsigned long long)lo || v > (unsigned long long)hi) return false;
    *out = v;
    return true;
}

// A number in [lo, hi]: an integer written in decimal for FLAG_INT and FLAG_U64 (whose
// range fits a double exactly: 2^53 at most), any number strtod reads for FLAG_REAL.
static bool set_number(flag *f, const char *s, ag_err *err) {
    const bool integer = f->kind == FLAG_INT || f->kind == FLAG_U64;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    uint64_t u = 0;
    // strtod skips leading white space; a value that starts with it is refused, as the
    // integers' is. 16 digits print 2^53, the largest integer bound, in full.
    bool ok = !errno && end != s && *end == '\0' && v >= f->lo && v <= f->hi &&
              (*s == '-' || *s == '.' || (*s >= '0' && *s <= '9'));
    if (integer) ok = ok && is_decimal(s);
    if (f->kind == FLAG_U64) ok = ok && u64_in_range(s, f->lo, f->hi, &u);
    char typed[512];
    if (!ok)
        return failed(err, "%s needs %s in [%.16g, %.16g], got '%s'", f->name,
                      integer ? "an integer" : "a number", f->lo, f->hi,
                      shown(s, typed, sizeof typed));
    if (f->kind == FLAG_INT) *(int *)f->value = (int)v;
    else if (f->kind == FLAG_U64) *(uint64_t *)f->value = u;
    else *(double *)f->value = v;
    return true;
}

bool flags_set(flag *f, const char *s, ag_err *err) {
    switch (f->kind) {
    case FLAG_STRING:
        if (!*s) return failed(err, "%s needs a value, got an empty one", f->name);
        *(const char **)f->value = s;
        return true;
    case FLAG_SWITCH: {
        char typed[512];
        if (strcmp(s, "true") && strcmp(s, "false"))
            return failed(err, "%s needs true or false, got '%s'", f->name,
                          shown(s, typed, sizeof typed));
        *(bool *)f->value = !strcmp(s, "true");
        return true;
    }
    case FLAG_CHOICE: return set_choice(f, s, err);
    default: return set_number(f, s, err);
    }
}

bool flags_given(const flag *flags, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(flags[i].name, name)) return flags[i].given;
    return false;
}

const char *flags_first_given(const flag *flags, int n, const char *const names[]) {
    for (int i = 0; names[i]; i++)
        if (flags_given(flags, n, names[i])) return names[i];
    return NULL;
}

const char *const *flags_pos_choices(const char *none_name) {
    enum { MOST = 32, LONGEST = 32 };
    static char names[MOST][LONGEST];
    static const char *choices[MOST + 1];
    int n = 0;
    choices[n++] = none_name;
    for (const char *name; n < MOST && (name = ag_pos_kind_name((ag_pos_kind)n)) != NULL; n++) {
        size_t i = 0;
        for (; name[i] && i + 1 < LONGEST; i++) names[n][i] = (char)tolower((unsigned char)name[i]);
        names[n][i] = '\0';
        choices[n] = names[n];
    }
    choices[n] = NULL;
    return choices;
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
    case FLAG_STRING: {
        const char *s = *(const char *const *)f->value;
        snprintf(buf, size, "%s", s ? s : "");
        break;
    }
    case FLAG_SWITCH: snprintf(buf, size, "%s", *(const bool *)f->value ? "true" : "false"); break;
    case FLAG_CHOICE: snprintf(buf, size, "%s", f->choices[*(const int *)f->value]); break;
    }
}

void flags_format(const flag *f, char *buf, size_t size) { format(f, buf, size, true); }

// Prints `text` from column HELP_COLUMN, wrapped at spaces before HELP_WIDTH.
static void print_wrapped(const char *text, FILE *f) {
    const int width = HELP_WIDTH - HELP_COLUMN;
    while ((int)strlen(text) > width) {
        int cut = width;
        while (cut > 0 && text[cut] != ' ') cut--;
        if (cut == 0) break;  // one word longer than the line: printed whole
        fprintf(f, "%.*s\n%*s", cut, text, HELP_COLUMN, "");
        text += cut + 1;
    }
    fprintf(f, "%s\n", text);
}

void flags_usage(const char *usage_line, const flag *flags, int n, FILE *f) {
    fprintf(f, "%s\n", usage_line);
    for (int i = 0; i < n; i++) {
        const flag *g = &flags[i];
        char text[1024], value[256];
        format(g, value, sizeof value, false);
        int at = snprintf(text, sizeof text, "%s", g->help);
        if (g->kind == FLAG_CHOICE) {
            at += snprintf(text + at, sizeof text - (size_t)at, " (");
            for (int c = 0; g->choices[c]; c++)
                at += snprintf(text + at, sizeof text - (size_t)at, "%s%s", c ? "|" : "",
                               g->choices[c]);
            snprintf(text + at, sizeof text - (size_t)at, "; default %s)", value);
        } else if (g->kind == FLAG_STRING && *(const char *const *)g->value) {
            // A text's default too, from the variable: dates --help did not say where its
            // --save and --svg go, and the defaults other programs wrote into their help
            // lines were a second copy. Escaped: tiny_lm's --prompt is a newline.
            char shown_value[256];
            snprintf(text + at, sizeof text - (size_t)at, " (default %s)",
                     escaped(value, 100, shown_value, sizeof shown_value));
        } else if (g->kind != FLAG_STRING && g->kind != FLAG_SWITCH) {
            snprintf(text + at, sizeof text - (size_t)at, " (default %s)", value);
        }
        fprintf(f, "  %-*s ", HELP_COLUMN - 3, g->name);
        print_wrapped(text, f);
    }
}

// The flag argv[i] names, NULL if none.
static flag *find(flag *flags, int n, const char *arg) {
    for (int k = 0; k < n; k++)
        if (!is_positional(&flags[k]) && !strcmp(flags[k].name, arg)) return &flags[k];
    return NULL;
}

// The next argument without a flag that has not been given yet, NULL if none.
static flag *next_positional(flag *flags, int n) {
    for (int k = 0; k < n; k++)
        if (is_positional(&flags[k]) && !flags[k].given) return &flags[k];
    return NULL;
}

flags_result flags_parse(const char *usage_line, flag *flags, int n, int argc, char **argv,
                         ag_err *err) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            flags_usage(usage_line, flags, n, stdout);
            return FLAGS_HELP;
        }
        bool looks_like_flag = arg[0] == '-';
        flag *f = looks_like_flag ? find(flags, n, arg) : next_positional(flags, n);
        char typed[512];
        if (!f && looks_like_flag) {
            failed(err, "unknown option '%s' (see --help)", shown(arg, typed, sizeof typed));
            return FLAGS_BAD;
        }
        if (!f) {
            failed(err, "unexpected argument '%s' (see --help)", shown(arg, typed, sizeof typed));
            return FLAGS_BAD;
        }
        f->given = true;
        if (f->kind == FLAG_SWITCH) {
            *(bool *)f->value = true;
            continue;
        }
        const char *text = arg;  // an argument without a flag is its own value
        if (looks_like_flag) {
            if (i + 1 >= argc) {
                failed(err, "%s needs a value (see --help)", arg);
                return FLAGS_BAD;
            }
            // A value that is itself an option is a value left out: copy_task --out --cross
            // made a directory named "--cross" and trained without cross-attention.
            const char *next = argv[i + 1];
            if (find(flags, n, next) || !strcmp(next, "--help") || !strcmp(next, "-h")) {
                failed(err, "%s needs a value, got the option '%s' (see --help)", arg, next);
                return FLAGS_BAD;
            }
            text = argv[++i];
        }
        if (!flags_set(f, text, err)) return FLAGS_BAD;
    }
    return FLAGS_RUN;
}

// The metadata key of a saved flag: its name without "--".
static const char *meta_key(const flag *f) { return f->name + 2; }

// What `file` recorded for saved flag f, or NULL. A switch it does not name is off: the
// checkpoint was saved before that switch was recorded (--bf16 was not, once).
static const char *saved_value(const flag *f, const ag_safetensors *file) {
    const char *v = ag_safetensors_meta(file, meta_key(f));
    return v || f->kind != FLAG_SWITCH ? v : "false";
}

bool flags_from_file(flag *flags, int n, const ag_safetensors *file, const char *path,
                     ag_err *err) {
    // Text values outlive the file: they are kept here, one run's worth.
    enum { KEPT = 8, KEPT_LEN = FLAGS_VALUE_MAX };
    static char kept[KEPT][KEPT_LEN];
    static int n_kept;
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        if (!flags[i].saved || flags[i].given) continue;
        const char *v = saved_value(&flags[i], file);
        ag_err why;
        if (!v) {
            // Another program's checkpoint lacks the first of them.
            ok = failed(err, "%s: no '%s' in the metadata, which this program's checkpoints "
                        "record (saved by another program?)", path, meta_key(&flags[i]));
        } else if (flags[i].kind == FLAG_STRING && (n_kept == KEPT || strlen(v) >= KEPT_LEN)) {
            ok = failed(err, "%s: '%s' is too long", path, meta_key(&flags[i]));
        } else {
            if (flags[i].kind == FLAG_STRING) v = strcpy(kept[n_kept++], v);
            ok = flags_set(&flags[i], v, &why);
            if (!ok) failed(err, "%s: %s", path, why.msg);
        }
    }
    return ok;
}

bool flags_check_file(const flag *flags, int n, const ag_safetensors *file, const char *path,
                      ag_err *err) {
    for (int i = 0; i < n; i++) {
        if (!flags[i].saved) continue;
        char here[FLAGS_VALUE_MAX];
        flags_format(&flags[i], here, sizeof here);
        const char *there = saved_value(&flags[i], file);
        if (!there)
            return failed(err, "%.300s: saved by a run with other settings: no %s there",
                          path, flags[i].name);
        if (strcmp(there, here) != 0)
            return failed(err, "%.300s: saved by a run with other settings: %s %.100s there, "
                          "%.100s here", path, flags[i].name, there, here);
    }
    return true;
}

const char *const *flags_to_meta(flags_meta *m, const flag *flags, int n,
                                 const char *const extra[]) {
    int k = 0;
    for (int i = 0; i < n && i < FLAGS_MAX; i++) {
        if (!flags[i].saved) continue;
        flags_format(&flags[i], m->text[i], sizeof m->text[i]);
        m->pairs[k++] = meta_key(&flags[i]);
        m->pairs[k++] = m->text[i];
    }
    for (int i = 0; extra && extra[i] && k < 2 * FLAGS_MAX; i++) m->pairs[k++] = extra[i];
    m->pairs[k] = NULL;
    return m->pairs;
}
