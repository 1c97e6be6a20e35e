// Command-line flags from a table: each flag names its variable, its kind, its
// range and its help line, so a program declares its options once and gets
// parsing, range checks, one-line errors and --help from the same table.
#ifndef EXAMPLES_FLAGS_H
#define EXAMPLES_FLAGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { FLAG_INT, FLAG_U64, FLAG_REAL, FLAG_STRING, FLAG_SWITCH } flag_kind;

typedef struct {
    const char *name;  // "--lr"
    flag_kind kind;
    void *value;       // int *, uint64_t *, double *, const char **, bool *
    double lo, hi;     // accepted range (FLAG_INT, FLAG_U64, FLAG_REAL)
    const char *help;
    bool given;        // set by flags_parse when the flag is on the command line
} flag;

// Parses argv against the table. Returns 0 to run, 1 after printing --help,
// 2 after printing a one-line error ("prog: --lr needs a number in [0, 10],
// got 'x'", "prog: unknown option '--bogus'").
int flags_parse(const char *prog, const char *usage_line, flag *flags, int n, int argc,
                char **argv);
void flags_usage(const char *usage_line, const flag *flags, int n, FILE *f);
// The entry for `name`, or NULL.
flag *flags_find(flag *flags, int n, const char *name);
// A flag's value as text that flags_set reads back exactly ("0.001", "64",
// "true"); for saving a run's settings (in checkpoint metadata, say).
void flags_format(const flag *f, char *buf, size_t size);
// Sets a flag from text, with the checks of the command line; false after a
// one-line error naming `prog` and the flag.
bool flags_set(const char *prog, flag *f, const char *text);

#endif
