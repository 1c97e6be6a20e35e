// Sampling a token from a row of logits: greedy, temperature, top-k, top-p.
//
// Probabilities are computed in double whatever the logits' dtype. Top-k and
// top-p need the tokens in order of probability, likeliest first and equal ones by
// index: a stable radix sort of V indices on the high bits of their probabilities
// (which are not negative, so their bits order them as numbers) finished on the low bits
// within each run of equal high bits, skipped when neither filter is on. qsort took a
// third of a byte-level model's decode step. Top-p sorts only the tokens that can be
// kept when they suffice (top_p_kept). The logits are read in place, not element by
// element through ag_tensor_item.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attograd/generate.h"
#include "nn.h"

struct ag_sampler {
    int vocab;
    ag_sample_config cfg;
    ag_pcg32 rng;
    double *p;  // [vocab]
    int *order; // [vocab]
    int *spare; // [vocab], the sort's other buffer
    uint64_t *key, *spare_key;  // [vocab] each
    int count[4][256];          // the sort's counts of each high byte of the keys
};

bool agi_sample_config_ok(const char *op, int vocab, const ag_sample_config *cfg) {
    if (vocab < 1 || !(cfg->temperature >= 0) || !isfinite(cfg->temperature) ||
        cfg->top_k < 0 || !(cfg->top_p >= 0 && cfg->top_p <= 1)) {
        ag_error("%s: needs vocab >= 1, temperature >= 0, top_k >= 0, top_p in [0, 1]; "
                 "got vocab %d, temperature %g, top_k %d, top_p %g",
                 op, vocab, cfg->temperature, cfg->top_k, cfg->top_p);
        return false;
    }
    return true;
}

ag_sampler *ag_sampler_new(int vocab, const ag_sample_config *cfg, uint64_t seed,
                           uint64_t stream) {
    if (!agi_given(cfg, "sampler", "config") || !agi_sample_config_ok("sampler", vocab, cfg))
        return NULL;
    ag_sampler *s = agi_calloc(sizeof *s);
    s->p = agi_calloc((size_t)vocab * sizeof *s->p);
    s->order = agi_calloc((size_t)vocab * sizeof *s->order);
    s->spare = agi_calloc((size_t)vocab * sizeof *s->spare);
    s->key = agi_calloc((size_t)vocab * sizeof *s->key);
    s->spare_key = agi_calloc((size_t)vocab * sizeof *s->spare_key);
    s->vocab = vocab;
    s->cfg = *cfg;
    if (s->cfg.top_p == 0) s->cfg.top_p = 1;  // a zeroed field: the filter is off
    ag_pcg32_seed(&s->rng, seed, stream);
    return s;
}

void ag_sampler_free(ag_sampler *s) {
    if (!s) return;
    agi_free(s->p);
    agi_free(s->order);
    agi_free(s->spare);
    agi_free(s->key);
    agi_free(s->spare_key);
    agi_free(s);
}

// One pass of an LSD radix sort: keys [0, n) and their tokens into to_key / to_order by
// the byte at `shift`, stably, given that byte's counts (made into starts here). False,
// with nothing moved, when every key has the same byte there.
static bool scatter_by_byte(int count[256], int shift, const uint64_t *key, const int *order,
                            uint64_t *to_key, int *to_order, int n) {
    if (count[key[0] >> shift & 255] == n) return false;
    for (int d = 0, start = 0; d < 256; d++) {
        const int c = count[d];
        count[d] = start;
        start += c;
    }
    for (int i = 0; i < n; i++) {
        const int at = count[key[i] >> shift & 255]++;
        to_key[at] = key[i];
        to_order[at] = order[i];
    }
    return true;
}

// Keys [0, n) (with their tokens) that share their high halves, in order of their low
// halves, stably: an insertion sort for a short run, else an LSD radix sort, a byte a
// pass, through the spare buffers. Insertion alone moved up to n^2 / 2 keys, and a run
// can be most of the vocabulary: probabilities that agree in their first 20 mantissa bits
// (a temperature far above the logits' spread) made a draw quadratic in V.
enum { RUN_INSERTION_MAX = 64 };

static void sort_run_by_low_halves(uint64_t *key, int *order, uint64_t *spare_key, int *spare,
                                   int n, int count[256]) {
    if (n <= RUN_INSERTION_MAX) {
        for (int i = 1; i < n; i++) {
            const uint64_t k = key[i];
            const int o = order[i];
            int j = i;
            for (; j > 0 && key[j - 1] > k; j--) {
                key[j] = key[j - 1];
                order[j] = order[j - 1];
            }
            key[j] = k;
            order[j] = o;
        }
        return;
    }
    for (int shift = 0; shift < 32; shift += 8) {
        memset(count, 0, 256 * sizeof *count);
        for (int i = 0; i < n; i++) count[key[i] >> shift & 255]++;
        if (!scatter_by_byte(count, shift, key, order, spare_key, spare, n)) continue;
        memcpy(key, spare_key, (size_t)n * sizeof *key);
        memcpy(order, spare, (size_t)n * sizeof *order);
    }
}

