#include "fnv1a.h"

// The 64-bit FNV prime, 2^40 + 2^8 + 0xb3.
#define FNV1A_PRIME UINT64_C(0x100000001b3)

uint64_t fnv1a(uint64_t h, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV1A_PRIME;
    }
    return h;
}
