#define _POSIX_C_SOURCE 200809L  // clock_gettime
#include "dist_hooks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef COPY_TASK_MPI
#include <attograd/dist.h>

static int started, finished;
static double combine_seconds;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// main returns 1 on an error, after printing it; the other ranks would wait
// for this one forever.
static void end_job_on_early_exit(void) {
    if (started && !finished) ag_dist_abort("the error above ends all %d processes", ag_dist_size());
}

// Started by mpirun (Open MPI, or a PMI launcher as MPICH's): starting MPI in
// a plain run would only cost time (close to a second here).
static int under_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

void dist_start(int *argc, char ***argv) {
    if (!under_mpirun()) return;
    if (ag_dist_init(argc, argv) != 0) exit(1);
    started = 1;
    atexit(end_job_on_early_exit);
    if (ag_dist_rank() != 0 && !freopen("/dev/null", "w", stdout))
        ag_dist_abort("cannot silence stdout");
    if (ag_dist_size() > 1)
        printf("data-parallel on %d processes (MPI): each trains on its slice of the batch\n",
               ag_dist_size());
}

void dist_finish(void) {
    finished = 1;
    if (started) ag_dist_finalize();
}

int dist_rank(void) { return ag_dist_rank(); }
int dist_size(void) { return ag_dist_size(); }

void dist_slice(int total, int *first, int *count) {
    ag_dist_slice s = ag_dist_batch_slice(total, ag_dist_rank(), ag_dist_size());
    *first = s.first, *count = s.count;
}

void dist_combine_step(ag_params *ps, double *loss, long *scored, long *correct) {
    if (ag_dist_size() == 1) return;
    if (isnan(*loss)) ag_dist_abort("the training loss is NaN");
    double t0 = now();
    double sums[3] = {*loss * (double)*scored, (double)*scored, (double)*correct};
    ag_dist_sum(sums, 3);
    // The batch's loss is a mean over its scored positions: this rank's
    // gradient counts with its share of them.
    ag_dist_allreduce_grads(ps, (double)*scored / sums[1]);
    *loss = sums[0] / sums[1];
    *scored = (long)sums[1], *correct = (long)sums[2];
    combine_seconds += now() - t0;
}

void dist_sum_counts(long *v, int n) {
    double d[8];
    for (int at = 0; at < n; at += 8) {
        int k = n - at < 8 ? n - at : 8;
        for (int i = 0; i < k; i++) d[i] = (double)v[at + i];
        ag_dist_sum(d, k);
        for (int i = 0; i < k; i++) v[at + i] = (long)d[i];
    }
}

void dist_report(int steps, double train_seconds) {
    if (ag_dist_size() == 1 || steps < 1) return;
    printf("gradient all-reduce: %.3f ms per step, %.1f%% of the training time (rank 0)\n",
           1e3 * combine_seconds / steps, 100 * combine_seconds / train_seconds);
}

#else  // one process

// N copies of a one-process build would each train alone and write the same
// files: refuse.
void dist_start(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (!n) n = getenv("PMI_SIZE");
    if (n && atoi(n) > 1) {
        fprintf(stderr, "copy_task: started by mpirun on %s processes, but built without MPI "
                        "(install libopenmpi-dev and reconfigure with -DAG_MPI=ON)\n", n);
        exit(2);
    }
}
void dist_finish(void) {}
int dist_rank(void) { return 0; }
int dist_size(void) { return 1; }
void dist_slice(int total, int *first, int *count) { *first = 0, *count = total; }
void dist_combine_step(ag_params *ps, double *loss, long *scored, long *correct) {
    (void)ps, (void)loss, (void)scored, (void)correct;
}
void dist_sum_counts(long *v, int n) { (void)v, (void)n; }
void dist_report(int steps, double train_seconds) { (void)steps, (void)train_seconds; }

#endif
