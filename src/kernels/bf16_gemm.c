// Products with bfloat16 operands and float32 sums (see bf16_gemm.h).
//
// vdpbf16ps takes, in each of 16 lanes, a pair of bf16 values of each operand (the two
// halves of a 32-bit word) and adds both products to a float32 sum. Measured on this
// instruction (AMD Zen 5, every lane of 32 million random cases, ranges chosen to reach
// overflow, cancellation and subnormals), it computes, one rounding (to nearest even) at
// each step and with subnormal results and inputs taken as zeros of their sign,
//     s = ftz(fma(a_odd, b_odd, s));  s = ftz(fma(a_even, b_even, s))
// the odd (high) halves first. This is Intel's documented order; the fused form matters
// only where a product overflows or underflows float32 (a bf16 product is exact in
// float32 otherwise). The portable path below does exactly those steps with fmaf, on
// operands rounded as vcvtne2ps2bf16 rounds (checked on all 2^32 floats), packed into the
// same pairs: k = 2p in the low half and 2p + 1 in the high half of pair p, an odd K
// padded with a zero. So the two paths give the same bits, and tests on a machine with
// the instruction compare them.
//
// The blocking follows tile_gemm.c's, with pairs of k where it has k: a register tile of
// 12 rows by 2 vectors (24 accumulators, each vdpbf16ps two k deep), chunks of KC = 512
// values of k (256 pairs, so panels take the bytes of tile_gemm's float panels), blocks of
// NC = 512 columns of op(B). Both operands are always packed (the packing rounds them).
// Each chunk's sum times alpha is added to C in turn, so the result depends only on K.
// A product large enough is cut over the threads as tile_gemm's are (product_split.c),
// with op(A) always packed: by columns, op(A) packed once for all slices, or by rows,
// op(B) packed once for all slices.
#include "bf16_gemm.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "../core/parallel.h"
#include "cpu_switch.h"
#include "product_split.h"
#include "scratch.h"
#include "transpose16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define AG_HAVE_BF16_TILES 1
#include <immintrin.h>
#endif

static bool cpu_runs_vdpbf16ps(void) {
#ifdef AG_HAVE_BF16_TILES
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

static agi_cpu_switch native = {0, "AG_BF16_NATIVE", cpu_runs_vdpbf16ps};

bool agi_bf16_native(void) { return agi_cpu_switch_on(&native); }

void agi_bf16_native_enable(bool on) { agi_cpu_switch_set(&native, on); }

uint16_t agi_bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t exponent = (u >> 23) & 0xFF, mantissa = u & 0x7FFFFF;
    if (exponent == 0xFF && mantissa) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    if (exponent == 0) return (uint16_t)((u >> 16) & 0x8000);              // zero, subnormal
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);  // to nearest even (inf stays)
}

