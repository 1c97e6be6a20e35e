// Register-tiled products (see tile_gemm.h), after the layered design of BLIS and oneDNN.
//
// The register tile: MR = 12 rows of C by NV = 2 vectors of VL reals (12 x 32 floats, 24
// accumulators). For each k it loads the two vectors of row k of op(B), broadcasts each
// of the 12 elements of column k of op(A) and makes 24 fused multiply-adds: on a core
// with two FMA pipes that is 12 cycles of arithmetic for 14 loads, which the load ports
// keep up with. Narrower tiles (4 and 1 rows, 1 vector) take the edges, so that a short
// product does not pay for 12 rows.
//
// The caches (sizes for 48 KB L1 and 1 MB L2 per core): the sum over k runs in chunks of
// KC = 256; for each chunk a block of NC columns of op(B) (256 x 512 floats, 512 KB) is
// packed into panels of 32 columns, each panel's rows contiguous (kc x 32), and stays in
// L2 while every panel of 12 rows of op(A) passes over it; a panel of op(A) (12 x 256,
// 12 KB) stays in L1 while the 16 panels of the block stream through from L2. op(B) is
// packed when it is given transposed (B^T: the transposes run in registers, 16 x 16 at a
// time) and when its rows are far apart (then a block read in place would land in a few
// sets of the caches); op(A) is read in place when it is A (12 row pointers), and packed
// into panels of 12 contiguous values a k when it is given as A^T and wide products reuse
// it (in place it would take two cache lines a k), or when its rows lie a multiple of 4 KB
// apart (see pack_a_rows). Packing is a copy of each operand once, against 2 M N K flops.
//
// Threads: a product large enough is cut over attograd's pool into whole tiles, along its
// rows or its columns, an operand packed once for all slices where that pays
// (product_split.c, which bf16_gemm.c shares).
//
// Sums run over k in order, one fused multiply-add per step, in chunks of KC values of k
// (each chunk's sum times alpha added to C), so a result does not depend on the tiling,
// the packing, the thread count or the call: the same inputs give the same bits.
#include "tile_gemm.h"

#include "../core/parallel.h"
#include "../core/real.h"
#include "cpu_switch.h"
#include "product_split.h"
#include "scratch.h"
#include "transpose16.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define AG_HAVE_TILES 1
#include <immintrin.h>
#endif

