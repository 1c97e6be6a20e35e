// The thread pool's workers are joined when the process exits (issue 9:
// they never were, so valgrind reported their stacks as "possibly lost" and
// failed any threaded program run with --error-exitcode), and a child of
// fork() neither waits for its parent's workers nor tries to join them. And
// the pool's slices of a job cover [0, n) exactly, for counts beyond INT_MAX too.
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/core/parallel.h"
#include "testing.h"

// Threads of this process, from /proc/self/task (Linux).
static int thread_count(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

// A product big enough to be split over the pool's threads.
static double parallel_work(void) {
    ag_tensor *a = ag_tensor_ones(AG_F64, 2, (int[]){192, 192});
    ag_tape *tp = ag_tape_new();
    double v = ag_tensor_item(ag_matmul(tp, a, a, false, false), 5);
    ag_tape_free(tp);
    ag_tensor_free(a);
    return v;
}

// Threads before attograd's pool started (OpenBLAS may have its own).
static int base_threads;

// Registered before the pool registers its own handler, so it runs after
// it: by then the pool's worker must be gone. A joined thread can stay listed
// in /proc for a moment after pthread_join returns (the kernel reaps it a
// little later, later still on a loaded machine), so the count is given a
// second to settle; a worker that was never joined keeps running and stays.
static void exit_with_thread_count(void) {
    for (int tries = 0; tries < 100 && thread_count() != base_threads; tries++)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    _exit(thread_count() == base_threads ? 0 : 3);
}

// Runs `body` in a child and returns its exit status (or 128 + signal);
// the child is given 20 s, so a hang fails rather than stalls the test.
static int in_child(void (*body)(void)) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        body();
        exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Starts the pool's worker (after exit_with_thread_count is registered).
static void run_threaded(void) {
    ag_tape_free(ag_tape_new());  // the runtime starts (and stops OpenBLAS's own threads)
    base_threads = thread_count();
    ag_threads_set(2);
    if (parallel_work() != 192.0) _exit(4);
    if (thread_count() != base_threads + 1) _exit(5);  // the worker did start
}

static void run_threaded_then_exit(void) {
    atexit(exit_with_thread_count);
    run_threaded();
}

// Work in an exit handler that runs after the pool's (registered before it): it restarted
// the workers, which nothing joined. Its caller now runs the job alone, to the same result.
static void work_at_exit(void) {
    if (parallel_work() != 192.0) _exit(4);
}

static void run_threaded_then_work_at_exit(void) {
    atexit(exit_with_thread_count);
    atexit(work_at_exit);
    run_threaded();
}

// In a fresh process (this program run again), where the thread count
// before the pool starts is known: a forked child's would change as
// OpenBLAS restarts its own threads there.
static void run_self_with_exit_check(void) {
    execl("/proc/self/exe", "test_parallel_exit", "--threaded-exit", (char *)NULL);
    _exit(7);
}

// A pthreads OpenBLAS starts workers of its own when it is loaded; attograd gives it one
// thread and stops them as the program starts (where the build has blas_thread_shutdown_:
// Debian's does), so that they never spin beside its own, and so that no worker is still
// starting when a program that never made a tape exits (LeakSanitizer counted what the
// sanitizer held for such a thread as a leak). So at main, before any attograd call,
// OpenBLAS has one thread and no worker is left to stop: the first tape changes nothing.
// The count is taken relative to the threads at main: a sanitizer's runtime may keep a
// thread of its own (ThreadSanitizer does).
extern int blas_thread_shutdown_(void) __attribute__((weak));
extern int openblas_get_num_threads(void) __attribute__((weak));

static void openblas_threads_stop(void) {
    if (!blas_thread_shutdown_ || !openblas_get_num_threads) _exit(0);
    if (openblas_get_num_threads() != 1) _exit(8);
    // A thread joined a moment ago can stay listed for a moment: the count is read once it
    // holds for three reads in a row, 10 ms apart.
    int before = thread_count();
    for (int same = 0, tries = 0; same < 3 && tries < 100; tries++) {
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        int now = thread_count();
        same = now == before ? same + 1 : 0;
        before = now;
    }
    ag_tape_free(ag_tape_new());
    _exit(thread_count() != before ? 6 : 0);
}

static void run_self_with_openblas_check(void) {
    execl("/proc/self/exe", "test_parallel_exit", "--openblas", (char *)NULL);
    _exit(7);
}

static void openblas_workers_are_stopped(void) {
    int st = in_child(run_self_with_openblas_check);
    if (st)
        fprintf(stderr, "  child exit %d (8: OpenBLAS has more than one thread at main; 6: the "
                "first tape stopped OpenBLAS's workers, so they ran until then)\n", st);
    CHECK(st == 0);
}

static void workers_are_joined_at_exit(void) {
    int st = in_child(run_self_with_exit_check);
    if (st) fprintf(stderr, "  child exit %d\n", st);
    CHECK(st == 0);
}

static void run_self_with_work_at_exit(void) {
    execl("/proc/self/exe", "test_parallel_exit", "--work-at-exit", (char *)NULL);
    _exit(7);
}

static void no_worker_outlives_work_done_at_exit(void) {
    int st = in_child(run_self_with_work_at_exit);
    if (st) fprintf(stderr, "  child exit %d (3: a worker was still running at the end)\n", st);
    CHECK(st == 0);
}

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

// A child forked after the workers started: it computes (its caller runs
// every slice) and exits normally, without waiting for absent workers.
// ThreadSanitizer cannot start threads in the child of a threaded process
// (it hangs or dies), so there the child computes on its own thread and
// checks only the exit.
static void fork_child(void) {
#ifdef UNDER_TSAN
    ag_threads_set(1);
#endif
    if (parallel_work() != 192.0) _exit(4);
    exit(0);
}

static void run_then_fork(void) {
    ag_threads_set(2);
    if (parallel_work() != 192.0) _exit(4);
    int status = in_child(fork_child);
    if (status != 0) _exit(status);
}

static void a_forked_child_computes_and_exits(void) {
    int st = in_child(run_then_fork);
    if (st) fprintf(stderr, "  child exit %d\n", st);
    CHECK(st == 0);
}

// A child forked while another thread of its parent runs a job (holding the pool until
// the job's slices end): the child has no such thread, and its first job waited forever
// for the pool. The fork now waits for the job. Here the other thread's job takes 200 ms,
// and the fork comes as it starts.
//
// The other thread then waits for the child before it ends: a thread that ends gives
// its allocator cache back under the allocator's locks, and the AddressSanitizer runtime
// of GCC 12 does not take them around fork (later runtimes do), so a fork at that moment
// left the child a lock held by a thread it does not have (1 run in 10 hung in its first
// malloc). glibc's malloc takes its locks around fork: this is the sanitizer's, not the
// pool's.
static atomic_int job_started, child_done;

static void slow_slice(size_t begin, size_t end, void *ctx) {
    (void)ctx;
    if (begin == 0 && end > 0) {
        atomic_store(&job_started, 1);
        nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
    }
}

static void *run_slow_job(void *unused) {
    (void)unused;
    agi_parallel_for(8, 1e3 * AGI_PARALLEL_MIN_WORK, slow_slice, NULL);
    while (!atomic_load(&child_done)) nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    return NULL;
}

static void computing_child(void) {
#ifdef UNDER_TSAN
    ag_threads_set(1);
#endif
    if (parallel_work() != 192.0) _exit(4);
    exit(0);
}

static void fork_during_a_job(void) {
    ag_threads_set(2);
    if (parallel_work() != 192.0) _exit(4);
    pthread_t other;
    if (pthread_create(&other, NULL, run_slow_job, NULL) != 0) _exit(8);
    while (!atomic_load(&job_started)) sched_yield();
    int status = in_child(computing_child);
    atomic_store(&child_done, 1);
    pthread_join(other, NULL);
    if (status != 0) _exit(status);
}

static void a_child_forked_during_another_threads_job_computes(void) {
    int st = in_child(fork_during_a_job);
    if (st) fprintf(stderr, "  child exit %d (142: it hung)\n", st);
    CHECK(st == 0);
}

// A worker late to a job (woken after the caller had run every slice) still reads the
// pool's thread count as it looks for slices, and claims none, so nothing orders that read
// before the caller's next calls. ag_threads_set of the count the pool already has wrote
// it all the same: a data race, which ThreadSanitizer reported in test_memory 7 runs in
// 10 on a loaded machine. The count is now written only when it changes, after the
// workers are joined. Here each job comes after the worker has gone to sleep (it waits
// 500 us for the next job), so it wakes late; the check is ThreadSanitizer's.
static void no_slice(size_t begin, size_t end, void *ctx) { (void)begin, (void)end, (void)ctx; }

static void test_setting_the_same_count_does_not_race_a_late_worker(void) {
    ag_threads_set(2);
    for (int i = 0; i < 200; i++) {
        agi_parallel_for(2, 1e3 * AGI_PARALLEL_MIN_WORK, no_slice, NULL);
        ag_threads_set(2);
        nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
    }
    CHECK(ag_threads() == 2);
    ag_threads_set(1);
}

// ---- The slices of a job ----------------------------------------------------------------

// The slices a job was called on, recorded under a lock (the workers call concurrently);
// the callback touches no memory per index, so a count of billions costs nothing.
#define MAX_CALLS 64
static struct {
    pthread_mutex_t lock;
    size_t begin[MAX_CALLS], end[MAX_CALLS];
    int calls;
} seen = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void record_slice(size_t begin, size_t end, void *ctx) {
    (void)ctx;
    pthread_mutex_lock(&seen.lock);
    if (seen.calls < MAX_CALLS) seen.begin[seen.calls] = begin, seen.end[seen.calls] = end;
    seen.calls++;
    pthread_mutex_unlock(&seen.lock);
}

// Runs a job of n items on the pool and sorts its slices by their starts (the calls come
// in whatever order the threads take them); returns the number of calls.
static int slices_of(size_t n) {
    seen.calls = 0;
    agi_parallel_for(n, 1e3 * AGI_PARALLEL_MIN_WORK, record_slice, NULL);
    const int calls = seen.calls < MAX_CALLS ? seen.calls : MAX_CALLS;
    for (int i = 1; i < calls; i++)
        for (int k = i; k > 0 && seen.begin[k - 1] > seen.begin[k]; k--) {
            size_t b = seen.begin[k], e = seen.end[k];
            seen.begin[k] = seen.begin[k - 1], seen.end[k] = seen.end[k - 1];
            seen.begin[k - 1] = b, seen.end[k - 1] = e;
        }
    return seen.calls;
}

// Sorted slices cover [0, n) exactly: each starts where the one before ended, none is
// empty, and their lengths add up to n.
static bool covers_exactly(int calls, size_t n) {
    if (calls < 1 || calls > MAX_CALLS || seen.begin[0] != 0 || seen.end[calls - 1] != n)
        return false;
    size_t total = 0;
    for (int i = 0; i < calls; i++) {
        if (seen.end[i] <= seen.begin[i] || (i > 0 && seen.begin[i] != seen.end[i - 1]))
            return false;
        total += seen.end[i] - seen.begin[i];
    }
    return total == n;
}

// Wide enough for n s with n up to SIZE_MAX where the compiler has 128-bit integers.
#ifdef __SIZEOF_INT128__
__extension__ typedef unsigned __int128 wide;
#else
typedef uint64_t wide;
#endif

// The pool's slices of each of `k` counts cover it exactly, S of them, and slice s is
// [n s / S, n (s + 1) / S), computed in `wide`.
static void slices_are_floors(const size_t counts[], size_t k, uint64_t S) {
    for (size_t c = 0; c < k; c++) {
        const size_t n = counts[c];
        const int calls = slices_of(n);
        CHECK(calls == (int)S);
        CHECK(covers_exactly(calls, n));
        for (int s = 0; s < calls && s < MAX_CALLS; s++) {
            CHECK(seen.begin[s] == (size_t)((wide)n * (wide)s / S));
            CHECK(seen.end[s] == (size_t)((wide)n * (wide)(s + 1) / S));
        }
    }
}

// A job of more than INT_MAX items (the rows of a softmax over a [2^31 + 5, 1] tensor)
// was given to the pool as an int, which wrapped: negative, and the job did nothing, or
// small, and it did a part. Its slices now cover all of it, two threads' four each.
static void a_job_beyond_int_max_is_covered(void) {
    ag_threads_set(2);
    const uint64_t S = 2 * AGI_SLICES_PER_THREAD;
    // n s fits 64 bits for these n.
    const size_t counts[] = {(size_t)INT_MAX + 1000, 3000000000u, (size_t)UINT32_MAX + 5,
                             (size_t)1 << 40};
    slices_are_floors(counts, sizeof counts / sizeof *counts, S);
#ifdef __SIZEOF_INT128__
    // Counts whose n s does not fit 64 bits: the bounds are still floor(n s / S), as
    // 128-bit arithmetic computes them.
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 3, ((size_t)1 << 62) + 12345};
    slices_are_floors(huge, sizeof huge / sizeof *huge, S);
#endif
    ag_threads_set(1);
}

