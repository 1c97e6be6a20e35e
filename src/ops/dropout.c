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
#include "../kernels/vecmath.h"

typedef struct {
    double p;
    uint64_t seed, site;
} dropout_params;

// ---- The keep rule --------------------------------------------------------------------

// The smallest output that keeps an element, in [0, 2^32]. p * 2^32 is exact in double.
static uint64_t keep_threshold(double p) { return (uint64_t)round(p * 4294967296.0); }

// p = 1, and p within 2^-33 of 1 (its threshold rounds to 2^32): no output is kept.
static bool keeps_nothing(double p) { return keep_threshold(p) > UINT32_MAX; }

// A generator positioned at element (row, 0) of a [..., D] tensor.
static ag_pcg32 row_generator(uint64_t seed, uint64_t site, size_t row, int D) {
    ag_pcg32 g;
    ag_pcg32_seed(&g, seed, site);
    ag_pcg32_advance(&g, (uint64_t)row * (uint64_t)D);
    return g;
}

// ---- The op ------------------------------------------------------------------------------
//
// The forward draws a row's numbers LANES at a time: lane k starts at the row's k-th output
// and steps LANES outputs at once, so the lanes' k-th draws of step w are outputs 32w + k:
// the same numbers, in the same places, as one generator stepping one output at a time.
// pcg32 steps its state by an affine map, s -> M s + inc, so k steps are s -> A_k s + C_k
// (A_k = M^k, C_k = inc (M^(k-1) + ... + 1)): each lane is one multiply-add from the row's
// state, and a lane's step of LANES outputs is one more. The lanes are independent, so the
// loops over them vectorise; the draws match ag_dropout_row_mask's (tested).

#define LANES 32  // = the bits of a mask word: one step of the lanes fills one word

// The affine map of k pcg32 steps on stream `inc`, read off ag_pcg32_advance.
typedef struct {
    uint64_t mult, plus;
} affine;

static affine steps_map(uint64_t inc, uint64_t k) {
    ag_pcg32 zero = {0, inc}, one = {1, inc};
    ag_pcg32_advance(&zero, k);
    ag_pcg32_advance(&one, k);
    return (affine){one.state - zero.state, zero.state};
}

typedef struct {
    int D;
    uint64_t seed, site, inc;
    uint32_t threshold;  // < 2^32: keeps_nothing(p) never reaches the kernels
    real s;              // 1 / (1 - p)
    uint64_t lane_mult[LANES], lane_plus[LANES];  // lane k's start: k steps from the row's
    affine step, row;    // LANES steps, and D steps (one row)
    const real *x, *dy;
    real *y, *dx;
    uint32_t *bits;  // rows x agi_dropout_words(D), or NULL when not recording
} dropout_job;

// pcg32's output permutation (XSH-RR) of a state, as ag_pcg32_next applies it.
static inline uint32_t pcg32_output(uint64_t old) {
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31u));
}

void R(agi_dropout_forward_rows)(size_t begin, size_t end, void *ctx);
void R(agi_dropout_backward_rows)(size_t begin, size_t end, void *ctx);

AGI_HOT void R(agi_dropout_forward_rows)(size_t begin, size_t end, void *ctx) {
    const dropout_job *j = ctx;
    const int D = j->D, words = agi_dropout_words(D);
    const uint32_t threshold = j->threshold;
    const real s = j->s;
    // Row r ends exactly where row r + 1 begins (at (r + 1) * D), so one state positioned
    // at row `begin` and stepped a row at a time serves the whole slice.
    ag_pcg32 g = row_generator(j->seed, j->site, begin, D);
    uint64_t row_state = g.state;
    for (size_t r = begin; r < end; r++) {
        const real *restrict x = j->x + r * D;
        real *restrict y = j->y + r * D;
        uint64_t st[LANES];
        for (int k = 0; k < LANES; k++) st[k] = j->lane_mult[k] * row_state + j->lane_plus[k];
        for (int w = 0; w < words; w++) {
            const int c0 = LANES * w, count = D - c0 < LANES ? D - c0 : LANES;
            uint32_t u[LANES], keep = 0;
            for (int k = 0; k < LANES; k++) {
                u[k] = pcg32_output(st[k]);
                st[k] = st[k] * j->step.mult + j->step.plus;
            }
            for (int k = 0; k < LANES; k++) keep |= (uint32_t)(u[k] >= threshold) << k;
            if (count == LANES) {
                for (int k = 0; k < LANES; k++) y[c0 + k] = x[c0 + k] * (u[k] >= threshold ? s : 0);
            } else {
                keep &= (1u << count) - 1;
                for (int k = 0; k < count; k++) y[c0 + k] = x[c0 + k] * (u[k] >= threshold ? s : 0);
            }
            if (j->bits) j->bits[r * (size_t)words + (size_t)w] = keep;
        }
        row_state = j->row.mult * row_state + j->row.plus;
    }
}

