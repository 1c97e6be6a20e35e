// Position bias inside the softmax (RELATIVE, T5, ALiBi): b(head, i, j) depends on the
// head and on j - i alone, so one call computes it once per relative position, into a
// vector rel[head, (j - i) + T - 1] of h (T + S - 1) reals, and the softmax and attention
// kernels add rel[head, j - i + T - 1] to score (i, j) as they go: never a T x S buffer.
// Gradient: d table[head, col] = sum over (i, j) with column(j - i) = col of dS_ij, i.e.
// the score gradients summed along each diagonal (into d rel), then gathered by column.
#include <stdlib.h>

#include "op.h"

void R(agi_pos_rel_fill)(const agi_mask_inputs *m, const real *table, int T, int S, real *rel) {
    const int n = T + S - 1, h = m->heads;
    const int cols = m->pos.kind == AG_POS_RELATIVE ? 2 * m->pos.max_distance + 1
                                                    : m->pos.num_buckets;
    for (int head = 0; head < h; head++)
        for (int k = 0; k < n; k++) {
            const int d = k - (T - 1);  // j - i
            real b;
            if (m->pos.kind == AG_POS_ALIBI) {
                const double slope = agi_alibi_slope(head, h);
                b = (real)(m->pos.bidirectional ? -slope * abs(d) : slope * d);
            } else {
                b = table[(size_t)head * cols + agi_pos_column(&m->pos, d)];
            }
            rel[(size_t)head * n + k] = b;
        }
}

void R(agi_pos_rel_grad)(const agi_mask_inputs *m, const real *grel, int T, int S,
                         real *gtable) {
    if (m->pos.kind == AG_POS_ALIBI) return;
    const int n = T + S - 1;
    const int cols = m->pos.kind == AG_POS_RELATIVE ? 2 * m->pos.max_distance + 1
                                                    : m->pos.num_buckets;
    for (int head = 0; head < m->heads; head++)
        for (int k = 0; k < n; k++)
            gtable[(size_t)head * cols + agi_pos_column(&m->pos, k - (T - 1))] +=
                grel[(size_t)head * n + k];
}

#if AG_ONCE
// T5's bucket of relative position rel = j - i, step by step as HuggingFace's
// T5Attention._relative_position_bucket, in float32 as torch computes it there: exact
// buckets for |rel| < max_exact, then logarithmic up to max_distance, then the last.
static int t5_bucket(int rel, bool bidirectional, int num_buckets, int max_distance) {
    int bucket = 0, nb = num_buckets;
    if (bidirectional) {
        nb /= 2;
        bucket += rel > 0 ? nb : 0;
        rel = abs(rel);
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    const int max_exact = nb / 2;
    if (rel < max_exact) return bucket + rel;
    const float ratio = logf((float)rel / (float)max_exact) /
                        (float)log((double)max_distance / max_exact) * (float)(nb - max_exact);
    const long large = max_exact + (long)ratio;
    return bucket + (int)(large < nb - 1 ? large : nb - 1);
}

int agi_pos_column(const ag_pos_bias *p, int rel) {
    if (p->kind == AG_POS_T5)
        return t5_bucket(rel, p->bidirectional, p->num_buckets, p->max_distance);
    const int M = p->max_distance;
    return (rel < -M ? -M : rel > M ? M : rel) + M;
}

// The ALiBi paper's slopes: for h a power of two, 2^(-8 (k + 1) / h); otherwise those of
// the power of two p just below h, then every other slope of 2p for the remaining heads.
double agi_alibi_slope(int k, int h) {
    int p = 1;
    while (p * 2 <= h) p *= 2;
    if (k < p) return pow(2.0, -8.0 * (k + 1) / p);
    return pow(2.0, -8.0 * (2 * (k - p) + 1) / (2 * p));
}
#endif
