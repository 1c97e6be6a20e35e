// The thread pool.
//
// Waking a sleeping thread costs a futex call and a cross-core interrupt, far
// more than the gap between the jobs the ops of a training step issue (tens
// of microseconds; measurements in bench/README.md). So a worker that
// finishes a job first watches the job counter for a while (SPIN_SECONDS,
// with the CPU's pause hint) and only then sleeps; the caller signals the
// condition variable only when a worker is asleep, and waits for completion
// on an atomic counter. A job handed out during a step then starts at once,
// and idle workers still go to sleep: the spin is bounded, and yields to any
// other thread that wants the core, unlike the OpenMP and OpenBLAS pools,
// whose unbounded spinning made small steps several times slower. OpenBLAS
// itself is pinned to one thread.
//
// A job's slices are each claimed by whichever thread comes first, the caller
// included; a thread starts with its own share and then helps with the others'
// (run_parts): if a worker is slow to wake, descheduled by another process or
// slowed by a neighbour on its core, the other thread runs the rest of its share,
// so a job does not wait long for a thread that is not running, and two threads
// are not slower than one even on a loaded machine. Which thread runs a slice does
// not change its result: the slicing alone (fixed by the thread count) decides the
// arithmetic.
//
// The workers are joined at exit (atexit): a thread still running when the
// process ends keeps its stack and thread-local storage allocated, which
// valgrind reports as "possibly lost" and fails a threaded program run with
// --error-exitcode. A child of fork() has none of its parent's workers and
// starts its own when it needs them.
#define _POSIX_C_SOURCE 200809L  // pthreads, sched_yield
#include "parallel.h"

#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_THREADS 64
#define SPIN_SECONDS 500e-6

static pthread_once_t runtime_once = PTHREAD_ONCE_INIT;

// A pthreads build of OpenBLAS starts its own workers when it is loaded, and each spins
// for a while (about 0.1 s of a core here, bench/README.md) waiting for work it will never
// get, since attograd gives OpenBLAS one thread. They are stopped here where the build
// offers the means (blas_thread_shutdown_, which OpenBLAS itself uses around fork; weak,
// so that other builds link without it); a later call asking OpenBLAS for more threads
// starts them again.
extern int blas_thread_shutdown_(void) __attribute__((weak));
// OpenBLAS starts them from its own constructor, gotoblas_init. Linked as libopenblas.so it
// has run before ours; linked statically (libopenblas.a after libattograd.a) it ran after:
// its workers started once ours had stopped them, and spun in every program (and an exit
// while one was still starting crashed in blas_thread_server, 1 run in 10). It returns at
// once when OpenBLAS is already initialised.
extern void gotoblas_init(void) __attribute__((weak));

static void runtime_init_once(void) {
    if (gotoblas_init) gotoblas_init();
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_) blas_thread_shutdown_();
}

void agi_runtime_init(void) { pthread_once(&runtime_once, runtime_init_once); }

// And as the program starts, not only at its first tape: a program that exits before it
// makes one (a tool that loads a checkpoint and reports) would otherwise end while
// OpenBLAS's worker may still be starting, and LeakSanitizer, checking at exit, counts
// what the sanitizer's own start of that thread holds at that moment as leaked. Stopping
// the workers joins them, so none is left half-started; the calls in ag_tape_new and
// ag_data_parallel_new stay for a program whose own constructor makes a tape before this
// one has run.
__attribute__((constructor)) static void runtime_init_at_load(void) { agi_runtime_init(); }

