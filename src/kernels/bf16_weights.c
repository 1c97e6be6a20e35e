// bfloat16 copies of weights (bf16_weights.h): a list searched in order (a decoder asks
// for a few dozen weights), each copy packed by agi_gemv_bf16_pack, then checked by
// agi_gemv_bf16_checked.
#include "bf16_weights.h"

#include "../core/internal.h"
#include "gemv.h"

typedef struct {
    const float *w;
    int N, K;
    uint16_t *copy;
    bool fresh;  // made or checked since the last expiry
} entry;

struct agi_bf16_weights {
    entry *e;
    int count, cap;
};

agi_bf16_weights *agi_bf16_weights_new(void) { return agi_calloc(sizeof(agi_bf16_weights)); }

void agi_bf16_weights_free(agi_bf16_weights *t) {
    if (!t) return;
    for (int i = 0; i < t->count; i++) agi_free(t->e[i].copy);
    agi_free(t->e);
    agi_free(t);
}

void agi_bf16_weights_expire(agi_bf16_weights *t) {
    for (int i = 0; t && i < t->count; i++) t->e[i].fresh = false;
}

void agi_bf16_weights_gemv(agi_bf16_weights *t, int M, int N, int K, const float *X, int ldx,
                           const float *W, const float *bias, float *Y, int ldy) {
    entry *e = NULL;
    for (int i = 0; i < t->count && !e; i++)
        if (t->e[i].w == W && t->e[i].N == N && t->e[i].K == K) e = &t->e[i];
    if (!e) {
        t->e = agi_reserve(t->e, &t->cap, t->count, t->count + 1, 16, sizeof *t->e);
        e = &t->e[t->count++];
        *e = (entry){W, N, K, agi_malloc(agi_gemv_bf16_packed_len(N, K) * sizeof *e->copy),
                     true};
        agi_gemv_bf16_pack(N, K, W, (size_t)K, e->copy);
    }
    if (e->fresh) {
        agi_gemv_bf16(M, N, K, X, ldx, e->copy, bias, Y, ldy);
        return;
    }
    agi_gemv_bf16_checked(M, N, K, X, ldx, W, e->copy, bias, Y, ldy);
    e->fresh = true;
}
