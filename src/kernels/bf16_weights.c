// bfloat16 copies of weights (bf16_weights.h): a list searched in order (a decoder asks
// for a few dozen weights), each copy rounded by vcvtneps2bf16 where the bf16 products
// run natively, which rounds as agi_bf16_round does (bf16_gemm.c), and by
// agi_bf16_round elsewhere.
#include "bf16_weights.h"

#include "../core/internal.h"
#include "bf16_gemm.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AG_HAVE_BF16_CONVERT 1
#endif

typedef struct {
    const float *w;
    size_t n;
    uint16_t *copy;
    bool fresh;  // made since the last expiry
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

#ifdef AG_HAVE_BF16_CONVERT
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static size_t
convert_native(const float *w, size_t n, uint16_t *dst) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(w + i + 16),
                                                                  _mm512_loadu_ps(w + i)));
    return i;
}
#endif

static void convert(const float *w, size_t n, uint16_t *dst) {
    size_t i = 0;
#ifdef AG_HAVE_BF16_CONVERT
    if (agi_bf16_native()) i = convert_native(w, n, dst);
#endif
    for (; i < n; i++) dst[i] = agi_bf16_round(w[i]);
}

const uint16_t *agi_bf16_weights_of(agi_bf16_weights *t, const float *w, size_t n) {
    entry *e = NULL;
    for (int i = 0; i < t->count && !e; i++)
        if (t->e[i].w == w && t->e[i].n == n) e = &t->e[i];
    if (!e) {
        t->e = agi_reserve(t->e, &t->cap, t->count, t->count + 1, 16, sizeof *t->e);
        e = &t->e[t->count++];
        *e = (entry){w, n, agi_malloc(n * sizeof *e->copy), false};
    }
    if (!e->fresh) {
        convert(w, n, e->copy);
        e->fresh = true;
    }
    return e->copy;
}
