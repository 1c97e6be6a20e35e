// pcg32: PCG-XSH-RR with 64-bit state and 32-bit output, written from the
// published algorithm (O'Neill 2014, pcg-random.org).
#include <math.h>

#include "attograd/random.h"

// The LCG multiplier of the PCG paper (Knuth's MMIX constant).
#define PCG_MULT 6364136223846793005ULL

uint32_t ag_pcg32_next(ag_pcg32 *rng) {
    uint64_t old = rng->state;
    rng->state = old * PCG_MULT + rng->inc;
    // Output permutation on the OLD state: xorshift the high bits down, keep
    // 32 of them, then rotate by the top 5 bits, so even the weak low bits of
    // the LCG never reach the output unpermuted.
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31u));
}

void ag_pcg32_seed(ag_pcg32 *rng, uint64_t initstate, uint64_t initseq) {
    rng->state = 0u;
    rng->inc = (initseq << 1u) | 1u;  // the increment must be odd
    ag_pcg32_next(rng);
    rng->state += initstate;
    ag_pcg32_next(rng);
}

ag_pcg32 ag_pcg32_make(uint64_t initstate, uint64_t initseq) {
    ag_pcg32 r;
    ag_pcg32_seed(&r, initstate, initseq);
    return r;
}

uint32_t ag_pcg32_bounded(ag_pcg32 *rng, uint32_t bound) {
    // 2^32 wraps to 0 in a uint32_t: read bound 0 as that full range, where
    // the reference's -bound % bound would divide by zero.
    if (bound == 0) return ag_pcg32_next(rng);
    // Reject the lowest 2^32 mod bound outputs: what remains is a whole number
    // of copies of [0, bound), so the modulo is unbiased.
    uint32_t threshold = (uint32_t)(-bound) % bound;
    for (;;) {
        uint32_t r = ag_pcg32_next(rng);
        if (r >= threshold) return r % bound;
    }
}

void ag_pcg32_advance(ag_pcg32 *rng, uint64_t delta) {
    // Jump ahead in O(log delta) (Brown, "Random Number Generation with
    // Arbitrary Strides", 1994): s -> M s + C is an affine map, and composing
    // it with itself squares it; accumulate the maps for the set bits of delta.
    uint64_t cur_mult = PCG_MULT, cur_plus = rng->inc;
    uint64_t acc_mult = 1u, acc_plus = 0u;
    while (delta > 0) {
        if (delta & 1u) {
            acc_mult *= cur_mult;
            acc_plus = acc_plus * cur_mult + cur_plus;
        }
        cur_plus = (cur_mult + 1u) * cur_plus;
        cur_mult *= cur_mult;
        delta >>= 1u;
    }
    rng->state = acc_mult * rng->state + acc_plus;
}

double ag_pcg32_double(ag_pcg32 *rng) {
    uint64_t hi = ag_pcg32_next(rng) >> 5;  // 27 bits
    uint64_t lo = ag_pcg32_next(rng) >> 6;  // 26 bits
    return (double)((hi << 26) | lo) * (1.0 / 9007199254740992.0);  // / 2^53
}

float ag_pcg32_float(ag_pcg32 *rng) {
    return (float)(ag_pcg32_next(rng) >> 8) * (1.0f / 16777216.0f);  // / 2^24
}

double ag_pcg32_normal(ag_pcg32 *rng) {
    // 1 - u lies in (0, 1], so the log is finite.
    double u1 = 1.0 - ag_pcg32_double(rng);
    double u2 = ag_pcg32_double(rng);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}
