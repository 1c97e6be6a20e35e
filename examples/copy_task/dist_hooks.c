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

// Every error is agreed on through dist_failed and ends through dist_finish;
// a rank that leaves main any other way would leave the others waiting.
static void end_job_on_early_exit(void) {
    if (started && !finished) ag_dist_abort("left the run alone; ending all %d processes",
                                            ag_dist_size());
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
}

void dist_finish(void) {
    finished = 1;
    if (started) ag_dist_finalize();
}

// FNV-1a: equal messages on two ranks give equal values, exact in a double.
static uint32_t fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

// v[1 + r] = rank r's value, on every rank (the others add zeros).
static double *gather_values(double mine, double first) {
    int n = ag_dist_size();
    double *v = calloc((size_t)n + 1, sizeof *v);
    if (!v) ag_dist_abort("out of memory");
    v[0] = first;
    v[1 + ag_dist_rank()] = mine;
    ag_dist_sum(v, n + 1);
    return v;
}

bool dist_failed(bool failed, const char *msg) {
    if (!started) {
        if (failed) fprintf(stderr, "copy_task: %s\n", msg);
        return failed;
    }
    int n = ag_dist_size(), rank = ag_dist_rank();
    double *v = gather_values(failed ? (double)(fnv1a(msg) | 1u) : 0, failed);
    int count = (int)v[0];
    bool everywhere_same = count == n;
    for (int r = 1; everywhere_same && r < n; r++) everywhere_same = v[1 + r] == v[1];
    free(v);
    fflush(stdout);
    if (failed && everywhere_same && rank == 0)
        fprintf(stderr, "copy_task: all %d ranks: %s\n", n, msg);
    else if (failed && !everywhere_same)
        fprintf(stderr, "copy_task: rank %d of %d: %s\n", rank, n, msg);
    fflush(stderr);
    return count > 0;
}

bool dist_differs_from_rank0(uint32_t value) {
    if (!started) return false;
    double *v = gather_values(value, 0);
    bool differs = v[1 + ag_dist_rank()] != v[1];
    free(v);
    return differs;
}

int dist_rank(void) { return ag_dist_rank(); }
int dist_size(void) { return ag_dist_size(); }

void dist_slice(int total, int *first, int *count) {
    ag_dist_slice s = ag_dist_batch_slice(total, ag_dist_rank(), ag_dist_size());
    *first = s.first, *count = s.count;
}

void dist_combine_step(ag_params *ps, double *loss, long *scored, long *correct, bool *mine) {
    bool bad = !isfinite(*loss);
    *mine = bad;
    if (ag_dist_size() == 1) return;
    double t0 = now();
    double sums[4] = {*loss * (double)*scored, (double)*scored, (double)*correct, bad};
    ag_dist_sum(sums, 4);
    // The batch's loss is a mean over its scored positions: this rank's
    // gradient counts with its share of them.
    ag_dist_allreduce_grads(ps, (double)*scored / sums[1]);
    *loss = sums[0] / sums[1];
    *scored = (long)sums[1], *correct = (long)sums[2];
    *mine = bad || (sums[3] == 0 && !isfinite(*loss));  // finite parts, a sum that overflowed
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
bool dist_failed(bool failed, const char *msg) {
    if (failed) fprintf(stderr, "copy_task: %s\n", msg);
    return failed;
}
bool dist_differs_from_rank0(uint32_t value) {
    (void)value;
    return false;
}
void dist_slice(int total, int *first, int *count) { *first = 0, *count = total; }
void dist_combine_step(ag_params *ps, double *loss, long *scored, long *correct, bool *mine) {
    (void)ps, (void)scored, (void)correct;
    *mine = !isfinite(*loss);
}
void dist_sum_counts(long *v, int n) { (void)v, (void)n; }
void dist_report(int steps, double train_seconds) { (void)steps, (void)train_seconds; }

#endif