#if AG_ONCE
// AVX-512 F, BW and VL, which also the score-block passes of score_block_avx512.c use.
static bool cpu_runs_tiles(void) {
#ifdef AG_HAVE_TILES
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

static agi_cpu_switch tiles = {0, "AG_TILE_GEMM", cpu_runs_tiles};

bool agi_tile_gemm_available(void) { return agi_cpu_switch_on(&tiles); }

void agi_tile_gemm_enable(bool on) { agi_cpu_switch_set(&tiles, on); }
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
#define VSTORE(p, v) _mm512_storeu_pd(p, v)
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
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VZERO() _mm512_setzero_ps()
#endif

// The register tile, the k chunk, a block of columns of op(B) (512 KB) and the most rows
// of op(A) packed at once (2 MB: a batch of 2048 rows, packed once for every block of
// columns of op(B)).
enum { MR = 12, NV = 2, NR = NV * VL, KC = 256 };
enum { NC = 512 * 1024 / (KC * (int)sizeof(real)) / NR * NR };
enum { MC_MAX = 2048 * 1024 / (KC * (int)sizeof(real)) / MR * MR };
// A in place whose rows lie a multiple of 4 KB apart (K = 1024, 2048, 3072 ... floats): the
// 12 rows of a panel fall in the same sets of L1 (its set index is address bits 6 to 11),
// and evict each other as op(B)'s panels stream through those sets. Such an op(A) is packed
// into panels as A^T is (pack_a_rows), once for every block of columns, by a part of the
// product with columns enough (PACK_A_MIN_N) to repay the copy: read as one stream, the
// panels ran 1-4% faster than the same rows copied a line past KC apart. A product cut by
// columns over threads copies it whole once for all its slices (share_a), rows
// A_SHARED_PAD past K apart: there the threads' share of the copy, a plain memcpy, ran
// 2-3% faster than their share of the packing (bench/README.md).
enum { A_SHARED_PAD = 64 / (int)sizeof(real) };
_Static_assert((MC_MAX + MR) * KC * sizeof(real) <= AGI_SCRATCH_A_BYTES &&
                   NC * KC * sizeof(real) <= AGI_SCRATCH_B_BYTES,
               "the blocks fit the scratch");

// Extents are ints; a loop that steps by a block or a tile over one counts in ptrdiff_t, as
// the step past the last block would pass INT_MAX for an extent within a block of it.

// Where a tile reads op(A)[r][k]: A[r lda + k] (A in place), A[k lda + r] (A^T in place),
// or a packed panel, A[k MR + r].
enum { A_ROWS, A_COLS, A_PACKED };

static inline vmask lanes(int n) {  // the first n lanes (all for n >= VL, none for n <= 0)
    return n >= VL ? (vmask)-1 : n <= 0 ? (vmask)0 : (vmask)((1u << n) - 1);
}

// One tile: rows [0, mr) (mr <= MT) by columns [0, nr) (nr <= NT VL) of
// C = alpha op(A) op(B) + beta C (+ bias), k from 0 to kc; op(B)[k][c] = B[k ldb + c].
// AM, FULL, MT and NT are constants at every call, so the loops unroll and the
// accumulators live in registers; FULL (mr = MR, nr = NR, also constants) says a whole
// 12 x 2 tile. Rows past mr read row 0 again (valid memory) and store nothing.
TARGET ALWAYS_INLINE void tile(const int AM, const bool FULL, const int MT, const int NT,
                               int mr, int nr, int kc, const real *A, size_t lda,
                               const real *B, size_t ldb, real alpha, real beta,
                               const real *bias, real *C, int ldc) {
    vec acc[MR * NV];
    const real *a[MR];
    vmask m[NV];
#pragma GCC unroll 12
    for (int r = 0; r < MT; r++) {
        const int row = r < mr ? r : 0;
        a[r] = AM == A_ROWS ? A + (size_t)row * lda + kc : A + row;
        if (r < mr) {  // this tile's rows of C, wanted in L1 by the end of the sum
            _mm_prefetch((const char *)(C + (size_t)r * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + (size_t)r * ldc + NT * VL - 1), _MM_HINT_T0);
        }
    }
#pragma GCC unroll 2
    for (int v = 0; v < NT; v++) m[v] = lanes(nr - v * VL);
#pragma GCC unroll 24
    for (int t = 0; t < MT * NT; t++) acc[t] = VZERO();
    const ptrdiff_t astep = AM == A_ROWS ? 1 : AM == A_COLS ? (ptrdiff_t)lda : MR;
    // A full tile of rows in place reads row 3 i + j at q[i] + j lda: four pointers and
    // lda in registers, where twelve row pointers and the loop's bounds (16 registers)
    // spilled to the stack and were reloaded every k.
    const ptrdiff_t ld = (ptrdiff_t)lda;
    const real *q[4] = {A, A, A, A};
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        if (AM == A_ROWS && FULL) q[i] = A + 3 * i * ld + kc;
    const real *b = B;
    const ptrdiff_t k0 = AM == A_ROWS ? -kc : 0, k1 = AM == A_ROWS ? 0 : kc;
#pragma GCC unroll 4
    for (ptrdiff_t k = k0; k < k1; k++) {
        vec bv[NV];
#pragma GCC unroll 2
        for (int v = 0; v < NT; v++) bv[v] = VLOADM(m[v], b + v * VL);
        b += ldb;
        const ptrdiff_t ak = k * astep;
#pragma GCC unroll 12
        for (int r = 0; r < MT; r++) {
            const vec ar = VSET1(AM == A_ROWS && FULL ? q[r / 3][(ptrdiff_t)(r % 3) * ld + k]
                                                      : a[r][ak]);
#pragma GCC unroll 2
            for (int v = 0; v < NT; v++) acc[r * NT + v] = VFMA(ar, bv[v], acc[r * NT + v]);
        }
    }
    const vec va = VSET1(alpha);
#pragma GCC unroll 12
    for (int r = 0; r < MT; r++) {
        if (r >= mr) break;
        real *c = C + (size_t)r * ldc;
#pragma GCC unroll 2
        for (int v = 0; v < NT; v++) {
            vec x = VMUL(acc[r * NT + v], va);
            if (beta != 0) x = VADD(x, VLOADM(m[v], c + v * VL));
            if (bias) x = VADD(x, VLOADM(m[v], bias + v * VL));
            VSTOREM(c + v * VL, m[v], x);
        }
    }
}

// Each tile shape is a function of its own, so that the register allocator sees one
// loop at a time: inlined together into one dispatcher, the 12 x 2 loops spilled to the
// stack and reloaded 2-4 values every k. A full 12 x 2 tile has one of its own (no masks;
// one pointer to a packed panel or to op(A) = A^T, four to rows of A in place).
#define TILE_FN(AM, MT, NT)                                                                 \
    TARGET __attribute__((noinline)) static void tile_##AM##_##MT##_##NT(                    \
        int mr, int nr, int kc, const real *A, size_t lda, const real *B, size_t ldb,       \
        real alpha, real beta, const real *bias, real *C, int ldc) {                        \
        tile(AM, false, MT, NT, mr, nr, kc, A, lda, B, ldb, alpha, beta, bias, C, ldc);     \
    }