static struct {
    pthread_mutex_t job_lock;  // one parallel job at a time
    pthread_mutex_t lock;      // guards sleeping on `start`
    pthread_cond_t start;
    pthread_t workers[MAX_THREADS];
    void *scratch[MAX_THREADS];  // worker k's agi_thread_scratch, at k - 1
    int n_workers;
    // Requested, including the caller: written under job_lock, read also without it (by
    // ag_threads on any thread, and by a worker late to the last job).
    atomic_int threads;
    atomic_ulong generation;           // bumped for every job and for shutdown
    // The current job's slices, 1 once claimed: thread k's own on a cache line of their own.
    struct {
        _Alignas(64) atomic_int slice[AGI_SLICES_PER_THREAD];
    } taken[MAX_THREADS];
    atomic_int done_parts;             // slices of the current job finished
    atomic_int sleeping;               // workers waiting on `start`
    atomic_bool quit;
    bool exited;                       // the workers were joined at exit: none start again
    unsigned long born;                // the generation when the workers were started
    // The job: written before its slices are opened, read only after a slice has
    // been claimed from it, so a claim always sees its own job's fields.
    void (*fn)(size_t, size_t, void *);
    void *ctx;
    size_t n;
    agi_error_scope scope;  // the caller's own error handler, if it has one
    // What the workers did for the caller in the current job: errors reported and heap
    // blocks obtained, credited to the caller when the job ends (agi_errors_reported,
    // agi_allocations_here count a thread's own work, its jobs' slices included).
    atomic_ulong job_errors;
    atomic_uint_fast64_t job_allocations;
} pool = {.job_lock = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .start = PTHREAD_COND_INITIALIZER,
          .threads = 1};

// True on a thread while it runs a slice of a job: on the workers always, and
// on the calling thread while it runs its own slices. A parallel_for nested in
// a slice (a gemm inside a batch loop) then runs inline instead of waiting for
// the job lock its own caller holds.
static _Thread_local bool in_worker;
// The thread whose slices this one owns (run_parts): 0 for the caller, k for worker k.
static _Thread_local int my_owner;
// Data-parallel steps running on this thread (agi_threads_pin).
static _Thread_local int pinned;
// agi_thread_scratch's memory (a worker's is pool.scratch[my_owner - 1]).
static _Thread_local void *my_scratch;
// The thread count this thread computes as if set, 0 for none (agi_threads_as_if).
static _Thread_local int as_if;

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// Where slice s of S of a job of n items starts: floor(n s / S) for 0 <= s <= S, though n s
// may not fit in a size_t. With n = q S + r it is q s + floor(r s / S) exactly, and r s <
// S * S is small: the bounds n s / S computed wide would give, so a count's slicing (which
// decides the order of a job's sums) is the one it always had.
static size_t slice_start(size_t n, int s, int S) {
    return n / (size_t)S * (size_t)s + n % (size_t)S * (size_t)s / (size_t)S;
}

// Claims and runs slices of the current job until none is left. With P threads and
// K = AGI_SLICES_PER_THREAD, a job of n items has S = P K slices, slice s = [n s / S,
// n (s + 1) / S); thread k (the caller 0, worker k) owns slices k K ... (k + 1) K - 1, the
// range [n k / P, n (k + 1) / P). A thread runs its own slices first, front to back, then
// takes what is left of the others' from their back ends. So consecutive ops give a thread
// the same part of the data (the rows of a product and the rows the next op reads from
// it), still in its core's caches; and when a thread starts late or runs slow (on this VM
// one vCPU is now and then a third slower than the other, as a neighbour takes its core's
// share), the other takes over the last quarter or more of its range instead of waiting
// for it. Which thread runs a slice does not change its result.
static void claim(int owner, int i) {
    if (atomic_exchange(&pool.taken[owner].slice[i], 1)) return;
    const int S = pool.threads * AGI_SLICES_PER_THREAD, s = owner * AGI_SLICES_PER_THREAD + i;
    const size_t begin = slice_start(pool.n, s, S), end = slice_start(pool.n, s + 1, S);
    if (begin < end && my_owner == 0) {
        pool.fn(begin, end, pool.ctx);  // the caller: its work is its own already
    } else if (begin < end) {
        // A worker works for the caller: under its error handler, and what it reports or
        // allocates counts as the caller's (added before the slice is marked done, so the
        // caller, waiting for that mark, sees it).
        const agi_error_scope outer = agi_error_scope_set(pool.scope);
        const unsigned long errors = agi_errors_reported();
        const uint64_t allocations = agi_allocations_here();
        pool.fn(begin, end, pool.ctx);
        atomic_fetch_add(&pool.job_errors, agi_errors_reported() - errors);
        atomic_fetch_add(&pool.job_allocations, agi_allocations_here() - allocations);
        agi_error_scope_set(outer);
    }
    atomic_fetch_add(&pool.done_parts, 1);
}