float agi_bf16_value(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t pair_of(float even, float odd) {
    return (uint32_t)agi_bf16_round(even) | (uint32_t)agi_bf16_round(odd) << 16;
}

// Loops that step by a block or a tile over an extent (an int) count in ptrdiff_t: the step
// past the last block would pass INT_MAX for an extent within a block of it.

// The register tile, the k chunk (in k and in pairs), a block of columns of op(B) and the
// most rows of op(A) packed at once: the bytes of tile_gemm.c's float blocks.
enum { MR = 12, VL = 16, NV = 2, NR = NV * VL, KC = 512, KP = KC / 2 };
enum { NC = 512 * 1024 / (KP * 4) / NR * NR, MC_MAX = 2048 * 1024 / (KP * 4) / MR * MR };
_Static_assert((MC_MAX + MR) * KP * sizeof(uint32_t) <= AGI_SCRATCH_A_BYTES &&
                   NC * KP * sizeof(uint32_t) <= AGI_SCRATCH_B_BYTES,
               "the blocks fit the scratch");

// ---- Packing: pairs of rounded values, panels of MR rows and NR columns ----------------
//
// Panel i of op(A) (rows i MR ..) holds word [p MR + r] = op(A)[r][2p], op(A)[r][2p + 1];
// panel j of op(B) word [p NR + c] = op(B)[2p][c], op(B)[2p + 1][c]. Values past K, past
// the last row and past the last column are zeros. The operands point at element [0][0]
// of the chunk; op(A)[r][k] = A[r lda + k], or A[k lda + r] (ta); op(B)[k][c] = B[k ldb +
// c], or B[c ldb + k] (tb).

// op(X)[i][j] of X given as itself, or as its transpose.
static float element(const float *X, size_t ld, bool transposed, int i, int j) {
    return transposed ? X[(size_t)j * ld + i] : X[(size_t)i * ld + j];
}

// Rows [0, mc) and k [0, kc) of op(A), element by element (the portable path, and the
// native path's edges).
// Panels of `width` rows of op(X) (op(X)[r][k] = element(X, ld, transposed, r, k)), rows
// [0, n) of it: the panels from row i0 to i1, the pairs from p0 on. op(A) is such an
// operand with width MR; op(B)^T with width NR.
static void pack_portable(const float *X, size_t ld, bool transposed, int width, int kc,
                          int n, int i0, int i1, int p0, uint32_t *dst) {
    const int kp = (kc + 1) / 2;
    for (ptrdiff_t i = i0; i < i1; i += width)
        for (int p = p0; p < kp; p++)
            for (int r = 0; r < width; r++) {
                const bool in = r < n - i;  // i + r < n, which i + r itself might pass INT_MAX
                const int row = in ? (int)i + r : 0, k = 2 * p;
                const float e = in ? element(X, ld, transposed, row, k) : 0;
                const float o = in && k + 1 < kc ? element(X, ld, transposed, row, k + 1) : 0;
                dst[(size_t)i * kp + (size_t)p * width + r] = pair_of(e, o);
            }
}

// ---- The portable tile: the instruction's steps in scalar code ------------------------

static float flush(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

static void tile_portable(int mr, int nr, int kp, const uint32_t *Ap, const uint32_t *Bp,
                          float alpha, float beta, const float *bias, float *C, int ldc) {
    for (int r = 0; r < mr; r++) {
        float acc[NR] = {0};
        for (int p = 0; p < kp; p++) {
            const uint32_t a = Ap[(size_t)p * MR + r];
            const float a_even = agi_bf16_value((uint16_t)a), a_odd = agi_bf16_value(a >> 16);
            for (int c = 0; c < NR; c++) {
                const uint32_t b = Bp[(size_t)p * NR + c];
                acc[c] = flush(fmaf(a_odd, agi_bf16_value(b >> 16), acc[c]));
                acc[c] = flush(fmaf(a_even, agi_bf16_value((uint16_t)b), acc[c]));
            }
        }
        float *row = C + (size_t)r * ldc;
        for (int c = 0; c < nr; c++) {
            float x = acc[c] * alpha;
            if (beta != 0) x = x + row[c];
            if (bias) x = x + bias[c];
            row[c] = x;
        }
    }
}

// ---- The native path: vcvtne2ps2bf16 packing, vdpbf16ps tiles -------------------------
#ifdef AG_HAVE_BF16_TILES
#define TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline __mmask16 lanes(int n) {
    return n >= VL ? (__mmask16)-1 : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

// The words (even[c], odd[c]) for c < 16, rounded: 16 bf16 of each row side by side, then
// interleaved.
TARGET ALWAYS_INLINE __m512i pairs(__m512 even, __m512 odd) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

// n <= 32 consecutive floats (zeros after them) as 16 words of pairs (x[2p], x[2p + 1]).
TARGET ALWAYS_INLINE __m512i pairs_of_row(const float *x, int n) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(lanes(n - 16), x + 16),
                                        _mm512_maskz_loadu_ps(lanes(n), x));
}

