// attograd/random.h — pcg32 (PCG-XSH-RR 64/32), the only source of randomness.
//
// Written from the published algorithm (M. E. O'Neill, "PCG: A Family of
// Simple Fast Space-Efficient Statistically Good Algorithms for Random Number
// Generation", 2014): a 64-bit LCG whose state is permuted into a 32-bit
// output by an xorshift and a data-dependent rotation. A generator is a plain
// value; it is always passed explicitly, never global.
//
// Streams: `initseq` picks one of 2^63 independent sequences. `advance` jumps
// ahead (or back, with a negative delta in two's complement) in O(log delta),
// which is how dropout replays the mask of one row from (seed, stream, offset).
#ifndef ATTOGRAD_RANDOM_H
#define ATTOGRAD_RANDOM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ag_pcg32 {
    uint64_t state;
    uint64_t inc;  // always odd; encodes the stream
} ag_pcg32;

// Seeds exactly as pcg32_srandom_r does, so (42, 54) reproduces the
// reference output published with pcg32.
void ag_pcg32_seed(ag_pcg32 *rng, uint64_t initstate, uint64_t initseq);
ag_pcg32 ag_pcg32_make(uint64_t initstate, uint64_t initseq);

uint32_t ag_pcg32_next(ag_pcg32 *rng);

// Uniform in [0, bound) without modulo bias (rejection below 2^32 mod bound).
// Bound 0 stands for 2^32: one ag_pcg32_next.
uint32_t ag_pcg32_bounded(ag_pcg32 *rng, uint32_t bound);

// Moves the generator `delta` steps; (uint64_t)-k steps back by k.
void ag_pcg32_advance(ag_pcg32 *rng, uint64_t delta);

// Uniform in [0, 1): 53 random bits from two outputs (double), 24 from one (float).
double ag_pcg32_double(ag_pcg32 *rng);
float ag_pcg32_float(ag_pcg32 *rng);

// Standard normal by the Box-Muller transform; consumes four outputs, keeps no
// cached second value, so the generator's position stays easy to reason about.
double ag_pcg32_normal(ag_pcg32 *rng);

#ifdef __cplusplus
}
#endif
#endif
