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
// Errors: from dist_start on, report every error through dist_fail, which under
// mpirun ends the whole job at once with one line naming the rank, never waiting in
// a collective for a rank that has stopped. An error every rank meets alike (a bad
// flag, a missing file) is reported once, by rank 0. A return from main between
// dist_start and dist_finish ends the job as well (an atexit handler).
#ifndef EXAMPLES_DIST_H
#define EXAMPLES_DIST_H

#include <attograd.h>

// First thing in main, before the flags are read (they may fail).
void dist_start(const char *prog, int *argc, char ***argv);
// On the way out of a run that went well, on every rank.
void dist_finish(void);
int dist_rank(void);
int dist_size(void);

// One line "prog: <message>" on stderr, and returns status; under mpirun,
// "prog: rank R of N: <message>", and the whole job ends (never returns).
int dist_fail(int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// This rank's items of `total`: [*first, *first + *count), as even as possible.
void dist_slice(int total, int *first, int *count);

// After backward, before the optimizer step: *loss, a mean over `count` items on this
// rank, becomes the mean over every rank's items, and the gradient of every rank
// becomes that mean's gradient, clipped to the global norm `clip` (0: not clipped).
// Returns the norm before clipping; NAN, without combining, when *loss is not
// finite (under mpirun the caller then ends the job: see dist_fail).
double dist_combine(ag_params *ps, double *loss, double count, double clip);

// v[0 .. n) <- their sums over the ranks (in rank order: the same bits everywhere).
void dist_sum(double *v, int n);

// With several ranks, prints the time spent combining gradients per step and as a
// share of `train_seconds`.
void dist_report(int steps, double train_seconds);

#endif
