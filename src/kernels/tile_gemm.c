// Register-tiled products (see tile_gemm.h). A tile of C is MR rows by NV vectors of VL
// reals: for each k it loads NV vectors of row k of B and, per row r of the tile, one
// broadcast element of op(A), and accumulates MR * NV fused multiply-adds into registers.
// Tiles are sized so that the accumulators and the B vectors fit the 32 vector registers
// with loads to spare: 8 x 1, 8 x 2, 8 x 3 and 6 x 4 vectors. The last vector of a row of
// tiles is masked when N is not a multiple of VL; a tile past the last row of A reads row
// 0 again (valid memory) and stores nothing.
//
// Sums run over k in order, one fused multiply-add per step, so a result does not depend
// on the tiling, the thread count or the call: the same inputs give the same bits.
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
        on = __builtin_cpu_supports("avx512f") && !(env && strcmp(env, "0") == 0);
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

void R(agi_transpose)(real *dst, int ldd, const real *src, int lds, int rows, int cols) {
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
                               real beta, real *C, int ldc, vmask last) {
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
            VSTOREM(c + v * VL, m, x);
        }
    }
}

// All tiles of a column band of NV vectors, rows MR at a time.
#define BAND(TA, MR, NV)                                                                  \
    for (int m0 = 0; m0 < M; m0 += MR)                                                    \
        tile(TA, MR, NV, M - m0 < MR ? M - m0 : MR, K, alpha,                             \
             TA ? A + m0 : A + (size_t)m0 * lda, lda, B + n0, ldb, beta,                  \
             C + (size_t)m0 * ldc + n0, ldc, last)

TARGET static void tile_gemm_avx512(bool ta, int M, int N, int K, real alpha, const real *A,
                                    int lda, const real *B, int ldb, real beta, real *C,
                                    int ldc) {
    for (int n0 = 0; n0 < N; n0 += 4 * VL) {
        const int width = N - n0 < 4 * VL ? N - n0 : 4 * VL;
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
}
#endif

void R(agi_tile_gemm)(bool ta, int M, int N, int K, real alpha, const real *A, int lda,
                      const real *B, int ldb, real beta, real *C, int ldc) {
    if (M <= 0 || N <= 0) return;
#ifdef AG_HAVE_TILES
    tile_gemm_avx512(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    (void)ta, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta;
    (void)C, (void)ldc;
    abort();  // agi_tile_gemm_available() is false here: callers never come
#endif
}
