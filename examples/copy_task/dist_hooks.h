// The copy task on several processes (mpirun -np N ./copy_task ...), through
// attograd/dist.h when the example is built with MPI; one process otherwise,
// where every function here does nothing (or the obvious).
//
// Each rank trains on its slice of every global batch (--batch is the global
// batch), the gradients are combined before the optimizer step, and
// evaluation is split over the ranks and summed: the run follows the curve of
// one process with the whole batch. Only rank 0 prints (the other ranks'
// stdout goes to /dev/null) and writes files; every rank reads them.
#ifndef COPY_TASK_DIST_HOOKS_H
#define COPY_TASK_DIST_HOOKS_H

#include <stdbool.h>
#include <stdint.h>

#include <attograd.h>

// First thing in main, before the options are parsed: from then on, every
// error goes through dist_failed, and the job ends through dist_finish.
// Leaving main any other way ends every rank of the job (MPI_Abort), so that
// a forgotten path cannot leave the others waiting.
void dist_start(int *argc, char ***argv);
void dist_finish(void);
int dist_rank(void);
int dist_size(void);

// Every rank calls it at the same point of the run, `failed` saying whether
// this rank hit an error there and `msg` what it was. Returns true on every
// rank if any rank failed: all of them then leave through dist_finish
// together (no rank is left waiting in a collective). The error is printed
// once: "copy_task: MSG" on one process; "copy_task: all N ranks: MSG" when
// every rank failed with the same message; otherwise each rank that failed
// prints "copy_task: rank R of N: MSG". An error only some ranks can hit (a
// save, which rank 0 does alone) is checked with every rank calling this.
bool dist_failed(bool failed, const char *msg);

// True on the ranks whose `value` differs from rank 0's (never on one
// process): files every rank loads must hold the same thing.
bool dist_differs_from_rank0(uint32_t value);

// This rank's items of `total`: [*first, *first + *count).
void dist_slice(int total, int *first, int *count);

// After backward, before the optimizer step: every rank's gradient becomes
// the whole global batch's, and *loss, *scored, *correct the batch's (the
// loss a mean over all scored positions). A rank's non-finite loss makes the
// batch's non-finite on every rank; *mine says whether this rank's own loss
// was (or, when no rank's own loss was but their sum is not finite, true on
// every rank): the ranks that report the failure.
void dist_combine_step(ag_params *ps, double *loss, long *scored, long *correct, bool *mine);

// v[0..n) <- their sums over ranks (counts of an evaluation).
void dist_sum_counts(long *v, int n);

// With several ranks, prints the time spent combining gradients, per step
// and as a share of `train_seconds`.
void dist_report(int steps, double train_seconds);

#endif