// s->order[0, n), token indices in increasing order, sorted by s->p[] descending, equal
// ones by index. The key of a probability is the complement of its bits (p >= 0, so a
// larger p has larger bits); an LSD radix sort, a byte a pass, orders the keys by their
// high 32 bits (passes in which every key has the same byte move nothing and are
// skipped), stably, so that equal keys keep their order by index; then each run of equal
// high halves is ordered by its low halves.
static void sort_by_probability(ag_sampler *s, int V) {
    int *order = s->order, *spare = s->spare;
    uint64_t *key = s->key, *spare_key = s->spare_key;
    int(*count)[256] = s->count;
    memset(s->count, 0, sizeof s->count);
    for (int c = 0; c < V; c++) {
        uint64_t bits;
        memcpy(&bits, &s->p[order[c]], sizeof bits);
        key[c] = ~bits;
        for (int b = 0; b < 4; b++) count[b][key[c] >> (32 + 8 * b) & 255]++;
    }
    for (int b = 0; b < 4; b++) {
        if (!scatter_by_byte(count[b], 32 + 8 * b, key, order, spare_key, spare, V)) continue;
        uint64_t *tk = key;
        key = spare_key, spare_key = tk;
        int *to = order;
        order = spare, spare = to;
    }
    for (int i0 = 0, i1; i0 < V; i0 = i1) {
        for (i1 = i0 + 1; i1 < V && key[i1] >> 32 == key[i0] >> 32;) i1++;
        sort_run_by_low_halves(key + i0, order + i0, spare_key + i0, spare + i0, i1 - i0,
                               count[0]);
    }
    if (order != s->order) memcpy(s->order, order, (size_t)V * sizeof *order);
}

// How many of the likeliest tokens the top-p filter keeps, at most `kept` (top-k's), with
// s->order holding them likeliest first. The tokens whose probability exceeds (1 - top_p)
// / V are sorted first, alone: the others hold at most 1 - top_p of the mass, so these
// reach top_p, and they are the head of the whole order (equal ones by index both ways).
// When rounding stops the sum short of top_p among them, or top-k keeps more tokens than
// they are, the whole vocabulary is sorted, as it always was: the result is the same.
static int top_p_kept(ag_sampler *s, double total, int kept) {
    const int V = s->vocab;
    int n = V;
    if (s->cfg.top_p < 1) {
        const double above = total * (1 - s->cfg.top_p) / V;
        n = 0;
        for (int c = 0; c < V; c++)
            if (s->p[c] > above) s->order[n++] = c;
    }
    for (bool whole = n == V || n == 0;; whole = true) {
        if (whole)
            for (int c = 0; c < V; c++) s->order[c] = c;
        sort_by_probability(s, whole ? V : n);
        if (s->cfg.top_p >= 1) return kept;
        double acc = 0;
        const int seen = whole || kept < n ? kept : n;
        for (int i = 0; i < seen; i++) {
            acc += s->p[s->order[i]] / total;
            if (acc >= s->cfg.top_p) return i + 1;
        }
        if (whole || kept <= n) return kept;
    }
}

int ag_sampler_next(ag_sampler *s, const ag_tensor *logits, size_t row) {
    if (!agi_given(s, "sampler", "sampler")) return -1;
    if (!logits || (logits->dtype != AG_F32 && logits->dtype != AG_F64) ||
        logits->ndim < 1 || logits->shape[logits->ndim - 1] != s->vocab) {
        ag_error("sampler: logits %s must be f32 or f64 [..., %d]", agi_dtype_shape(logits),
                 s->vocab);
        return -1;
    }
    // A gradient's view before any backward reached it: reading it would dereference NULL.
    if (!logits->data) {
        ag_error("sampler: logits %s have no data (a gradient view no backward has reached)",
                 agi_shape(logits));
        return -1;
    }
    const int V = s->vocab;
    if (row >= logits->numel / (size_t)V) {
        ag_error("sampler: row %zu out of range for logits %s", row, agi_shape(logits));
        return -1;
    }
    double m = -INFINITY;
    int best = 0;
    // The row in its own dtype: a pointer of the other would point past the data (UB).
    const bool f32 = logits->dtype == AG_F32;
    const float *zf = f32 ? (const float *)logits->data + row * (size_t)V : NULL;
    const double *zd = f32 ? NULL : (const double *)logits->data + row * (size_t)V;
    for (int c = 0; c < V; c++) {
        const double z = zf ? zf[c] : zd[c];
        if (isnan(z)) {
            ag_error("sampler: row %zu of logits %s holds a NaN", row, agi_shape(logits));
            return -1;
        }
        s->p[c] = z;
        if (z > m) m = z, best = c;
    }
    if (m == -INFINITY) {
        ag_error("sampler: row %zu of logits %s is all -inf: no token has a probability", row,
                 agi_shape(logits));
        return -1;
    }
    if (s->cfg.temperature == 0) return best;
    if (m == INFINITY) {
        ag_error("sampler: row %zu of logits %s holds +inf: its probabilities at temperature %g "
                 "are NaN",
                 row, agi_shape(logits), s->cfg.temperature);
        return -1;
    }
    double total = 0;
    for (int c = 0; c < V; c++) total += s->p[c] = exp((s->p[c] - m) / s->cfg.temperature);
    int kept = V;
    bool filtered = (s->cfg.top_k > 0 && s->cfg.top_k < V) || s->cfg.top_p < 1;
    if (filtered) {
        if (s->cfg.top_k > 0 && s->cfg.top_k < kept) kept = s->cfg.top_k;
        kept = top_p_kept(s, total, kept);
        total = 0;
        for (int i = 0; i < kept; i++) total += s->p[s->order[i]];
    } else {
        for (int c = 0; c < V; c++) s->order[c] = c;
    }
    double u = ag_pcg32_double(&s->rng) * total, acc = 0;
    for (int i = 0; i < kept; i++) {
        acc += s->p[s->order[i]];
        if (u < acc) return s->order[i];
    }
    return s->order[kept - 1];  // u rounded up to the total
}