// dst[c][r] = src[r][c] for a 16 x 16 block of 32-bit words in registers: `rows` words of
// each of the first `cols` rows of dst.
TARGET ALWAYS_INLINE void transpose_words(__m512i w[16], uint32_t *dst, int ldd, int rows,
                                          int cols) {
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_castsi512_ps(w[i]);
    agi_transpose16(r);
    const __mmask16 m = lanes(rows);
    for (int c = 0; c < cols; c++) _mm512_mask_storeu_ps(dst + (size_t)c * ldd, m, r[c]);
}

enum { PACK_PAIRS = 8 };  // pairs copied across all panels at a time (see tile_gemm.c)

// The transposing packings (op(A) given as A, op(B) as B^T) read a panel's rows 32 floats
// at a time, the rows of each panel in turn, from L3 or memory; the lines they will read
// AHEAD blocks of 32 later (in the next panel after the last block) are prefetched.
enum { AHEAD = 2 };

// Rows [0, n) (n <= 32) of a panel of `rows` rows of X (row stride ld) from x = X + 32 b,
// b = the block the packing is at plus AHEAD: the same panel while b < blocks (32-float
// blocks in a row of kc), else the next panel's at b - blocks.
TARGET ALWAYS_INLINE void prefetch_ahead(const float *X, size_t ld, int kc, int b, int rows,
                                          int next, int r0, int r1) {
    const int blocks = (kc + 31) / 32;
    if (b >= blocks) X += (size_t)rows * ld, b -= blocks, r1 = r1 < next ? r1 : next;
    if (b >= blocks) return;
    for (int r = r0; r < r1; r++) {
        const float *x = X + (size_t)r * ld + 32 * b;
        _mm_prefetch((const char *)x, _MM_HINT_T0);
        if (kc - 32 * b > 16) _mm_prefetch((const char *)(x + 16), _MM_HINT_T0);
    }
}

// Panels of op(A): from A^T (rows of pairs of rows, interleaved), or from A (32 values of
// k of each row turned into 16 pairs, then 16 x 16 words transposed).
TARGET static void pack_a_native(bool ta, const float *A, size_t lda, int kc, int mc,
                                 uint32_t *dst) {
    const int kp = (kc + 1) / 2;
    if (ta) {
        const int full = kc / 2;  // pairs with both rows
        for (int p0 = 0; p0 < full; p0 += PACK_PAIRS)
            for (ptrdiff_t i = 0; i < mc; i += MR) {
                uint32_t *d = dst + (size_t)i * kp;
                const __mmask16 m = lanes(mc - i);
                const int p1 = full - p0 < PACK_PAIRS ? full : p0 + PACK_PAIRS;
                for (int p = p0; p < p1; p++) {
                    const float *e = A + (size_t)(2 * p) * lda + i;
                    const __m512i w = pairs(_mm512_maskz_loadu_ps(m, e),
                                            _mm512_maskz_loadu_ps(m, e + lda));
                    _mm512_mask_storeu_epi32(d + (size_t)p * MR, lanes(MR), w);
                }
            }
        if (full < kp) pack_portable(A, lda, ta, MR, kc, mc, 0, mc, full, dst);
        return;
    }
    for (ptrdiff_t i = 0; i < mc; i += MR) {  // 32 values of k of each row at a time
        uint32_t *d = dst + (size_t)i * kp;
        const int rows = mc - i < MR ? mc - i : MR;
        const int next = mc - i - MR < MR ? mc - i - MR : MR;  // the next panel's rows
        for (int p = 0; p < kp; p += 16) {
            prefetch_ahead(A + (size_t)i * lda, lda, kc, p / 16 + AHEAD, MR, next, 0, rows);
            __m512i w[16];
            for (int r = 0; r < 16; r++)
                w[r] = r < rows ? pairs_of_row(A + (size_t)(i + r) * lda + 2 * p, kc - 2 * p)
                                : _mm512_setzero_si512();
            transpose_words(w, d + (size_t)p * MR, MR, MR, kp - p < 16 ? kp - p : 16);
        }
    }
}

