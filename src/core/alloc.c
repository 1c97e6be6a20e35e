// The one heap allocator of the library: 64-byte aligned (BLAS kernels run
// measurably faster on aligned rows; see bench/README.md), and counted, so
// tests can prove that a repeated training step allocates nothing.
//
// Large blocks (a tape's arena, a model's parameters and gradients) start on a 2 MiB
// boundary and ask Linux for transparent huge pages (madvise; where the system leaves
// them to the program's choice, as Debian does): a product streaming weights of several
// MB then misses the TLB far less, and memory touched for the first time faults once per
// 2 MiB instead of once per 4 KiB page (bench/README.md has both measured). Elsewhere
// the advice is skipped and nothing else changes.
#define _DEFAULT_SOURCE  // madvise, MADV_HUGEPAGE
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "internal.h"

// Each block starts with a 64-byte header holding its size, so frees can be
// accounted without a side table and the payload stays 64-byte aligned.
#define HEADER 64

static atomic_uint_fast64_t n_alloc, n_free;
static atomic_size_t live, peak;
// Blocks obtained by the calling thread, and by the pool's workers in its jobs
// (agi_allocations_credit): what ag_op_check counts, which another user thread's
// allocations, made meanwhile, must not disturb.
static _Thread_local uint64_t allocations_here;

uint64_t agi_allocations_here(void) { return allocations_here; }

void agi_allocations_credit(uint64_t n) { allocations_here += n; }

#define HUGE_PAGE ((size_t)2 << 20)
// Blocks from this size on are huge-page aligned: the alignment wastes less than a
// huge page of address space (never touched, so never memory) per block.
#define HUGE_BLOCK (4 * HUGE_PAGE)

void *agi_malloc(size_t bytes) {
    void *base = NULL;
    if (bytes > SIZE_MAX - 2 * HUGE_PAGE) {
        fprintf(stderr, "attograd: out of memory allocating %zu bytes\n", bytes);
        abort();
    }
    const bool huge = bytes >= HUGE_BLOCK;
    const size_t align = huge ? HUGE_PAGE : 64;
    // C11 aligned_alloc wants a multiple of the alignment.
    const size_t total = (bytes + HEADER + align - 1) & ~(align - 1);
    if (!(base = aligned_alloc(align, total))) {
        fprintf(stderr, "attograd: out of memory allocating %zu bytes\n", bytes);
        abort();
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge) (void)madvise(base, total, MADV_HUGEPAGE);  // advice: its failure changes nothing
#endif
    *(size_t *)base = bytes;
    atomic_fetch_add(&n_alloc, 1);
    allocations_here++;
    size_t now = atomic_fetch_add(&live, bytes) + bytes;
    size_t old = atomic_load(&peak);
    while (now > old && !atomic_compare_exchange_weak(&peak, &old, now)) {
    }
    return (char *)base + HEADER;
}

void *agi_calloc(size_t bytes) {
    void *p = agi_malloc(bytes);
    memset(p, 0, bytes);
    return p;
}

void agi_free(void *p) {
    if (!p) return;
    char *base = (char *)p - HEADER;
    atomic_fetch_add(&n_free, 1);
    atomic_fetch_sub(&live, *(size_t *)base);
    free(base);
}

char *agi_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = agi_malloc(n);
    memcpy(d, s, n);
    return d;
}

void *agi_reserve(void *arr, int *cap, int count, int need, int first, size_t elem) {
    if (need <= *cap) return arr;
    int c = *cap ? *cap : first;
    while (c < need) c = c > INT_MAX / 2 ? INT_MAX : 2 * c;
    size_t bytes;
    if (!agi_size_mul((size_t)c, elem, &bytes)) {
        fprintf(stderr, "attograd: out of memory growing an array to %d elements of %zu bytes\n",
                c, elem);
        abort();
    }
    void *grown = agi_malloc(bytes);
    if (count) memcpy(grown, arr, (size_t)count * elem);
    agi_free(arr);
    *cap = c;
    return grown;
}

ag_memory_stats ag_memory_usage(void) {
    ag_memory_stats s;
    s.allocations = atomic_load(&n_alloc);
    s.frees = atomic_load(&n_free);
    s.bytes_live = atomic_load(&live);
    s.bytes_peak = atomic_load(&peak);
    return s;
}
