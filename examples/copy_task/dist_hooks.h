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

#include <attograd.h>

// After the options are parsed. From then on, leaving main other than
// through dist_finish (an error return) ends every rank of the job.
void dist_start(int *argc, char ***argv);
void dist_finish(void);
int dist_rank(void);
int dist_size(void);

// This rank's items of `total`: [*first, *first + *count).
void dist_slice(int total, int *first, int *count);

// After backward, before the optimizer step: every rank's gradient becomes
// the whole global batch's, and *loss, *scored, *correct the batch's (the
// loss a mean over all scored positions). A NaN loss ends the job.
void dist_combine_step(ag_params *ps, double *loss, long *scored, long *correct);

// v[0..n) <- their sums over ranks (counts of an evaluation).
void dist_sum_counts(long *v, int n);

// With several ranks, prints the time spent combining gradients, per step
// and as a share of `train_seconds`.
void dist_report(int steps, double train_seconds);

#endif
