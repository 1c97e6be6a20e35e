// attograd's own thread pool (see ag_threads_set for the policy).
#ifndef ATTOGRAD_PARALLEL_H
#define ATTOGRAD_PARALLEL_H

#include <stdbool.h>
#include <stddef.h>

// Work below this many flop-equivalents runs on the calling thread: waking a
// sleeping worker costs tens of microseconds, more than small jobs take.
#define AGI_PARALLEL_MIN_WORK 200000.0

// Slices of a job per thread: the finest split of a job's items the pool makes.
#define AGI_SLICES_PER_THREAD 4

// Calls fn(begin, end, ctx) on contiguous, deterministic slices of [0, n): with P threads,
// slice s of S = P * AGI_SLICES_PER_THREAD is [n s / S, n (s + 1) / S) (empty slices are
// skipped). Thread k runs the slices of [n k / P, n (k + 1) / P) first, then helps with the
// others' (parallel.c). `work` is the estimated cost of the whole loop; small loops, and
// loops started from inside a worker, run inline as fn(0, n, ctx). A result must depend on
// the slices only, never on which thread ran one.
void agi_parallel_for(size_t n, double work, void (*fn)(size_t begin, size_t end, void *ctx),
                      void *ctx);

// A job over tiles (blocks, chunks) of `size` of an int extent n >= 1: how many, and
// where tiles [.., end) end (n for the last one). Neither computes n + size - 1 or
// end * size past n, which pass INT_MAX for an n within a tile of it.
static inline int agi_tiles(int n, int size) { return (n - 1) / size + 1; }
static inline int agi_tile_end(int end, int size, int n) {
    return end <= (n - 1) / size ? end * size : n;
}

// Marks the calling thread as inside a data-parallel step (on, then off; nests) for
// ag_threads_set, which refuses to run there. A step of one slice calls its loss function
// here, not as a job of the pool, and its ops still split over the threads; yet the count
// it runs on must stay, as for a step of several slices, whose loss function runs in a job.
void agi_threads_pin(bool on);

// Makes the calling thread compute as if the thread count were n (0: as it is set): ag_threads
// and agi_parallel_threads give n, and agi_parallel_for cuts a job into the slices n threads
// would run, all of them run here, one after another. The same slices give the same bits,
// so ag_op_check compares 1 with 2 threads this way, without setting the process's count
// under other threads that use it.
void agi_threads_as_if(int n);

// How many threads agi_parallel_for would run a job of this work on, called here and now:
// 1 for small work, in a job's slice, or with one thread set; else the thread count. A
// kernel that lays out shared data for its slices (a product packing an operand once for
// all of them) asks this first.
int agi_parallel_threads(double work);

// Scratch memory of the calling thread, AGI_THREAD_SCRATCH_BYTES long and 64-byte
// aligned, where the kernels pack a product's operands (src/kernels/scratch.h). A pool
// worker's is allocated when the pool starts it, by the thread that starts the pool; any
// other thread's at its first call (freed when it exits). So which thread runs which
// slice of a job never decides whether a step allocates: a repeated step allocates
// nothing however the slices fall.
#define AGI_THREAD_SCRATCH_BYTES ((size_t)21 << 17)
void *agi_thread_scratch(void);

// At least `bytes` of the calling thread's own memory, kept and grown to the largest size
// asked (a kernel asks the same sizes every step: a repeated step allocates nothing), its
// contents kept until the next call; freed when the thread exits.
void *agi_thread_buffer(size_t bytes);

// memset(p, 0, bytes), split over the threads when it is large (the gradients a backward
// zeroes are a good part of a small model's step).
void agi_zero(void *p, size_t bytes);

#endif
