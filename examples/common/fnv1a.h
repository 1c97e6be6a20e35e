// FNV-1a, 64 bits: a few bits that tell two byte strings apart. What a checkpoint
// records of the text it was trained on, and what the processes of a data-parallel
// run compare of their flags, data and model (dist_agree.h). Not for security.
#ifndef EXAMPLES_FNV1A_H
#define EXAMPLES_FNV1A_H

#include <stddef.h>
#include <stdint.h>

// The hash of no bytes: where a hash starts.
#define FNV1A_START UINT64_C(0xcbf29ce484222325)

// The hash `h` continued over n bytes: fnv1a(fnv1a(FNV1A_START, a, n), b, m) is the
// hash of a followed by b.
uint64_t fnv1a(uint64_t h, const void *bytes, size_t n);

#endif
