// Vectorisable float math and the multiversioning of the loops that use it: the one float
// exp of the library (elementwise exp, sigmoid, tanh and SiLU, cross-entropy, the fused
// attention's softmax), and a cheaper 2^-v for GELU. libm's expf and erff are calls the
// compiler cannot vectorise; a libm call per element runs at a tenth of the memory
// bandwidth. The f64 kernels keep libm (float64 is the gradient-checking precision).
//
//   agi_expf: x = n ln2 + r, |r| <= ln2 / 2 (n by rounding, ln2 in two parts as
//     Cody and Waite split it), exp(r) by its Taylor series to r^7 (truncation
//     below 1e-8 relative), times 2^n built in the exponent bits. x is clamped
//     to [-87, 88], so the result is normal and finite: exp(-100) gives 1.6e-38,
//     not 0, and exp(+inf) 1.65e38; a NaN passes through. Callers that need
//     the whole float range, denormals and +inf included (agi_expf_full), or
//     exp of a non-positive score (the softmax) wrap it.
//   agi_exp2f_neg: 2^-v for v >= 0, below.
//
// The multiversioning itself (AGI_HOT, AGI_INLINE) is in src/core/multiversion.h.
#ifndef ATTOGRAD_VECMATH_H
#define ATTOGRAD_VECMATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "../core/multiversion.h"

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

// 2^-v for v >= 0: v = n - f with n = round(v) and |f| <= 1/2, 2^f by a degree-5 polynomial
// 1 + f q(f) (minimax relative error 9.2e-8 on [-1/2, 1/2]; exactly 1 at v = 0), times 2^-n
// built in the exponent bits. Cheaper than agi_expf (no range reduction by ln 2 in two parts,
// one clamp) for callers that fold log2(e) into their argument (GELU: exp(-a^2 / 2) =
// 2^-(a c)^2): one rounding of v becomes v 2^-24 ln 2 relative in the result, as it would in
// exp. agi_exp2f_neg is 0 once the result would be subnormal (v > 126), and NaN for NaN;
// agi_exp2f_neg_clamped is 2^-min(v, 126) (a NaN passes), for sums that start from 1 and
// cannot tell 2^-126 from 0.
AGI_INLINE float agi_exp2f_neg_clamped(float v) {
    const float w = v > 126.0f ? 126.0f : v;  // NaN passes
    const float shifter = 12582912.0f;        // 1.5 * 2^23: adding it rounds to an integer
    const float t = w + shifter, n = t - shifter, f = n - w;
    // q(f) by Estrin's scheme: shorter chains of dependent operations than Horner's.
    const float f2 = f * f;
    const float q01 = 0.693146977507089f + f * 0.240222419210299f;
    const float q23 = 0.0555073379518662f + f * 0.00967152336226525f;
    const float p = 1.0f + f * (q01 + f2 * (q23 + f2 * 0.00132647465924993f));
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);  // n sits in the low mantissa bits of t
    uint32_t scale_bits = (0x4B400000u + 127u - bits) << 23;  // 2^-n, unsigned: no overflow
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return p * scale;
}

AGI_INLINE float agi_exp2f_neg(float v) {
    const float y = agi_exp2f_neg_clamped(v);
    return v > 126.0f ? 0.0f : y;
}

// exp over all floats, as libm's expf: +inf above 88.72, NaN for NaN. Between 88
// (agi_expf's clamp: 2^128 has no float exponent) and 88.72 it is (e^(x/2))^2, x/2 exact;
// below -87 (its other clamp; e^x turns denormal at -87.34) e^(x + 44) e^-44, x + 44 exact
// and one more rounding, as a denormal must have; -inf gives 0.
AGI_INLINE float agi_expf_full(float x) {
    const bool top = x > 88.0f, low = x < -87.0f;
    const float h = agi_expf(top ? 0.5f * x : low ? x + 44.0f : x);
    const float y = top ? h * h : low ? h * 7.781132280e-20f : h;  // e^-44 in float
    return x != x ? x : x > 88.7228394f ? INFINITY : y;
}

#endif
