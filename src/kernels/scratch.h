// Where the kernels pack a product's operands: the calling thread's scratch
// (agi_thread_scratch, core/parallel.h), cut into a block of op(A) and a block of op(B);
// and, for a product split over the threads, all of op(B) packed once for every slice.
#ifndef ATTOGRAD_SCRATCH_H
#define ATTOGRAD_SCRATCH_H

#include <stddef.h>

enum { AGI_SCRATCH_A_BYTES = 17 << 16, AGI_SCRATCH_B_BYTES = 1 << 19 };

// The calling thread's blocks, AGI_SCRATCH_A_BYTES and AGI_SCRATCH_B_BYTES long, 64-byte
// aligned; their contents last until the thread's next product.
void *agi_scratch_a(void);
void *agi_scratch_b(void);

// At least `bytes` of the calling thread's memory for a shared packed operand, kept and
// grown to the largest size asked (only the thread that splits a product over the others
// asks, the same sizes every step: a repeated step allocates nothing). Freed when the
// thread exits.
void *agi_scratch_shared(size_t bytes);

#endif