static void run_parts(void) {
    const int P = pool.threads;
    for (int i = 0; i < AGI_SLICES_PER_THREAD; i++) claim(my_owner, i);
    for (int k = 1; k < P; k++)
        for (int i = AGI_SLICES_PER_THREAD - 1; i >= 0; i--) claim((my_owner + k) % P, i);
}

// A spin that lets any other runnable thread have this core now and then.
static void spin_once(unsigned spins) {
    cpu_relax();
    if ((spins & 255) == 255) sched_yield();
}

// Returns the generation after `seen`: spins for SPIN_SECONDS, then sleeps.
static unsigned long wait_for_job(unsigned long seen) {
    double deadline = 0;
    for (unsigned spins = 0;; spins++) {
        unsigned long g = atomic_load(&pool.generation);
        if (g != seen) return g;
        spin_once(spins);
        if ((spins & 255) == 255) {  // look at the clock now and then, not every spin
            double t = agi_seconds_now();
            if (deadline == 0) deadline = t + SPIN_SECONDS;
            if (t > deadline) break;
        }
    }
    // Sleep. `sleeping` is raised before `generation` is read again (both
    // sequentially consistent), and the caller bumps `generation` before it
    // reads `sleeping`: so either it sees us asleep and signals, or we see its
    // job here and do not wait.
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add(&pool.sleeping, 1);
    unsigned long g;
    while ((g = atomic_load(&pool.generation)) == seen) pthread_cond_wait(&pool.start, &pool.lock);
    atomic_fetch_sub(&pool.sleeping, 1);
    pthread_mutex_unlock(&pool.lock);
    return g;
}

static void *worker_main(void *arg) {
    in_worker = true;
    my_owner = (int)(intptr_t)arg;
    my_scratch = pool.scratch[my_owner - 1];
    // Not the current generation: the first job may already have been posted
    // before this thread got here, and it must not be mistaken for an old one.
    unsigned long seen = pool.born;
    for (;;) {
        seen = wait_for_job(seen);
        if (atomic_load(&pool.quit)) break;
        run_parts();
    }
    return NULL;
}

static void post_job(void) {
    atomic_fetch_add(&pool.generation, 1);
    if (atomic_load(&pool.sleeping) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.start);
        pthread_mutex_unlock(&pool.lock);
    }
}

static void stop_workers(void) {
    atomic_store(&pool.quit, true);
    post_job();
    for (int i = 0; i < pool.n_workers; i++) {
        pthread_join(pool.workers[i], NULL);
        agi_free(pool.scratch[i]);
        pool.scratch[i] = NULL;
    }
    pool.n_workers = 0;
    atomic_store(&pool.quit, false);
}

// exit() from a thread while another runs a job (which holds job_lock, as
// does a job whose slice calls exit) leaves the workers running: joining
// them would wait for that job forever. A job after this (from an exit handler
// registered before the pool's, which runs later) starts no workers that nothing
// would join: its caller runs every slice, the same slices.
static void stop_workers_at_exit(void) {
    if (pthread_mutex_trylock(&pool.job_lock) != 0) return;
    if (pool.n_workers) stop_workers();
    pool.exited = true;
    pthread_mutex_unlock(&pool.job_lock);
}

