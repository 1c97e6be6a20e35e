// Command-line flags from a table: each flag names its variable, its kind, its
// range and its help line, so a program declares its options once and gets
// parsing, range checks, one-line errors and --help from the same table; and the
// flags a run records in its checkpoint, read back when it is resumed.
#ifndef EXAMPLES_FLAGS_H
#define EXAMPLES_FLAGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <attograd.h>

typedef enum { FLAG_INT, FLAG_U64, FLAG_REAL, FLAG_STRING, FLAG_SWITCH, FLAG_CHOICE } flag_kind;

typedef struct {
    const char *name;  // "--lr"
    flag_kind kind;
    void *value;       // int *, uint64_t *, double *, const char **, bool *, int * (the
                       // index of the choice)
    double lo, hi;     // accepted range (FLAG_INT, FLAG_U64, FLAG_REAL)
    const char *help;
    bool saved;        // recorded in checkpoints (flags_meta), read back (flags_from_file)
    const char *const *choices;  // FLAG_CHOICE: the names, NULL-terminated
    bool given;        // set by flags_parse when the flag is on the command line
} flag;

// A row of a table: FLAG("--lr", REAL, &lr, 0, 10, saved, "help"); a FLAG_CHOICE row
// names its choices with .choices = ... after it (designated, as here, so that the
// fields a row leaves out are zero without a warning).
#define FLAG(name_, kind_, value_, lo_, hi_, saved_, ...)                                     \
    {.name = name_, .kind = FLAG_##kind_, .value = value_, .lo = lo_, .hi = hi_,              \
     .saved = saved_, .help = __VA_ARGS__}

// Parses argv against the table. Returns 0 to run, 1 after printing --help on
// stdout, 2 with one line in err ("--lr needs a number in [0, 10], got 'x'",
// "unknown option '--bogus' (see --help)").
int flags_parse(const char *usage_line, flag *flags, int n, int argc, char **argv, ag_err *err);
void flags_usage(const char *usage_line, const flag *flags, int n, FILE *f);
// Sets a flag from text, with the checks of the command line; false with one line
// in err naming the flag.
bool flags_set(flag *f, const char *text, ag_err *err);

// Every saved flag not given on the command line takes its value from the metadata
// of the safetensors file `path` (key: the name without "--"). False with one line in
// err for a file that does not load, a missing key or a bad value.
bool flags_from_file(flag *flags, int n, const char *path, ag_err *err);

// The saved flags as key, value pairs for ag_checkpoint_save, then the pairs of
// `extra` (NULL-terminated, or NULL), then NULL; the text lives in *m.
#define FLAGS_MAX 64
typedef struct {
    char text[FLAGS_MAX][1024];
    const char *pairs[2 * FLAGS_MAX + 1];
} flags_meta;
const char *const *flags_to_meta(flags_meta *m, const flag *flags, int n,
                                 const char *const extra[]);

#endif
