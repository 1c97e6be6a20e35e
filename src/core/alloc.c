// The one heap allocator of the library: 64-byte aligned (BLAS kernels run
// measurably faster on aligned rows; see bench/README.md), and counted, so
// tests can prove that a repeated training step allocates nothing.
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

// Each block starts with a 64-byte header holding its size, so frees can be
// accounted without a side table and the payload stays 64-byte aligned.
#define HEADER 64

static atomic_uint_fast64_t n_alloc, n_free;
static atomic_size_t live, peak;

void *agi_malloc(size_t bytes) {
    void *base = NULL;
    // C11 aligned_alloc wants a multiple of the alignment.
    size_t total = (bytes + HEADER + 63) & ~(size_t)63;
    if (bytes > SIZE_MAX - 2 * HEADER || !(base = aligned_alloc(64, total))) {
        fprintf(stderr, "attograd: out of memory allocating %zu bytes\n", bytes);
        abort();
    }
    *(size_t *)base = bytes;
    atomic_fetch_add(&n_alloc, 1);
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