#define TILE_FULL(AM)                                                                       \
    TARGET __attribute__((noinline)) static void tile_##AM##_full(                          \
        int kc, const real *A, size_t lda, const real *B, size_t ldb, real alpha,            \
        real beta, const real *bias, real *C, int ldc) {                                    \
        tile(AM, true, MR, NV, MR, NR, kc, A, lda, B, ldb, alpha, beta, bias, C, ldc);      \
    }
#define TILE_FNS(AM)                                                                        \
    TILE_FULL(AM)                                                                           \
    TILE_FN(AM, 12, 2) TILE_FN(AM, 4, 2) TILE_FN(AM, 1, 2)                                   \
    TILE_FN(AM, 12, 1) TILE_FN(AM, 4, 1) TILE_FN(AM, 1, 1)
TILE_FNS(A_ROWS)
TILE_FNS(A_COLS)
TILE_FNS(A_PACKED)

// The tile for `rows` x `cols` at the largest fitting shape: a full tile, or 12, 4 or 1
// rows by 2 or 1 vectors.
#define TILE_SHAPES(AM)                                                                    \
    do {                                                                                   \
        if (cols == NR && rows == MR) {                                                    \
            tile_##AM##_full(kc, A, lda, B, ldb, alpha, beta, bias, C, ldc);               \
        } else if (cols > VL) {                                                            \
            if (rows > 4) tile_##AM##_12_2(rows, cols, kc, A, lda, B, ldb, alpha, beta,     \
                                          bias, C, ldc);                                   \
            else if (rows > 1) tile_##AM##_4_2(rows, cols, kc, A, lda, B, ldb, alpha, beta, \
                                               bias, C, ldc);                              \
            else tile_##AM##_1_2(rows, cols, kc, A, lda, B, ldb, alpha, beta, bias, C, ldc); \
        } else {                                                                           \
            if (rows > 4) tile_##AM##_12_1(rows, cols, kc, A, lda, B, ldb, alpha, beta,     \
                                          bias, C, ldc);                                   \
            else if (rows > 1) tile_##AM##_4_1(rows, cols, kc, A, lda, B, ldb, alpha, beta, \
                                               bias, C, ldc);                              \
            else tile_##AM##_1_1(rows, cols, kc, A, lda, B, ldb, alpha, beta, bias, C, ldc); \
        }                                                                                  \
    } while (0)

TARGET static void any_tile(int am, int rows, int cols, int kc, const real *A, size_t lda,
                            const real *B, size_t ldb, real alpha, real beta,
                            const real *bias, real *C, int ldc) {
    if (am == A_ROWS) TILE_SHAPES(A_ROWS);
    else if (am == A_COLS) TILE_SHAPES(A_COLS);
    else TILE_SHAPES(A_PACKED);
}