AGI_HOT void R(agi_dropout_backward_rows)(size_t begin, size_t end, void *ctx) {
    const dropout_job *j = ctx;
    const int D = j->D, words = agi_dropout_words(D);
    const real s = j->s;
    for (size_t r = begin; r < end; r++) {
        const real *restrict dy = j->dy + r * D;
        real *restrict dx = j->dx + r * D;
        for (int w = 0; w < words; w++) {
            const int c0 = LANES * w, count = D - c0 < LANES ? D - c0 : LANES;
            const uint32_t keep = j->bits[r * (size_t)words + (size_t)w];
            if (count == LANES)
                for (int k = 0; k < LANES; k++) dx[c0 + k] += dy[c0 + k] * ((keep >> k & 1u) ? s : 0);
            else
                for (int k = 0; k < count; k++) dx[c0 + k] += dy[c0 + k] * ((keep >> k & 1u) ? s : 0);
        }
    }
}

static void dropout_forward(ag_node *n) {
    const dropout_params *p = n->params;
    const ag_tensor *x = n->in[0];
    real *y = n->out->data;
    if (keeps_nothing(p->p)) {  // x * 0, and nothing to save
        for (size_t k = 0; k < x->numel; k++) y[k] = ((const real *)x->data)[k] * 0;
        return;
    }
    const int D = agi_last(x);
    const size_t rows = agi_rows(x);
    dropout_job j = {.D = D, .seed = p->seed, .site = p->site,
                     .threshold = (uint32_t)keep_threshold(p->p),
                     .s = (real)(1.0 / (1.0 - p->p)), .x = x->data, .y = y};
    const uint64_t inc = row_generator(p->seed, p->site, 0, 0).inc;
    for (int k = 0; k < LANES; k++) {
        affine a = steps_map(inc, (uint64_t)k);
        j.lane_mult[k] = a.mult, j.lane_plus[k] = a.plus;
    }
    j.step = steps_map(inc, LANES);
    j.row = steps_map(inc, (uint64_t)D);
    if (n->recording) {
        j.bits = ag_tape_alloc(n->tape, rows * (size_t)agi_dropout_words(D) * sizeof *j.bits);
        n->saved = j.bits;
    }
    agi_parallel_for(rows, 10.0 * (double)x->numel, R(agi_dropout_forward_rows), &j);
}

static void dropout_backward(ag_node *n) {
    const dropout_params *p = n->params;
    const ag_tensor *x = n->in[0];
    if (keeps_nothing(p->p)) {  // y = x * 0: dy * 0, zero unless dy is not finite
        const real *dy = n->out->grad;
        real *dx = x->grad;
        for (size_t k = 0; k < x->numel; k++) dx[k] += dy[k] * 0;
        return;
    }
    dropout_job j = {.D = agi_last(x), .s = (real)(1.0 / (1.0 - p->p)), .dy = n->out->grad,
                     .dx = x->grad, .bits = n->saved};
    agi_parallel_for(agi_rows(x), 2.0 * (double)x->numel, R(agi_dropout_backward_rows), &j);
}

