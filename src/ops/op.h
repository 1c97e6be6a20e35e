// What every op file needs: the public API, the real type, the BLAS and
// threading kernels, and small helpers for shape checks.
#ifndef ATTOGRAD_OP_H
#define ATTOGRAD_OP_H

#include "../core/internal.h"
#include "../core/parallel.h"
#include "../kernels/gemm.h"
#include "../core/real.h"
#include "attograd/ops.h"
#include "pos.h"
#include "registry.h"

// The f32 or f64 variant of an op, by the dtype of a float input.
static inline const ag_op *agi_pick(const ag_tensor *x, const ag_op *f32, const ag_op *f64) {
    return x->dtype == AG_F64 ? f64 : f32;
}

// Input checks shared by the constructors; each reports "<op>: ..." and
// returns false. The first three pass inline, as every op of a decode step calls them a few
// times; their reports (*_failed) are in checks.c.
bool agi_check_float_failed(const char *op, const char *what, const ag_tensor *t);
bool agi_check_same_dtype_failed(const char *op, const ag_tensor *a, const ag_tensor *b);
bool agi_check_ndim_failed(const char *op, const char *what, const ag_tensor *t, int lo,
                           int hi);
static inline bool agi_check_float(const char *op, const char *what, const ag_tensor *t) {
    return (t && agi_is_float(t->dtype)) || agi_check_float_failed(op, what, t);
}
static inline bool agi_check_same_dtype(const char *op, const ag_tensor *a,
                                        const ag_tensor *b) {
    return a->dtype == b->dtype || agi_check_same_dtype_failed(op, a, b);
}
static inline bool agi_check_ndim(const char *op, const char *what, const ag_tensor *t, int lo,
                                  int hi) {
    return (t->ndim >= lo && t->ndim <= hi) || agi_check_ndim_failed(op, what, t, lo, hi);
}
bool agi_check_same_shape(const char *op, const ag_tensor *a, const ag_tensor *b);
// b's shape equals a's shape or a trailing part of it (b broadcasts over a's
// leading dims).
bool agi_check_trailing(const char *op, const ag_tensor *a, const ag_tensor *b);

// The arguments of a loss over the rows of `x` [..., C] (`what`: "logits") against class
// targets: the tape, x's dtype and dimensions, and n_targets, one a row, checked before
// any target is read (a short array is an error, never a read past its end). Then the
// targets, copied into tape memory (the caller may change its array before backward) and
// checked in the same pass: each in [0, C) or equal to ignore_index. Returns the copy and
// the count of rows not ignored in *kept; on a bad target, reports "<op>: target T at
// position R is out of range for C classes (<what> <shape>, ignore_index I)"; on any
// error NULL. Large arrays are split over the threads.
int32_t *agi_targets_copy(const char *op, const char *what, const ag_tensor *x, ag_tape *tp,
                          const int32_t *targets, size_t n_targets, int32_t ignore_index,
                          size_t *kept);

// Where element (slice n, query i, key j) of a mask lies, for scores [..., T, S] seen as
// [na, nb, T, S] (nb = h for [B, h, T, S]; na = 1 for fewer dims): at
// (n / nb) sa + (n % nb) sb + i st + j. A stride is 0 along a dim the mask broadcasts over.
typedef struct {
    size_t sa, sb, st;
    int nb;
} agi_mask_layout;

static inline size_t agi_mask_at(const agi_mask_layout *l, size_t n, int i) {
    return n / (size_t)l->nb * l->sa + n % (size_t)l->nb * l->sb + (size_t)i * l->st;
}

// What ag_softmax and ag_attention do to the scores, checked once by
// agi_check_softmax_masks: the scale, causality, where the optional masks and position
// table sit among the op's inputs, how each mask maps onto the scores, and the position
// term.
typedef struct {
    double scale;  // never 0 (the check maps 0 to 1)
    bool causal;
    int q_offset;  // position of query row 0 among the keys: causal masks key j > q_offset
                   // + i, and the position term sees query i at q_offset + i
    int window;    // > 0: keys at distance >= window from q_offset + i masked (behind it,
                   // and ahead of it unless causal); 0: none
    int mask, add, kpm, table;  // input index of each, -1 when absent
    agi_mask_layout mask_at, add_at, kpm_at;
    bool add_one_to_one;  // each additive-mask element serves exactly one score
    bool add_by_slices;   // some additive-mask element serves more than one slice
    bool keeps;           // mask polarity: true = may attend
    ag_pos_bias pos;      // the position scheme (pos.h); table: NULL here (it is input `table`)
    int heads;            // the head count of the position term (head = n % heads)
} agi_scores;