// A square block of VL x VL reals turned in registers: dst[c][r] = src[r][c], in an
// unpack / shuffle network (transpose16.h for floats; 24 operations for 64 doubles).
TARGET ALWAYS_INLINE void transpose_block(real *dst, int ldd, const real *src, size_t lds) {
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
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (size_t)i * lds);
    agi_transpose16(r);
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (size_t)i * ldd, r[i]);
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

// Rows are copied a few at a time across all panels, so that the stores of a panel go to
// consecutive lines rather than one row to every panel in turn (whose addresses, panels
// a power of two apart, collide in the store buffer).
enum { PACK_ROWS = 16 };

// Columns [0, nc) of rows [0, kc) of op(B) into panels of NR columns: panel j (columns
// j NR ..) at dst + j NR kc, row k of it at + k NR; columns past nc are zero. B points at
// op(B)[0][0]: B[k ldb + c] (B in place) or B[c ldb + k] (tb, B^T given). The source
// comes from L3 or memory: the lines of the rows (or, for B^T, the panel) after the ones
// being copied are prefetched.
TARGET static void pack_b(bool tb, const real *B, size_t ldb, int kc, int nc, real *dst) {
    if (!tb) {
        for (int k0 = 0; k0 < kc; k0 += PACK_ROWS)
            for (ptrdiff_t j = 0; j < nc; j += NR) {
                real *d = dst + (size_t)j * kc;
                const int k1 = kc - k0 < PACK_ROWS ? kc : k0 + PACK_ROWS;
                for (int k = k0; k < k1; k++)
                    for (int v = 0; v < NV; v++) {
                        if (k + PACK_ROWS < kc && v * VL < nc - j)
                            _mm_prefetch((const char *)(B + (size_t)(k + PACK_ROWS) * ldb + j +
                                                        v * VL),
                                         _MM_HINT_T0);
                        const vmask m = lanes(nc - j - v * VL);
                        VSTORE(d + (size_t)k * NR + v * VL,
                               VLOADM(m, B + (size_t)k * ldb + j + v * VL));
                    }
            }
        return;
    }
    const int kb = kc / VL * VL;
    for (ptrdiff_t j = 0; j < nc; j += NR) {
        real *d = dst + (size_t)j * kc;
        if (nc - j >= NR) {
            const int next = nc - j - NR < NR ? nc - j - NR : NR;  // the next panel's rows
            for (int k = 0; k < kb; k += VL)
                for (int v = 0; v < NV; v++) {
                    for (int c = v * VL; c < v * VL + VL && c < next; c++)
                        _mm_prefetch((const char *)(B + (size_t)(j + NR + c) * ldb + k),
                                     _MM_HINT_T0);
                    transpose_block(d + (size_t)k * NR + v * VL, NR,
                                    B + (size_t)(j + v * VL) * ldb + k, ldb);
                }
            for (int k = kb; k < kc; k++)
                for (int c = 0; c < NR; c++) d[(size_t)k * NR + c] = B[(size_t)(j + c) * ldb + k];
        } else {
            for (int k = 0; k < kc; k++)
                for (int c = 0; c < NR; c++)
                    d[(size_t)k * NR + c] = c < nc - j ? B[(size_t)(j + c) * ldb + k] : 0;
        }
    }
}

// Rows [0, mc) of op(A) = A^T, k in [0, kc), into panels of MR rows: panel i (rows i MR
// ..) at dst + i MR kc, column k of it at + k MR; rows past mc are zero. A points at
// op(A)[0][0] = A[0]: op(A)[r][k] = A[k lda + r].
TARGET static void pack_a(const real *A, size_t lda, int kc, int mc, real *dst) {
    for (int k0 = 0; k0 < kc; k0 += PACK_ROWS)
        for (ptrdiff_t i = 0; i < mc; i += MR) {
            real *d = dst + (size_t)i * kc;
            const int k1 = kc - k0 < PACK_ROWS ? kc : k0 + PACK_ROWS;
            for (int k = k0; k < k1; k++)
                for (int c = 0; c < MR; c += VL) {
                    if (k + PACK_ROWS < kc)  // the next rows' line
                        _mm_prefetch((const char *)(A + (size_t)(k + PACK_ROWS) * lda + i + c),
                                     _MM_HINT_T0);
                    const vmask keep = lanes(MR - c);  // the panel's lanes, zero past mc
                    const vec x = VLOADM(lanes(mc - i - c), A + (size_t)k * lda + i + c);
                    VSTOREM(d + (size_t)k * MR + c, keep, x);
                }
        }
}

