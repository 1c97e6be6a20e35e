#include "dist.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "escape.h"
#include "fnv1a.h"

static const char *program = "example";

// The message of a failed check, and its exit.
static _Noreturn void end_run(int status, const char *who, const char *msg) {
    fflush(stdout);
    fprintf(stderr, "%s: %s", program, who);
    put_line(msg, stderr);  // a path holding a newline split the line in two
    fflush(stderr);
    dist_finish();
    exit(status);
}

#ifdef EXAMPLES_MPI
#include <attograd/dist.h>

static int started, finished;  // under mpirun: between ag_dist_init and ag_dist_finalize
static double combine_seconds;

// A return from main with the job running would leave the other ranks waiting
// for this one forever.
static void end_job_on_early_exit(void) {
    if (started && !finished)
        ag_dist_abort("stopped early: ending all %d processes", ag_dist_size());
}

// Started by mpirun (Open MPI, or a PMI launcher as MPICH's): starting MPI in a plain
// run would only cost time (close to a second here).
static bool under_mpirun(void) {
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
    if (started && !finished) ag_dist_finalize();
    finished = 1;
}

int dist_rank(void) { return ag_dist_rank(); }
int dist_size(void) { return ag_dist_size(); }

// Every rank's `k` values, rank r's at all[r * k]: each rank puts its own in place
// and the sum over the ranks fills in the others. A hash goes in as two halves of 32
// bits, which a double holds exactly.
static double *gather(const double *mine, int k) {
    int n = ag_dist_size();
    double *all = calloc((size_t)n * (size_t)k, sizeof *all);
    if (!all) ag_dist_abort("out of memory");
    memcpy(all + (size_t)ag_dist_rank() * (size_t)k, mine, sizeof *mine * (size_t)k);
    ag_dist_sum(all, n * k);
    return all;
}

static void check(bool failed, int status, const char *fmt, va_list ap) {
    char msg[1024] = "";
    if (failed) vsnprintf(msg, sizeof msg, fmt, ap);
    if (!started) {
        if (failed) end_run(status, "", msg);
        return;
    }
    const uint64_t h = fnv1a(FNV1A_START, msg, strlen(msg));
    const double mine[3] = {failed, (double)(h >> 32), (double)(h & 0xffffffffu)};
    double *all = gather(mine, 3);
    const int n = ag_dist_size();
    int count = 0;
    bool alike = true;  // every rank failed with the same message
    for (int r = 0; r < n; r++) {
        count += all[3 * r] != 0;
        alike = alike && all[3 * r] != 0 && all[3 * r + 1] == all[1] && all[3 * r + 2] == all[2];
    }
    free(all);
    if (count == 0) return;
    char who[64] = "";
    if (alike) snprintf(who, sizeof who, "all %d ranks: ", n);
    else snprintf(who, sizeof who, "rank %d of %d: ", ag_dist_rank(), n);
    if (failed && (!alike || ag_dist_rank() == 0)) end_run(status, who, msg);
    dist_finish();
    exit(status);
}

static bool differs_from_rank0(uint64_t value) {
    if (!started) return false;
    const double mine[2] = {(double)(value >> 32), (double)(value & 0xffffffffu)};
    double *all = gather(mine, 2);
    bool differs = all[0] != mine[0] || all[1] != mine[1];
    free(all);
    return differs;
}

void dist_slice(int total, int *first, int *count) {
    ag_dist_slice s = ag_dist_batch_slice(total, ag_dist_rank(), ag_dist_size());
    *first = s.first;
    *count = s.count;
}

bool dist_combine(ag_params *ps, double *loss, double weight, double *sums, int n) {
    const bool mine = !isfinite(*loss);
    if (ag_dist_size() == 1) return mine;
    const double start = now_seconds();
    // The loss times what it averages over, that count, how many ranks' losses were
    // not finite, and the caller's sums.
    double all[3 + DIST_MAX_SUMS] = {*loss * weight, weight, mine};
    for (int i = 0; i < n; i++) all[3 + i] = sums[i];
    ag_dist_sum(all, 3 + n);
    // The batch's loss is a mean over its items: this rank's gradient counts with its
    // share of them.
    ag_dist_allreduce_grads(ps, weight / all[1]);
    *loss = all[0] / all[1];
    for (int i = 0; i < n; i++) sums[i] = all[3 + i];
    combine_seconds += now_seconds() - start;
    const bool none_was = all[2] == 0;  // yet the mean may have overflowed
    return mine || (none_was && !isfinite(*loss));
}

void dist_sum(double *v, int n) { ag_dist_sum(v, n); }

void dist_report(int steps, double train_seconds) {
    if (ag_dist_size() == 1 || steps < 1) return;
    printf("gradient all-reduce: %.3f ms per step, %.1f%% of the training time (rank 0)\n",
           1e3 * combine_seconds / steps, 100 * combine_seconds / train_seconds);
}

#else  // one process

void dist_start(const char *prog, int *argc, char ***argv) {
    (void)argc;
    (void)argv;
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

void dist_finish(void) {}
int dist_rank(void) { return 0; }
int dist_size(void) { return 1; }

static void check(bool failed, int status, const char *fmt, va_list ap) {
    if (!failed) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    end_run(status, "", msg);
}

static bool differs_from_rank0(uint64_t value) {
    (void)value;
    return false;
}

void dist_slice(int total, int *first, int *count) {
    *first = 0;
    *count = total;
}

bool dist_combine(ag_params *ps, double *loss, double weight, double *sums, int n) {
    (void)ps;
    (void)weight;
    (void)sums;
    (void)n;
    return !isfinite(*loss);
}

void dist_sum(double *v, int n) {
    (void)v;
    (void)n;
}

void dist_report(int steps, double train_seconds) {
    (void)steps;
    (void)train_seconds;
}

#endif

void dist_check(bool failed, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    check(failed, status, fmt, ap);
    va_end(ap);
}

void dist_check_same(uint64_t value, int status, const char *fmt, ...) {
    const bool differs = differs_from_rank0(value);
    va_list ap;
    va_start(ap, fmt);
    check(differs, status, fmt, ap);
    va_end(ap);
}
