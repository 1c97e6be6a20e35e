// The elementwise passes over a block of attention scores: masks and position bias, the
// online softmax, and the probabilities, dropout and score gradients of the backward.
// A block is bq rows (queries) by bk columns (keys) of reals, rows ld apart. Compiled once
// per real type (typed source): each name is R(...) of real.h, so include real.h first.
#ifndef ATTOGRAD_SCORE_BLOCK_H
#define ATTOGRAD_SCORE_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/real.h"

// What is added to or removed from one block's scores, as plain pointers at the block's
// first row and key. A NULL pointer is absent. A row stride of 0 repeats row 0 for every
// query (a mask broadcast over queries).
typedef struct {
    const real *rel;      // position bias by relative position: row r, key c adds
                          // rel[c - r] (the caller points it at relative position j0 - i0)
    const real *add;      // additive mask
    size_t add_ld;
    const uint8_t *mask;  // boolean mask
    size_t mask_ld;
    const uint8_t *kpm;   // key padding, one row for all queries
    bool keeps;           // polarity of mask and kpm: true = may attend (else: masked)
    bool causal;          // row r masks keys c >= causal_first + r
    int causal_first;
    bool window;          // row r masks keys c < window_lo + r and c >= window_hi + r
    int window_lo, window_hi;  // (a sliding window; both within [-bq, bk])
} agi_score_masks;

// s = s + rel + add, then -inf where mask, key padding, causality or a window forbid a key, in
// ag_softmax's order.
void R(agi_score_mask)(real *s, int ld, int bq, int bk, const agi_score_masks *m);

// One online-softmax step on a block of scores s (see src/ops/attention.c): raises each
// row's running max m[r] to m', scales its running sum l[r] and its output row o (dv
// reals, rows ldo apart) by exp(m - m'), adds the block's exp(s - m') to l[r] and leaves
// exp(s - m') in s, times keep / (1 - p) when keep (rows ldkeep apart) is not NULL.
// When `saved` is not NULL the scores are first copied there as they are (rows ld apart):
// the pass reads them anyway, and backward can then skip making them again.
// A row that has seen only -inf keeps m = -inf, l = 0 and a zero block; a row whose
// scores so far contain a NaN (or a +inf) ends with l = NaN, so NaN reaches o.
void R(agi_online_softmax_block)(real *s, int ld, int bq, int bk, real *m, double *l, real *o,
                                 int ldo, int dv, const uint8_t *keep, int ldkeep,
                                 real keep_scale, real *saved);

// P = exp((s - mx[r]) - lsum[r]), row by row; s may be P (in place). s - mx first: it is
// small (exact when s is near mx), where s - (mx + lsum) in the real type would lose lsum
// for a large |mx|.
void R(agi_probs_block)(const real *s, real *P, int ld, int bq, int bk, const real *mx,
                        const real *lsum);

// Pd = P keep / (1 - p) (keep rows ldkeep apart).
void R(agi_dropout_block)(const real *P, real *Pd, int ld, int bq, int bk, const uint8_t *keep,
                          int ldkeep, real keep_scale);

// dS = P (dP - D[r]) in place of dPd, with dP = dPd keep / (1 - p) (or dPd when keep is
// NULL): the score gradient through the softmax and dropout.
void R(agi_dscores_block)(const real *P, real *dS, int ld, int bq, int bk, const double *D,
                          const uint8_t *keep, int ldkeep, real keep_scale);

// out[r] = a_r . b_r over n reals, summed in double, for `rows` rows (a's ld lda, b's ldb):
// D = rowsum(dO * O) of the attention backward. With bf16_a each a is rounded to bfloat16
// first: under bf16 autocast the product dP = dO V^T sees dO so, and D must match it (on a
// row whose weights are nearly one-hot, dP - D at the chosen key is the difference of two
// nearly equal sums, and dO's rounding in one of them only would be all of it).
void R(agi_rows_dot)(const real *a, int lda, const real *b, int ldb, int rows, int n,
                     bool bf16_a, double *out);

// g[r * ldg + c] += dS[r * ld + c] for the block: the gradient of an additive mask, whose
// rows are ldg apart; ldg = (size_t)-1 walks back one element per row instead (g[c - r]),
// the diagonals of a position bias by relative position.
void R(agi_score_grad_add)(const real *dS, int ld, int bq, int bk, real *g, size_t ldg);

#endif