// Rows [0, mc) of op(A) = A in place, k in [0, kc), into pack_a's panels of MR rows (rows
// past mc zero): in float32 16 values of k of a panel's rows at a time, turned in registers.
TARGET static void pack_a_rows(const real *A, size_t lda, int kc, int mc, real *dst) {
#ifdef AG_REAL_F64
    for (ptrdiff_t i = 0; i < mc; i += MR)
        for (int r = 0; r < MR; r++)
            for (int k = 0; k < kc; k++)
                dst[(size_t)i * kc + (size_t)k * MR + r] =
                    i + r < mc ? A[(size_t)(i + r) * lda + k] : 0;
#else
    for (ptrdiff_t i = 0; i < mc; i += MR) {
        real *d = dst + (size_t)i * kc;
        const int rows = mc - i < MR ? (int)(mc - i) : MR;
        for (int k0 = 0; k0 < kc; k0 += VL) {
            const int kn = kc - k0 < VL ? kc - k0 : VL;
            const vmask m = lanes(kn);
            __m512 r[16];
            for (int q = 0; q < 16; q++)
                r[q] = q < rows ? VLOADM(m, A + (size_t)(i + q) * lda + k0) : VZERO();
            agi_transpose16(r);
            for (int q = 0; q < kn; q++) VSTOREM(d + (size_t)(k0 + q) * MR, lanes(MR), r[q]);
        }
    }
#endif
}

// One product as the threads share it.
typedef struct {
    agi_product_split s;  // first: its callbacks get the product back
    bool ta, tb;
    int lda, ldb, ldc;
    size_t mpad, npad;  // M and N rounded up to whole tiles (past INT_MAX near it)
    real alpha, beta;
    const real *A, *B, *bias;
    real *C;
} product;

// op(A) is packed when it is given as A^T and each panel of it meets enough columns to
// repay the copy; op(B) when it is given as B^T, or when a chunk of its rows spans more
// than half of L2 (rows far apart, whose lines would crowd into a few cache sets).
enum { PACK_A_MIN_N = 256, IN_PLACE_B_BYTES = 512 * 1024 };
// The rows a slice of rows needs to pack its own blocks of op(B) (product_split.h).
enum { OWN_B_MIN_ROWS = 128 };

static void part_split(const agi_product_split *s, int m0, int m1, int n0, int n1);
static void pack_row_panels(const agi_product_split *s, int begin, int end);
static void pack_panels(const agi_product_split *s, int begin, int end);

static product plan(bool ta, bool tb, int M, int N, int K, real alpha, const real *A,
                    int lda, const real *B, int ldb, real beta, real *C, int ldc,
                    const real *bias) {
    const int kc = K < KC ? K : KC;
    const size_t mpad = ((size_t)M + MR - 1) / MR * MR, npad = ((size_t)N + NR - 1) / NR * NR;
    const size_t k = K > 0 ? (size_t)K : 0;
    // op(A) in place with rows a multiple of 4 KB apart (share_a): copied whole once for all
    // the slices of a product cut by columns, else packed a block of rows at a time by each
    // part.
    const bool pack_rows = !ta && M > MR && (size_t)lda * sizeof(real) % 4096 == 0;
    const agi_product_split s = {
        M, N, K, MR, NR, ta && N >= PACK_A_MIN_N,
        tb || (size_t)kc * (size_t)ldb * sizeof(real) > IN_PLACE_B_BYTES, pack_rows,
        pack_rows ? (size_t)M * (k + A_SHARED_PAD) * sizeof(real) : mpad * k * sizeof(real),
        npad * k * sizeof(real), OWN_B_MIN_ROWS, part_split,
        pack_row_panels, pack_panels, false, NULL, NULL};
    return (product){s, ta, tb, lda, ldb, ldc, mpad, npad, alpha, beta, A, B, bias, C};
}