TARGET static void pack_b_native(bool tb, const float *B, size_t ldb, int kc, int nc,
                                 uint32_t *dst) {
    const int kp = (kc + 1) / 2;
    if (!tb) {
        const int full = kc / 2;
        for (int p0 = 0; p0 < full; p0 += PACK_PAIRS)
            for (ptrdiff_t j = 0; j < nc; j += NR) {
                uint32_t *d = dst + (size_t)j * kp;
                const int p1 = full - p0 < PACK_PAIRS ? full : p0 + PACK_PAIRS;
                for (int p = p0; p < p1; p++)
                    for (int v = 0; v < NV; v++) {
                        const __mmask16 m = lanes(nc - j - v * VL);
                        const float *e = B + (size_t)(2 * p) * ldb + j + v * VL;
                        _mm512_storeu_si512(d + (size_t)p * NR + v * VL,
                                            pairs(_mm512_maskz_loadu_ps(m, e),
                                                  _mm512_maskz_loadu_ps(m, e + ldb)));
                    }
            }
        if (full < kp) pack_portable(B, ldb, !tb, NR, kc, nc, 0, nc, full, dst);
        return;
    }
    for (ptrdiff_t j = 0; j < nc; j += NR) {  // 32 values of k of each column at a time
        uint32_t *d = dst + (size_t)j * kp;
        const int next = nc - j - NR < NR ? nc - j - NR : NR;  // the next panel's rows
        for (int p = 0; p < kp; p += 16)
            for (int v = 0; v < NV; v++) {
                prefetch_ahead(B + (size_t)j * ldb, ldb, kc, p / 16 + AHEAD, NR, next, v * VL,
                               nc - j < v * VL + VL ? nc - j : v * VL + VL);
                __m512i w[16];
                for (int c = 0; c < 16; c++)
                    w[c] = v * VL + c < nc - j
                               ? pairs_of_row(B + (size_t)(j + v * VL + c) * ldb + 2 * p,
                                              kc - 2 * p)
                               : _mm512_setzero_si512();
                transpose_words(w, d + (size_t)p * NR + v * VL, NR, 16,
                                kp - p < 16 ? kp - p : 16);
            }
    }
}

TARGET ALWAYS_INLINE void tile_bf16(const int MT, const int NT, int mr, int nr, int kp,
                                    const uint32_t *Ap, const uint32_t *Bp, float alpha,
                                    float beta, const float *bias, float *C, int ldc) {
    __m512 acc[MR * NV];
    __mmask16 m[NV];
#pragma GCC unroll 12
    for (int r = 0; r < MT; r++)
        if (r < mr) {
            _mm_prefetch((const char *)(C + (size_t)r * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + (size_t)r * ldc + NT * VL - 1), _MM_HINT_T0);
        }
#pragma GCC unroll 2
    for (int v = 0; v < NT; v++) m[v] = lanes(nr - v * VL);
#pragma GCC unroll 24
    for (int t = 0; t < MT * NT; t++) acc[t] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int p = 0; p < kp; p++) {
        __m512bh bv[NV];
#pragma GCC unroll 2
        for (int v = 0; v < NT; v++)
            bv[v] = (__m512bh)_mm512_loadu_si512(Bp + (size_t)p * NR + v * VL);
#pragma GCC unroll 12
        for (int r = 0; r < MT; r++) {
            const __m512bh ar = (__m512bh)_mm512_set1_epi32((int)Ap[(size_t)p * MR + r]);
#pragma GCC unroll 2
            for (int v = 0; v < NT; v++)
                acc[r * NT + v] = _mm512_dpbf16_ps(acc[r * NT + v], ar, bv[v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 12
    for (int r = 0; r < MT; r++) {
        if (r >= mr) break;
        float *c = C + (size_t)r * ldc;
#pragma GCC unroll 2
        for (int v = 0; v < NT; v++) {
            __m512 x = _mm512_mul_ps(acc[r * NT + v], va);
            if (beta != 0) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m[v], c + v * VL));
            if (bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m[v], bias + v * VL));
            _mm512_mask_storeu_ps(c + v * VL, m[v], x);
        }
    }
}

