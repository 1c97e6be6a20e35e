// A position scheme's score term inside the softmax and the fused attention: b(head, i, j)
// depends on the head and on j - i alone, so one call computes it once per relative
// position, into a vector rel[head, (j - i) + T - 1 + q_offset] of h (T + S - 1) reals
// (query rows i at positions q_offset + i), and the kernels add it to score (i, j) as they
// go: never a T x S buffer. The scheme (pos.h) gives the term: a column of its table, or a
// value.
// Gradient: d table[head, col] = sum over (i, j) with column(j - i) = col of dS_ij, i.e.
// the score gradients summed along each diagonal (into d rel), then gathered by column.
#include "op.h"

void R(agi_pos_rel_fill)(const agi_scores *m, const real *table, int T, int S,
                         real *rel) {
    const agi_pos_scheme *s = agi_pos_scheme_of(m->pos.kind);
    const int n = T + S - 1, h = m->heads;
    const int cols = s->table_cols ? s->table_cols(&m->pos) : 0;
    for (int head = 0; head < h; head++)
        for (int k = 0; k < n; k++) {
            const int r = k - (T - 1) - m->q_offset;  // j - i
            rel[(size_t)head * n + k] = s->column
                                            ? table[(size_t)head * cols + s->column(&m->pos, r)]
                                            : (real)s->value(&m->pos, head, r);
        }
}

void R(agi_pos_rel_grad)(const agi_scores *m, const real *grel, int T, int S,
                         real *gtable) {
    const agi_pos_scheme *s = agi_pos_scheme_of(m->pos.kind);
    if (!s->column) return;
    const int n = T + S - 1, cols = s->table_cols(&m->pos);
    for (int head = 0; head < m->heads; head++)
        for (int k = 0; k < n; k++)
            gtable[(size_t)head * cols + s->column(&m->pos, k - (T - 1) - m->q_offset)] +=
                grel[(size_t)head * n + k];
}