// Only the thread that forks is copied into the child: its workers are not there to be
// woken, joined or waited for. A worker may hold `lock` at the moment of the fork (on its
// way to sleep): the fork waits for it to let go, and the child starts its own lock,
// condition and count of sleepers, none of them shared with threads it does not have.
// Another thread may be running a job, holding `job_lock` until its slices end: the fork
// waits for that job too (a child would otherwise wait forever, at its first job, for a
// lock that no thread of its own holds), unless it is called from a job's slice, whose
// job cannot end before the fork returns.
static _Thread_local bool fork_holds_jobs;
static void hold_lock_for_fork(void) {
    fork_holds_jobs = !in_worker;
    if (fork_holds_jobs) pthread_mutex_lock(&pool.job_lock);
    pthread_mutex_lock(&pool.lock);
}
static void release_lock_in_parent(void) {
    pthread_mutex_unlock(&pool.lock);
    if (fork_holds_jobs) pthread_mutex_unlock(&pool.job_lock);
}
static void forget_workers_in_child(void) {
    for (int i = 0; i < pool.n_workers; i++) {
        agi_free(pool.scratch[i]);
        pool.scratch[i] = NULL;
    }
    pool.n_workers = 0;
    atomic_store(&pool.sleeping, 0);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.start, NULL);
    if (fork_holds_jobs) pthread_mutex_init(&pool.job_lock, NULL);
}

static void start_workers(int count) {
    static bool registered;  // under job_lock, as every call here is
    if (!registered) {
        registered = true;
        (void)atexit(stop_workers_at_exit);
        (void)pthread_atfork(hold_lock_for_fork, release_lock_in_parent,
                             forget_workers_in_child);
    }
    pool.born = atomic_load(&pool.generation);
    for (int i = 0; i < count; i++) {
        pool.scratch[i] = agi_malloc(AGI_THREAD_SCRATCH_BYTES);
        if (pthread_create(&pool.workers[i], NULL, worker_main, (void *)(intptr_t)(i + 1)) != 0) {
            agi_free(pool.scratch[i]);
            pool.scratch[i] = NULL;
            break;  // fewer threads than asked still computes the same slices
        }
        pool.n_workers++;
    }
}

void ag_threads_set(int n) {
    agi_runtime_init();
    // Stopping the workers takes the job lock, which the job running this thread holds
    // until every slice ends, this one included: it would wait for itself forever. A step
    // of one slice holds no job, but it is a step all the same: the count it runs on stays.
    if (in_worker || pinned) {
        ag_error("threads_set: called from inside a parallel job (a data-parallel loss "
                 "function, say), which holds the pool; set the thread count between steps");
        return;
    }
    if (n < 1) {  // as torch.set_num_threads: a typo, not a request for one thread
        ag_error("threads_set: the count must be >= 1, got %d; it stays %d", n,
                 atomic_load(&pool.threads));
        return;
    }
    if (n > MAX_THREADS) n = MAX_THREADS;
    pthread_mutex_lock(&pool.job_lock);
    // The count it has already keeps its workers: restarted, each would allocate its
    // scratch again, and a program that sets the count before every step would allocate.
    // And it is not written again: a worker late to the last job (the caller ran every
    // slice) may still be reading it, with nothing to order that read before this write.
    // A new count is written once the workers are joined.
    if (n != pool.threads) {
        if (pool.n_workers) stop_workers();
        pool.threads = n;  // workers start lazily, at the first job big enough
    }
    pthread_mutex_unlock(&pool.job_lock);
}

int ag_threads(void) {
    return as_if ? as_if : atomic_load_explicit(&pool.threads, memory_order_relaxed);
}

void agi_threads_as_if(int n) { as_if = n < 0 ? 0 : n > MAX_THREADS ? MAX_THREADS : n; }

void agi_threads_pin(bool on) { pinned += on ? 1 : -1; }

// What a thread allocated for itself (agi_thread_scratch outside the pool, and
// agi_thread_buffer) is freed by one thread-specific key's destructor when the thread
// exits; the process's main thread keeps it to the end, reachable from its thread-local
// storage.
static _Thread_local struct {
    void *scratch, *buffer;
    size_t buffer_bytes;
} owned;
static pthread_key_t owned_key;
static pthread_once_t owned_key_once = PTHREAD_ONCE_INIT;

static void free_owned(void *unused) {
    (void)unused;
    if (my_scratch == owned.scratch) my_scratch = NULL;
    agi_free(owned.scratch);
    agi_free(owned.buffer);
    owned.scratch = owned.buffer = NULL;
    owned.buffer_bytes = 0;
}