TARGET static void tile_native(int rows, int cols, int kp, const uint32_t *Ap,
                               const uint32_t *Bp, float alpha, float beta, const float *bias,
                               float *C, int ldc) {
    if (cols > VL) {
        if (rows > 4) tile_bf16(MR, 2, rows, cols, kp, Ap, Bp, alpha, beta, bias, C, ldc);
        else if (rows > 1) tile_bf16(4, 2, rows, cols, kp, Ap, Bp, alpha, beta, bias, C, ldc);
        else tile_bf16(1, 2, rows, cols, kp, Ap, Bp, alpha, beta, bias, C, ldc);
    } else {
        if (rows > 4) tile_bf16(MR, 1, rows, cols, kp, Ap, Bp, alpha, beta, bias, C, ldc);
        else if (rows > 1) tile_bf16(4, 1, rows, cols, kp, Ap, Bp, alpha, beta, bias, C, ldc);
        else tile_bf16(1, 1, rows, cols, kp, Ap, Bp, alpha, beta, bias, C, ldc);
    }
}
#endif

// ---- The blocking and the threads --------------------------------------------------------

typedef struct {
    agi_product_split s;  // first: its callbacks get the product back
    bool ta, tb, native;
    int lda, ldb, ldc;
    size_t mpad, npad;  // M and N rounded up to whole tiles (past INT_MAX near it)
    float alpha, beta;
    const float *A, *B, *bias;
    float *C;
} product;
// All of op(A) packed for the slices (s.a_packed) holds chunk k0 at k0 / 2 mpad words,
// panel i of it at + i kp; all of op(B) (s.b_packed) chunk k0 at k0 / 2 npad, panel j at
// + j kp.

// Rows [0, n) of op(A) (b false), or columns of op(B) (b true), k in [0, kc), into panels
// by the product's path.
static void pack(const product *p, bool b, const float *X, int kc, int n, uint32_t *dst) {
#ifdef AG_HAVE_BF16_TILES
    if (p->native) {
        if (b)
            pack_b_native(p->tb, X, (size_t)p->ldb, kc, n, dst);
        else
            pack_a_native(p->ta, X, (size_t)p->lda, kc, n, dst);
        return;
    }
#endif
    pack_portable(X, (size_t)(b ? p->ldb : p->lda), b ? !p->tb : p->ta, b ? NR : MR, kc, n, 0, n,
                  0, dst);
}

static const float *a_at(const product *p, int m0, int k0) {  // op(A)[m0][k0]
    return p->ta ? p->A + (size_t)k0 * p->lda + m0 : p->A + (size_t)m0 * p->lda + k0;
}

static const float *b_at(const product *p, int k0, int n0) {  // op(B)[k0][n0]
    return p->tb ? p->B + (size_t)n0 * p->ldb + k0 : p->B + (size_t)k0 * p->ldb + n0;
}

// Panel i0 / MR of op(A) (b false), or i0 / NR of op(B), chunk k0 (kc long) in the operand
// packed once for all slices.
static uint32_t *shared_at(const product *p, bool b, int k0, int i0, int kc) {
    return (uint32_t *)(b ? p->s.b_packed : p->s.a_packed) +
           (size_t)k0 / 2 * (size_t)(b ? p->npad : p->mpad) + (size_t)i0 * (size_t)((kc + 1) / 2);
}

// The panels of rows [i0, i0 + n) of op(A) (b false) or of columns of op(B), k in [k0, k0
// + kc): in the operand packed once for all slices, or packed now into this thread's
// scratch.
static const uint32_t *block(const product *p, bool b, int k0, int i0, int kc, int n) {
    if (b ? p->s.b_packed : p->s.a_packed) return shared_at(p, b, k0, i0, kc);
    uint32_t *buf = b ? agi_scratch_b() : agi_scratch_a();
    pack(p, b, b ? b_at(p, k0, i0) : a_at(p, i0, k0), kc, n, buf);
    return buf;
}

