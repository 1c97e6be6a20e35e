// The float32 score-block passes for AVX-512 CPUs (see score_block_avx512.c): the same
// contracts as agi_online_softmax_block, agi_probs_block and agi_dscores_block of
// score_block.h, and out[r] = a_r . b_r (in double) for `rows` rows of n floats. Call
// only when agi_tile_gemm_available().
#ifndef ATTOGRAD_SCORE_BLOCK_AVX512_H
#define ATTOGRAD_SCORE_BLOCK_AVX512_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void agi_online_softmax_block_avx512(float *s, int ld, int bq, int bk, float *m, double *l,
                                     float *o, int ldo, int dv, const uint8_t *keep,
                                     int ldkeep, float keep_scale, float *saved);
void agi_probs_block_avx512(const float *s, float *P, int ld, int bq, int bk,
                            const float *mx, const float *lsum);
void agi_dscores_block_avx512(const float *P, float *dS, int ld, int bq, int bk,
                              const double *D, const uint8_t *keep, int ldkeep,
                              float keep_scale);
void agi_rows_dot_avx512(const float *a, int lda, const float *b, int ldb, int rows, int n,
                         double *out);

#endif
