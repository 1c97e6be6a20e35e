// Matrix-vector products (gemv.h): rows of W in blocks of 16, each row's dot product with
// x in one vector accumulator (16 lanes, fused multiply-adds over k in order, the last
// chunk of k masked), the 16 accumulators of a block then reduced together by a tree of
// shuffles into one vector whose lane r is row r's sum: 16 results a store, about 2
// shuffles and adds a row instead of the 8 of a reduction each. Rows of a block past N
// read row 0 again and store nothing.
//
// bfloat16 weights (agi_gemv_bf16): the same blocks and tree, each lane's sum on
// vdpbf16ps, 32 values of k a vector (16 pairs: lane j takes k = 2j and 2j + 1 of each
// 32), x rounded to bf16 as it is loaded. Half the bytes of W a row: decoding reads its
// weights once a token, so a step takes about half the time. The weights are a copy
// (bf16_weights.h), so their order is the kernel's: a block's 16 rows chunk by chunk of k,
// one stream of memory, where 16 rows read in place are 16 streams, each half as long as
// float32's, which the hardware's prefetch did not keep up with (README, "Decoding
// speed"). The portable path does the instruction's steps (bf16_gemm.c: the odd product
// fused in first, then the even one, subnormals flushed) in each lane and adds the lanes
// in the tree's order, so it gives the same bits.
#include "gemv.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "../core/parallel.h"
#include "bf16_gemm.h"

enum { ROWS = 16, KC = 32 };  // rows of a block; values of k a bf16 chunk

// Chunks of KC values of k in K.
static int chunks(int K) { return K <= 0 ? 0 : agi_tiles(K, KC); }

// Elements of a packed block of ROWS rows of K values.
static size_t block_len(int K) { return (size_t)ROWS * (size_t)chunks(K) * KC; }