// The slicing decides the order of a job's sums, so it must not change with the counts'
// type: for every n that fits an int the slices are the non-empty [n s / S, n (s + 1) / S),
// S = 4 P, the formula computed here in 64 bits (as the pool did before); one thread runs
// the whole job as one call.
static void small_jobs_keep_their_slices(void) {
    for (int P = 1; P <= 3; P++) {
        ag_threads_set(P);
        const int S = P * AGI_SLICES_PER_THREAD;
        for (size_t n = 1; n <= 200; n++) {
            const int calls = slices_of(n);
            CHECK(covers_exactly(calls, n));
            if (P == 1) {
                CHECK(calls == 1);
                continue;
            }
            int k = 0;
            bool same = true;
            for (int s = 0; s < S; s++) {
                const size_t b = (size_t)((int64_t)n * s / S);
                const size_t e = (size_t)((int64_t)n * (s + 1) / S);
                if (b == e) continue;
                same &= k < calls && seen.begin[k] == b && seen.end[k] == e;
                k++;
            }
            CHECK(same && k == calls);
        }
    }
    ag_threads_set(1);
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--threaded-exit")) {
        alarm(20);
        run_threaded_then_exit();
        return 0;  // exit_with_thread_count decides the status
    }
    if (argc == 2 && !strcmp(argv[1], "--work-at-exit")) {
        alarm(20);
        run_threaded_then_work_at_exit();
        return 0;  // exit_with_thread_count decides the status
    }
    if (argc == 2 && !strcmp(argv[1], "--openblas")) openblas_threads_stop();
    RUN(openblas_workers_are_stopped);
    RUN(workers_are_joined_at_exit);
    RUN(no_worker_outlives_work_done_at_exit);
    RUN(a_forked_child_computes_and_exits);
    RUN(a_child_forked_during_another_threads_job_computes);
    RUN(test_setting_the_same_count_does_not_race_a_late_worker);
    RUN(a_job_beyond_int_max_is_covered);
    RUN(small_jobs_keep_their_slices);
    return testing_summary();
}
