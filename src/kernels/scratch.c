// The kernels' scratch (scratch.h): the calling thread's fixed blocks and its growable
// buffer (core/parallel.h), which frees both when the thread exits.
#include "scratch.h"

#include "../core/parallel.h"

_Static_assert(AGI_SCRATCH_A_BYTES + AGI_SCRATCH_B_BYTES <= AGI_THREAD_SCRATCH_BYTES,
               "the packed blocks fit a thread's scratch");

void *agi_scratch_a(void) { return agi_thread_scratch(); }

void *agi_scratch_b(void) { return (char *)agi_thread_scratch() + AGI_SCRATCH_A_BYTES; }

// Only the thread that splits a product over the others asks (agi_parallel_threads is 1
// in a slice), so the calling thread's growable buffer serves all the slices.
void *agi_scratch_shared(size_t bytes) { return agi_thread_buffer(bytes); }
