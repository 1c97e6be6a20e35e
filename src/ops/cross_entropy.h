// The row kernels of cross-entropy (src/ops/cross_entropy.c), seen by its tests: the
// forward over one chunk of rows, portable and, in f32, with AVX-512 (rows of at most 16
// classes as 16 lanes, wider rows along the row), which must give the very same bits.
#ifndef ATTOGRAD_OPS_CROSS_ENTROPY_H
#define ATTOGRAD_OPS_CROSS_ENTROPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Per row, saved for backward: the row maximum m and 1 / s, s = sum exp(x - m), so that
// softmax(x)[c] = exp(x[c] - m) / s.
typedef struct {
    float m, inv_s;
} agi_ce_stats_f32;
typedef struct {
    double m, inv_s;
} agi_ce_stats_f64;

// Rows [r0, r1) of logits x [rows, C], a chunk of at most 256 rows: writes stats[r] (when
// stats is not NULL) and returns the chunk's part of the summed loss, the sum over its kept
// rows of m - x[t] + log s.
double agi_ce_forward_rows_portable_f32(const float *x, const int32_t *targets,
                                        int32_t ignore_index, int C, size_t r0, size_t r1,
                                        agi_ce_stats_f32 *stats);
double agi_ce_forward_rows_portable_f64(const double *x, const int32_t *targets,
                                        int32_t ignore_index, int C, size_t r0, size_t r1,
                                        agi_ce_stats_f64 *stats);
// The same with AVX-512, into *loss; false (and nothing done) where the CPU has none.
bool agi_ce_forward_rows_avx512_f32(const float *x, const int32_t *targets,
                                    int32_t ignore_index, int C, size_t r0, size_t r1,
                                    agi_ce_stats_f32 *stats, double *loss);

// Backward of rows [r0, r1) of x [rows, C]: dx += (softmax - onehot(target)) g, from the
// saved stats; and the same with AVX-512 for C <= 16 (false, nothing done, where the CPU has
// no AVX-512 or C > 16).
void agi_ce_backward_rows_portable_f32(const float *x, float *dx, const int32_t *targets,
                                       int32_t ignore_index, int C, size_t rows, size_t r0,
                                       size_t r1, const agi_ce_stats_f32 *stats, float g);
void agi_ce_backward_rows_portable_f64(const double *x, double *dx, const int32_t *targets,
                                       int32_t ignore_index, int C, size_t rows, size_t r0,
                                       size_t r1, const agi_ce_stats_f64 *stats, double g);
bool agi_ce_backward_rows_avx512_f32(const float *x, float *dx, const int32_t *targets,
                                     int32_t ignore_index, int C, size_t rows, size_t r0,
                                     size_t r1, const agi_ce_stats_f32 *stats, float g);

#endif
