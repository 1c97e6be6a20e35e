// Inverted dropout.
//   x: [..., D] -> y: [..., D]
//   y = x * keep * s,  s = 1 / (1 - p)
// With the mask fixed, y is linear in x:  dx = dy * keep * s.
// Both are a multiplication even where keep = 0, so a dropped NaN or inf stays NaN
// (x * 0), as PyTorch's x * mask * s, and a NaN upstream gradient stays NaN.
//
// The keep rule (shared with ag_dropout_row_mask, which a fused attention kernel
// uses to replay one row): element (r, c) takes u, the (r * D + c)-th 32-bit output
// of pcg32 seeded (seed, site), and is kept iff u >= round(p * 2^32). u is uniform
// on [0, 2^32), so P(keep) = 1 - round(p * 2^32) / 2^32, within 2^-33 of 1 - p;
// p = 0 keeps everything and p = 1 (threshold 2^32) nothing.
//
// When recording, the forward keeps the mask as a BITMASK in tape memory (1 bit per
// element, each row padded to whole 32-bit words so rows can be written in parallel):
// backward then needs no random numbers at all, and the mask costs 1/32 of an f32
// activation instead of a byte (or a float) per element.
#include "op.h"

typedef struct {
    double p;
    uint64_t seed, site;
} dropout_params;

// ---- The keep rule --------------------------------------------------------------------

// The smallest output that keeps an element, in [0, 2^32]. p * 2^32 is exact in double.
static uint64_t keep_threshold(double p) { return (uint64_t)round(p * 4294967296.0); }

// A generator positioned at element (row, 0) of a [..., D] tensor.
static ag_pcg32 row_generator(uint64_t seed, uint64_t site, size_t row, int D) {
    ag_pcg32 g;
    ag_pcg32_seed(&g, seed, site);
    ag_pcg32_advance(&g, (uint64_t)row * (uint64_t)D);
    return g;
}

// Keep flags of the next `count` (<= 32) elements: bit k for the k-th.
static uint32_t next_keep_bits(ag_pcg32 *g, uint64_t threshold, int count) {
    uint32_t bits = 0;
    for (int k = 0; k < count; k++) bits |= (uint32_t)(ag_pcg32_next(g) >= threshold) << k;
    return bits;
}

static int words_per_row(int D) { return (D + 31) / 32; }

// ---- The op ------------------------------------------------------------------------------

typedef struct {
    int D;
    uint64_t seed, site, threshold;
    real s;  // 1 / (1 - p)
    const real *x, *dy;
    real *y, *dx;
    uint32_t *bits;  // rows x words_per_row(D), or NULL when not recording
} dropout_job;

static void forward_rows(int begin, int end, void *ctx) {
    const dropout_job *j = ctx;
    const int D = j->D, words = words_per_row(D);
    // Row r ends exactly where row r + 1 begins (at (r + 1) * D), so one generator
    // positioned at row `begin` serves the whole slice: the same draws as seeding
    // every row afresh, without the O(log) jump per row.
    ag_pcg32 g = row_generator(j->seed, j->site, (size_t)begin, D);
    for (size_t r = (size_t)begin; r < (size_t)end; r++) {
        const real *x = j->x + r * D;
        real *y = j->y + r * D;
        for (int w = 0; w < words; w++) {
            int c0 = 32 * w, count = D - c0 < 32 ? D - c0 : 32;
            uint32_t keep = next_keep_bits(&g, j->threshold, count);
            if (j->bits) j->bits[r * words + w] = keep;
            for (int k = 0; k < count; k++) y[c0 + k] = x[c0 + k] * ((keep >> k & 1u) ? j->s : 0);
        }
    }
}

