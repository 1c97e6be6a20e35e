// Register-tiled products (see tile_gemm.h). A tile of C is MR rows by NV vectors of VL
// reals: for each k it loads NV vectors of row k of B and, per row r of the tile, one
// broadcast element of op(A), and accumulates MR * NV fused multiply-adds into registers.
// Tiles are sized so that the accumulators and the B vectors fit the 32 vector registers
// with loads to spare: 8 x 1, 8 x 2, 8 x 3 and 6 x 4 vectors. The last vector of a row of
// tiles is masked when N is not a multiple of VL; a tile past the last row of A reads row
// 0 again (valid memory) and stores nothing.
//
// Sums run over k in order, one fused multiply-add per step, in chunks of KC values of k
// (each chunk's sum added to C), so a result does not depend on the tiling, the thread
// count or the call: the same inputs give the same bits.
#include "tile_gemm.h"

#include "../core/real.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define AG_HAVE_TILES 1
#include <immintrin.h>
#endif

#if AG_ONCE
static atomic_int tiles_state;  // 0: not decided yet, 1: on, 2: off

bool agi_tile_gemm_available(void) {
    int s = atomic_load_explicit(&tiles_state, memory_order_relaxed);
    if (s == 0) {
        bool on = false;
#ifdef AG_HAVE_TILES
        __builtin_cpu_init();
        const char *env = getenv("AG_TILE_GEMM");
        on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && !(env && strcmp(env, "0") == 0);
#endif
        s = on ? 1 : 2;
        atomic_store_explicit(&tiles_state, s, memory_order_relaxed);
    }
    return s == 1;
}

void agi_tile_gemm_enable(bool on) {
    atomic_store(&tiles_state, 0);
    if (!on || !agi_tile_gemm_available()) atomic_store(&tiles_state, 2);
}
#endif


#ifdef AG_HAVE_TILES
#define TARGET __attribute__((target("avx512f")))
#define ALWAYS_INLINE static inline __attribute__((always_inline))

#ifdef AG_REAL_F64
typedef __m512d vec;
typedef __mmask8 vmask;
enum { VL = 8 };
#define VLOADM(m, p) _mm512_maskz_loadu_pd(m, p)
#define VSTOREM(p, m, v) _mm512_mask_storeu_pd(p, m, v)
#define VSET1(x) _mm512_set1_pd(x)
#define VFMA(a, b, c) _mm512_fmadd_pd(a, b, c)
#define VMUL(a, b) _mm512_mul_pd(a, b)
#define VADD(a, b) _mm512_add_pd(a, b)
#define VZERO() _mm512_setzero_pd()
#else
typedef __m512 vec;
typedef __mmask16 vmask;
enum { VL = 16 };
#define VLOADM(m, p) _mm512_maskz_loadu_ps(m, p)
#define VSTOREM(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VZERO() _mm512_setzero_ps()
#endif

// One tile: rows [0, mr) of op(A) (mr <= MR) times columns [0, NV * VL) of B, the last
// vector under mask `last`. TA, MR and NV are constants at every call, so the loops
// unroll and the accumulators live in registers.
TARGET ALWAYS_INLINE void tile(const bool TA, const int MR, const int NV, int mr, int K,
                               real alpha, const real *A, int lda, const real *B, int ldb,
                               real beta, real *C, int ldc, const real *bias, vmask last) {
    vec acc[6 * 4 > 8 * 3 ? 6 * 4 : 8 * 3];
    const real *a[8];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        const int row = r < mr ? r : 0;
        a[r] = TA ? A + row : A + (size_t)row * lda;
    }
#pragma GCC unroll 24
    for (int t = 0; t < MR * NV; t++) acc[t] = VZERO();
    const vmask full = (vmask)-1;
    for (int k = 0; k < K; k++) {
        const real *b = B + (size_t)k * ldb;
        vec bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = VLOADM(v == NV - 1 ? last : full, b + v * VL);
        const size_t ak = TA ? (size_t)k * lda : (size_t)k;
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const vec ar = VSET1(a[r][ak]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r * NV + v] = VFMA(ar, bv[v], acc[r * NV + v]);
        }
    }
    const vec va = VSET1(alpha);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (r >= mr) break;
        real *c = C + (size_t)r * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            const vmask m = v == NV - 1 ? last : full;
            vec x = VMUL(acc[r * NV + v], va);
            if (beta != 0) x = VADD(x, VLOADM(m, c + v * VL));
            if (bias) x = VADD(x, VLOADM(m, bias + v * VL));
            VSTOREM(c + v * VL, m, x);
        }
    }
}