// The keys [*begin, *end) that queries [i0, i1) can see at all, of S: with causality none
// beyond the last query's position q_offset + i1 - 1; with a window W none W or more
// behind the first query's position, nor (without causality) W or more ahead of the
// last's. Other keys are masked for every query of the range; *begin <= *end.
static inline void agi_scores_keys(const agi_scores *m, int S, int i0, int i1, int *begin,
                                   int *end) {
    const long long first = (long long)m->q_offset + i0 - m->window + 1,
                    last = (long long)m->q_offset + i1 - 1;
    long long e = S;
    if (m->causal && last + 1 < e) e = last + 1;
    if (m->window > 0 && last + m->window < e) e = last + m->window;
    *end = e > 0 ? (int)e : 0;
    *begin = m->window > 0 && first > 0 ? (first < *end ? (int)first : *end) : 0;
}

// The checks ag_softmax and ag_attention share, of everything in o: scale finite;
// q_offset >= 0 and q_offset + T an int; `mask` bool and `additive_mask` of dtype dt,
// each of a shape that fits the scores (agi_mask_fits); `key_padding_mask` bool
// [scores[0], S]; the position term
// (pos.h: a kind with a term, its table [heads, ...] of dtype dt). `heads`, when not 0, is
// the scores' head count (attention). Appends the masks and table present to
// in[*n_in ...] and records everything in *m. `subject` names the op's first input in
// messages ("scores [2,4,5,7]", "q [2,2,3,5]"), `operands` what key padding must fit.
// `names` gives the masks the names of the caller's own fields in messages (NULL: the
// softmax's, "mask", "additive_mask", "key_padding_mask").
typedef struct {
    const char *mask, *additive_mask, *key_padding_mask;
} agi_mask_names;
bool agi_check_softmax_masks(const char *op, const ag_softmax_opts *o, ag_dtype dt, int ndim,
                             const int scores[], int heads, const agi_about *subject,
                             const agi_about *operands, const agi_mask_names *names,
                             ag_tensor *in[], int *n_in, agi_scores *m);

// The position term by relative position (see pos_bias.c): rel[head, (j - i) + T - 1]
// for heads m->heads (query rows at q_offset + i), from `table` (NULL for a scheme without
// one); and the table gradient from the term gradients grel of the same layout (added
// into gtable).
void R(agi_pos_rel_fill)(const agi_scores *m, const real *table, int T, int S, real *rel);
void R(agi_pos_rel_grad)(const agi_scores *m, const real *grel, int T, int S, real *gtable);

// RoPE (rope.c), shared with the fused attention, which rotates q and k inside: the cos
// and sin of positions offset .. offset + T - 1 for a head width d, [T, d/2] each, in tape
// memory; and `rows` rows of src (ld lds) at table positions t0, t0 + 1, ... rotated by
// sign times their angles into dst (ld ldd), added when `add`.
real *R(agi_rope_table)(ag_tape *tp, double base, long long offset, int T, int d);
void R(agi_rope_rows)(const real *cs, int T, int t0, int d, const real *src, int lds,
                      real *dst, int ldd, int rows, real sign, bool add);

// A dropout stream id (ag_dropout's `site`) for a module's dropout, from its parameter
// prefix and a suffix naming the place (FNV-1a): each place draws a stream of its own,
// fixed by its name, not by the order in which the modules were made.
uint64_t agi_dropout_site(const char *prefix, const char *suffix);

// Dropout's draws replayed a block of rows at a time (dropout.c; the fused attention's
// dropout): the keep flags ag_dropout_row_mask gives, rows row0 .. row0 + rows - 1 of a
// [..., D] tensor into keep (rows ld bytes apart), 32 lanes of pcg32 at a time. The plan
// holds the lanes' jumps for (seed, site, p, D): make it once per op call.
typedef struct {
    uint64_t seed, site, threshold;
    int D;
    uint64_t lane_mult[32], lane_plus[32], step_mult, step_plus, row_mult, row_plus;
} agi_dropout_plan;
void agi_dropout_plan_make(agi_dropout_plan *pl, uint64_t seed, uint64_t site, double p, int D);
void agi_dropout_keep_rows(const agi_dropout_plan *pl, size_t row0, int rows, uint8_t *keep,
                           size_t ld);
// The 32-bit words of keep flags ag_dropout saves for a row of D >= 1 elements: ceil(D / 32),
// without D + 31, which passes INT_MAX for D near it.
static inline int agi_dropout_words(int D) { return (D - 1) / 32 + 1; }

// Product of all dims but the last: the number of rows of a [..., D] tensor.
// A gradient gathered from many elements (a broadcast operand's, a mask's, a weight's)
// is summed in double, also for f32, and added to the real gradient once: a float sum
// over many rows drifts by up to that many roundings. n zeroed sums in tape memory, and
// their landing in d.
static inline double *agi_grad_sums(ag_tape *tp, size_t n) {
    double *s = ag_tape_alloc(tp, n * sizeof *s);
    for (size_t i = 0; i < n; i++) s[i] = 0;
    return s;
}
static inline void R(agi_grad_sums_add)(real *d, const double *s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] += (real)s[i];
}

static inline size_t agi_rows(const ag_tensor *t) {
    return t->ndim ? t->numel / (size_t)t->shape[t->ndim - 1] : 1;
}
static inline int agi_last(const ag_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

#endif
