// The cross-entropy row kernels (src/ops/cross_entropy.c): the AVX-512 rows agree with the
// portable rows at every width around the lane count, with ignored rows, extreme, infinite and
// NaN logits: the forward's row maxima exactly, its 1 / s and loss part within a few ulps (it
// sums its exps with fused multiply-adds), and the backward from the same statistics in every
// bit; and through the op, the loss summed by
// chunks over many rows is the same on one thread and two, close to f64, and a NaN or -inf
// logit does what the formula says.
#include <float.h>
#include <stdlib.h>

#include "../src/ops/cross_entropy.h"
#include "op_checks.h"

enum { ROWS = 250 };  // one chunk, not a whole number of 16-row blocks

// Logits of a few kinds by row: uniform, +-1000 and a near tie, a -inf among finite values
// (not the target), all equal, and (when `nan`) a NaN in some kept rows.
static void fill_logits(float *x, int C, int32_t *t, bool nan, uint64_t seed) {
    ag_pcg32 g = ag_pcg32_make(seed, 3);
    for (int r = 0; r < ROWS; r++) {
        float *xr = x + (size_t)r * C;
        for (int c = 0; c < C; c++) xr[c] = (float)(8 * ag_pcg32_double(&g) - 4);
        if (r % 7 == 1) xr[0] = 1000, xr[C - 1] = C > 1 ? 999.5f : 1000;
        if (r % 7 == 2 && C > 1) xr[C / 2] = -INFINITY;
        if (r % 7 == 3)
            for (int c = 0; c < C; c++) xr[c] = 0.25f;
        if (r % 7 == 4) xr[C - 1] = -1000;
        if (nan && r % 31 == 5) xr[C / 3] = NAN;
        t[r] = r % 5 == 0 ? -100 : (int32_t)ag_pcg32_bounded(&g, (uint32_t)C);
        if (r % 7 == 2 && C > 1 && t[r] == C / 2) t[r] = (C / 2 + 1) % C;  // a finite loss
    }
}

// The statistics of the two forwards: m the same bits, 1 / s within 4 ulps of float (s sums at
// most 16 exps in float lanes before double, each within 2 ulps of the other code's). A row
// with a NaN logit has 1 / s NaN in both, which makes its whole gradient NaN whatever m is
// (the AVX-512 code takes the max by pairs, the portable code in a chain, and a NaN hides
// a different part of the row from each).
static bool stats_close(const agi_ce_stats_f32 *a, const agi_ce_stats_f32 *b, int rows) {
    for (int r = 0; r < rows; r++) {
        const float p = a[r].inv_s, q = b[r].inv_s;
        if (isnan(p) || isnan(q)) {
            if (!(isnan(p) && isnan(q))) return false;
        } else if (memcmp(&a[r].m, &b[r].m, sizeof a[r].m) != 0 ||
                   fabsf(p - q) > 4 * FLT_EPSILON * fabsf(p)) {
            return false;
        }
    }
    return true;
}

static void test_avx512_rows_match_the_portable_rows_at_every_width(void) {
    const int widths[] = {1, 2, 3, 5, 8, 11, 15, 16, 17, 31, 32, 33, 100, 255, 256, 257, 600};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++)
        for (int nan = 0; nan < 2; nan++) {
            const int C = widths[w];
            float *x = malloc((size_t)ROWS * C * sizeof *x);
            int32_t t[ROWS];
            agi_ce_stats_f32 a[ROWS], b[ROWS];
            fill_logits(x, C, t, nan, 10 + (uint64_t)w);
            memset(a, 0, sizeof a), memset(b, 0, sizeof b);
            double la = agi_ce_forward_rows_portable_f32(x, t, -100, C, 0, ROWS, a), lb = 0;
            if (agi_ce_forward_rows_avx512_f32(x, t, -100, C, 0, ROWS, b, &lb)) {
                // The loss part: about 200 rows' m - x[t] + log s, each log s within 4 ulps.
                CHECK(nan ? isnan(lb) : fabs(la - lb) <= 1e-6 * (fabs(la) + ROWS));
                CHECK(stats_close(a, b, ROWS));
            }
            CHECK(nan ? isnan(la) : isfinite(la));
            // Backward from those stats, over all rows and over a run that starts and ends
            // inside 16-row blocks, onto a gradient that already holds values.
            float *ga = malloc((size_t)ROWS * C * sizeof *ga), *gb = malloc((size_t)ROWS * C * sizeof *gb);
            for (size_t i = 0; i < (size_t)ROWS * C; i++) ga[i] = gb[i] = (float)(i % 7) - 3;
            const size_t runs[2][2] = {{0, ROWS}, {5, 203}};
            for (int k = 0; k < 2; k++) {
                agi_ce_backward_rows_portable_f32(x, ga, t, -100, C, ROWS, runs[k][0], runs[k][1], a, 0.37f);
                if (!agi_ce_backward_rows_avx512_f32(x, gb, t, -100, C, ROWS, runs[k][0], runs[k][1], a, 0.37f))
                    agi_ce_backward_rows_portable_f32(x, gb, t, -100, C, ROWS, runs[k][0], runs[k][1], a, 0.37f);
            }
            CHECK(memcmp(ga, gb, (size_t)ROWS * C * sizeof *ga) == 0);
            free(ga), free(gb);
            free(x);
        }
}