// Lines [l0, l0 + n) (of `lines`) of each row of the panel of op(A) after the one at A:
// the next MR rows (A in place), or the next packed panel (MR lines for each line of a
// row).
static inline void prefetch_lines(int am, const real *A, size_t lda, int kc, int l0, int n,
                                  int lines) {
    const int l1 = l0 + n < lines ? l0 + n : lines;
    if (am == A_ROWS) {
        for (int r = 0; r < MR; r++)
            for (int l = l0; l < l1; l++)
                _mm_prefetch((const char *)(A + (size_t)(MR + r) * lda) + 64 * l, _MM_HINT_T0);
    } else {
        for (int l = l0 * MR; l < l1 * MR; l++)
            _mm_prefetch((const char *)(A + (size_t)MR * kc) + 64 * l, _MM_HINT_T0);
    }
}

// C[m0:m1, n0:n1] of the product (m0, m1 multiples of MR and n0, n1 of NR but at the
// ends): every chunk of k, every block of NC columns, every panel of rows.
TARGET static void part(const product *p, int m0, int m1, int n0, int n1) {
    const int K = p->s.K;
    const real *a_packed = p->s.a_packed, *b_packed = p->s.b_packed;
    // Rows of op(A) packed at once: as many blocks of at most MC_MAX as needed, even.
    // A slice of a few columns (a product cut by columns over threads) would pack all of
    // op(A) for a few tiles: it reads A in place.
    const bool pack_rows = p->s.share_a && n1 - n0 >= PACK_A_MIN_N;
    const int blocks = p->s.pack_a || pack_rows ? agi_tiles(m1 - m0, MC_MAX) : 1;
    const int mcb = blocks > 1 ? ((m1 - m0 - 1) / blocks + MR) / MR * MR : m1 - m0;
    for (ptrdiff_t k0 = 0; k0 < K || k0 == 0; k0 += KC) {
        const int kc = K - k0 < KC ? K - k0 : KC;
        const real beta = k0 ? 1 : p->beta;
        const real *bias = k0 ? NULL : p->bias;  // the first chunk adds the bias
        for (ptrdiff_t mb = m0; mb < m1; mb += mcb) {
            const int mc = m1 - mb < mcb ? m1 - mb : mcb;
            const real *Ab;
            size_t lda = (size_t)p->lda;
            int am = p->ta ? A_COLS : A_ROWS;
            if (a_packed && p->s.share_a) {  // copied whole, rows K + A_SHARED_PAD apart
                lda = (size_t)K + A_SHARED_PAD;
                Ab = a_packed + (size_t)mb * lda + k0;
            } else if (a_packed) {
                Ab = a_packed + (size_t)k0 * p->mpad + (size_t)mb * kc;
                am = A_PACKED;
                lda = MR;
            } else if (p->s.pack_a || pack_rows) {
                real *buf = agi_scratch_a();
                if (p->s.pack_a) pack_a(p->A + (size_t)k0 * lda + mb, lda, kc, mc, buf);
                else pack_a_rows(p->A + (size_t)mb * lda + k0, lda, kc, mc, buf);
                Ab = buf;
                am = A_PACKED;
                lda = MR;
            } else {
                Ab = p->ta ? p->A + (size_t)k0 * lda + mb : p->A + (size_t)mb * lda + k0;
            }
            for (ptrdiff_t nb = n0; nb < n1; nb += NC) {
                const int nc = n1 - nb < NC ? n1 - nb : NC;
                const real *Bb;
                size_t ldb = NR, pstep = (size_t)kc;  // B block and the step of a column
                if (b_packed) {
                    Bb = b_packed + (size_t)k0 * p->npad + (size_t)nb * kc;
                } else if (p->s.pack_b) {
                    real *buf = agi_scratch_b();
                    pack_b(p->tb, p->tb ? p->B + (size_t)nb * p->ldb + k0
                                        : p->B + (size_t)k0 * p->ldb + nb,
                           (size_t)p->ldb, kc, nc, buf);
                    Bb = buf;
                } else {
                    Bb = p->B + (size_t)k0 * p->ldb + nb;
                    ldb = (size_t)p->ldb;
                    pstep = 1;
                }
                for (ptrdiff_t i = 0; i < mc; i += MR) {
                    const int rows = mc - i < MR ? mc - i : MR;
                    const real *Ai = am == A_ROWS ? Ab + (size_t)i * lda
                                     : am == A_COLS ? Ab + i : Ab + (size_t)i * kc;
                    real *Ci = p->C + (size_t)(mb + i) * p->ldc + nb;
                    // The next panel of op(A) is fetched into L1 a few lines a tile while
                    // this one's tiles run (it came from L3 at its first tile, otherwise).
                    const int tiles = (nc + NR - 1) / NR;
                    const int lines = (kc * (int)sizeof(real) + 63) / 64;  // a row of it
                    const int per = (lines + tiles - 1) / tiles;
                    const bool next = mc - i > MR && am != A_COLS;
                    for (int j = 0; j < nc; j += NR) {
                        const int cols = nc - j < NR ? nc - j : NR;
                        if (next) prefetch_lines(am, Ai, lda, kc, j / NR * per, per, lines);
                        any_tile(am, rows, cols, kc, Ai, lda, Bb + (size_t)j * pstep, ldb,
                                 p->alpha, beta, bias ? bias + nb + j : NULL, Ci + j, p->ldc);
                    }
                }
            }
        }
        if (K <= 0) break;
    }
}