// A square block of VL x VL reals turned in registers: dst[c][r] = src[r][c], the
// unpack / shuffle network of 64 operations for 256 floats (or 24 for 64 doubles) in
// place of a scalar load and store per element.
TARGET ALWAYS_INLINE void transpose_block(real *dst, int ldd, const real *src, int lds) {
#ifdef AG_REAL_F64
    __m512d r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm512_loadu_pd(src + (size_t)i * lds);
    for (int i = 0; i < 4; i++) {  // lane l of t[2i + e]: rows 2i, 2i + 1 of column 2l + e
        t[2 * i] = _mm512_unpacklo_pd(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_pd(r[2 * i], r[2 * i + 1]);
    }
    for (int e = 0; e < 2; e++) {  // column 2l + e: lane l of t[e], t[2 + e], t[4 + e], t[6 + e]
        const __m512d v0 = _mm512_shuffle_f64x2(t[e], t[2 + e], 0x44);
        const __m512d v1 = _mm512_shuffle_f64x2(t[e], t[2 + e], 0xEE);
        const __m512d w0 = _mm512_shuffle_f64x2(t[4 + e], t[6 + e], 0x44);
        const __m512d w1 = _mm512_shuffle_f64x2(t[4 + e], t[6 + e], 0xEE);
        _mm512_storeu_pd(dst + (size_t)(0 + e) * ldd, _mm512_shuffle_f64x2(v0, w0, 0x88));
        _mm512_storeu_pd(dst + (size_t)(2 + e) * ldd, _mm512_shuffle_f64x2(v0, w0, 0xDD));
        _mm512_storeu_pd(dst + (size_t)(4 + e) * ldd, _mm512_shuffle_f64x2(v1, w1, 0x88));
        _mm512_storeu_pd(dst + (size_t)(6 + e) * ldd, _mm512_shuffle_f64x2(v1, w1, 0xDD));
    }
#else
    __m512 r[16], t[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (size_t)i * lds);
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
        _mm512_storeu_ps(dst + (size_t)(0 + c) * ldd, _mm512_shuffle_f32x4(v0, w0, 0x88));
        _mm512_storeu_ps(dst + (size_t)(4 + c) * ldd, _mm512_shuffle_f32x4(v0, w0, 0xDD));
        _mm512_storeu_ps(dst + (size_t)(8 + c) * ldd, _mm512_shuffle_f32x4(v1, w1, 0x88));
        _mm512_storeu_ps(dst + (size_t)(12 + c) * ldd, _mm512_shuffle_f32x4(v1, w1, 0xDD));
    }
#endif
}

