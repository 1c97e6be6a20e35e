// Data-parallel training for the examples: `mpirun -np N ./build/examples/<prog> ...`
// through attograd/dist.h when the examples are built with MPI (AG_MPI); one process
// otherwise, where every function here does nothing (or the obvious), and a program
// started as N copies by mpirun refuses to run rather than train N times alone.
//
// Each rank holds the whole model and trains on its slice of every global batch;
// the gradients are combined before the optimizer step, weighted by what each rank's
// loss averages over, so the run takes the steps one process would take on the whole
// batch. Only rank 0 prints (the others' stdout goes to /dev/null) and writes files;
// every rank reads them.
//
// Errors: every rank meets each check of a run at the same point (dist_check), so
// that a rank that fails never leaves another waiting for it: when any rank fails a
// check, every rank ends there, with one line from each rank that failed, or one line
// for all of them when every rank failed alike. A return from main between dist_start
// and dist_finish ends the whole job as well (MPI_Abort, from an atexit handler).
#ifndef EXAMPLES_DIST_H
#define EXAMPLES_DIST_H

#include <stdint.h>

#include <attograd.h>

// First thing in main, before the flags are read (they may fail).
void dist_start(const char *prog, int *argc, char ***argv);
// On the way out of a run that went well, on every rank.
void dist_finish(void);
int dist_rank(void);
int dist_size(void);

// Every rank calls it at the same point of the run, `failed` saying whether this rank
// met an error there (described by fmt, ...). Returns when no rank failed. Otherwise
// prints, on stderr, "prog: <message>" in one process; under mpirun "prog: all N
// ranks: <message>" when every rank failed with the same message, else "prog: rank R
// of N: <message>" from each rank that failed; and every rank exits with `status`.
// An error only one rank can meet (a save, which rank 0 does alone) is checked the
// same way, with the other ranks passing false.
void dist_check(bool failed, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

// dist_check, failing the ranks whose `value` differs from rank 0's: what must be the
// same on every rank, as a hash (dist_agree.h). Never fails in one process.
void dist_check_same(uint64_t value, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

// This rank's items of `total`: [*first, *first + *count), as even as possible.
void dist_slice(int total, int *first, int *count);

// The most `sums` dist_combine adds up beside the loss.
#define DIST_MAX_SUMS 8

// After backward, before the optimizer step: *loss, a mean over `weight` items on this
// rank (its sequences, or its scored targets), becomes the mean over every rank's
// items, and this rank's gradient becomes that mean's gradient; sums[0 .. n) (counts
// of the step, such as correct predictions) become their sums over the ranks. Returns
// whether this rank is one to report a non-finite loss: its own loss was not finite,
// or (on every rank) no rank's was but their mean is not.
bool dist_combine(ag_params *ps, double *loss, double weight, double *sums, int n);

// v[0 .. n) <- their sums over the ranks (in rank order: the same bits everywhere).
void dist_sum(double *v, int n);

// With several ranks, prints the time spent combining gradients per step and as a
// share of `train_seconds`.
void dist_report(int steps, double train_seconds);

#endif