static void backward_rows(int begin, int end, void *ctx) {
    const dropout_job *j = ctx;
    const int D = j->D, words = words_per_row(D);
    for (size_t r = (size_t)begin; r < (size_t)end; r++) {
        const real *dy = j->dy + r * D;
        real *dx = j->dx + r * D;
        for (int w = 0; w < words; w++) {
            int c0 = 32 * w, count = D - c0 < 32 ? D - c0 : 32;
            uint32_t keep = j->bits[r * words + w];
            for (int k = 0; k < count; k++) dx[c0 + k] += dy[c0 + k] * ((keep >> k & 1u) ? j->s : 0);
        }
    }
}

static void dropout_forward(ag_node *n) {
    const dropout_params *p = n->params;
    const ag_tensor *x = n->in[0];
    real *y = n->out->data;
    if (p->p >= 1) {  // nothing kept: x * 0, and nothing to save
        for (size_t k = 0; k < x->numel; k++) y[k] = ((const real *)x->data)[k] * 0;
        return;
    }
    const int D = agi_last(x);
    const size_t rows = agi_rows(x);
    dropout_job j = {D, p->seed, p->site, keep_threshold(p->p), (real)(1.0 / (1.0 - p->p)),
                     x->data, NULL, y, NULL, NULL};
    if (n->recording) {
        j.bits = ag_tape_alloc(n->tape, rows * (size_t)words_per_row(D) * sizeof *j.bits);
        n->saved = j.bits;
    }
    agi_parallel_for((int)rows, 10.0 * (double)x->numel, forward_rows, &j);
}

static void dropout_backward(ag_node *n) {
    const dropout_params *p = n->params;
    const ag_tensor *x = n->in[0];
    if (p->p >= 1) {  // y = x * 0: dy * 0, zero unless dy is not finite
        const real *dy = n->out->grad;
        real *dx = x->grad;
        for (size_t k = 0; k < x->numel; k++) dx[k] += dy[k] * 0;
        return;
    }
    dropout_job j = {agi_last(x), 0, 0, 0, (real)(1.0 / (1.0 - p->p)), NULL,
                     n->out->grad, NULL, x->grad, n->saved};
    agi_parallel_for((int)agi_rows(x), 2.0 * (double)x->numel, backward_rows, &j);
}

const ag_op R(agi_dropout_op) = {"dropout", dropout_forward, dropout_backward,
    "dx = dy * keep / (1 - p)"};

#if AG_ONCE
extern const ag_op agi_dropout_op_f32, agi_dropout_op_f64;

ag_tensor *ag_dropout(ag_tape *tp, ag_tensor *x, double p, bool training, uint64_t seed,
                      uint64_t site) {
    if (!agi_check_float("dropout", "x", x)) return NULL;
    if (!(p >= 0 && p <= 1)) {  // also rejects NaN
        ag_error("dropout: p must be in [0, 1], got %g; x %s", p, agi_shape(x));
        return NULL;
    }
    if (!training || p == 0) return x;
    dropout_params prm = {p, seed, site};
    return ag_apply(tp, agi_pick(x, &agi_dropout_op_f32, &agi_dropout_op_f64), 1, &x, x->ndim,
                    x->shape, &prm, sizeof prm);
}

void ag_dropout_row_mask(uint64_t seed, uint64_t site, double p, size_t row, int D,
                         uint8_t *keep) {
    if (!(p >= 0 && p <= 1)) {
        ag_error("dropout_row_mask: p must be in [0, 1], got %g", p);
        return;
    }
    if (D < 0 || (D > 0 && !keep)) {
        ag_error("dropout_row_mask: needs D >= 0 and a buffer of D bytes, got D = %d%s", D,
                 keep ? "" : " and no buffer");
        return;
    }
    ag_pcg32 g = row_generator(seed, site, row, D);
    const uint64_t threshold = keep_threshold(p);
    for (int c0 = 0; c0 < D; c0 += 32) {
        int count = D - c0 < 32 ? D - c0 : 32;
        uint32_t bits = next_keep_bits(&g, threshold, count);
        for (int k = 0; k < count; k++) keep[c0 + k] = (uint8_t)(bits >> k & 1u);
    }
}
#endif