static void part_split(const agi_product_split *s, int m0, int m1, int n0, int n1) {
    part((const product *)s, m0, m1, n0, n1);
}

// Panels [begin, end) of op(B), every chunk of k, into b_packed.
static void pack_panels(const agi_product_split *s, int begin, int end) {
    const product *p = (const product *)s;
    const int n0 = begin * NR, n1 = agi_tile_end(end, NR, s->N);
    for (ptrdiff_t k0 = 0; k0 < s->K; k0 += KC) {
        const int kc = s->K - k0 < KC ? s->K - k0 : KC;
        pack_b(p->tb, p->tb ? p->B + (size_t)n0 * p->ldb + k0 : p->B + (size_t)k0 * p->ldb + n0,
               (size_t)p->ldb, kc, n1 - n0,
               (real *)s->b_packed + (size_t)k0 * p->npad + (size_t)n0 * kc);
    }
}

// Panels [begin, end) of op(A), every chunk of k, into a_packed; or, for an op(A) copied
// whole, its rows [begin MR, end MR).
static void pack_row_panels(const agi_product_split *s, int begin, int end) {
    const product *p = (const product *)s;
    const int m0 = begin * MR, m1 = agi_tile_end(end, MR, s->M);
    const size_t lda = (size_t)p->lda;
    if (s->share_a) {
        const size_t ld = (size_t)s->K + A_SHARED_PAD;
        for (ptrdiff_t r = m0; r < m1; r++)
            memcpy((real *)s->a_packed + (size_t)r * ld, p->A + (size_t)r * lda,
                   (size_t)s->K * sizeof(real));
        return;
    }
    for (ptrdiff_t k0 = 0; k0 < s->K; k0 += KC) {
        const int kc = s->K - k0 < KC ? s->K - k0 : KC;
        pack_a(p->A + (size_t)k0 * lda + m0, lda, kc, m1 - m0,
               (real *)s->a_packed + (size_t)k0 * p->mpad + (size_t)m0 * kc);
    }
}

TARGET static void tile_gemm_avx512(bool ta, bool tb, int M, int N, int K, real alpha,
                                    const real *A, int lda, const real *B, int ldb, real beta,
                                    real *C, int ldc, const real *bias) {
    product p = plan(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    agi_product_run(&p.s, 2.0 * M * N * K);
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
    for (ptrdiff_t r0 = 0; r0 < rows; r0 += BLK)
        for (ptrdiff_t c0 = 0; c0 < cols; c0 += BLK) {
            const int r1 = rows - r0 > BLK ? r0 + BLK : rows;
            const int c1 = cols - c0 > BLK ? c0 + BLK : cols;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++)
                    dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
        }
}
