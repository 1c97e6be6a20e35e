// Per-thread scratch memory of the kernels: the packed panels of a product. Each slot of
// a thread grows to the largest size asked of it and is kept (so a repeated training step
// allocates nothing after the first); a thread's slots are freed when it exits.
#ifndef ATTOGRAD_SCRATCH_H
#define ATTOGRAD_SCRATCH_H

#include <stddef.h>

typedef enum {
    AGI_SCRATCH_A,       // a block of packed rows of op(A)
    AGI_SCRATCH_B,       // a block of packed columns of op(B)
    AGI_SCRATCH_SHARED,  // the whole packed op(B) of a product split over the threads
    AGI_SCRATCH_SLOTS
} agi_scratch_slot;

// At least `bytes` of 64-byte aligned memory of the calling thread's slot, valid until
// the thread asks the same slot again or exits; its contents are not kept across a
// growth.
void *agi_scratch(agi_scratch_slot slot, size_t bytes);

#endif
