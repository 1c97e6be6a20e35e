// The kernels' scratch (scratch.h): the thread's fixed blocks, and the shared operand in
// thread-local storage, freed by a thread-specific key's destructor when the thread exits
// (the main thread's stays to the end, reachable from its thread-local storage).
#include "scratch.h"

#include <pthread.h>

#include "../core/internal.h"
#include "../core/parallel.h"

_Static_assert(AGI_SCRATCH_A_BYTES + AGI_SCRATCH_B_BYTES <= AGI_THREAD_SCRATCH_BYTES,
               "the packed blocks fit a thread's scratch");

void *agi_scratch_a(void) { return agi_thread_scratch(); }

void *agi_scratch_b(void) { return (char *)agi_thread_scratch() + AGI_SCRATCH_A_BYTES; }

static _Thread_local struct {
    void *p;
    size_t bytes;
} shared;

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void free_shared(void *unused) {
    (void)unused;
    agi_free(shared.p);
    shared.p = NULL;
    shared.bytes = 0;
}

static void make_key(void) { (void)pthread_key_create(&key, free_shared); }

void *agi_scratch_shared(size_t bytes) {
    if (shared.p && shared.bytes >= bytes) return shared.p;
    pthread_once(&key_once, make_key);
    agi_free(shared.p);
    shared.p = agi_malloc(bytes);
    shared.bytes = bytes;
    (void)pthread_setspecific(key, &shared);
    return shared.p;
}
