// Per-thread scratch (scratch.h). The slots live in thread-local storage; a thread-specific
// key, set on a thread's first use, runs the destructor that frees them when the thread
// exits (the pool's workers are joined at ag_threads_set and at exit). The calling
// thread's slots stay allocated until the process ends, reachable from its thread-local
// storage.
#include "scratch.h"

#include <pthread.h>
#include <stdbool.h>

#include "../core/internal.h"

static _Thread_local struct {
    void *p[AGI_SCRATCH_SLOTS];
    size_t bytes[AGI_SCRATCH_SLOTS];
    bool registered;
} mine;

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void free_slots(void *unused) {
    (void)unused;
    for (int s = 0; s < AGI_SCRATCH_SLOTS; s++) {
        agi_free(mine.p[s]);
        mine.p[s] = NULL;
        mine.bytes[s] = 0;
    }
}

static void make_key(void) { (void)pthread_key_create(&key, free_slots); }

void *agi_scratch(agi_scratch_slot slot, size_t bytes) {
    if (mine.bytes[slot] >= bytes && mine.p[slot]) return mine.p[slot];
    if (!mine.registered) {
        pthread_once(&key_once, make_key);
        mine.registered = pthread_setspecific(key, &mine) == 0;
    }
    agi_free(mine.p[slot]);
    mine.p[slot] = agi_malloc(bytes);
    mine.bytes[slot] = bytes;
    return mine.p[slot];
}