static void make_owned_key(void) { (void)pthread_key_create(&owned_key, free_owned); }

static void free_owned_at_exit(void) {
    pthread_once(&owned_key_once, make_owned_key);
    (void)pthread_setspecific(owned_key, &owned);
}

void *agi_thread_scratch(void) {
    if (!my_scratch) {
        my_scratch = owned.scratch = agi_malloc(AGI_THREAD_SCRATCH_BYTES);
        free_owned_at_exit();
    }
    return my_scratch;
}

void *agi_thread_buffer(size_t bytes) {
    if (owned.buffer && owned.buffer_bytes >= bytes) return owned.buffer;
    agi_free(owned.buffer);
    owned.buffer = agi_malloc(bytes);
    owned.buffer_bytes = bytes;
    free_owned_at_exit();
    return owned.buffer;
}

int agi_parallel_threads(double work) {
    const int threads = ag_threads();
    return threads <= 1 || work < AGI_PARALLEL_MIN_WORK || in_worker ? 1 : threads;
}

// A job as `as_if` threads would run it, every slice on the calling thread: the same
// slices, so the same bits (which thread runs a slice never changes its result).
static void run_as_if(size_t n, void (*fn)(size_t, size_t, void *), void *ctx) {
    const int S = as_if * AGI_SLICES_PER_THREAD;
    in_worker = true;
    for (int s = 0; s < S; s++) {
        const size_t begin = slice_start(n, s, S), end = slice_start(n, s + 1, S);
        if (begin < end) fn(begin, end, ctx);
    }
    in_worker = false;
}

void agi_parallel_for(size_t n, double work, void (*fn)(size_t, size_t, void *), void *ctx) {
    if (n == 0) return;
    if (n == 1 || agi_parallel_threads(work) == 1) {
        fn(0, n, ctx);
        return;
    }
    if (as_if) {
        run_as_if(n, fn, ctx);
        return;
    }
    pthread_mutex_lock(&pool.job_lock);
    if (pool.n_workers == 0 && !pool.exited) start_workers(pool.threads - 1);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.scope = agi_error_scope_now();
    atomic_store(&pool.job_errors, 0);
    atomic_store(&pool.job_allocations, 0);
    atomic_store(&pool.done_parts, 0);
    for (int k = 0; k < pool.threads; k++)  // opens the job
        for (int i = 0; i < AGI_SLICES_PER_THREAD; i++) atomic_store(&pool.taken[k].slice[i], 0);
    post_job();

    in_worker = true;
    run_parts();
    in_worker = false;

    // Every slice is claimed by now; wait for the ones still running elsewhere.
    const int slices = pool.threads * AGI_SLICES_PER_THREAD;
    for (unsigned spins = 0; atomic_load(&pool.done_parts) < slices; spins++)
        if ((spins & 1023) == 1023) sched_yield(); else cpu_relax();
    agi_errors_credit(atomic_load(&pool.job_errors));
    agi_allocations_credit(atomic_load(&pool.job_allocations));
    pthread_mutex_unlock(&pool.job_lock);
}

typedef struct {
    char *p;
    size_t bytes;
} zero_job;

enum { ZERO_CHUNK = 64 * 1024 };

static void zero_chunks(size_t begin, size_t end, void *ctx) {
    const zero_job *z = ctx;
    const size_t lo = begin * ZERO_CHUNK;
    const size_t hi = end * ZERO_CHUNK < z->bytes ? end * ZERO_CHUNK : z->bytes;
    memset(z->p + lo, 0, hi - lo);
}

void agi_zero(void *p, size_t bytes) {
    zero_job z = {p, bytes};
    const size_t chunks = (bytes + ZERO_CHUNK - 1) / ZERO_CHUNK;
    if (chunks < 4) {
        memset(p, 0, bytes);
        return;
    }
    // A memory pass costs about what a flop-equivalent per byte does here.
    agi_parallel_for(chunks, (double)bytes, zero_chunks, &z);
}
