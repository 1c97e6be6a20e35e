#define _POSIX_C_SOURCE 200809L  // clock_gettime, nanosleep
#include "dist.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char *program = "example";
static int started, finished;  // under mpirun: between ag_dist_init and ag_dist_finalize

#ifdef EXAMPLES_MPI
#include <attograd/dist.h>

static double combine_seconds;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A return from main with the job running would leave the other ranks waiting
// for this one forever.
static void end_job_on_early_exit(void) {
    if (started && !finished)
        ag_dist_abort("stopped early: ending all %d processes", ag_dist_size());
}

// Started by mpirun (Open MPI, or a PMI launcher as MPICH's): starting MPI in a plain
// run would only cost time.
static int under_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

void dist_start(const char *prog, int *argc, char ***argv) {
    program = prog;
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

static _Noreturn void end_job(const char *msg) {
    // An error every rank meets alike is rank 0's to report: by the time another
    // rank would, rank 0's abort has ended it. One that only this rank meets is
    // reported a second late.
    if (ag_dist_rank() != 0) nanosleep(&(struct timespec){1, 0}, NULL);
    ag_dist_abort("%s", msg);
}

void dist_slice(int total, int *first, int *count) {
    ag_dist_slice s = ag_dist_batch_slice(total, ag_dist_rank(), ag_dist_size());
    *first = s.first, *count = s.count;
}

static void combine(ag_params *ps, double *loss, double count) {
    if (ag_dist_size() == 1) return;
    double t0 = now(), sums[2] = {*loss * count, count};
    ag_dist_sum(sums, 2);
    ag_dist_allreduce_grads(ps, count / sums[1]);
    *loss = sums[0] / sums[1];
    combine_seconds += now() - t0;
}

void dist_sum(double *v, int n) { ag_dist_sum(v, n); }

void dist_report(int steps, double train_seconds) {
    if (ag_dist_size() == 1 || steps < 1) return;
    printf("gradient all-reduce: %.3f ms per step, %.1f%% of the training time (rank 0)\n",
           1e3 * combine_seconds / steps, 100 * combine_seconds / train_seconds);
}

#else  // one process

void dist_start(const char *prog, int *argc, char ***argv) {
    (void)argc, (void)argv;
    program = prog;
    // N copies of a one-process build would each train alone and write the same files.
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (!n) n = getenv("PMI_SIZE");
    if (n && atoi(n) > 1) {
        fprintf(stderr, "%s: started by mpirun on %s processes, but built without MPI "
                        "(install libopenmpi-dev and reconfigure with -DAG_MPI=ON)\n", prog, n);
        exit(2);
    }
}
void dist_finish(void) { finished = 1; }
int dist_rank(void) { return 0; }
int dist_size(void) { return 1; }
static _Noreturn void end_job(const char *msg) { (void)msg, abort(); }  // never started
void dist_slice(int total, int *first, int *count) { *first = 0, *count = total; }
static void combine(ag_params *ps, double *loss, double count) {
    (void)ps, (void)loss, (void)count;
}
void dist_sum(double *v, int n) { (void)v, (void)n; }
void dist_report(int steps, double train_seconds) { (void)steps, (void)train_seconds; }

#endif

double dist_combine(ag_params *ps, double *loss, double count, double clip) {
    if (!isfinite(*loss)) return NAN;
    combine(ps, loss, count);
    return ag_params_clip_grad_norm(ps, clip > 0 ? clip : INFINITY);
}

int dist_fail(int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (started && !finished) end_job(msg);
    fprintf(stderr, "%s: %s\n", program, msg);
    return status;
}