// The tree of sum_lanes_of_16 below for one row: lanes added in pairs 2 apart within each
// group of 4, those two sums, then the groups in pairs, then the pairs.
static float tree_of_16(const float a[ROWS]) {
    float group[4];
    for (int g = 0; g < 4; g++)
        group[g] = (a[4 * g] + a[4 * g + 2]) + (a[4 * g + 1] + a[4 * g + 3]);
    return (group[0] + group[1]) + (group[2] + group[3]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f")))
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// Lane r of the result is the sum of the lanes of a[r].
TARGET static inline __m512 sum_lanes_of_16(const __m512 a[ROWS]) {
    __m512 t[8], u[4], w[2];
    // Within each 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] for a pair a, b.
    for (int i = 0; i < 8; i++)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    // Within each 128-bit lane: rows 4j .. 4j + 3, each the sum of its 4 lanes there.
    for (int j = 0; j < 4; j++)
        u[j] = _mm512_add_ps(
            _mm512_shuffle_ps(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
            _mm512_shuffle_ps(t[2 * j], t[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    // The 128-bit lanes of u[j] added in pairs, then the pairs.
    for (int j = 0; j < 2; j++)
        w[j] = _mm512_add_ps(
            _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_shuffle_f32x4(u[2 * j], u[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

TARGET void agi_gemv_f32(int N, int K, float alpha, const float *W, int ldw, const float *x,
                         float beta, float *y, const float *bias) {
    const __mmask16 tail = (__mmask16)((1u << (K % 16)) - 1);
    const int whole = K / 16 * 16;
    for (ptrdiff_t n0 = 0; n0 < N; n0 += ROWS) {  // an int would pass INT_MAX after the last
        const int rows = N - n0 < ROWS ? N - n0 : ROWS;
        const float *w[ROWS];
        __m512 acc[ROWS];
        for (int r = 0; r < ROWS; r++) {
            w[r] = W + (size_t)(r < rows ? n0 + r : 0) * ldw;
            acc[r] = _mm512_setzero_ps();
        }
        for (int k = 0; k < whole; k += 16) {
            const __m512 xv = _mm512_loadu_ps(x + k);
            for (int r = 0; r < ROWS; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + k), xv, acc[r]);
        }
        if (tail) {
            const __m512 xv = _mm512_maskz_loadu_ps(tail, x + whole);
            for (int r = 0; r < ROWS; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w[r] + whole), xv, acc[r]);
        }
        const __mmask16 out = (__mmask16)(rows == ROWS ? 0xFFFF : (1u << rows) - 1);
        __m512 v = _mm512_mul_ps(sum_lanes_of_16(acc), _mm512_set1_ps(alpha));
        if (beta != 0) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(out, y + n0));
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(out, bias + n0));
        _mm512_mask_storeu_ps(y + n0, out, v);
    }
}

// n values of x from x (n <= 16, or more: all 16): the mask of their float32 lanes.
static inline __mmask16 lanes32(int n) {
    return n >= 16 ? (__mmask16)-1 : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

// Chunk [k0, k0 + 32) of x as 32 bf16 values, zeros past K.
TARGET_BF16 static inline __m512bh x_chunk(const float *x, int k0, int K) {
    const int n = K - k0;
    if (n >= KC) return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k0 + 16), _mm512_loadu_ps(x + k0));
    return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(lanes32(n - 16), x + k0 + 16),
                               _mm512_maskz_loadu_ps(lanes32(n), x + k0));
}

// Rows n0 .. n0 + rows of y from the packed blocks at P (rows past N are its zero rows).
TARGET_BF16 static void gemv_bf16_native(int rows, int K, const uint16_t *P, const float *x,
                                         const float *bias, float *y) {
    const int C = chunks(K);
    for (ptrdiff_t n0 = 0; n0 < rows; n0 += ROWS) {
        __m512 acc[ROWS];
        for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_ps();
        for (int c = 0; c < C; c++, P += ROWS * KC) {
            const __m512bh xv = x_chunk(x, c * KC, K);
            for (int r = 0; r < ROWS; r++)
                acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(P + r * KC), xv);
        }
        const __mmask16 out = lanes32(rows - n0);
        __m512 v = sum_lanes_of_16(acc);
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(out, bias + n0));
        _mm512_mask_storeu_ps(y + n0, out, v);
    }
}

// The packed block of rows [0, rows) of W (rows <= ROWS; the others zeros) at P; with
// `check`, each chunk of P is read first and written only where it differs.
TARGET_BF16 static void pack_block_native(const float *W, size_t ldw, int rows, int K,
                                          bool check, uint16_t *P) {
    for (ptrdiff_t k0 = 0; k0 < K; k0 += KC)
        for (int r = 0; r < ROWS; r++, P += KC) {
            const int n = r < rows ? K - k0 : 0;
            const float *w = W + (n ? (size_t)r * ldw + k0 : 0);
            const __m512 lo = n >= KC ? _mm512_loadu_ps(w) : _mm512_maskz_loadu_ps(lanes32(n), w),
                         hi = n >= KC ? _mm512_loadu_ps(w + 16)
                                      : _mm512_maskz_loadu_ps(lanes32(n - 16), w + 16);
            const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            if (!check || _mm512_cmpneq_epi16_mask(v, _mm512_loadu_si512(P)))
                _mm512_storeu_si512(P, v);
        }
}
#define AG_HAVE_GEMV_BF16_NATIVE 1
#else
void agi_gemv_f32(int N, int K, float alpha, const float *W, int ldw, const float *x,
                  float beta, float *y, const float *bias) {
    (void)N, (void)K, (void)alpha, (void)W, (void)ldw, (void)x, (void)beta, (void)y, (void)bias;
    abort();  // agi_tile_gemm_available() is false here: callers never come
}
#endif

// ---- bfloat16 weights -----------------------------------------------------------------

static float flush(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

static void gemv_bf16_portable(int rows, int K, const uint16_t *P, const float *x,
                               const float *bias, float *y) {
    const int C = chunks(K);
    for (int n = 0; n < rows; n++) {
        const uint16_t *w = P + (size_t)(n / ROWS) * block_len(K) + (size_t)(n % ROWS) * KC;
        float lane[ROWS] = {0};
        for (int c = 0; c < C; c++, w += ROWS * KC)
            for (int j = 0; j < ROWS; j++) {
                const int e = c * KC + 2 * j, o = e + 1;  // values past K are zeros
                const float we = agi_bf16_value(w[2 * j]),
                            xe = e < K ? agi_bf16_value(agi_bf16_round(x[e])) : 0,
                            wo = agi_bf16_value(w[2 * j + 1]),
                            xo = o < K ? agi_bf16_value(agi_bf16_round(x[o])) : 0;
                lane[j] = flush(fmaf(wo, xo, lane[j]));
                lane[j] = flush(fmaf(we, xe, lane[j]));
            }
        float v = tree_of_16(lane);
        if (bias) v = v + bias[n];
        y[n] = v;
    }
}

size_t agi_gemv_bf16_packed_len(int N, int K) {
    return N <= 0 ? 0 : (size_t)agi_tiles(N, ROWS) * block_len(K);
}

typedef struct {
    bool native, check;
    int M, N, K, ldx, ldy;
    const float *X, *bias;
    const uint16_t *P;  // agi_gemv_bf16_pack writes it
    size_t block;       // elements of a block of ROWS packed rows
    float *Y;
    size_t ldw;       // agi_gemv_bf16_pack and _checked: W's rows
    const float *W;   // the weights packed into P, or NULL
} bf16_rows;

// Block b of W packed into P (j->P), or with j->check made so where it differs.
static void pack_block(const bf16_rows *j, int b) {
    const int n0 = b * ROWS, rows = j->N - n0 < ROWS ? j->N - n0 : ROWS;
    const float *W = j->W + (size_t)n0 * j->ldw;
    uint16_t *P = (uint16_t *)j->P + (size_t)b * j->block;
#ifdef AG_HAVE_GEMV_BF16_NATIVE
    if (j->native) {
        pack_block_native(W, j->ldw, rows, j->K, j->check, P);
        return;
    }
#endif
    for (ptrdiff_t k0 = 0; k0 < j->K; k0 += KC)
        for (int r = 0; r < ROWS; r++, P += KC)
            for (int e = 0; e < KC; e++) {
                const int k = k0 + e;  // at most INT_MAX: the last chunk starts at a multiple
                                       // of KC below K
                const uint16_t v =
                    r < rows && k < j->K ? agi_bf16_round(W[(size_t)r * j->ldw + k]) : 0;
                if (!j->check || P[e] != v) P[e] = v;
            }
}

static void pack_blocks(size_t begin, size_t end, void *ctx) {
    for (int b = (int)begin; b < (int)end; b++) pack_block(ctx, b);  // blocks of N rows
}

void agi_gemv_bf16_pack(int N, int K, const float *W, size_t ldw, uint16_t *P) {
    if (N <= 0 || K <= 0) return;
    bf16_rows j = {.native = agi_bf16_native(), .N = N, .K = K, .P = P,
                   .block = block_len(K), .ldw = ldw, .W = W};
    agi_parallel_for((size_t)agi_tiles(N, ROWS), (double)N * K, pack_blocks, &j);
}

// Blocks [begin, end) of ROWS rows of W, each against every row of X in turn: a block is
// read from memory once, then from the cache for the other rows (a prompt's positions).
// One row of X takes all the blocks in one call, unless each block is checked against W
// first (j->check), which puts it in the cache for the product.
static void bf16_blocks(size_t begin_block, size_t end_block, void *ctx) {
    const bf16_rows *j = ctx;
    const int begin = (int)begin_block, end = (int)end_block;  // blocks of N rows
    const int step = j->M == 1 && !j->check ? end - begin : 1;
    for (int b = begin; b < end; b += step) {
        const int n0 = b * ROWS, n = agi_tile_end(b + step, ROWS, j->N) - n0;
        if (j->check) pack_block(j, b);
        const uint16_t *P = j->P + (size_t)b * j->block;
        const float *bias = j->bias ? j->bias + n0 : NULL;
        for (int i = 0; i < j->M; i++) {
            const float *x = j->X + (size_t)i * j->ldx;
            float *y = j->Y + (size_t)i * j->ldy + n0;
#ifdef AG_HAVE_GEMV_BF16_NATIVE
            if (j->native) {
                gemv_bf16_native(n, j->K, P, x, bias, y);
                continue;
            }
#endif
            gemv_bf16_portable(n, j->K, P, x, bias, y);
        }
    }
}

// agi_gemv_bf16, with W given (j->check) for agi_gemv_bf16_checked.
static void gemv_bf16(int M, int N, int K, const float *X, int ldx, const float *W,
                      const uint16_t *P, const float *bias, float *Y, int ldy) {
    if (M <= 0 || N <= 0) return;
    K = K < 0 ? 0 : K;
    bf16_rows j = {.native = agi_bf16_native(), .check = W && K > 0, .M = M, .N = N, .K = K,
                   .ldx = ldx, .ldy = ldy, .X = X, .bias = bias, .P = P,
                   .block = block_len(K), .Y = Y, .ldw = (size_t)K, .W = W};
    agi_parallel_for((size_t)agi_tiles(N, ROWS), 2.0 * M * N * K, bf16_blocks, &j);
}

void agi_gemv_bf16(int M, int N, int K, const float *X, int ldx, const uint16_t *P,
                   const float *bias, float *Y, int ldy) {
    gemv_bf16(M, N, K, X, ldx, NULL, P, bias, Y, ldy);
}

void agi_gemv_bf16_checked(int M, int N, int K, const float *X, int ldx, const float *W,
                           uint16_t *P, const float *bias, float *Y, int ldy) {
    gemv_bf16(M, N, K, X, ldx, W, P, bias, Y, ldy);
}