// dst[c][r] = src[r][c] for r < rows, c < cols: whole blocks in registers, the edges
// element by element.
TARGET static void transpose_avx512(real *dst, int ldd, const real *src, int lds, int rows,
                                    int cols) {
    const int rb = rows / VL * VL, cb = cols / VL * VL;
    for (int r0 = 0; r0 < rb; r0 += VL)
        for (int c0 = 0; c0 < cb; c0 += VL)
            transpose_block(dst + (size_t)c0 * ldd + r0, ldd, src + (size_t)r0 * lds + c0, lds);
    for (int c = 0; c < cols; c++)
        for (int r = c < cb ? rb : 0; r < rows; r++)
            dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

// One tile of rows [m0, m0 + MR) (fewer at the end) of the band; B points at the band.
#define TILE(TA, MR, NV, rows)                                                            \
    tile(TA, MR, NV, rows, K, alpha, TA ? A + m0 : A + (size_t)m0 * lda, lda, B, ldb,     \
         beta, C + (size_t)m0 * ldc, ldc, bias, last)

// All tiles of a band, rows MR at a time. The last few rows take a tile of 4, 2 or 1
// rows, so that a short product (a single row, in generation) does not pay for MR.
#define BAND(TA, MR, NV)                                                                  \
    for (int m0 = 0; m0 < M; m0 += MR) {                                                  \
        const int rows = M - m0 < MR ? M - m0 : MR;                                       \
        if (rows > 4) TILE(TA, MR, NV, rows);                                             \
        else if (rows > 2) TILE(TA, 4, NV, rows);                                         \
        else if (rows == 2) TILE(TA, 2, NV, 2);                                           \
        else TILE(TA, 1, NV, 1);                                                          \
    }

// C[:, 0:width] (+)= alpha op(A) B for one band of at most 4 vectors of columns.
TARGET static void band(bool ta, int M, int width, int K, real alpha, const real *A, int lda,
                        const real *B, int ldb, real beta, real *C, int ldc,
                        const real *bias) {
    const int nv = (width + VL - 1) / VL, tail = width - (nv - 1) * VL;
    const vmask last = (vmask)(tail == VL ? (vmask)-1 : (vmask)((1u << tail) - 1));
    if (ta) {
        switch (nv) {
        case 1: BAND(true, 8, 1); break;
        case 2: BAND(true, 8, 2); break;
        case 3: BAND(true, 8, 3); break;
        default: BAND(true, 6, 4); break;
        }
    } else {
        switch (nv) {
        case 1: BAND(false, 8, 1); break;
        case 2: BAND(false, 8, 2); break;
        case 3: BAND(false, 8, 3); break;
        default: BAND(false, 6, 4); break;
        }
    }
}

// Blocking, for products larger than the caches: k in chunks of KC and rows in blocks
// of MC (about 384 KB of op(A)), so that a block of op(A) stays in the second-level
// cache while every band of columns runs over it, and a band's chunk of B (KC x 64
// reals) in the first level while every tile of the block reads it; later chunks of k
// add onto what the earlier ones stored. With B^T given (tb), each chunk of a band is
// first turned into rows in a buffer on the stack (64 KB in float, 128 KB in double).
enum { KC = 256, BAND_W = 4 * VL };

TARGET static void tile_gemm_avx512(bool ta, bool tb, int M, int N, int K, real alpha,
                                    const real *A, int lda, const real *B, int ldb, real beta,
                                    real *C, int ldc, const real *bias) {
    real packed[KC * BAND_W];
    for (int k0 = 0; k0 < K || k0 == 0; k0 += KC) {
        const int kc = K - k0 < KC ? K - k0 : KC;
        const real b = k0 ? 1 : beta;
        const real *bias0 = k0 ? NULL : bias;  // the first chunk adds the bias
        // As many rows as keep the block near 384 KB (a multiple of 24 = both tile
        // heights): short sums take long blocks, so a band of B^T is turned fewer times.
        const int MC = kc > 0 ? (384 * 1024 / (kc * (int)sizeof(real)) + 23) / 24 * 24 : M;
        for (int m0 = 0; m0 < M; m0 += MC) {
            const int mc = M - m0 < MC ? M - m0 : MC;
            const real *Ab = ta ? A + (size_t)k0 * lda + m0 : A + (size_t)m0 * lda + k0;
            real *Cb = C + (size_t)m0 * ldc;
            for (int n0 = 0; n0 < N; n0 += BAND_W) {
                const int width = N - n0 < BAND_W ? N - n0 : BAND_W;
                if (tb) {  // packed[k][c] = B^T[k0 + k][n0 + c] = B[n0 + c][k0 + k]
                    transpose_avx512(packed, BAND_W, B + (size_t)n0 * ldb + k0, ldb, width,
                                     kc);
                    band(ta, mc, width, kc, alpha, Ab, lda, packed, BAND_W, b, Cb + n0, ldc,
                         bias0 ? bias0 + n0 : NULL);
                } else {
                    band(ta, mc, width, kc, alpha, Ab, lda, B + (size_t)k0 * ldb + n0, ldb, b,
                         Cb + n0, ldc, bias0 ? bias0 + n0 : NULL);
                }
            }
        }
        if (K <= 0) break;
    }
}
#endif

void R(agi_tile_gemm)(bool ta, bool tb, int M, int N, int K, real alpha, const real *A,
                      int lda, const real *B, int ldb, real beta, real *C, int ldc,
                      const real *bias) {
    if (M <= 0 || N <= 0) return;
#ifdef AG_HAVE_TILES
    tile_gemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
#else
    (void)ta, (void)tb, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta;
    (void)bias;
    (void)C, (void)ldc;
    abort();  // agi_tile_gemm_available() is false here: callers never come
#endif
}

void R(agi_transpose)(real *dst, int ldd, const real *src, int lds, int rows, int cols) {
#ifdef AG_HAVE_TILES
    if (agi_tile_gemm_available()) {
        transpose_avx512(dst, ldd, src, lds, rows, cols);
        return;
    }
#endif
    enum { BLK = 16 };  // a block of each stays in cache while it is turned
    for (int r0 = 0; r0 < rows; r0 += BLK)
        for (int c0 = 0; c0 < cols; c0 += BLK) {
            const int r1 = r0 + BLK < rows ? r0 + BLK : rows;
            const int c1 = c0 + BLK < cols ? c0 + BLK : cols;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++)
                    dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
        }
}
