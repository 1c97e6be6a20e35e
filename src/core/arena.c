#include "arena.h"

#include "internal.h"

#define ALIGN 64
#define MIN_BLOCK ((size_t)1 << 20)

struct agi_block {
    agi_block *next;
    size_t size, used;
    unsigned char *mem;
};

void agi_arena_init(agi_arena *a) {
    a->first = a->cur = NULL;
    a->used = a->reserved = a->peak = 0;
}

static agi_block *block_new(size_t size) {
    agi_block *b = agi_malloc(sizeof *b);
    b->next = NULL;
    b->size = size;
    b->used = 0;
    b->mem = agi_malloc(size);
    return b;
}

void *agi_arena_alloc(agi_arena *a, size_t bytes) {
    size_t need = (bytes + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    if (need == 0) need = ALIGN;
    // Walk forward through blocks kept from earlier steps before creating one;
    // a block too small for this request is skipped (its tail stays unused).
    while (a->cur && a->cur->used + need > a->cur->size) {
        if (!a->cur->next) break;
        a->cur = a->cur->next;
    }
    if (!a->cur || a->cur->used + need > a->cur->size) {
        // Double the arena each time, so the number of blocks stays logarithmic.
        size_t size = a->reserved > MIN_BLOCK ? a->reserved : MIN_BLOCK;
        if (size < need) size = need;
        agi_block *b = block_new(size);
        if (a->cur) {
            b->next = a->cur->next;
            a->cur->next = b;
        } else {
            a->first = b;
        }
        a->cur = b;
        a->reserved += size;
    }
    void *p = a->cur->mem + a->cur->used;
    a->cur->used += need;
    a->used += need;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

void agi_arena_reset(agi_arena *a) {
    for (agi_block *b = a->first; b; b = b->next) b->used = 0;
    a->cur = a->first;
    a->used = 0;
}

bool agi_arena_owns(const agi_arena *a, const void *p) {
    const unsigned char *q = p;
    for (const agi_block *b = a->first; b; b = b->next)
        if (q >= b->mem && q < b->mem + b->size) return true;
    return false;
}

void agi_arena_free(agi_arena *a) {
    agi_block *b = a->first;
    while (b) {
        agi_block *next = b->next;
        agi_free(b->mem);
        agi_free(b);
        b = next;
    }
    agi_arena_init(a);
}
