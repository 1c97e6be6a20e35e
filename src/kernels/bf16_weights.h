// bfloat16 copies of float32 weights, for products that read a weight matrix far more
// often than it changes: a decode step under autocast reads every weight once a token, and
// reading a bf16 copy moves half the bytes. A table holds the copies of the weights it
// was asked for, each made at its first use and checked against its weights (mended where
// they changed) at its first use after the table is told that they may have changed
// (agi_bf16_weights_expire: at the start of a generation).
#ifndef ATTOGRAD_BF16_WEIGHTS_H
#define ATTOGRAD_BF16_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct agi_bf16_weights agi_bf16_weights;

agi_bf16_weights *agi_bf16_weights_new(void);
void agi_bf16_weights_free(agi_bf16_weights *t);

// Y [M, N] = X [M, K] W^T (+ 1 bias^T) as agi_gemv_bf16 (gemv.h) gives it on the table's
// copy of W [N, K] (rows K apart): the copy made now (allocated) if the table has none,
// checked and mended in the same pass as the product if the weights have expired since
// it was last checked. W is a weight that does not move (a parameter): the table knows a
// copy by W, N and K.
void agi_bf16_weights_gemv(agi_bf16_weights *t, int M, int N, int K, const float *X, int ldx,
                           const float *W, const float *bias, float *Y, int ldy);

// Every copy is checked again at its next use (the weights may have changed); allocates
// nothing.
void agi_bf16_weights_expire(agi_bf16_weights *t);

#endif
