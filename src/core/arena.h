// A bump allocator made of blocks that are kept across resets.
//
// Why blocks and not one growing buffer: pointers into the arena must stay
// valid while a step runs, so it can never move. Why keep them on reset: a
// training step repeats the allocations of the previous one in the same order
// and sizes, so after the first step every request lands in a block that
// already exists and the step allocates nothing.
#ifndef ATTOGRAD_ARENA_H
#define ATTOGRAD_ARENA_H

#include <stdbool.h>
#include <stddef.h>

typedef struct agi_block agi_block;

typedef struct agi_arena {
    agi_block *first, *cur;
    size_t used;      // bytes handed out since the last reset (with padding)
    size_t reserved;  // bytes owned by all blocks
    size_t peak;
} agi_arena;

void agi_arena_init(agi_arena *a);
void *agi_arena_alloc(agi_arena *a, size_t bytes);  // 64-byte aligned
void agi_arena_reset(agi_arena *a);
void agi_arena_free(agi_arena *a);
// Whether p points into one of the arena's blocks.
bool agi_arena_owns(const agi_arena *a, const void *p);

#endif
