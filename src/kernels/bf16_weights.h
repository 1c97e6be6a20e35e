// bfloat16 copies of float32 weights, for products that read a weight matrix far more
// often than it changes: a decode step under autocast reads every weight once a token, and
// reading a bf16 copy moves half the bytes. A table holds the copies of the weights it
// was asked for, each made once and made again only after the table is told that the
// weights may have changed (agi_bf16_weights_expire: at the start of a generation).
#ifndef ATTOGRAD_BF16_WEIGHTS_H
#define ATTOGRAD_BF16_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct agi_bf16_weights agi_bf16_weights;

agi_bf16_weights *agi_bf16_weights_new(void);
void agi_bf16_weights_free(agi_bf16_weights *t);

// W [N, K] (rows K apart) rounded to bfloat16 and packed for agi_gemv_bf16 (gemv.h): the
// table's copy, made now (allocated the first time) when the table has none of W or the
// weights have expired since it was made. W is a weight that does not move (a parameter):
// the table knows a copy by W, N and K.
const uint16_t *agi_bf16_weights_of(agi_bf16_weights *t, const float *W, int N, int K);

// Every copy is made again at its next use (the weights may have changed); allocates
// nothing.
void agi_bf16_weights_expire(agi_bf16_weights *t);

#endif