static void random_targets(int32_t *t, size_t rows, int C, int ignore_every, uint64_t seed) {
    ag_pcg32 rng = ag_pcg32_make(seed, 9);
    for (size_t r = 0; r < rows; r++)
        t[r] = r % (size_t)ignore_every == 1 ? -100 : (int32_t)ag_pcg32_bounded(&rng, (uint32_t)C);
}

// A row-major reference in double: mean over kept rows of lse - x[t].
static double reference_loss(const float *x, const int32_t *t, size_t rows, int C) {
    double total = 0;
    size_t kept = 0;
    for (size_t r = 0; r < rows; r++) {
        if (t[r] == -100) continue;
        double m = -INFINITY, s = 0;
        for (int c = 0; c < C; c++) m = fmax(m, x[r * C + c]);
        for (int c = 0; c < C; c++) s += exp(x[r * C + c] - m);
        total += m + log(s) - x[r * C + t[r]];
        kept++;
    }
    return total / (double)kept;
}

static void test_many_rows_same_bits_on_two_threads_and_close_to_double(void) {
    const int widths[] = {11, 256, 40};
    for (int w = 0; w < 3; w++) {
        const int C = widths[w];
        const size_t rows = 3000;  // several chunks, the last one short
        ag_tensor *x = random_tensor(AG_F32, (test_shape){2, {(int)rows, C}}, 50 + (uint64_t)w, -6, 6);
        ag_tensor_set_requires_grad(x, true);
        int32_t *t = malloc(rows * sizeof *t);
        random_targets(t, rows, C, 9, 60 + (uint64_t)w);
        float loss[2];
        float *grad[2];
        for (int run = 0; run < 2; run++) {
            ag_threads_set(run + 1);
            ag_tape *tp = ag_tape_new();
            ag_tensor_zero_grad(x);
            ag_tensor *y = ag_cross_entropy(tp, x, t, rows, -100);
            ag_backward(tp, y);
            loss[run] = ag_tensor_f32(y)[0];
            grad[run] = malloc(x->numel * sizeof(float));
            memcpy(grad[run], x->grad, x->numel * sizeof(float));
            ag_tape_free(tp);
        }
        ag_threads_set(1);
        CHECK(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0);
        CHECK(memcmp(grad[0], grad[1], x->numel * sizeof(float)) == 0);
        CHECK_NEAR(loss[0], reference_loss(ag_tensor_f32(x), t, rows, C), 1e-6);
        free(grad[0]), free(grad[1]), free(t);
        ag_tensor_free(x);
    }
}

// A NaN logit makes its row's gradient and the loss NaN, and no other row's gradient; a
// -inf logit has probability exactly 0 (its gradient is exactly 0 unless it is the target).
static void test_nan_and_minus_infinity_logits(void) {
    const int widths[] = {11, 256};
    for (int w = 0; w < 2; w++) {
        const int C = widths[w], rows = 40;
        ag_tensor *x = random_tensor(AG_F32, (test_shape){2, {rows, C}}, 70, -3, 3);
        ag_tensor_set_requires_grad(x, true);
        float *xv = ag_tensor_f32(x);
        int32_t t[40];
        for (int r = 0; r < rows; r++) t[r] = (r * 7) % C;
        xv[3 * C + 1] = -INFINITY;  // row 3, class 1 (the target is 21 % C)
        ag_tape *tp = ag_tape_new();
        ag_tensor *y = ag_cross_entropy(tp, x, t, (size_t)rows, -100);
        ag_backward(tp, y);
        CHECK(isfinite(ag_tensor_f32(y)[0]));
        CHECK(ag_tensor_grad_item(x, (size_t)(3 * C + 1)) == 0.0);
        ag_tape_free(tp);

        xv[17 * C + C - 1] = NAN;
        ag_tensor_zero_grad(x);
        tp = ag_tape_new();
        y = ag_cross_entropy(tp, x, t, (size_t)rows, -100);
        ag_backward(tp, y);  // dy = 1: dy / N is finite
        CHECK(isnan(ag_tensor_f32(y)[0]));
        size_t nan_elsewhere = 0, finite_in_row = 0;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < C; c++) {
                double g = ag_tensor_grad_item(x, (size_t)(r * C + c));
                if (r == 17) finite_in_row += isfinite(g);
                else nan_elsewhere += isnan(g);
            }
        CHECK(finite_in_row == 0 && nan_elsewhere == 0);
        ag_tape_free(tp);
        ag_tensor_free(x);
    }
}

int main(void) {
    RUN(test_avx512_rows_match_the_portable_rows_at_every_width);
    RUN(test_many_rows_same_bits_on_two_threads_and_close_to_double);
    RUN(test_nan_and_minus_infinity_logits);
    return testing_summary();
}
