// attograd/dist.h — data-parallel training over several processes or
// machines, on MPI.
//
// Every process (rank) holds the whole model and trains on its slice of each
// global batch; after backward, the gradients are combined so that every rank
// takes the very same optimizer step, the one a single process would take on
// the whole batch:
//
//     ag_dist_init(&argc, &argv);
//     ... build the model and the optimizer the same way on every rank ...
//     ag_dist_broadcast_params(ps);                 // every rank starts from rank 0's values
//     for each step:
//         ag_dist_slice s = ag_dist_batch_slice(B, ag_dist_rank(), ag_dist_size());
//         ... forward and backward on sequences [s.first, s.first + s.count) of the batch ...
//         ag_dist_allreduce_grads(ps, s.weight);    // the whole batch's gradient, everywhere
//         ag_optim_step(opt);
//     ag_dist_finalize();
//
// These functions live in their own library, attograd_dist (CMake target
// attograd::attograd_dist, built when AG_MPI is on), which links MPI; the
// attograd library itself never does. This header includes no MPI header.
//
// Determinism: every reduction here adds in an order fixed by the number of
// processes (never the order in which messages happen to arrive), so the
// same run gives the same bits every time.
//
// Failures: MPI's own errors end the whole job (MPI_ERRORS_ARE_FATAL).
// ag_dist_init installs an attograd error handler that prints the
// programming error with the rank that hit it and ends the whole job
// (MPI_Abort), so that one rank's error never leaves the others waiting
// forever; a failure on user data (a file that does not load, a NaN loss)
// should end the job the same way, through ag_dist_abort. A handler of your own that
// returns after a dist_* error leaves the ranks' messages out of step (a message of the
// failed call may still wait in a queue, and be taken by a later call): end the job.
#ifndef ATTOGRAD_DIST_H
#define ATTOGRAD_DIST_H

#include "attograd/params.h"

#ifdef __cplusplus
extern "C" {
#endif

// Starts MPI (if nobody has yet) and installs the error handler described
// above. Call it before anything else in main, on every rank. Returns 0 (at once when
// it has already started), or -1 if MPI could not start (with a message on stderr), as
// after ag_dist_finalize: MPI starts once in a process.
int ag_dist_init(int *argc, char ***argv);
// Ends MPI if ag_dist_init started it. Every rank must call it. A rank that calls it while
// another still waits in ag_dist_allreduce_grads, ag_dist_sum or ag_dist_broadcast_params
// (the ranks ran different numbers of steps) ends the job, with a line from the waiting
// rank, instead of leaving both waiting.
void ag_dist_finalize(void);

// This process's rank (0 to size - 1) and the number of processes; 0 and 1
// before ag_dist_init.
int ag_dist_rank(void);
int ag_dist_size(void);

// Prints "<prog>: rank R of N: <message>" on stderr and ends every process
// of the job with exit status 1 (MPI_Abort). Never returns. Before ag_dist_init or after
// ag_dist_finalize it prints "<prog>: <message>" (<prog> is "attograd" until
// ag_dist_init has seen argv) and exits with status 1 (MPI_Abort
// only while MPI runs: outside its life MPI forbids it), which mpirun takes for the
// job's end.
void ag_dist_abort(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;

// Copies rank 0's parameter values into every rank's store. Collective: all
// ranks call it, with stores of the same dtype and layout (checked, down to each
// parameter's shape and name: a mismatch is a programming error naming both ranks').
// Rank 0 sends its values to each rank in turn. A rank that is in ag_dist_sum or
// ag_dist_allreduce_grads, or has ended, where another broadcasts is reported, never
// waited for.
void ag_dist_broadcast_params(ag_params *ps);

// Replaces every rank's gradient buffer by the sum over ranks r of
// weight_r * grad_r, where weight_r is the `weight` rank r passed: its share
// of the global batch's loss. With a loss that is a mean over the batch,
// weight = (what this rank's loss averages over) / (what the whole batch's
// loss averages over), e.g. s.weight from ag_dist_batch_slice when every
// sequence counts the same; 1.0 / ag_dist_size() gives the plain average.
// Two ranks exchange their buffers, and more gather them while each receives at most
// 1 MiB, adding in rank order; larger buffers go round a ring (each rank sends and
// receives 2 (N-1)/N times its bytes). The sum of each element is formed in a fixed
// order. Collective, and allocates nothing after its first call. Every rank's store must
// have the same length and dtype: gradients of another are a programming error, reported
// by a rank that receives them (never added as their bytes come).
void ag_dist_allreduce_grads(ag_params *ps, double weight);

// values[0..n) <- their sum over all ranks, added in rank order (so every
// rank gets the same bits). For losses, counts and accuracies of a step.
// Collective; n (>= 0) must be the same on every rank, and every rank calls it, n = 0
// included (it sends its count). A negative n is refused. A rank that sums another n, is
// in ag_dist_allreduce_grads or ag_dist_broadcast_params, or has ended is reported, never
// waited for.
void ag_dist_sum(double *values, int n);

// A rank's part of a global batch of `global_batch` items: items
// [first, first + count), as even as possible (the first global_batch % size
// ranks get one more), and weight = count / global_batch. A batch smaller
// than the number of ranks would leave a rank without data: that is a
// programming error (reported; count is then 0).
typedef struct ag_dist_slice {
    int first, count;
    double weight;
} ag_dist_slice;

ag_dist_slice ag_dist_batch_slice(int global_batch, int rank, int size);

#ifdef __cplusplus
}
#endif
#endif
