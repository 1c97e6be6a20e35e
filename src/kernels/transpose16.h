// A 16 x 16 block of 32-bit lanes turned in registers (AVX-512): r[i] holds row i before
// and column i after. The unpack / shuffle network of 64 operations for 256 lanes, in
// place of a scalar load and store per element; the packing of products uses it on
// floats and on pairs of bfloat16.
#ifndef ATTOGRAD_TRANSPOSE16_H
#define ATTOGRAD_TRANSPOSE16_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx512f"))) static inline __attribute__((always_inline)) void
agi_transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {  // lane l of t[2i]: rows 2i, 2i + 1 of columns 4l, 4l + 1
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {  // lane l of u[4i + c]: rows 4i..4i + 3 of column 4l + c
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {  // column 4l + c: lane l of u[c], u[4 + c], u[8 + c], u[12 + c]
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        const __m512 w1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[0 + c] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}
#endif

#endif
