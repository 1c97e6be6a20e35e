// Float exp and erfc written so that the compiler vectorises the loops that use
// them (libm's expf and erff are calls it cannot vectorise), for the f32
// elementwise kernels (GELU). Both propagate NaN. The f64 kernels keep libm.
//
//   agi_expf: x = n ln2 + r, |r| <= ln2 / 2 (n by rounding, ln2 in two parts as
//     Cody and Waite split it), exp(r) by its Taylor series to r^7 (truncation
//     below 1e-8 relative), times 2^n built in the exponent bits. x is clamped
//     to [-87, 88], so the result is normal and finite: exp(-100) gives 1.6e-38,
//     not 0, and exp(+inf) 1.65e38, which the callers below tolerate.
//   agi_erfcf (z >= 0): the Chebyshev fit of erfc in Numerical Recipes (erfcc),
//     relative error below 1.2e-7 for every z >= 0, so Phi(x) = erfc(-x/sqrt2)/2
//     keeps its relative accuracy far into the tail (where GELU is tiny).
//
// Loops that call them are compiled for AVX2 and for the baseline (function
// multiversioning, as in attention.c); the functions must be inlined into each.
#ifndef ATTOGRAD_VECMATH_H
#define ATTOGRAD_VECMATH_H

#include <stdint.h>
#include <string.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define AGI_NO_CLONES
#endif
#endif
#ifdef __SANITIZE_THREAD__
#define AGI_NO_CLONES
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute) && !defined(AGI_NO_CLONES)
#if __has_attribute(target_clones) && __has_attribute(always_inline)
#define AGI_HOT __attribute__((target_clones("avx2", "default")))
#define AGI_INLINE static inline __attribute__((always_inline))
#endif
#endif
#ifndef AGI_HOT
#define AGI_HOT
#define AGI_INLINE static inline
#endif

AGI_INLINE float agi_expf(float x) {
    x = x < -87.0f ? -87.0f : x;  // comparisons with NaN are false: NaN passes
    x = x > 88.0f ? 88.0f : x;
    const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    float t = x * 1.44269504088896341f + shifter;
    float n = t - shifter;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);  // n sits in the low mantissa bits of t
    float r = x - n * 0.693145751953125f - n * 1.428606820309417232e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.66666672e-1f + r * (4.16666679e-2f +
              r * (8.33333377e-3f + r * (1.38888892e-3f + r * 1.98412701e-4f))))));
    uint32_t scale_bits = (bits - 0x4B400000u + 127u) << 23;  // 2^n, unsigned: no overflow
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return p * scale;
}

AGI_INLINE float agi_erfcf(float z) {
    float t = 1.0f / (1.0f + 0.5f * z);
    float poly = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
                 t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
                 t * (-0.82215223f + t * 0.17087277f))))))));
    return t * agi_expf(-z * z + poly);
}

#endif
