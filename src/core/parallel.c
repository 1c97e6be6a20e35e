// The thread pool. Workers sleep on a condition variable between jobs (never
// spin: spinning OpenMP/OpenBLAS threads made small steps 5x slower on two
// cores), and OpenBLAS itself is pinned to one thread, so nothing
// oversubscribes the cores.
#include "parallel.h"

#include <cblas.h>
#include <pthread.h>

#include "internal.h"

#define MAX_THREADS 64

static pthread_once_t runtime_once = PTHREAD_ONCE_INIT;

static void runtime_init_once(void) { openblas_set_num_threads(1); }

void agi_runtime_init(void) { pthread_once(&runtime_once, runtime_init_once); }

static struct {
    pthread_mutex_t job_lock;  // one parallel job at a time
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    pthread_t workers[MAX_THREADS];
    int n_workers;
    int threads;               // requested, including the caller
    unsigned long generation;  // bumped for every job and for shutdown
    int pending;               // workers still busy with the current job
    bool quit;
    void (*fn)(int, int, void *);
    void *ctx;
    int n, parts;
    unsigned long born;        // the generation when the workers were started
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, {0}, 0, 1, 0, 0, false, NULL, NULL, 0, 0, 0};

static _Thread_local bool in_worker;

static void run_part(int part) {
    int begin = (int)((long long)pool.n * part / pool.parts);
    int end = (int)((long long)pool.n * (part + 1) / pool.parts);
    if (begin < end) pool.fn(begin, end, pool.ctx);
}

static void *worker_main(void *arg) {
    int part = (int)(long)arg;
    in_worker = true;
    pthread_mutex_lock(&pool.lock);
    // Not pool.generation: the job that started this worker may already have
    // been posted (generation bumped) before the worker got here.
    unsigned long seen = pool.born;
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.start, &pool.lock);
        seen = pool.generation;
        if (pool.quit) break;
        pthread_mutex_unlock(&pool.lock);
        run_part(part);
        pthread_mutex_lock(&pool.lock);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

static void stop_workers(void) {
    pthread_mutex_lock(&pool.lock);
    pool.quit = true;
    pool.generation++;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < pool.n_workers; i++) pthread_join(pool.workers[i], NULL);
    pool.n_workers = 0;
    pool.quit = false;
}

static void start_workers(int count) {
    pool.born = pool.generation;  // under job_lock: no job is running
    for (int i = 0; i < count; i++) {
        if (pthread_create(&pool.workers[i], NULL, worker_main, (void *)(long)(i + 1)) != 0)
            break;  // fewer threads than asked still computes the same slices
        pool.n_workers++;
    }
}

void ag_set_num_threads(int n) {
    agi_runtime_init();
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    pthread_mutex_lock(&pool.job_lock);
    if (pool.n_workers) stop_workers();
    pool.threads = n;  // workers start lazily, at the first job big enough
    pthread_mutex_unlock(&pool.job_lock);
}

int ag_get_num_threads(void) { return pool.threads; }

void agi_parallel_for(int n, double work, void (*fn)(int, int, void *), void *ctx) {
    if (n <= 0) return;
    int parts = pool.threads < n ? pool.threads : n;
    if (parts <= 1 || work < AGI_PARALLEL_MIN_WORK || in_worker) {
        fn(0, n, ctx);
        return;
    }
    pthread_mutex_lock(&pool.job_lock);
    if (pool.n_workers == 0) start_workers(pool.threads - 1);
    pthread_mutex_lock(&pool.lock);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    // Slices are fixed by the requested thread count, so results never depend
    // on how many workers actually started.
    pool.parts = pool.threads;
    pool.pending = pool.n_workers;
    pool.generation++;
    pthread_cond_broadcast(&pool.start);
    pthread_mutex_unlock(&pool.lock);

    run_part(0);
    for (int part = pool.n_workers + 1; part < pool.parts; part++) run_part(part);

    pthread_mutex_lock(&pool.lock);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.job_lock);
}
