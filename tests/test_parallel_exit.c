// The thread pool's workers are joined when the process exits (issue 9:
// they never were, so valgrind reported their stacks as "possibly lost" and
// failed any threaded program run with --error-exitcode), and a child of
// fork() neither waits for its parent's workers nor tries to join them.
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

static void run_threaded_then_exit(void) {
    atexit(exit_with_thread_count);
    ag_tape_free(ag_tape_new());  // the runtime starts (and stops OpenBLAS's own threads)
    base_threads = thread_count();
    ag_threads_set(2);
    if (parallel_work() != 192.0) _exit(4);
    if (thread_count() != base_threads + 1) _exit(5);  // the worker did start
}

// In a fresh process (this program run again), where the thread count
// before the pool starts is known: a forked child's would change as
// OpenBLAS restarts its own threads there.
static void run_self_with_exit_check(void) {
    execl("/proc/self/exe", "test_parallel_exit", "--threaded-exit", (char *)NULL);
    _exit(7);
}

// A pthreads OpenBLAS starts workers of its own when it is loaded; attograd gives it one
// thread and stops them, so that they never spin beside its own (where the build has
// blas_thread_shutdown_: Debian's does).
// The count is taken relative to the threads before attograd starts: a
// sanitizer's runtime may keep a thread of its own (ThreadSanitizer does).
extern int blas_thread_shutdown_(void) __attribute__((weak));
extern int openblas_get_num_threads(void) __attribute__((weak));

static void openblas_threads_stop(void) {
    if (!blas_thread_shutdown_ || !openblas_get_num_threads) _exit(0);
    int before = thread_count(), workers = openblas_get_num_threads() - 1;
    ag_tape_free(ag_tape_new());
    int expected = before - workers;
    for (int tries = 0; tries < 100 && thread_count() != expected; tries++)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    _exit(thread_count() != expected ? 6 : 0);
}

static void run_self_with_openblas_check(void) {
    execl("/proc/self/exe", "test_parallel_exit", "--openblas", (char *)NULL);
    _exit(7);
}

static void openblas_workers_are_stopped(void) {
    int st = in_child(run_self_with_openblas_check);
    if (st) fprintf(stderr, "  child exit %d (6: OpenBLAS's threads still run)\n", st);
    CHECK(st == 0);
}

static void workers_are_joined_at_exit(void) {
    int st = in_child(run_self_with_exit_check);
    if (st) fprintf(stderr, "  child exit %d\n", st);
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

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--threaded-exit")) {
        alarm(20);
        run_threaded_then_exit();
        return 0;  // exit_with_thread_count decides the status
    }
    if (argc == 2 && !strcmp(argv[1], "--openblas")) openblas_threads_stop();
    RUN(openblas_workers_are_stopped);
    RUN(workers_are_joined_at_exit);
    RUN(a_forked_child_computes_and_exits);
    return testing_summary();
}
