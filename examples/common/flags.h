// Command-line flags from a table: each flag names its variable, its kind, its
// range and its help line, so a program declares its options once and gets
// parsing, range checks, one-line errors and --help from the same table; and the
// flags a run records in its checkpoint, read back (or checked) when it is resumed.
//
// A program's table, one row a flag:
//     flag flags[] = {
//         FLAG("--lr", REAL, &o->lr, 0, 10, true, "peak learning rate"),
//         FLAG("--threads", INT, &o->threads, 1, 256, false, "threads", .per_rank = true),
//         FLAG("OUT.dot", STRING, &o->out, 0, 0, false, "the file to write"),
//     };
// A row whose name does not start with '-' is an argument without a flag (the first
// such row takes the first such argument, and so on).
#ifndef EXAMPLES_FLAGS_H
#define EXAMPLES_FLAGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <attograd.h>

typedef enum { FLAG_INT, FLAG_U64, FLAG_REAL, FLAG_STRING, FLAG_SWITCH, FLAG_CHOICE } flag_kind;

typedef struct {
    const char *name;  // "--lr"; or "OUT.dot", an argument without a flag
    flag_kind kind;
    void *value;       // int *, uint64_t *, double *, const char **, bool *, int * (the
                       // index of the choice)
    double lo, hi;     // accepted range (FLAG_INT, FLAG_U64, FLAG_REAL)
    const char *help;
    bool saved;        // recorded in checkpoints (flags_to_meta), read back
                       // (flags_from_file) or checked (flags_check_file)
    // Under mpirun, the processes may differ in it: it is each one's own (--threads),
    // or a path whose contents are compared instead (--data, --resume: then only
    // whether it is given must agree). See dist_agree.h.
    bool per_rank;
    const char *const *choices;  // FLAG_CHOICE: the names, NULL-terminated
    bool given;        // set by flags_parse when the flag is on the command line
} flag;

// A row of a table: FLAG("--lr", REAL, &lr, 0, 10, saved, "help"); a FLAG_CHOICE row
// names its choices with .choices = ... after the help, and a per-rank flag says
// .per_rank = true there (designated, so that the fields a row leaves out are zero).
#define FLAG(name_, kind_, value_, lo_, hi_, saved_, ...)                                     \
    {.name = name_, .kind = FLAG_##kind_, .value = value_, .lo = lo_, .hi = hi_,              \
     .saved = saved_, .help = __VA_ARGS__}

// The most rows a table may have.
#define FLAGS_MAX 64
// The room for a flag's value in a checkpoint's metadata, its NUL included: a path as
// realpath gives it (PATH_MAX). At 1024, a --data path of 1024 bytes or more was saved
// cut, and --resume looked for a file that is not there.
#define FLAGS_VALUE_MAX 4096

typedef enum {
    FLAGS_RUN,   // the flags are good: run
    FLAGS_HELP,  // --help was printed on stdout: exit 0
    FLAGS_BAD,   // one line in err ("--lr needs a number in [0, 10], got 'x'",
                 // "unknown option '--bogus' (see --help)"): exit 2
} flags_result;

// Parses argv against the table.
flags_result flags_parse(const char *usage_line, flag *flags, int n, int argc, char **argv,
                         ag_err *err);
void flags_usage(const char *usage_line, const flag *flags, int n, FILE *f);
// Sets a flag from text, with the checks of the command line; false with one line
// in err naming the flag.
bool flags_set(flag *f, const char *text, ag_err *err);
// Whether the flag `name` was on the command line (false for a name not in the table).
bool flags_given(const flag *flags, int n, const char *name);
// The first of `names` (NULL-terminated) that was on the command line, or NULL.
const char *flags_first_given(const flag *flags, int n, const char *const names[]);

// Decimal digits with an optional '-', all of s, in [lo, hi] (into *out): no spaces,
// no '+', no "0x", no trailing text, nothing strtol would quietly clamp. What an
// integer flag takes, and what a program reads integers of its own metadata with.
bool int_in_range(const char *s, long lo, long hi, int *out);

// The choices of a --pos row, in the order of ag_pos_kind (a choice's index is its kind):
// `none_name` for AG_POS_NONE (what the program does with no scheme in the attention),
// then every other kind the library names (ag_pos_kind_name), lower case. The library's
// table is the one list of them: a list of the programs' own had lost a scheme added
// there. NULL-terminated, in static storage, one list a program.
const char *const *flags_pos_choices(const char *none_name);

// The flag's value as text that flags_set reads back to the same value
// ("0.10000000000000001" for 0.1); a string flag that is not set gives "".
void flags_format(const flag *f, char *buf, size_t size);

// Every saved flag not given on the command line takes its value from the metadata
// of `file`, a checkpoint loaded from `path` (key: the name without "--"). False with
// one line in err for a missing key or a bad value.
bool flags_from_file(flag *flags, int n, const ag_safetensors *file, const char *path,
                     ag_err *err);
// Whether every saved flag has the value the metadata of `file` (loaded from `path`)
// records for it; false with one line in err naming the first that differs ("ck:
// saved by a run with other settings: --seed 1 there, 9 here").
bool flags_check_file(const flag *flags, int n, const ag_safetensors *file, const char *path,
                      ag_err *err);

// The saved flags as key, value pairs for ag_checkpoint_save, then the pairs of
// `extra` (NULL-terminated, or NULL), then NULL; the text lives in *m.
typedef struct {
    char text[FLAGS_MAX][FLAGS_VALUE_MAX];
    const char *pairs[2 * FLAGS_MAX + 1];
} flags_meta;
const char *const *flags_to_meta(flags_meta *m, const flag *flags, int n,
                                 const char *const extra[]);

#endif
