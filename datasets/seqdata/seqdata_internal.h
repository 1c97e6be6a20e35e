// Internal declarations shared by the files of datasets/seqdata: the three tasks
// (task.c: alphabet, layout, generator and checker of one sequence, which is
// all the rest needs to know about a task) and the error messages of the
// file functions (seqdata_error.c).
#ifndef SEQDATA_INTERNAL_H
#define SEQDATA_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

#include <stdlib.h>

#include "attograd.h"
#include "seqdata.h"

// ---- Tasks -----------------------------------------------------------------------------
// Token ids common to all tasks: digits are 0-9, the separator is 10.
enum { SEQ_SEP_TOKEN = 10, SEQ_FIRST_KEY_TOKEN = 11 };

// Valid task enum value?
bool seq_task_valid(ag_task t);
const char *seq_task_alphabet(ag_task t);
int seq_task_max_length(ag_task t);

// Fills the layout fields of d (task, length, seq_len, vocab, ...) for a
// valid task and length; leaves count, seeds and tokens alone.
void seq_task_layout(ag_seqdata *d, ag_task t, int length);

// Writes one sequence of d's task and size, drawn from rng, into s[0 .. seq_len).
void seq_task_generate(const ag_seqdata *d, ag_pcg32 *rng, int32_t *s);

// 0 if s (seq_len tokens) is a valid sequence of d's task and size; otherwise
// nonzero, with `problem` describing the first violation in the file's terms
// ("column 17: expected the separator '|', found '3'"; columns count from 1).
int seq_task_check(const ag_seqdata *d, const int32_t *s, char *problem, size_t size);

// A few lines (separated by '\n') saying what a sequence of d's task and
// size is and what is scored: the comment at the top of a saved file.
void seq_task_describe(const ag_seqdata *d, char *buf, size_t size);

// ---- Files ----------------------------------------------------------------------------
// The first line of every dataset file.
#define SEQ_MAGIC "# attograd sequence dataset v1"

// Fills *err (if not NULL) with "<path>:<line>: <problem>", or with
// "<path>: <problem>" when line <= 0; returns -1.
int seq_fail(ag_err *err, const char *path, long line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
int seq_vfail(ag_err *err, const char *path, long line, const char *fmt, va_list ap);

// Never NULL: out of memory ends the program with one line.
void *seq_malloc(size_t bytes);
void *seq_calloc(size_t bytes);  // zero-filled

// ---- Messages --------------------------------------------------------------------------
// A readable, quoted form of byte c for messages: 'x' if printable, else
// byte 0x0d. Returns buf.
const char *seq_describe_char(int c, char buf[16]);

#endif