const ag_op R(agi_dropout_op) = {"dropout", dropout_forward, dropout_backward,
    "dx = dy * keep / (1 - p)"};

#if AG_ONCE
uint64_t agi_dropout_site(const char *prefix, const char *suffix) {
    uint64_t h = 14695981039346656037ULL;
    for (const char *s = prefix; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    for (const char *s = suffix; s && *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

ag_tensor *ag_dropout(ag_tape *tp, ag_tensor *x, double p, bool training, uint64_t seed,
                      uint64_t site) {
    if (!agi_check_float("dropout", "x", x)) return NULL;
    if (!(p >= 0 && p <= 1)) {  // also rejects NaN
        ag_error("dropout: p must be in [0, 1], got %g; x %s", p, agi_shape(x));
        return NULL;
    }
    if (!training || p == 0) return x;
    dropout_params prm = {p, seed, site};
    return ag_op_apply(tp, agi_pick(x, &agi_dropout_op_f32, &agi_dropout_op_f64), 1, &x, x->ndim,
                    x->shape, &prm, sizeof prm);
}

// ---- Replaying rows (the fused attention's dropout) ---------------------------------------

void agi_dropout_plan_make(agi_dropout_plan *pl, uint64_t seed, uint64_t site, double p, int D) {
    pl->seed = seed, pl->site = site, pl->D = D;
    pl->threshold = keep_threshold(p);
    const uint64_t inc = row_generator(seed, site, 0, 0).inc;
    for (int k = 0; k < 32; k++) {
        affine a = steps_map(inc, (uint64_t)k);
        pl->lane_mult[k] = a.mult, pl->lane_plus[k] = a.plus;
    }
    affine a = steps_map(inc, 32);
    pl->step_mult = a.mult, pl->step_plus = a.plus;
    a = steps_map(inc, (uint64_t)D);
    pl->row_mult = a.mult, pl->row_plus = a.plus;
}

// The lanes of the forward above, writing a byte per element.
AGI_HOT static void keep_rows_mv(const agi_dropout_plan *pl, size_t row0, int rows,
                                 uint8_t *keep, size_t ld) {
    const int D = pl->D;
    uint64_t row_state = row_generator(pl->seed, pl->site, row0, D).state;
    for (int r = 0; r < rows; r++) {
        uint8_t *kr = keep + (size_t)r * ld;
        uint64_t st[32];
        for (int k = 0; k < 32; k++) st[k] = pl->lane_mult[k] * row_state + pl->lane_plus[k];
        for (ptrdiff_t c0 = 0; c0 < D; c0 += 32) {  // past INT_MAX after the last
            uint8_t flags[32];
            for (int k = 0; k < 32; k++) {
                flags[k] = pcg32_output(st[k]) >= pl->threshold;
                st[k] = st[k] * pl->step_mult + pl->step_plus;
            }
            const int count = D - c0 < 32 ? (int)(D - c0) : 32;
            memcpy(kr + c0, flags, (size_t)count);
        }
        row_state = pl->row_mult * row_state + pl->row_plus;
    }
}

void agi_dropout_keep_rows(const agi_dropout_plan *pl, size_t row0, int rows, uint8_t *keep,
                           size_t ld) {
    keep_rows_mv(pl, row0, rows, keep, ld);
}

// Keep flags of the next `count` (<= 32) elements: bit k for the k-th.
static uint32_t next_keep_bits(ag_pcg32 *g, uint64_t threshold, int count) {
    uint32_t bits = 0;
    for (int k = 0; k < count; k++) bits |= (uint32_t)(ag_pcg32_next(g) >= threshold) << k;
    return bits;
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
    for (ptrdiff_t c0 = 0; c0 < D; c0 += 32) {  // past INT_MAX after the last
        int count = D - c0 < 32 ? (int)(D - c0) : 32;
        uint32_t bits = next_keep_bits(&g, threshold, count);
        for (int k = 0; k < count; k++) keep[c0 + k] = (uint8_t)(bits >> k & 1u);
    }
}
#endif