// C[m0:m1, n0:n1]: every chunk of k, every block of rows and of columns, every panel.
static void part(const agi_product_split *s, int m0, int m1, int n0, int n1) {
    const product *p = (const product *)s;
    const int K = s->K;
    const int blocks = s->a_packed ? 1 : agi_tiles(m1 - m0, MC_MAX);
    const int mcb = blocks > 1 ? ((m1 - m0 - 1) / blocks + MR) / MR * MR : m1 - m0;
    for (ptrdiff_t k0 = 0; k0 < K || k0 == 0; k0 += KC) {
        const int kc = K - k0 < KC ? K - k0 : KC, kp = (kc + 1) / 2;
        const float beta = k0 ? 1 : p->beta;
        const float *bias = k0 ? NULL : p->bias;
        for (ptrdiff_t mb = m0; mb < m1; mb += mcb) {
            const int mc = m1 - mb < mcb ? m1 - mb : mcb;
            const uint32_t *Ab = block(p, false, k0, mb, kc, mc);
            for (ptrdiff_t nb = n0; nb < n1; nb += NC) {
                const int nc = n1 - nb < NC ? n1 - nb : NC;
                const uint32_t *Bb = block(p, true, k0, nb, kc, nc);
                for (ptrdiff_t i = 0; i < mc; i += MR) {
                    const int rows = mc - i < MR ? mc - i : MR;
                    float *Ci = p->C + (size_t)(mb + i) * p->ldc + nb;
                    for (int j = 0; j < nc; j += NR) {
                        const int cols = nc - j < NR ? nc - j : NR;
                        const uint32_t *Ai = Ab + (size_t)i * kp, *Bj = Bb + (size_t)j * kp;
                        const float *bj = bias ? bias + nb + j : NULL;
#ifdef AG_HAVE_BF16_TILES
                        if (p->native) {
                            tile_native(rows, cols, kp, Ai, Bj, p->alpha, beta, bj, Ci + j,
                                        p->ldc);
                            continue;
                        }
#endif
                        tile_portable(rows, cols, kp, Ai, Bj, p->alpha, beta, bj, Ci + j, p->ldc);
                    }
                }
            }
        }
        if (K <= 0) break;
    }
}

// Panels [begin, end) of op(A) (b false) or of op(B), every chunk of k, into the shared
// packed operand.
static void pack_shared(const agi_product_split *s, bool b, int begin, int end) {
    const product *p = (const product *)s;
    const int unit = b ? NR : MR, n = b ? s->N : s->M;
    const int i0 = begin * unit, i1 = agi_tile_end(end, unit, n);
    for (ptrdiff_t k0 = 0; k0 < s->K; k0 += KC) {
        const int kc = s->K - k0 < KC ? s->K - k0 : KC;
        pack(p, b, b ? b_at(p, k0, i0) : a_at(p, i0, k0), kc, i1 - i0,
             shared_at(p, b, k0, i0, kc));
    }
}

static void pack_a_panels(const agi_product_split *s, int begin, int end) {
    pack_shared(s, false, begin, end);
}

static void pack_b_panels(const agi_product_split *s, int begin, int end) {
    pack_shared(s, true, begin, end);
}

void agi_gemm_bf16(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc,
                   const float *bias) {
    if (M <= 0 || N <= 0) return;
    K = K < 0 ? 0 : K;
    const size_t mpad = ((size_t)M + MR - 1) / MR * MR, npad = ((size_t)N + NR - 1) / NR * NR;
    // Words of a packed operand: (kc + 1) / 2 pairs of each chunk, at most K / 2 + 1 in all.
    const size_t pairs = (size_t)K / 2 + 1;
    const agi_product_split s = {M, N, K, MR, NR, true, true, false, mpad * pairs * 4, npad * pairs * 4, INT_MAX, part, pack_a_panels,
                                 pack_b_panels, false, NULL, NULL};
    product p = {s, ta, tb, agi_bf16_native(), lda, ldb, ldc, mpad, npad, alpha, beta,
                 A, B, bias, C};
    agi_product_run(&p.s, 2.0 * M * N * K);
}
