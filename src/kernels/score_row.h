// The two products of the fused attention for one query row (decoding: one new position
// against the cached keys), as dot products on the keys and values where they lie: a tile
// product of one row would first transpose the key block and pack both operands, which
// for a few dozen keys costs more than the arithmetic. Typed (see src/core/real.h).
#ifndef ATTOGRAD_SCORE_ROW_H
#define ATTOGRAD_SCORE_ROW_H

#include "../core/real.h"

// s[c] = scale (q . K_c) for keys c < n, the keys K_c d wide and ldk apart. Each dot
// product is summed in 16 partial sums over d, then a fixed tree (score_row.c).
void R(agi_row_scores)(const real *q, const real *K, int ldk, int n, int d, real scale,
                       real *s);

// o[0, dv) += sum_{c < n} p[c] V_c, the values V_c ldv apart, summed in a fixed order.
// Every key is read: a weight 0 times a NaN value is NaN, as in the tile and BLAS products.
void R(agi_row_weighted_sum)(const real *p, const real *V, int ldv, int n, int dv, real *o);

#endif
