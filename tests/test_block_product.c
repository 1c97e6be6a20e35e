// The attention blocks' product kernel (src/kernels/block_product.c): each element is the
// k-ordered sum of fused multiply-adds, times alpha, plus C; within float rounding of
// float64; NaN and infinities carried as the arithmetic carries them. Shapes cover every
// tile and edge: rows and columns not multiples of a tile, a head's width of 16, 32, 64
// or 80, one row (T = 1), sums of one term, of a head's width and of a whole block, the
// narrow products whose panels of B are packed and the wide ones that go in bands.
#include <stdlib.h>
#include <string.h>

#include "../src/kernels/block_product.h"
#include "../src/kernels/tile_gemm.h"
#include "testing.h"

static const int rows[] = {1, 3, 5, 8, 9, 16, 17, 33, 64, 130};
static const int cols[] = {1, 15, 16, 17, 32, 33, 64, 80, 128, 130};
static const int sums[] = {0, 1, 16, 32, 64, 80, 256};
enum { N_ROWS = 10, N_COLS = 10, N_SUMS = 7 };

// One product's operands, with row strides wider than the rows; C starts from c0.
typedef struct {
    bool ta;
    int M, N, K, lda, ldb, ldc;
    float *A, *B, *C, *c0;
} problem;

static problem make(bool ta, int M, int N, int K, ag_pcg32 *rng) {
    problem p = {ta, M, N, K, (ta ? M : K) + 3, N + 70, N + 5, NULL, NULL, NULL, NULL};
    const size_t na = (size_t)p.lda * (size_t)(ta ? K : M) + 1,
                 nb = (size_t)p.ldb * (size_t)K + 1, nc = (size_t)p.ldc * (size_t)M;
    p.A = malloc(na * sizeof(float));
    p.B = malloc(nb * sizeof(float));
    p.C = malloc(nc * sizeof(float));
    p.c0 = malloc(nc * sizeof(float));
    for (size_t i = 0; i < na; i++) p.A[i] = (float)(2 * ag_pcg32_double(rng) - 1);
    for (size_t i = 0; i < nb; i++) p.B[i] = (float)(2 * ag_pcg32_double(rng) - 1);
    for (size_t i = 0; i < nc; i++) p.c0[i] = (float)(2 * ag_pcg32_double(rng) - 1);
    return p;
}

static void drop(problem *p) { free(p->A), free(p->B), free(p->C), free(p->c0); }

static float a_at(const problem *p, int m, int k) {
    return p->ta ? p->A[(size_t)k * p->lda + m] : p->A[(size_t)m * p->lda + k];
}

static void run(problem *p, float alpha, float beta) {
    memcpy(p->C, p->c0, (size_t)p->ldc * (size_t)p->M * sizeof(float));
    agi_block_product_f32(p->ta, p->M, p->N, p->K, alpha, p->A, p->lda, p->B, p->ldb, beta,
                          p->C, p->ldc);
}

// Every shape of the tables, both layouts of A, beta 0 and 1: each element equals the
// plain loop's fmaf sum in k order, times alpha, plus C, bit for bit; the columns of C
// past N are never written.
static void test_each_element_is_the_ordered_fused_sum(void) {
    if (!agi_tile_gemm_available()) {
        printf("block products: not available on this CPU (no AVX-512F); BLAS is used\n");
        return;
    }
    ag_pcg32 rng = ag_pcg32_make(5, 1);
    bool same = true, untouched = true;
    for (int a = 0; a < N_ROWS; a++)
        for (int b = 0; b < N_COLS; b++)
            for (int c = 0; c < N_SUMS; c++) {
                const bool ta = (a + b + c) % 2, beta1 = (a + c) % 2;
                problem p = make(ta, rows[a], cols[b], sums[c], &rng);
                run(&p, 0.7f, beta1 ? 1.0f : 0.0f);
                for (int m = 0; m < p.M; m++) {
                    for (int n = 0; n < p.N; n++) {
                        float acc = 0;
                        for (int k = 0; k < p.K; k++)
                            acc = fmaf(a_at(&p, m, k), p.B[(size_t)k * p.ldb + n], acc);
                        float want = acc * 0.7f;
                        if (beta1) want += p.c0[(size_t)m * p.ldc + n];
                        same &= memcmp(&want, &p.C[(size_t)m * p.ldc + n], sizeof want) == 0;
                    }
                    for (int n = p.N; n < p.ldc; n++)
                        untouched &= p.C[(size_t)m * p.ldc + n] == p.c0[(size_t)m * p.ldc + n];
                }
                drop(&p);
            }
    CHECK(same);
    CHECK(untouched);
}

// Against float64 on the same float inputs: within (K + 2) u of |alpha| sum |a b| + |c|,
// u = 2^-24, the bound of K rounded fused steps, the scaling and the addition.
static void test_within_float_rounding_of_float64(void) {
    if (!agi_tile_gemm_available()) return;
    ag_pcg32 rng = ag_pcg32_make(5, 2);
    const double u = ldexp(1.0, -24);
    const float alpha = -1.3f;
    double worst = 0;  // error over its bound
    for (int a = 0; a < N_ROWS; a += 3)
        for (int b = 0; b < N_COLS; b += 2)
            for (int c = 1; c < N_SUMS; c++) {
                const bool ta = (a + c) % 2;
                problem p = make(ta, rows[a], cols[b], sums[c], &rng);
                run(&p, alpha, 1.0f);
                for (int m = 0; m < p.M; m++)
                    for (int n = 0; n < p.N; n++) {
                        double sum = 0, mag = 0;
                        for (int k = 0; k < p.K; k++) {
                            const double x = (double)a_at(&p, m, k) * p.B[(size_t)k * p.ldb + n];
                            sum += x;
                            mag += fabs(x);
                        }
                        const double c0 = p.c0[(size_t)m * p.ldc + n];
                        const double want = (double)alpha * sum + c0;
                        const double bound = (p.K + 2) * u * (fabs(alpha) * mag + fabs(c0));
                        const double err = fabs(p.C[(size_t)m * p.ldc + n] - want);
                        worst = fmax(worst, err / bound);
                    }
                drop(&p);
            }
    printf("block products vs float64: worst error %.2f of the rounding bound\n", worst);
    CHECK(worst <= 1.0);
}

// A NaN in op(A) makes its row of C NaN, one in B its column; 0 times infinity is NaN; a
// NaN already in C stays with beta 1 and is overwritten with beta 0 (C is not read).
static void test_nan_propagates(void) {
    if (!agi_tile_gemm_available()) return;
    ag_pcg32 rng = ag_pcg32_make(5, 3);
    for (int t = 0; t < 2; t++) {
        problem p = make(t == 1, 40, 70, 32, &rng);
        if (p.ta) p.A[(size_t)5 * p.lda + 17] = NAN;  // op(A)[17][5]
        else p.A[(size_t)17 * p.lda + 5] = NAN;
        p.B[(size_t)9 * p.ldb + 66] = INFINITY;  // column 66, times 0 in row 3 below
        for (int k = 0; k < p.K; k++) {
            if (p.ta) p.A[(size_t)k * p.lda + 3] = k == 9 ? 0.0f : p.A[(size_t)k * p.lda + 3];
            else p.A[(size_t)3 * p.lda + k] = k == 9 ? 0.0f : p.A[(size_t)3 * p.lda + k];
        }
        p.c0[(size_t)30 * p.ldc + 2] = NAN;
        run(&p, 1.0f, 1.0f);
        bool row = true, col = true;
        for (int n = 0; n < p.N; n++) row &= isnan(p.C[(size_t)17 * p.ldc + n]);
        for (int m = 0; m < p.M; m++)
            col &= m == 17 || m == 3 || isinf(p.C[(size_t)m * p.ldc + 66]);
        CHECK(row);
        CHECK(col);
        CHECK(isnan(p.C[(size_t)3 * p.ldc + 66]));
        CHECK(isnan(p.C[(size_t)30 * p.ldc + 2]));
        run(&p, 1.0f, 0.0f);
        CHECK(!isnan(p.C[(size_t)30 * p.ldc + 2]));
        drop(&p);
    }
}

int main(void) {
    RUN(test_each_element_is_the_ordered_fused_sum);
    RUN(test_within_float_rounding_of_float64);
    RUN(test_nan_propagates);
    return testing_summary();
}
